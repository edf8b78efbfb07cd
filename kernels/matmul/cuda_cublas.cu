// matmul on CUDA: one gpu::LtGemm per direction, on PyTorch's row-major operands seen as
// column-major transposes (C^T = B^T A^T, no copies). addmm's bias is the BIAS epilogue and its
// gradient the BGRADA epilogue; bmm is the strided-batched form of the same call.
// The algorithm is the heuristic's first choice, picked once at setup and named in the label.
#include <cuda_bf16.h>

#include <memory>
#include <string>

#include "hotops/cublaslt_gemm.h"
#include "hotops/cuda_util.h"
#include "kernels/matmul/cuda_gemm.h"
#include "kernels/matmul/matmul.h"

namespace hotops::matmul {

const HostBuffer& operand(const Inputs& in, Operand o) {
  return o == Operand::a ? in.a : o == Operand::b ? in.b : in.dout;
}

CudaGemm cuda_gemm(const Shape& s) {
  CudaGemm g;
  gpu::GemmDesc& d = g.desc;
  d.ab = d.cd = s.dtype == DType::bf16 ? CUDA_R_16BF : CUDA_R_32F;  // tf32: f32 storage
  d.compute = s.dtype == DType::tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  d.alpha = static_cast<float>(s.alpha);
  d.batch = s.batch_count;  // packed: each matrix right after the previous
  switch (s.dir) {
    case Direction::fwd:  // out^T[N,M] = B^T[N,K] . A^T[K,M]
      d.m = s.N, d.n = s.M, d.k = s.K;
      g.a = Operand::b, g.b = Operand::a;
      break;
    case Direction::bwd_data:  // dA^T[K,M] = (B^T)^T . dOut^T:  A = B stored [K,N] -> col-major [N,K], transposed
      d.opa = CUBLAS_OP_T;
      d.m = s.K, d.n = s.M, d.k = s.N;
      g.a = Operand::b, g.b = Operand::dout;
      break;
    default:  // dB^T[N,K] = dOut^T[N,M] . A[M,K]:  B = A stored [M,K] -> col-major [K,M], transposed
      d.opb = CUBLAS_OP_T;
      d.m = s.N, d.n = s.K, d.k = s.M;
      g.a = Operand::dout, g.b = Operand::a;
  }
  g.bias = s.op == Op::addmm && s.dir == Direction::fwd;
  g.bias_grad = s.op == Op::addmm && s.dir == Direction::bwd_weight && s.beta == 1.0;
  return g;
}

namespace {

// dbias[n] = beta * sum_r dOut[r, n] over `rows` rows, accumulated in f32; one thread per column.
template <class T>
__global__ void column_sum(const T* __restrict__ dout, T* __restrict__ dbias, std::int64_t rows,
                           std::int64_t cols, float beta) {
  const std::int64_t n = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
  if (n >= cols) return;
  float acc = 0.f;
  for (std::int64_t r = 0; r < rows; ++r) acc += static_cast<float>(dout[r * cols + n]);
  dbias[n] = static_cast<T>(beta * acc);
}

class CudaMatmul final : public Case {
 public:
  explicit CudaMatmul(const Problem& p) : s_(shape_of(p)), in_(make_inputs(s_, p.seed())), out_(make_outputs(s_)) {
    // Device copies of the inputs; the bias already scaled by beta (a constant, folded once here).
    a_ = gpu::DeviceBuffer(in_.a);
    b_ = gpu::DeviceBuffer(in_.b);
    dout_ = gpu::DeviceBuffer(in_.dout);
    if (in_.bias.count()) {
      HostBuffer folded(s_.dtype, in_.bias.count());
      for (std::size_t n = 0; n < folded.count(); ++n) folded.set(n, s_.beta * in_.bias.get(n));
      bias_ = gpu::DeviceBuffer(folded);
    }
    out_d_ = gpu::DeviceBuffer(out_.primary.bytes());
    if (out_.dbias.count()) dbias_d_ = gpu::DeviceBuffer(out_.dbias.bytes());

    const CudaGemm g = cuda_gemm(s_);
    pa_ = device(g.a), pb_ = device(g.b);
    gpu::GemmDesc d = g.desc;
    if (g.bias) d.bias = bias_.get();
    if (g.bias_grad) d.bias_grad = dbias_d_.get();
    gemm_ = gpu::LtGemm::if_supported(d, p.name());
    if (!gemm_ && d.bias_grad) {
      // No kernel fuses the bias gradient for this shape/dtype: plain GEMM plus our column sum.
      d.bias_grad = nullptr;
      gemm_ = gpu::LtGemm::if_supported(d, p.name());
    }
    if (!gemm_) throw Error("cuBLASLt has no algorithm for " + p.name(), ErrorKind::unsupported);
    fused_dbias_ = d.bias_grad != nullptr;
    describe_algorithm(g.bias);
  }

  void run() override {
    gemm_->run(pa_, pb_, out_d_.get());  // beta 0: D is not read
    if (out_.dbias.count() && !fused_dbias_) {
      const std::int64_t rows = s_.batch_count * s_.M, cols = s_.N;
      const int threads = 256;
      const auto blocks = static_cast<unsigned>((cols + threads - 1) / threads);
      const auto beta = static_cast<float>(s_.beta);
      if (s_.dtype == DType::bf16)
        column_sum<<<blocks, threads, 0, gpu::stream()>>>(dout_.as<const __nv_bfloat16>(),
                                                          dbias_d_.as<__nv_bfloat16>(), rows, cols, beta);
      else
        column_sum<<<blocks, threads, 0, gpu::stream()>>>(dout_.as<const float>(), dbias_d_.as<float>(), rows, cols,
                                                          beta);
      HOTOPS_CHECK_LAUNCH();
    }
  }

  Check verify() override {
    out_d_.poison();
    if (out_.dbias.count()) dbias_d_.poison();
    run();
    out_d_.download(out_.primary);
    if (out_.dbias.count()) dbias_d_.download(out_.dbias);
    return matmul::verify(s_, in_, out_);
  }

  std::string label() const override { return label_; }

 private:
  const void* device(Operand o) const { return o == Operand::a ? a_.get() : o == Operand::b ? b_.get() : dout_.get(); }

  void describe_algorithm(bool bias_epilogue) {
    label_ = "cublasLt " + gemm_->algo_label();
    if (bias_epilogue) label_ += ", bias epilogue";
    if (fused_dbias_) label_ += ", bgrad epilogue";
    if (out_.dbias.count() && !fused_dbias_) label_ += " + hotops column_sum for dbias";
    if (s_.op == Op::addmm && s_.dir == Direction::fwd && s_.beta != 1.0) label_ += " (beta folded into bias)";
    if (s_.batch_count > 1) label_ += ", strided batch " + std::to_string(s_.batch_count);
  }

  Shape s_;
  Inputs in_;
  Outputs out_;
  gpu::DeviceBuffer a_, b_, dout_, bias_, out_d_, dbias_d_;
  std::unique_ptr<gpu::LtGemm> gemm_;
  const void* pa_ = nullptr;
  const void* pb_ = nullptr;
  bool fused_dbias_ = false;
  std::string label_;
};

}  // namespace

std::unique_ptr<Case> make_cuda(const Problem& p) { return std::make_unique<CudaMatmul>(p); }

}  // namespace hotops::matmul
