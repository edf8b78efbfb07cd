// batchnorm on the CPU: oneDNN's batch_normalization primitive (use_scale | use_shift), plus the
// O(C) hand-written C++ that makes it PyTorch's op: oneDNN neither updates running statistics nor
// saves invstd (it keeps the variance), so run() does both after the primitive, and bwd turns the
// saved invstd back into the variance oneDNN takes. That C++ is part of the op and is timed.
#include <cmath>

#include "hotops/check.h"
#include "hotops/cpu.h"
#include "kernels/batchnorm/batchnorm.h"

namespace hotops::batchnorm {
namespace {

using dnnl::memory;
using tag = memory::format_tag;
using flags = dnnl::normalization_flags;

memory::desc data_md(const Shape& s) {
  if (s.layout == Layout::nc) return cpu::md({s.N, s.C}, s.dtype, tag::nc);
  return cpu::md({s.N, s.C, s.H, s.W}, s.dtype, s.layout == Layout::nchw ? tag::nchw : tag::nhwc);
}

// The primitive descriptors of one problem (no memory touched): creating them is also the
// support probe, since oneDNN answers `unimplemented` for what this CPU cannot do.
struct Descriptors {
  dnnl::batch_normalization_forward::primitive_desc fwd;
  dnnl::batch_normalization_backward::primitive_desc bwd;
};

Descriptors descriptors(const Shape& s) {
  dnnl::engine& eng = cpu::engine();
  const memory::desc md = data_md(s);
  const auto eps = static_cast<float>(kEps);
  const flags scale_shift = flags::use_scale | flags::use_shift;
  Descriptors d;
  if (s.dir == Direction::infer) {
    const auto f = HOTOPS_CHECK_DNNL(dnnl::batch_normalization_forward::desc(
        dnnl::prop_kind::forward_inference, md, eps, scale_shift | flags::use_global_stats));
    d.fwd = HOTOPS_CHECK_DNNL(dnnl::batch_normalization_forward::primitive_desc(f, eng));
    return d;
  }
  const auto f = HOTOPS_CHECK_DNNL(
      dnnl::batch_normalization_forward::desc(dnnl::prop_kind::forward_training, md, eps, scale_shift));
  d.fwd = HOTOPS_CHECK_DNNL(dnnl::batch_normalization_forward::primitive_desc(f, eng));
  if (s.dir == Direction::bwd) {
    const auto b = HOTOPS_CHECK_DNNL(
        dnnl::batch_normalization_backward::desc(dnnl::prop_kind::backward, md, md, eps, scale_shift));
    d.bwd = HOTOPS_CHECK_DNNL(dnnl::batch_normalization_backward::primitive_desc(b, eng, d.fwd));
  }
  return d;
}

class CpuBatchnorm final : public Plan {
 public:
  explicit CpuBatchnorm(const Shape& s)
      : s_(s), d_(descriptors(s)), variance_(DType::f32, static_cast<std::size_t>(s.C)) {
    const memory::desc cvec = cpu::md({s_.C}, DType::f32, tag::a);
    if (s_.dir == Direction::bwd) {
      const auto& pd = d_.bwd;
      prim_ = cpu::Primitive(dnnl::batch_normalization_backward(pd),
                             {{DNNL_ARG_SRC, pd.src_desc()},
                              {DNNL_ARG_DIFF_DST, pd.diff_dst_desc()},
                              {DNNL_ARG_MEAN, pd.mean_desc()},
                              {DNNL_ARG_VARIANCE, pd.variance_desc()},
                              {DNNL_ARG_SCALE, cvec},
                              {DNNL_ARG_SHIFT, cvec},
                              {DNNL_ARG_DIFF_SRC, pd.diff_src_desc()},
                              {DNNL_ARG_DIFF_SCALE, cvec},
                              {DNNL_ARG_DIFF_SHIFT, cvec}});
      return;
    }
    const auto& pd = d_.fwd;
    prim_ = cpu::Primitive(dnnl::batch_normalization_forward(pd), {{DNNL_ARG_SRC, pd.src_desc()},
                                                                   {DNNL_ARG_DST, pd.dst_desc()},
                                                                   {DNNL_ARG_SCALE, cvec},
                                                                   {DNNL_ARG_SHIFT, cvec},
                                                                   {DNNL_ARG_MEAN, pd.mean_desc()},
                                                                   {DNNL_ARG_VARIANCE, pd.variance_desc()}});
  }

  void run(const Args& a) override {
    const auto C = static_cast<std::size_t>(s_.C);
    const auto eps = static_cast<float>(kEps);
    float* var = variance_.as<float>();
    if (s_.dir == Direction::bwd) {
      // oneDNN takes the variance: the one whose 1/sqrt(var + eps) is the saved invstd.
      const float* invstd = a.save_invstd;
      for (std::size_t c = 0; c < C; ++c) var[c] = 1.f / (invstd[c] * invstd[c]) - eps;
      prim_.run({a.x, a.dy, a.save_mean, var, a.gamma, a.beta, a.out, a.dgamma, a.dbeta});
      return;
    }
    if (s_.dir == Direction::infer) {
      prim_.run({a.x, a.out, a.gamma, a.beta, a.running_mean, a.running_var});
      return;
    }
    prim_.run({a.x, a.out, a.gamma, a.beta, a.save_mean, var});
    // oneDNN's variance is the biased one; PyTorch's running_var takes the unbiased one.
    const auto m = static_cast<float>(kMomentum);
    const auto n = static_cast<float>(s_.per_channel());
    const float unbias = n / (n - 1);
    const float* mean = a.save_mean;
    float* invstd = a.save_invstd;
    float* rm = a.running_mean;
    float* rv = a.running_var;
    for (std::size_t c = 0; c < C; ++c) {
      invstd[c] = 1.f / std::sqrt(var[c] + eps);
      rm[c] = (1 - m) * rm[c] + m * mean[c];
      rv[c] = (1 - m) * rv[c] + m * var[c] * unbias;
    }
  }

  std::string label() const override {
    const auto& pd = s_.dir == Direction::bwd ? static_cast<const dnnl::primitive_desc&>(d_.bwd)
                                              : static_cast<const dnnl::primitive_desc&>(d_.fwd);
    std::string l = "oneDNN batch_normalization " + std::string(pd.impl_info_str());
    if (s_.dir == Direction::fwd) l += " + C++ running-stat update and invstd";
    if (s_.dir == Direction::bwd) l += " + C++ invstd-to-variance";
    return cpu::with_threads(l);
  }

 private:
  Shape s_;
  Descriptors d_;
  HostBuffer variance_;  // fwd: oneDNN's (biased) batch variance; bwd: from the saved invstd
  cpu::Primitive prim_;
};

}  // namespace

std::string onednn_unsupported_reason(const Problem& p) {
  return cpu::onednn_unsupported_reason([&] { descriptors(shape_of(p)); }, p, "batch_normalization");
}
std::unique_ptr<Plan> make_cpu_plan(const Shape& s) { return std::make_unique<CpuBatchnorm>(s); }

}  // namespace hotops::batchnorm
