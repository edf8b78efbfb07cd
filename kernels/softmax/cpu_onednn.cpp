// softmax on the CPU: oneDNN's softmax_forward (forward_training) and softmax_backward over axis 1
// of a [rows, cols] row-major tensor. bwd runs from the destination y and dy, as PyTorch's
// _softmax_backward_data does.
#include "hotops/check.h"
#include "hotops/cpu.h"
#include "kernels/softmax/softmax.h"

namespace hotops::softmax {
namespace {

using dnnl::memory;

// The primitive descriptors of one problem (no memory touched): creating them is also the support
// probe, since oneDNN answers `unimplemented` for a dtype this CPU cannot do.
struct Plan {
  memory::desc md;
  dnnl::softmax_forward::primitive_desc fwd;
  dnnl::softmax_backward::primitive_desc bwd;  // bwd only
};

Plan plan(const Shape& s) {
  dnnl::engine& eng = cpu::engine();
  Plan p;
  p.md = cpu::md({s.rows, s.cols}, s.dtype, memory::format_tag::ab);
  const auto fd = HOTOPS_CHECK_DNNL(dnnl::softmax_forward::desc(dnnl::prop_kind::forward_training, p.md, 1));
  p.fwd = HOTOPS_CHECK_DNNL(dnnl::softmax_forward::primitive_desc(fd, eng));
  if (s.dir == Direction::bwd) {
    const auto bd = HOTOPS_CHECK_DNNL(dnnl::softmax_backward::desc(p.md, p.md, 1));
    p.bwd = HOTOPS_CHECK_DNNL(dnnl::softmax_backward::primitive_desc(bd, eng, p.fwd));
  }
  return p;
}

class CpuSoftmax final : public Case {
 public:
  explicit CpuSoftmax(const Problem& p)
      : s_(shape_of(p)), plan_(plan(s_)), in_(make_inputs(s_, p.seed())), out_(make_output(s_)) {
    auto mem = [&](HostBuffer& b) { return cpu::mem(plan_.md, b.data()); };
    if (s_.dir == Direction::fwd)
      call_ = {dnnl::softmax_forward(plan_.fwd), {{DNNL_ARG_SRC, mem(in_.x)}, {DNNL_ARG_DST, mem(out_)}}};
    else
      call_ = {dnnl::softmax_backward(plan_.bwd),
               {{DNNL_ARG_DST, mem(in_.y)}, {DNNL_ARG_DIFF_DST, mem(in_.dy)}, {DNNL_ARG_DIFF_SRC, mem(out_)}}};
  }

  void run() override { call_.run(); }

  Check verify() override {
    out_.poison();
    run();
    return softmax::verify(s_, in_, out_);
  }

  std::string label() const override {
    const bool fwd = s_.dir == Direction::fwd;
    return cpu::with_threads(std::string("oneDNN softmax_") + (fwd ? "forward forward_training " : "backward ") +
                             (fwd ? plan_.fwd.impl_info_str() : plan_.bwd.impl_info_str()));
  }

 private:
  Shape s_;
  Plan plan_;
  Inputs in_;
  HostBuffer out_;
  cpu::Call call_;
};

}  // namespace

HOTOPS_ONEDNN_CASE(CpuSoftmax, make_cpu_onednn, onednn_unsupported_reason, "softmax")

}  // namespace hotops::softmax
