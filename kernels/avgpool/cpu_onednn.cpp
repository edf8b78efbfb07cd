// global_avgpool on the CPU: oneDNN's average pooling over a window that is the whole of L
// (pooling_avg_exclude_padding, no padding: the plain mean), on the user's layout taken as it is:
// x as a 2-D image [N, C, L, 1] in nhwc (nlc) or nchw (ncl), y [N, C, 1, 1]. oneDNN 2.6 runs 1-D
// channels-last pooling (nwc) with its reference implementation only; as nhwc its jit kernels take
// it. fwd is forward_inference; bwd is pooling_backward, its hint a forward_training descriptor
// (average pooling has no workspace). The label names the implementation oneDNN chose. Where that is
// its simple one (`simple_*`, or a reference `ref:*`: oneDNN 2.6 runs ncl, NCHW, with simple_nchw
// whatever the CPU), hotops' loops run the pass instead (cpu_loops.cpp) and their label says so.
#include <utility>
#include <vector>

#include "hotops/check.h"
#include "hotops/cpu.h"
#include "kernels/avgpool/avgpool.h"

namespace hotops::avgpool {
namespace {

using dnnl::memory;

// The pass's primitive, its arguments in run()'s order (the input, then the output) and oneDNN's name
// of its implementation. Building it is also the support probe: oneDNN answers `unimplemented` for a
// dtype this CPU cannot do.
struct Pass {
  dnnl::primitive primitive;
  std::vector<std::pair<int, memory::desc>> args;
  std::string impl;
};

Pass pass_of(const Shape& s) {
  dnnl::engine& eng = cpu::engine();
  const auto tag = s.layout == Layout::nlc ? memory::format_tag::nhwc : memory::format_tag::nchw;
  const memory::desc x = cpu::md({s.N, s.C, s.L, 1}, s.dtype, tag);
  const memory::desc y = cpu::md({s.N, s.C, 1, 1}, s.dtype, tag);  // [N, C] in either layout
  const memory::dims one{1, 1}, window{s.L, 1}, none{0, 0};
  const auto alg = dnnl::algorithm::pooling_avg_exclude_padding;
  const bool fwd = s.dir == Direction::fwd;
  const auto forward = HOTOPS_CHECK_DNNL(dnnl::pooling_forward::primitive_desc(
      HOTOPS_CHECK_DNNL(dnnl::pooling_forward::desc(
          fwd ? dnnl::prop_kind::forward_inference : dnnl::prop_kind::forward_training, alg, x, y, one, window, none, none)),
      eng));
  if (fwd) return {dnnl::pooling_forward(forward), {{DNNL_ARG_SRC, x}, {DNNL_ARG_DST, y}}, forward.impl_info_str()};
  const auto backward = HOTOPS_CHECK_DNNL(dnnl::pooling_backward::primitive_desc(
      HOTOPS_CHECK_DNNL(dnnl::pooling_backward::desc(alg, x, y, one, window, none, none)), eng, forward));
  return {dnnl::pooling_backward(backward), {{DNNL_ARG_DIFF_DST, y}, {DNNL_ARG_DIFF_SRC, x}}, backward.impl_info_str()};
}

// oneDNN's simple or reference implementation, which hotops' loops replace.
bool simple(const std::string& impl) { return impl.rfind("simple", 0) == 0 || impl.rfind("ref", 0) == 0; }

class CpuAvgpool final : public Plan {
 public:
  CpuAvgpool(const Shape& s, Pass p) : s_(s) {
    prim_ = cpu::Primitive(p.primitive, p.args);
    impl_ = p.impl;
  }

  void run(const Args& a) override { prim_.run({s_.dir == Direction::fwd ? a.x : a.dy, a.out}); }

  std::string label() const override {
    return cpu::with_threads(std::string("oneDNN ") + (s_.dir == Direction::fwd ? "pooling_forward forward_inference" : "pooling_backward") +
                             " pooling_avg_exclude_padding, a window of all " + std::to_string(s_.L) + " positions, " + impl_);
  }

 private:
  Shape s_;
  cpu::Primitive prim_;
  std::string impl_;
};

}  // namespace

std::string onednn_unsupported_reason(const Problem& p) {
  return cpu::onednn_unsupported_reason([&] { pass_of(shape_of(p)); }, p, "average pooling");
}
std::unique_ptr<Plan> make_cpu_plan(const Shape& s) {
  Pass p = pass_of(s);
  if (s.layout == Layout::ncl && simple(p.impl)) return make_cpu_loops_plan(s, p.impl);
  return std::make_unique<CpuAvgpool>(s, std::move(p));
}

}  // namespace hotops::avgpool
