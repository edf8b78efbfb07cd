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
struct Plan {
  dnnl::batch_normalization_forward::primitive_desc fwd;
  dnnl::batch_normalization_backward::primitive_desc bwd;
};

Plan plan(const Shape& s) {
  dnnl::engine& eng = cpu::engine();
  const memory::desc md = data_md(s);
  const auto eps = static_cast<float>(kEps);
  const flags scale_shift = flags::use_scale | flags::use_shift;
  Plan p;
  if (s.dir == Direction::infer) {
    const auto d = HOTOPS_CHECK_DNNL(dnnl::batch_normalization_forward::desc(
        dnnl::prop_kind::forward_inference, md, eps, scale_shift | flags::use_global_stats));
    p.fwd = HOTOPS_CHECK_DNNL(dnnl::batch_normalization_forward::primitive_desc(d, eng));
    return p;
  }
  const auto d = HOTOPS_CHECK_DNNL(
      dnnl::batch_normalization_forward::desc(dnnl::prop_kind::forward_training, md, eps, scale_shift));
  p.fwd = HOTOPS_CHECK_DNNL(dnnl::batch_normalization_forward::primitive_desc(d, eng));
  if (s.dir == Direction::bwd) {
    const auto b = HOTOPS_CHECK_DNNL(
        dnnl::batch_normalization_backward::desc(dnnl::prop_kind::backward, md, md, eps, scale_shift));
    p.bwd = HOTOPS_CHECK_DNNL(dnnl::batch_normalization_backward::primitive_desc(b, eng, p.fwd));
  }
  return p;
}

class CpuBatchnorm final : public Case {
 public:
  explicit CpuBatchnorm(const Problem& p)
      : s_(shape_of(p)), plan_(plan(s_)), in_(make_inputs(s_, input_seed(p))), out_(make_outputs(s_)),
        variance_(DType::f32, static_cast<std::size_t>(s_.C)) {
    const memory::desc cvec = cpu::md({s_.C}, DType::f32, tag::a);
    if (s_.dir == Direction::bwd) {
      call_ = {dnnl::batch_normalization_backward(plan_.bwd),
               cpu::normalization_backward_args(
                   plan_.bwd, cvec,
                   {in_.x.data(), in_.save_mean.data(), variance_.data(), in_.gamma.data(), in_.beta.data(),
                    out_.out.data(), in_.dy.data(), out_.dgamma.data(), out_.dbeta.data()})};
      return;
    }
    const bool infer = s_.dir == Direction::infer;
    call_ = {dnnl::batch_normalization_forward(plan_.fwd),
             cpu::normalization_forward_args(
                 plan_.fwd, cvec,
                 {in_.x.data(), infer ? in_.running_mean.data() : out_.save_mean.data(),
                  infer ? in_.running_var.data() : variance_.data(), in_.gamma.data(), in_.beta.data(),
                  out_.out.data()})};
    if (!infer) reset_running_stats();
  }

  void run() override {
    const auto C = static_cast<std::size_t>(s_.C);
    const auto eps = static_cast<float>(kEps);
    if (s_.dir == Direction::bwd) {
      // oneDNN takes the variance: the one whose 1/sqrt(var + eps) is the saved invstd.
      const float* invstd = in_.save_invstd.as<float>();
      float* var = variance_.as<float>();
      for (std::size_t c = 0; c < C; ++c) var[c] = 1.f / (invstd[c] * invstd[c]) - eps;
    }
    call_.run();
    if (s_.dir == Direction::fwd) {
      // oneDNN's variance is the biased one; PyTorch's running_var takes the unbiased one.
      const auto m = static_cast<float>(kMomentum);
      const auto n = static_cast<float>(s_.per_channel());
      const float unbias = n / (n - 1);
      const float* mean = out_.save_mean.as<float>();
      const float* var = variance_.as<float>();
      float* invstd = out_.save_invstd.as<float>();
      float* rm = out_.running_mean.as<float>();
      float* rv = out_.running_var.as<float>();
      for (std::size_t c = 0; c < C; ++c) {
        invstd[c] = 1.f / std::sqrt(var[c] + eps);
        rm[c] = (1 - m) * rm[c] + m * mean[c];
        rv[c] = (1 - m) * rv[c] + m * var[c] * unbias;
      }
    }
  }

  Check verify() override {
    out_.out.poison();
    out_.save_mean.poison();
    out_.save_invstd.poison();
    out_.dgamma.poison();
    out_.dbeta.poison();
    // The timed runs moved the running statistics on: start again from the inputs' values.
    if (s_.dir == Direction::fwd) reset_running_stats();
    run();
    return batchnorm::verify(s_, in_, out_);
  }

  std::string label() const override {
    const auto& pd = s_.dir == Direction::bwd ? static_cast<const dnnl::primitive_desc&>(plan_.bwd)
                                              : static_cast<const dnnl::primitive_desc&>(plan_.fwd);
    std::string l = "oneDNN batch_normalization " + std::string(pd.impl_info_str());
    if (s_.dir == Direction::fwd) l += " + C++ running-stat update and invstd";
    if (s_.dir == Direction::bwd) l += " + C++ invstd-to-variance";
    return cpu::with_threads(l);
  }

 private:
  void reset_running_stats() {
    out_.running_mean = in_.running_mean;
    out_.running_var = in_.running_var;
  }

  Shape s_;
  Plan plan_;
  Inputs in_;
  Outputs out_;
  HostBuffer variance_;  // fwd: oneDNN's (biased) batch variance; bwd: from the saved invstd
  cpu::Call call_;
};

}  // namespace

HOTOPS_ONEDNN_CASE(CpuBatchnorm, make_cpu, cpu_unsupported_reason, "batch_normalization")

}  // namespace hotops::batchnorm
