// layernorm on the CPU: oneDNN's layer_normalization primitive (use_scale | use_shift, forward
// training so that it saves the statistics), plus the O(rows) C++ that makes it PyTorch's op: oneDNN
// saves and takes the variance, PyTorch rstd = 1 / sqrt(var + eps), so fwd turns the variance into
// rstd after the primitive and bwd turns the saved rstd back into a variance before it. That C++ is
// part of the op and is timed.
#include <cmath>
#include <unordered_map>

#include "hotops/check.h"
#include "hotops/cpu.h"
#include "kernels/layernorm/layernorm.h"

namespace hotops::layernorm {
namespace {

using dnnl::memory;
using tag = memory::format_tag;
using flags = dnnl::normalization_flags;

memory::desc data_md(const Shape& s) {
  const auto t = s.dtype == DType::bf16 ? memory::data_type::bf16 : memory::data_type::f32;
  return memory::desc({s.rows(), s.hidden}, t, tag::ab);
}
memory::desc stat_md(const Shape& s) { return memory::desc({s.rows()}, memory::data_type::f32, tag::a); }

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
    dnnl::engine& eng = cpu::engine();
    auto mem = [&](const memory::desc& d, HostBuffer& b) { return memory(d, eng, b.data()); };
    const memory::desc hvec({s_.hidden}, memory::data_type::f32, tag::a);
    if (s_.dir == Direction::bwd) {
      const auto& pd = plan_.bwd;
      prim_ = dnnl::layer_normalization_backward(pd);
      args_ = {{DNNL_ARG_SRC, mem(pd.src_desc(), in_.x)},
               {DNNL_ARG_DIFF_DST, mem(pd.diff_dst_desc(), in_.dy)},
               {DNNL_ARG_MEAN, mem(pd.mean_desc(), in_.mean)},
               {DNNL_ARG_VARIANCE, mem(pd.variance_desc(), variance_)},
               {DNNL_ARG_SCALE, mem(hvec, in_.gamma)},
               {DNNL_ARG_SHIFT, mem(hvec, in_.beta)},
               {DNNL_ARG_DIFF_SRC, mem(pd.diff_src_desc(), out_.out)},
               {DNNL_ARG_DIFF_SCALE, mem(hvec, out_.dgamma)},
               {DNNL_ARG_DIFF_SHIFT, mem(hvec, out_.dbeta)}};
      return;
    }
    const auto& pd = plan_.fwd;
    prim_ = dnnl::layer_normalization_forward(pd);
    args_ = {{DNNL_ARG_SRC, mem(pd.src_desc(), in_.x)},
             {DNNL_ARG_DST, mem(pd.dst_desc(), out_.out)},
             {DNNL_ARG_SCALE, mem(hvec, in_.gamma)},
             {DNNL_ARG_SHIFT, mem(hvec, in_.beta)},
             {DNNL_ARG_MEAN, mem(pd.mean_desc(), out_.mean)},
             {DNNL_ARG_VARIANCE, mem(pd.variance_desc(), variance_)}};
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
    cpu::execute(prim_, args_);
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
    return "oneDNN layer_normalization " + std::string(pd.impl_info_str()) +
           (s_.dir == Direction::bwd ? " + C++ rstd-to-variance" : " + C++ variance-to-rstd") + ", " +
           std::to_string(cpu::threads()) + " threads";
  }

 private:
  Shape s_;
  Plan plan_;
  Inputs in_;
  Outputs out_;
  HostBuffer variance_;  // fwd: oneDNN's (biased) variance; bwd: from the saved rstd
  dnnl::primitive prim_;
  cpu::Args args_;
};

}  // namespace

std::string cpu_unsupported_reason(const Problem& p) {
  try {
    plan(shape_of(p));
  } catch (const Error& e) {
    if (e.kind() == ErrorKind::unsupported)
      return std::string("oneDNN has no ") + dtype_name(p.dtype) + " layer_normalization " + direction_name(p.dir) +
             " for this CPU (ISA " + cpu::isa_name() + ")";
    throw;
  }
  return "";
}

std::unique_ptr<Case> make_cpu(const Problem& p) { return std::make_unique<CpuLayernorm>(p); }

}  // namespace hotops::layernorm
