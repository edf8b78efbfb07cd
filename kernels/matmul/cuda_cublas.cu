// matmul on CUDA: one cublasLt matmul per direction, on PyTorch's row-major operands seen as
// column-major transposes (C^T = B^T A^T, no copies). addmm's bias is the BIAS epilogue and its
// gradient the BGRADA epilogue; bmm is the strided-batched form of the same call.
// The algorithm is the heuristic's first choice, picked once at setup and named in the label.
#include <cuda_bf16.h>

#include <optional>
#include <string>

#include "hotops/cublaslt_gemm.h"
#include "hotops/cuda_util.h"
#include "kernels/matmul/matmul.h"

namespace hotops::matmul {
namespace {

cudaDataType_t cuda_type(DType t) { return t == DType::bf16 ? CUDA_R_16BF : CUDA_R_32F; }

cublasComputeType_t compute_type(DType t) {
  return t == DType::tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
}

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

// A column-major matrix layout (rows x cols, leading dimension ld), batched with a stride.
struct Layout {
  cublasLtMatrixLayout_t h = nullptr;
  Layout(DType t, std::int64_t rows, std::int64_t cols, std::int64_t ld, std::int64_t batch) {
    HOTOPS_CHECK_CUBLAS(cublasLtMatrixLayoutCreate(&h, cuda_type(t), rows, cols, ld));
    if (batch > 1) {
      const std::int32_t count = static_cast<std::int32_t>(batch);
      const std::int64_t stride = rows * cols;
      HOTOPS_CHECK_CUBLAS(cublasLtMatrixLayoutSetAttribute(h, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof count));
      HOTOPS_CHECK_CUBLAS(cublasLtMatrixLayoutSetAttribute(h, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride,
                                                           sizeof stride));
    }
  }
  ~Layout() { if (h) cublasLtMatrixLayoutDestroy(h); }
  Layout(const Layout&) = delete;
  Layout& operator=(const Layout&) = delete;
};

class CudaMatmul final : public Case {
 public:
  explicit CudaMatmul(const Problem& p) : s_(shape_of(p)), in_(make_inputs(s_, p.seed())), out_(make_outputs(s_)) {
    const std::int64_t M = s_.M, N = s_.N, K = s_.K, B = s_.batch_count;
    const DType t = s_.dtype;
    // Device copies of the inputs; the bias already scaled by beta (a constant, folded once here).
    a_ = gpu::DeviceBuffer(in_.a);
    b_ = gpu::DeviceBuffer(in_.b);
    dout_ = gpu::DeviceBuffer(in_.dout);
    if (in_.bias.count()) {
      HostBuffer folded(t, in_.bias.count());
      for (std::size_t n = 0; n < folded.count(); ++n) folded.set(n, s_.beta * in_.bias.get(n));
      bias_ = gpu::DeviceBuffer(folded);
    }
    out_d_ = gpu::DeviceBuffer(out_.primary.bytes());
    if (out_.dbias.count()) dbias_d_ = gpu::DeviceBuffer(out_.dbias.bytes());

    // D^T (col-major) = op(A) op(B); see the file comment. Layouts are (rows, cols, ld) col-major.
    cublasOperation_t opa = CUBLAS_OP_N, opb = CUBLAS_OP_N;
    switch (s_.dir) {
      case Direction::fwd:  // out^T[N,M] = B^T[N,K] . A^T[K,M]
        la_.emplace(t, N, K, N, B), lb_.emplace(t, K, M, K, B), ld_.emplace(t, N, M, N, B);
        pa_ = b_.get(), pb_ = a_.get();
        break;
      case Direction::bwd_data:  // dA^T[K,M] = (B^T)^T . dOut^T:  A = B stored [K,N] -> col-major [N,K], transposed
        opa = CUBLAS_OP_T;
        la_.emplace(t, N, K, N, B), lb_.emplace(t, N, M, N, B), ld_.emplace(t, K, M, K, B);
        pa_ = b_.get(), pb_ = dout_.get();
        break;
      default:  // dB^T[N,K] = dOut^T[N,M] . A[M,K]:  B = A stored [M,K] -> col-major [K,M], transposed
        opb = CUBLAS_OP_T;
        la_.emplace(t, N, M, N, B), lb_.emplace(t, K, M, K, B), ld_.emplace(t, N, K, N, B);
        pa_ = dout_.get(), pb_ = a_.get();
    }

    HOTOPS_CHECK_CUBLAS(cublasLtMatmulDescCreate(&desc_, compute_type(t), CUDA_R_32F));
    HOTOPS_CHECK_CUBLAS(cublasLtMatmulDescSetAttribute(desc_, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof opa));
    HOTOPS_CHECK_CUBLAS(cublasLtMatmulDescSetAttribute(desc_, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof opb));
    alpha_ = static_cast<float>(s_.alpha);

    cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_DEFAULT;
    if (s_.op == Op::addmm && s_.dir == Direction::fwd) {
      epi = CUBLASLT_EPILOGUE_BIAS;
      set_bias_pointer(bias_.get());
    }
    if (out_.dbias.count() && s_.beta == 1.0) {
      epi = CUBLASLT_EPILOGUE_BGRADA;  // sum of dOut over the GEMM's k (= M): exactly dbias
      set_bias_pointer(dbias_d_.get());
    }
    HOTOPS_CHECK_CUBLAS(cublasLtMatmulDescSetAttribute(desc_, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi));
    if (!pick_algorithm() && epi == CUBLASLT_EPILOGUE_BGRADA) {
      // No kernel fuses the bias gradient for this shape/dtype: plain GEMM plus our column sum.
      epi = CUBLASLT_EPILOGUE_DEFAULT;
      HOTOPS_CHECK_CUBLAS(cublasLtMatmulDescSetAttribute(desc_, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi));
      if (!pick_algorithm()) throw Error("cuBLASLt has no algorithm for " + p.name(), ErrorKind::unsupported);
    } else if (!algo_found_) {
      throw Error("cuBLASLt has no algorithm for " + p.name(), ErrorKind::unsupported);
    }
    fused_dbias_ = epi == CUBLASLT_EPILOGUE_BGRADA;
    describe_algorithm(epi);
  }

