// gelu on the CPU: oneDNN's eltwise primitive (eltwise_gelu_erf / eltwise_gelu_tanh), forward_training
// for fwd and eltwise_backward from the source (not the destination) for bwd, over the tensor seen
// as one flat dimension: the op is elementwise, so its shape does not matter to it.
#include "hotops/check.h"
#include "hotops/cpu.h"
#include "kernels/gelu/gelu.h"

namespace hotops::gelu {
namespace {

dnnl::algorithm dnnl_algorithm(Approx a) {
  return a == Approx::none ? dnnl::algorithm::eltwise_gelu_erf : dnnl::algorithm::eltwise_gelu_tanh;
}

// The primitive descriptors of one problem (no memory touched): creating them is also the
// support probe, since oneDNN answers `unimplemented` for a dtype this CPU cannot do.
cpu::Eltwise plan(const Shape& s) {
  return cpu::Eltwise(dnnl_algorithm(s.approx), cpu::md({s.elements}, s.dtype, dnnl::memory::format_tag::a), 0.f,
                      s.dir == Direction::bwd);
}

class CpuGelu final : public Case {
 public:
  explicit CpuGelu(const Problem& p)
      : s_(shape_of(p)), plan_(plan(s_)), in_(make_inputs(s_, input_seed(p))), out_(make_output(s_)) {
    // The tensors start `offset` elements into their buffers.
    call_ = plan_.bind(in_.x.data(), in_.dy.data(), out_.data(), s_.offset * dtype_size(s_.dtype));
  }

  void run() override { call_.run(); }

  Check verify() override {
    out_.poison();
    run();
    return gelu::verify(s_, in_, out_);
  }

  std::string label() const override {
    return cpu::with_threads(std::string("oneDNN eltwise_") + (s_.approx == Approx::none ? "gelu_erf " : "gelu_tanh ") +
                             (s_.dir == Direction::fwd ? "forward_training " : "backward ") + plan_.impl_info_str());
  }

 private:
  Shape s_;
  cpu::Eltwise plan_;
  Inputs in_;
  HostBuffer out_;
  cpu::Call call_;
};

}  // namespace

HOTOPS_ONEDNN_CASE(CpuGelu, make_cpu_onednn, onednn_unsupported_reason, "gelu")

}  // namespace hotops::gelu
