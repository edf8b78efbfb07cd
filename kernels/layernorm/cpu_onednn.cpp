// layernorm on the CPU: oneDNN's layer_normalization primitive (use_scale | use_shift, forward
// training so that it saves the statistics), plus the O(rows) C++ that makes it PyTorch's op: oneDNN
// saves and takes the variance, PyTorch rstd = 1 / sqrt(var + eps), so fwd turns the variance into
// rstd after the primitive and bwd turns the saved rstd back into a variance before it. That C++ is
// part of the op and is timed.
#include <cmath>

#include "hotops/check.h"
#include "hotops/cpu.h"
#include "kernels/layernorm/layernorm.h"

namespace hotops::layernorm {
namespace {

using dnnl::memory;
using tag = memory::format_tag;
using flags = dnnl::normalization_flags;

memory::desc data_md(const Shape& s) { return cpu::md({s.rows(), s.hidden}, s.dtype, tag::ab); }
memory::desc stat_md(const Shape& s) { return cpu::md({s.rows()}, DType::f32, tag::a); }

// The primitive descriptors of one problem (no memory touched): creating them is also the support
// probe, since oneDNN answers `unimplemented` for what this CPU cannot do.
struct Descriptors {
  dnnl::layer_normalization_forward::primitive_desc fwd;
  dnnl::layer_normalization_backward::primitive_desc bwd;
};

Descriptors descriptors(const Shape& s) {
  dnnl::engine& eng = cpu::engine();
  const memory::desc md = data_md(s), sd = stat_md(s);
  const auto eps = static_cast<float>(s.eps);
  const flags scale_shift = flags::use_scale | flags::use_shift;
  Descriptors p;
  const auto d = HOTOPS_CHECK_DNNL(
      dnnl::layer_normalization_forward::desc(dnnl::prop_kind::forward_training, md, sd, eps, scale_shift));
  p.fwd = HOTOPS_CHECK_DNNL(dnnl::layer_normalization_forward::primitive_desc(d, eng));
  if (s.dir == Direction::bwd) {
    const auto b = HOTOPS_CHECK_DNNL(
        dnnl::layer_normalization_backward::desc(dnnl::prop_kind::backward, md, md, sd, eps, scale_shift));
    p.bwd = HOTOPS_CHECK_DNNL(dnnl::layer_normalization_backward::primitive_desc(b, eng, p.fwd));
  }
  return p;
}

class CpuLayernorm final : public Plan {
 public:
  explicit CpuLayernorm(const Shape& s)
      : s_(s), d_(descriptors(s_)), variance_(DType::f32, static_cast<std::size_t>(s_.rows())) {
    const memory::desc hvec = cpu::md({s_.hidden}, DType::f32, tag::a);
    if (s_.dir == Direction::bwd)
      prim_ = cpu::Primitive(dnnl::layer_normalization_backward(d_.bwd),
                             {{DNNL_ARG_SRC, d_.bwd.src_desc()},
                              {DNNL_ARG_DIFF_DST, d_.bwd.diff_dst_desc()},
                              {DNNL_ARG_MEAN, d_.bwd.mean_desc()},
                              {DNNL_ARG_VARIANCE, d_.bwd.variance_desc()},
                              {DNNL_ARG_SCALE, hvec},
                              {DNNL_ARG_SHIFT, hvec},
                              {DNNL_ARG_DIFF_SRC, d_.bwd.diff_src_desc()},
                              {DNNL_ARG_DIFF_SCALE, hvec},
                              {DNNL_ARG_DIFF_SHIFT, hvec}});
    else
      prim_ = cpu::Primitive(dnnl::layer_normalization_forward(d_.fwd),
                             {{DNNL_ARG_SRC, d_.fwd.src_desc()},
                              {DNNL_ARG_DST, d_.fwd.dst_desc()},
                              {DNNL_ARG_SCALE, hvec},
                              {DNNL_ARG_SHIFT, hvec},
                              {DNNL_ARG_MEAN, d_.fwd.mean_desc()},
                              {DNNL_ARG_VARIANCE, d_.fwd.variance_desc()}});
  }

  void run(const Args& a) override {
    const auto R = static_cast<std::size_t>(s_.rows());
    const auto eps = static_cast<float>(s_.eps);
    float* var = variance_.as<float>();
    if (s_.dir == Direction::bwd) {
      // oneDNN takes the variance: the one whose 1/sqrt(var + eps) is the saved rstd.
      const auto* rstd = static_cast<const float*>(a.saved_rstd);
      for (std::size_t r = 0; r < R; ++r) var[r] = 1.f / (rstd[r] * rstd[r]) - eps;
      prim_.run({a.x, a.dy, a.saved_mean, var, a.gamma, a.beta, a.dx, a.dgamma, a.dbeta});
      return;
    }
    prim_.run({a.x, a.y, a.gamma, a.beta, a.mean, var});
    auto* rstd = static_cast<float*>(a.rstd);
    for (std::size_t r = 0; r < R; ++r) rstd[r] = 1.f / std::sqrt(var[r] + eps);
  }

  std::string label() const override {
    const auto& pd = s_.dir == Direction::bwd ? static_cast<const dnnl::primitive_desc&>(d_.bwd)
                                              : static_cast<const dnnl::primitive_desc&>(d_.fwd);
    return cpu::with_threads("oneDNN layer_normalization " + std::string(pd.impl_info_str()) +
                             (s_.dir == Direction::bwd ? " + C++ rstd-to-variance" : " + C++ variance-to-rstd"));
  }

 private:
  Shape s_;
  Descriptors d_;
  HostBuffer variance_;  // fwd: oneDNN's (biased) variance; bwd: from the saved rstd
  cpu::Primitive prim_;
};

}  // namespace

std::string onednn_unsupported_reason(const Problem& p) {
  return cpu::onednn_unsupported_reason([&] { descriptors(shape_of(p)); }, p, "layer_normalization");
}
std::unique_ptr<Plan> make_cpu_plan(const Shape& s) { return std::make_unique<CpuLayernorm>(s); }

}  // namespace hotops::layernorm
