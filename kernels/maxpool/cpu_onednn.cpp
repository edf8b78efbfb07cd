// maxpool on the CPU: oneDNN's pooling_forward (forward_training, pooling_max), which writes y and
// its workspace (the argmax of each window), and pooling_backward, which reads dy and that
// workspace. The workspace is the caller's (the benchmark fills it for bwd by one forward at setup);
// a backward run is the backward alone. A model's layer may take forward_inference (no workspace)
// and tensors in oneDNN's layouts (cpu_onednn.h), the run reordering y where the caller wants another.
#include "hotops/check.h"
#include "hotops/cpu.h"
#include "kernels/maxpool/cpu_onednn.h"
#include "kernels/maxpool/maxpool.h"

namespace hotops::maxpool {
namespace {

using dnnl::memory;

// The primitive descriptors of one problem (no memory touched): creating them is also the support
// probe, since oneDNN answers `unimplemented` for a dtype this CPU cannot do. x_md and y_md: the
// caller's layouts (by default the shape's NCHW or NHWC); the forward writes y in the layout it
// picks for x_md (fwd.dst_desc()), the same as y_md in the benchmark's layouts.
struct Descriptors {
  memory::desc x_md, y_md;
  dnnl::pooling_forward::primitive_desc fwd;
  dnnl::pooling_backward::primitive_desc bwd;  // bwd only
};

Descriptors descriptors(const Shape& s, const memory::desc& x = {}, const memory::desc& y = {}) {
  dnnl::engine& eng = cpu::engine();
  Descriptors d;
  const auto tag = s.layout == Layout::nchw ? memory::format_tag::nchw : memory::format_tag::nhwc;
  d.x_md = x.is_zero() ? cpu::md({s.N, s.C, s.H, s.W}, s.dtype, tag) : x;
  d.y_md = y.is_zero() ? cpu::md({s.N, s.C, s.OH(), s.OW()}, s.dtype, tag) : y;
  const memory::dims strides = {s.s, s.s}, kernel = {s.k, s.k}, pad_l = {s.pad, s.pad};
  // Floor mode: the right padding that makes oneDNN's output size PyTorch's (negative where the
  // last input rows or columns fall in no window).
  const memory::dims pad_r = {(s.OH() - 1) * s.s + s.k - s.H - s.pad, (s.OW() - 1) * s.s + s.k - s.W - s.pad};
  const bool infer = s.inference && s.dir == Direction::fwd;
  const memory::desc picked = x.is_zero() ? d.y_md : cpu::md({s.N, s.C, s.OH(), s.OW()}, s.dtype, memory::format_tag::any);
  const auto fd = HOTOPS_CHECK_DNNL(dnnl::pooling_forward::desc(
      infer ? dnnl::prop_kind::forward_inference : dnnl::prop_kind::forward_training, dnnl::algorithm::pooling_max, d.x_md,
      picked, strides, kernel, pad_l, pad_r));
  d.fwd = HOTOPS_CHECK_DNNL(dnnl::pooling_forward::primitive_desc(fd, eng));
  if (d.y_md.data.format_kind == dnnl_format_kind_any) d.y_md = d.fwd.dst_desc();
  if (s.dir == Direction::bwd) {
    const auto bd = HOTOPS_CHECK_DNNL(
        dnnl::pooling_backward::desc(dnnl::algorithm::pooling_max, d.x_md, d.y_md, strides, kernel, pad_l, pad_r));
    d.bwd = HOTOPS_CHECK_DNNL(dnnl::pooling_backward::primitive_desc(bd, eng, d.fwd));
  }
  return d;
}

class CpuMaxpool final : public Plan {
 public:
  CpuMaxpool(const Shape& s, const memory::desc& x = {}, const memory::desc& y = {}) : s_(s), d_(descriptors(s, x, y)) {
    const memory::desc ws = d_.fwd.workspace_desc();
    if (s_.dir == Direction::bwd) {
      prim_ = cpu::Primitive(dnnl::pooling_backward(d_.bwd),
                             {{DNNL_ARG_DIFF_DST, d_.y_md}, {DNNL_ARG_WORKSPACE, ws}, {DNNL_ARG_DIFF_SRC, d_.x_md}});
      return;
    }
    const memory::desc dst = d_.fwd.dst_desc();
    if (dst != d_.y_md) {  // the pool writes its own layout, the run reorders it into the caller's
      staged_ = memory(dst, cpu::engine());
      dnnl::engine& eng = cpu::engine();
      to_y_ = cpu::Primitive(dnnl::reorder(HOTOPS_CHECK_DNNL(dnnl::reorder::primitive_desc(eng, dst, eng, d_.y_md))),
                             {{DNNL_ARG_FROM, dst}, {DNNL_ARG_TO, d_.y_md}});
    }
    std::vector<std::pair<int, memory::desc>> args{{DNNL_ARG_SRC, d_.x_md}, {DNNL_ARG_DST, dst}};
    if (!s_.inference) args.push_back({DNNL_ARG_WORKSPACE, ws});
    prim_ = cpu::Primitive(dnnl::pooling_forward(d_.fwd), args);
  }

  void run(const Args& a) override {
    if (s_.dir == Direction::bwd) return prim_.run({a.dy, a.workspace, a.out});
    void* y = staged_ ? staged_.get_data_handle() : a.out;
    if (s_.inference) prim_.run({a.x, y});
    else prim_.run({a.x, y, a.workspace});
    if (staged_) to_y_.run({y, a.out});
  }

  std::string label() const override {
    const bool fwd = s_.dir == Direction::fwd;
    std::string l = std::string("oneDNN pooling_") +
                    (fwd ? (s_.inference ? "forward forward_inference pooling_max " : "forward forward_training pooling_max ")
                         : "backward pooling_max ") +
                    (fwd ? d_.fwd.impl_info_str() : d_.bwd.impl_info_str());
    if (!s_.inference) l += " (workspace " + std::to_string(d_.fwd.workspace_desc().get_size()) + " B)";
    if (staged_) l += ", y reordered into the caller's layout";
    return l + ", " + std::to_string(cpu::threads()) + " threads";
  }

  const memory::desc& y_desc() const { return d_.y_md; }

 private:
  Shape s_;
  Descriptors d_;
  cpu::Primitive prim_, to_y_;
  memory staged_;  // the pool's own output where the caller's y layout differs
};

}  // namespace

std::string onednn_unsupported_reason(const Problem& p) {
  return cpu::onednn_unsupported_reason([&] { descriptors(shape_of(p)); }, p, "max pooling");
}
std::unique_ptr<Plan> make_cpu_plan(const Shape& s) { return std::make_unique<CpuMaxpool>(s); }
std::unique_ptr<Plan> make_cpu_plan(const Shape& s, const memory::desc& x, const memory::desc& y) {
  HOTOPS_CHECK(s.dir == Direction::fwd, "maxpool: a plan on oneDNN's layouts is a forward one");
  return std::make_unique<CpuMaxpool>(s, x, y);
}
memory::desc onednn_y_desc(const Plan& p) {
  const auto* c = dynamic_cast<const CpuMaxpool*>(&p);
  HOTOPS_CHECK(c, "maxpool: not a CPU maxpool plan");
  return c->y_desc();
}
std::size_t cpu_workspace_bytes(const Shape& s) { return descriptors(s).fwd.workspace_desc().get_size(); }

}  // namespace hotops::maxpool
