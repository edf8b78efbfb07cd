// maxpool on the CPU: oneDNN's pooling_forward (forward_training, pooling_max), which writes y and
// its workspace (the argmax of each window), and pooling_backward, which reads dy and that
// workspace. The workspace is the caller's (the benchmark fills it for bwd by one forward at setup);
// a backward run is the backward alone.
#include "hotops/check.h"
#include "hotops/cpu.h"
#include "kernels/maxpool/maxpool.h"

namespace hotops::maxpool {
namespace {

using dnnl::memory;

// The primitive descriptors of one problem (no memory touched): creating them is also the support
// probe, since oneDNN answers `unimplemented` for a dtype this CPU cannot do.
struct Descriptors {
  memory::desc x_md, y_md;
  dnnl::pooling_forward::primitive_desc fwd;
  dnnl::pooling_backward::primitive_desc bwd;  // bwd only
};

Descriptors descriptors(const Shape& s) {
  dnnl::engine& eng = cpu::engine();
  Descriptors d;
  const auto tag = s.layout == Layout::nchw ? memory::format_tag::nchw : memory::format_tag::nhwc;
  d.x_md = cpu::md({s.N, s.C, s.H, s.W}, s.dtype, tag);
  d.y_md = cpu::md({s.N, s.C, s.OH(), s.OW()}, s.dtype, tag);
  const memory::dims strides = {s.s, s.s}, kernel = {s.k, s.k}, pad_l = {s.pad, s.pad};
  // Floor mode: the right padding that makes oneDNN's output size PyTorch's (negative where the
  // last input rows or columns fall in no window).
  const memory::dims pad_r = {(s.OH() - 1) * s.s + s.k - s.H - s.pad, (s.OW() - 1) * s.s + s.k - s.W - s.pad};
  const auto fd = HOTOPS_CHECK_DNNL(dnnl::pooling_forward::desc(dnnl::prop_kind::forward_training,
                                                                dnnl::algorithm::pooling_max, d.x_md, d.y_md,
                                                                strides, kernel, pad_l, pad_r));
  d.fwd = HOTOPS_CHECK_DNNL(dnnl::pooling_forward::primitive_desc(fd, eng));
  if (s.dir == Direction::bwd) {
    const auto bd = HOTOPS_CHECK_DNNL(
        dnnl::pooling_backward::desc(dnnl::algorithm::pooling_max, d.x_md, d.y_md, strides, kernel, pad_l, pad_r));
    d.bwd = HOTOPS_CHECK_DNNL(dnnl::pooling_backward::primitive_desc(bd, eng, d.fwd));
  }
  return d;
}

class CpuMaxpool final : public Plan {
 public:
  explicit CpuMaxpool(const Shape& s) : s_(s), d_(descriptors(s)) {
    const memory::desc ws = d_.fwd.workspace_desc();
    if (s_.dir == Direction::fwd)
      prim_ = cpu::Primitive(dnnl::pooling_forward(d_.fwd),
                             {{DNNL_ARG_SRC, d_.x_md}, {DNNL_ARG_DST, d_.y_md}, {DNNL_ARG_WORKSPACE, ws}});
    else
      prim_ = cpu::Primitive(dnnl::pooling_backward(d_.bwd),
                             {{DNNL_ARG_DIFF_DST, d_.y_md}, {DNNL_ARG_WORKSPACE, ws}, {DNNL_ARG_DIFF_SRC, d_.x_md}});
  }

  void run(const Args& a) override {
    if (s_.dir == Direction::fwd)
      prim_.run({a.x, a.out, a.workspace});
    else
      prim_.run({a.dy, a.workspace, a.out});
  }

  std::string label() const override {
    const bool fwd = s_.dir == Direction::fwd;
    return std::string("oneDNN pooling_") + (fwd ? "forward forward_training pooling_max " : "backward pooling_max ") +
           (fwd ? d_.fwd.impl_info_str() : d_.bwd.impl_info_str()) + " (workspace " +
           std::to_string(d_.fwd.workspace_desc().get_size()) + " B), " + std::to_string(cpu::threads()) +
           " threads";
  }

 private:
  Shape s_;
  Descriptors d_;
  cpu::Primitive prim_;
};

}  // namespace

std::string onednn_unsupported_reason(const Problem& p) {
  return cpu::onednn_unsupported_reason([&] { descriptors(shape_of(p)); }, p, "max pooling");
}
std::unique_ptr<Plan> make_cpu_plan(const Shape& s) { return std::make_unique<CpuMaxpool>(s); }
std::size_t cpu_workspace_bytes(const Shape& s) { return descriptors(s).fwd.workspace_desc().get_size(); }

}  // namespace hotops::maxpool
