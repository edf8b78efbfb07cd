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
struct Plan {
  dnnl::layer_normalization_forward::primitive_desc fwd;
  dnnl::layer_normalization_backward::primitive_desc bwd;
};

Plan plan(const Shape& s) {
  dnnl::engine& eng = cpu::engine();
  const memory::desc md = data_md(s), sd = stat_md(s);
  const auto eps = static_cast<float>(s.eps);
  const flags scale_shift = flags::use_scale | flags::use_shift;
  Plan p;
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

class CpuLayernorm final : public Case {
 public:
  explicit CpuLayernorm(const Problem& p)
      : s_(shape_of(p)), plan_(plan(s_)), in_(make_inputs(s_, p.seed())), out_(make_outputs(s_)),
        variance_(DType::f32, static_cast<std::size_t>(s_.rows())) {
    const memory::desc hvec = cpu::md({s_.hidden}, DType::f32, tag::a);
    if (s_.dir == Direction::bwd)
      call_ = {dnnl::layer_normalization_backward(plan_.bwd),
               cpu::normalization_backward_args(
                   plan_.bwd, hvec,
                   {in_.x.data(), in_.mean.data(), variance_.data(), in_.gamma.data(), in_.beta.data(),
                    out_.out.data(), in_.dy.data(), out_.dgamma.data(), out_.dbeta.data()})};
    else
      call_ = {dnnl::layer_normalization_forward(plan_.fwd),
               cpu::normalization_forward_args(plan_.fwd, hvec,
                                               {in_.x.data(), out_.mean.data(), variance_.data(), in_.gamma.data(),
                                                in_.beta.data(), out_.out.data()})};
  }

  void run() override {
    const auto R = static_cast<std::size_t>(s_.rows());
    const auto eps = static_cast<float>(s_.eps);
    float* var = variance_.as<float>();
    if (s_.dir == Direction::bwd) {
      // oneDNN takes the variance: the one whose 1/sqrt(var + eps) is the saved rstd.
      const float* rstd = in_.rstd.as<float>();
      for (std::size_t r = 0; r < R; ++r) var[r] = 1.f / (rstd[r] * rstd[r]) - eps;
    }
    call_.run();
    if (s_.dir == Direction::fwd) {
      float* rstd = out_.rstd.as<float>();
      for (std::size_t r = 0; r < R; ++r) rstd[r] = 1.f / std::sqrt(var[r] + eps);
    }
  }

  Check verify() override {
    out_.out.poison();
    out_.mean.poison();
    out_.rstd.poison();
    out_.dgamma.poison();
    out_.dbeta.poison();
    run();
    return layernorm::verify(s_, in_, out_);
  }

  std::string label() const override {
    const auto& pd = s_.dir == Direction::bwd ? static_cast<const dnnl::primitive_desc&>(plan_.bwd)
                                              : static_cast<const dnnl::primitive_desc&>(plan_.fwd);
    return cpu::with_threads("oneDNN layer_normalization " + std::string(pd.impl_info_str()) +
                             (s_.dir == Direction::bwd ? " + C++ rstd-to-variance" : " + C++ variance-to-rstd"));
  }

 private:
  Shape s_;
  Plan plan_;
  Inputs in_;
  Outputs out_;
  HostBuffer variance_;  // fwd: oneDNN's (biased) variance; bwd: from the saved rstd
  cpu::Call call_;
};

}  // namespace

HOTOPS_ONEDNN_CASE(CpuLayernorm, make_cpu, cpu_unsupported_reason, "layer_normalization")

}  // namespace hotops::layernorm
