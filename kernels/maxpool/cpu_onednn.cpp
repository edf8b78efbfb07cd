// maxpool on the CPU: oneDNN's pooling_forward (forward_training, pooling_max), which writes y and
// its workspace (the argmax of each window), and pooling_backward, which reads dy and that
// workspace. For bwd the forward runs once at setup to fill the workspace; only the backward is
// timed.
#include "hotops/check.h"
#include "hotops/cpu.h"
#include "kernels/maxpool/maxpool.h"

namespace hotops::maxpool {
namespace {

using dnnl::memory;

// The primitive descriptors of one problem (no memory touched): creating them is also the support
// probe, since oneDNN answers `unimplemented` for a dtype this CPU cannot do.
struct Plan {
  memory::desc x_md, y_md;
  dnnl::pooling_forward::primitive_desc fwd;
  dnnl::pooling_backward::primitive_desc bwd;  // bwd only
};

Plan plan(const Shape& s) {
  dnnl::engine& eng = cpu::engine();
  Plan p;
  const auto tag = s.layout == Layout::nchw ? memory::format_tag::nchw : memory::format_tag::nhwc;
  p.x_md = cpu::md({s.N, s.C, s.H, s.W}, s.dtype, tag);
  p.y_md = cpu::md({s.N, s.C, s.OH(), s.OW()}, s.dtype, tag);
  const memory::dims strides = {s.s, s.s}, kernel = {s.k, s.k}, pad_l = {s.pad, s.pad};
  // Floor mode: the right padding that makes oneDNN's output size PyTorch's (negative where the
  // last input rows or columns fall in no window).
  const memory::dims pad_r = {(s.OH() - 1) * s.s + s.k - s.H - s.pad, (s.OW() - 1) * s.s + s.k - s.W - s.pad};
  const auto fd = HOTOPS_CHECK_DNNL(dnnl::pooling_forward::desc(dnnl::prop_kind::forward_training,
                                                                dnnl::algorithm::pooling_max, p.x_md, p.y_md,
                                                                strides, kernel, pad_l, pad_r));
  p.fwd = HOTOPS_CHECK_DNNL(dnnl::pooling_forward::primitive_desc(fd, eng));
  if (s.dir == Direction::bwd) {
    const auto bd = HOTOPS_CHECK_DNNL(
        dnnl::pooling_backward::desc(dnnl::algorithm::pooling_max, p.x_md, p.y_md, strides, kernel, pad_l, pad_r));
    p.bwd = HOTOPS_CHECK_DNNL(dnnl::pooling_backward::primitive_desc(bd, eng, p.fwd));
  }
  return p;
}

class CpuMaxpool final : public Case {
 public:
  explicit CpuMaxpool(const Problem& p)
      : s_(shape_of(p)), plan_(plan(s_)), in_(make_inputs(s_, p.seed())), out_(make_output(s_)) {
    dnnl::engine& eng = cpu::engine();
    workspace_ = memory(plan_.fwd.workspace_desc(), eng);
    const memory x = cpu::mem(plan_.x_md, in_.x.data());
    if (s_.dir == Direction::fwd) {
      call_ = {
          dnnl::pooling_forward(plan_.fwd),
          {{DNNL_ARG_SRC, x}, {DNNL_ARG_DST, cpu::mem(plan_.y_md, out_.data())}, {DNNL_ARG_WORKSPACE, workspace_}}};
      return;
    }
    // The training forward once, into a scratch y, so the workspace holds this x's argmaxes.
    cpu::execute(dnnl::pooling_forward(plan_.fwd),
                 {{DNNL_ARG_SRC, x}, {DNNL_ARG_DST, memory(plan_.y_md, eng)}, {DNNL_ARG_WORKSPACE, workspace_}});
    call_ = {dnnl::pooling_backward(plan_.bwd),
             {{DNNL_ARG_DIFF_DST, cpu::mem(plan_.y_md, in_.dy.data())},
              {DNNL_ARG_WORKSPACE, workspace_},
              {DNNL_ARG_DIFF_SRC, cpu::mem(plan_.x_md, out_.data())}}};
  }

  void run() override { call_.run(); }

  Check verify() override {
    out_.poison();
    run();
    return maxpool::verify(s_, in_, out_);
  }

  std::string label() const override {
    const bool fwd = s_.dir == Direction::fwd;
    return std::string("oneDNN pooling_") + (fwd ? "forward forward_training pooling_max " : "backward pooling_max ") +
           (fwd ? plan_.fwd.impl_info_str() : plan_.bwd.impl_info_str()) + " (workspace " +
           std::to_string(plan_.fwd.workspace_desc().get_size()) + " B), " + std::to_string(cpu::threads()) +
           " threads";
  }

 private:
  Shape s_;
  Plan plan_;
  Inputs in_;
  HostBuffer out_;
  memory workspace_;
  cpu::Call call_;
};

}  // namespace

HOTOPS_ONEDNN_CASE(CpuMaxpool, make_cpu_onednn, onednn_unsupported_reason, "max pooling")

}  // namespace hotops::maxpool
