// matmul on the CPU: oneDNN's matmul primitive on the row-major operands as PyTorch holds them
// (transposes are strided views, not copies); addmm's dbias is a second, GEMV-shaped matmul.
#include "hotops/check.h"
#include "hotops/cpu.h"
#include "kernels/matmul/matmul.h"

namespace hotops::matmul {
namespace {

using dnnl::memory;
using tag = memory::format_tag;

// A row-major [B, rows, cols] operand, or its transpose ([B, cols, rows] viewed through strides).
memory::desc md(const Shape& s, std::int64_t rows, std::int64_t cols, bool transposed = false) {
  const memory::dim B = s.batch_count;
  const memory::data_type t = cpu::dnnl_type(s.dtype);
  if (!transposed) return memory::desc({B, rows, cols}, t, memory::dims{rows * cols, cols, 1});
  return memory::desc({B, cols, rows}, t, memory::dims{rows * cols, 1, cols});
}

dnnl::primitive_attr scaled(double factor) {
  dnnl::primitive_attr attr;
  if (factor != 1.0) {
    dnnl::post_ops po;
    po.append_eltwise(1.0f, dnnl::algorithm::eltwise_linear, static_cast<float>(factor), 0.0f);
    attr.set_post_ops(po);
  }
  return attr;
}

// The primitive descriptors of one problem (no memory touched): creating them is also the
// support probe, since oneDNN answers `unimplemented` for what this CPU cannot do.
struct Plan {
  dnnl::matmul::primitive_desc gemm;
  dnnl::matmul::primitive_desc dbias;  // addmm bwd_weight only
  bool has_dbias = false;
};

Plan plan(const Shape& s) {
  const std::int64_t M = s.M, N = s.N, K = s.K;
  dnnl::engine& eng = cpu::engine();
  Plan p;
  switch (s.dir) {
    case Direction::fwd: {
      // dst = alpha * (A.B + (beta / alpha) bias): the bias is a constant, folded once at setup.
      const memory::desc bias = s.op == Op::addmm ? cpu::md({1, 1, N}, s.dtype, tag::abc) : memory::desc();
      const auto d = HOTOPS_CHECK_DNNL(dnnl::matmul::desc(md(s, M, K), md(s, K, N), bias, md(s, M, N)));
      p.gemm = HOTOPS_CHECK_DNNL(dnnl::matmul::primitive_desc(d, scaled(s.alpha), eng));
      break;
    }
    case Direction::bwd_data: {  // dA = dOut . B^T
      const auto d = HOTOPS_CHECK_DNNL(dnnl::matmul::desc(md(s, M, N), md(s, K, N, true), md(s, M, K)));
      p.gemm = HOTOPS_CHECK_DNNL(dnnl::matmul::primitive_desc(d, scaled(s.alpha), eng));
      break;
    }
    default: {  // dB = A^T . dOut
      const auto d = HOTOPS_CHECK_DNNL(dnnl::matmul::desc(md(s, M, K, true), md(s, M, N), md(s, K, N)));
      p.gemm = HOTOPS_CHECK_DNNL(dnnl::matmul::primitive_desc(d, scaled(s.alpha), eng));
      if (s.op == Op::addmm) {
        // dbias[1,N] = beta * ones[1,M] . dOut[M,N]: a GEMV through oneDNN's matmul, which is
        // jit-compiled for every shape (oneDNN 2.6's reduction falls back to its reference code
        // when reducing over rows).
        const auto r = HOTOPS_CHECK_DNNL(dnnl::matmul::desc(
            cpu::md({1, M}, s.dtype, tag::ab), cpu::md({M, N}, s.dtype, tag::ab), cpu::md({1, N}, s.dtype, tag::ab)));
        p.dbias = HOTOPS_CHECK_DNNL(dnnl::matmul::primitive_desc(r, scaled(s.beta), eng));
        p.has_dbias = true;
      }
    }
  }
  return p;
}

class CpuMatmul final : public Case {
 public:
  explicit CpuMatmul(const Problem& p)
      : s_(shape_of(p)), plan_(plan(s_)), in_(make_inputs(s_, p.seed())), out_(make_outputs(s_)) {
    gemm_ = dnnl::matmul(plan_.gemm);
    const auto& pd = plan_.gemm;
    switch (s_.dir) {
      case Direction::fwd:
        gemm_args_ = cpu::matmul_args(pd, in_.a.data(), in_.b.data(), out_.primary.data());
        if (s_.op == Op::addmm) {
          folded_bias_ = HostBuffer(s_.dtype, in_.bias.count());
          for (std::size_t n = 0; n < in_.bias.count(); ++n)
            folded_bias_.set(n, in_.bias.get(n) * s_.beta / s_.alpha);
          gemm_args_[DNNL_ARG_BIAS] = cpu::mem(pd.bias_desc(), folded_bias_.data());
        }
        break;
      case Direction::bwd_data:
        gemm_args_ = cpu::matmul_args(pd, in_.dout.data(), in_.b.data(), out_.primary.data());
        break;
      default:
        gemm_args_ = cpu::matmul_args(pd, in_.a.data(), in_.dout.data(), out_.primary.data());
        if (plan_.has_dbias) {
          ones_ = HostBuffer(s_.dtype, static_cast<std::size_t>(s_.M));
          for (std::size_t i = 0; i < ones_.count(); ++i) ones_.set(i, 1.0);
          dbias_ = dnnl::matmul(plan_.dbias);
          dbias_args_ = cpu::matmul_args(plan_.dbias, ones_.data(), in_.dout.data(), out_.dbias.data());
        }
    }
  }

  void run() override {
    dnnl::stream& st = cpu::stream();
    HOTOPS_CHECK_DNNL(gemm_.execute(st, gemm_args_));
    if (plan_.has_dbias) HOTOPS_CHECK_DNNL(dbias_.execute(st, dbias_args_));
    HOTOPS_CHECK_DNNL(st.wait());
  }

  Check verify() override {
    out_.primary.poison();
    out_.dbias.poison();
    run();
    return matmul::verify(s_, in_, out_);
  }

  std::string label() const override {
    std::string l = "oneDNN matmul " + std::string(plan_.gemm.impl_info_str());
    if (plan_.has_dbias) l += " + dbias as ones.dOut " + std::string(plan_.dbias.impl_info_str());
    return cpu::with_threads(l);
  }

 private:
  Shape s_;
  Plan plan_;
  Inputs in_;
  Outputs out_;
  HostBuffer folded_bias_, ones_;
  dnnl::matmul gemm_, dbias_;
  cpu::Args gemm_args_, dbias_args_;
};

}  // namespace

std::string cpu_unsupported_reason(const Problem& p) {
  if (p.dtype != DType::f32 && p.dtype != DType::bf16)
    return std::string("the CPU backend has no ") + dtype_name(p.dtype) + " matmul";
  return cpu::onednn_unsupported_reason([&] { plan(shape_of(p)); }, std::string(dtype_name(p.dtype)) + " " + p.op);
}

std::unique_ptr<Case> make_cpu(const Problem& p) { return std::make_unique<CpuMatmul>(p); }

}  // namespace hotops::matmul