  ~CudaMatmul() override {
    if (pref_) cublasLtMatmulPreferenceDestroy(pref_);
    if (desc_) cublasLtMatmulDescDestroy(desc_);
  }

  void run() override {
    const float beta0 = 0.f;
    HOTOPS_CHECK_CUBLAS(cublasLtMatmul(gpu::cublaslt(), desc_, &alpha_, pa_, la_->h, pb_, lb_->h, &beta0,
                                       out_d_.get(), ld_->h, out_d_.get(), ld_->h, &algo_, gpu::cublas_workspace(),
                                       gpu::kCublasWorkspaceBytes, gpu::stream()));
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
  void set_bias_pointer(void* ptr) {
    HOTOPS_CHECK_CUBLAS(cublasLtMatmulDescSetAttribute(desc_, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &ptr, sizeof ptr));
  }

  bool pick_algorithm() {
    if (!pref_) {
      HOTOPS_CHECK_CUBLAS(cublasLtMatmulPreferenceCreate(&pref_));
      const std::uint64_t ws = gpu::kCublasWorkspaceBytes;
      HOTOPS_CHECK_CUBLAS(cublasLtMatmulPreferenceSetAttribute(pref_, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws,
                                                               sizeof ws));
    }
    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    const cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(gpu::cublaslt(), desc_, la_->h, lb_->h, ld_->h, ld_->h,
                                                             pref_, 1, &result, &found);
    algo_found_ = st == CUBLAS_STATUS_SUCCESS && found > 0;
    if (algo_found_) algo_ = result.algo;
    else if (st != CUBLAS_STATUS_SUCCESS && st != CUBLAS_STATUS_NOT_SUPPORTED) HOTOPS_CHECK_CUBLAS(st);
    return algo_found_;
  }

  void describe_algorithm(cublasLtEpilogue_t epi) {
    label_ = "cublasLt " + gpu::algo_label(algo_);
    if (epi == CUBLASLT_EPILOGUE_BIAS) label_ += ", bias epilogue";
    if (epi == CUBLASLT_EPILOGUE_BGRADA) label_ += ", bgrad epilogue";
    if (out_.dbias.count() && epi != CUBLASLT_EPILOGUE_BGRADA) label_ += " + hotops column_sum for dbias";
    if (s_.op == Op::addmm && s_.dir == Direction::fwd && s_.beta != 1.0) label_ += " (beta folded into bias)";
    if (s_.batch_count > 1) label_ += ", strided batch " + std::to_string(s_.batch_count);
  }

  Shape s_;
  Inputs in_;
  Outputs out_;
  gpu::DeviceBuffer a_, b_, dout_, bias_, out_d_, dbias_d_;
  std::optional<Layout> la_, lb_, ld_;
  const void* pa_ = nullptr;
  const void* pb_ = nullptr;
  cublasLtMatmulDesc_t desc_ = nullptr;
  cublasLtMatmulPreference_t pref_ = nullptr;
  cublasLtMatmulAlgo_t algo_{};
  bool algo_found_ = false;
  bool fused_dbias_ = false;
  float alpha_ = 1.f;
  std::string label_;
};

}  // namespace

std::unique_ptr<Case> make_cuda(const Problem& p) { return std::make_unique<CudaMatmul>(p); }

}  // namespace hotops::matmul
