// relu on the CPU: oneDNN's eltwise primitive (eltwise_relu, alpha 0), forward_training for fwd and
// eltwise_backward from the source for bwd (dx = x > 0 ? dy : 0, as threshold_backward), over the
// tensor seen as one flat dimension: the op is elementwise, so its shape does not matter to it.
#include "hotops/check.h"
#include "hotops/cpu.h"
#include "kernels/pointwise/pointwise.h"

namespace hotops::pointwise {
namespace {

// The primitive descriptors of one problem (no memory touched): creating them is also the support
// probe, since oneDNN answers `unimplemented` for a dtype this CPU cannot do.
cpu::Eltwise plan(const Shape& s) {
  constexpr float kAlpha = 0.f;  // the slope for x < 0: plain relu
  return cpu::Eltwise(dnnl::algorithm::eltwise_relu, cpu::md({s.elements}, s.dtype, dnnl::memory::format_tag::a),
                      kAlpha, s.dir == Direction::bwd);
}

class CpuRelu final : public Case {
 public:
  explicit CpuRelu(const Problem& p)
      : s_(shape_of(p)), plan_(plan(s_)), in_(make_inputs(s_, p)), out_(make_output(s_)) {
    // The tensors start `offset` elements into their buffers.
    call_ = plan_.bind(in_.x.data(), in_.dy.data(), out_.data(), s_.offset * dtype_size(s_.dtype));
  }

  void run() override { call_.run(); }

  Check verify() override {
    out_.poison();
    run();
    return pointwise::verify(s_, in_, out_);
  }

  std::string label() const override {
    return cpu::with_threads(std::string("oneDNN eltwise_relu ") +
                             (s_.dir == Direction::fwd ? "forward_training " : "backward (from src) ") +
                             plan_.impl_info_str());
  }

 private:
  Shape s_;
  cpu::Eltwise plan_;
  Inputs in_;
  HostBuffer out_;
  cpu::Call call_;
};

}  // namespace

HOTOPS_ONEDNN_CASE(CpuRelu, make_cpu_relu, relu_onednn_unsupported_reason, "relu")

}  // namespace hotops::pointwise
