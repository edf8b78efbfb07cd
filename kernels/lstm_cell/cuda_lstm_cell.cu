// lstm_cell on CUDA, hand-written around cublasLt, in PyTorch's row-major terms seen column-major
// (a row-major [r, c] matrix is a column-major [c, r] one, no copies):
//   fwd  1. GEMM   pre[B, 4H] (f32) = [x, h][B, K] . W^T          (one GEMM over the concatenations)
//        2. kernel bias add, activations, c' = f c + i g, h' = o tanh(c')   (reads pre, b, c)
//   bwd  1. kernel the activations again from pre, dgates[B, 4H] (storage dtype) and dc
//        2. GEMM   d[x, h][B, K] = dgates . W
//        3. GEMM   dW[4H, K]     = dgates^T . [x, h]
//        4. kernel db[4H] = column sums of dgates
// pre, the GEMM's f32 output without the bias, is the state fwd saves for bwd (a bwd plan makes it
// with the fwd GEMM on its first run on new inputs, or in forward()). The GEMMs' algorithms are the cublasLt heuristic's first choice,
// picked once at setup and named in the label; f32 uses CUBLAS_COMPUTE_32F (no tensor cores),
// tf32 CUBLAS_COMPUTE_32F_FAST_TF32, bf16 CUBLAS_COMPUTE_32F with bf16 operands.
// Pointwise math in f32; each thread does V consecutive columns of one sample (16-byte accesses to
// pre; V = 1 when H is not a multiple of 4).
#include <cuda_bf16.h>

#include <array>
#include <optional>
#include <string>

#include "hotops/cuda_elem.cuh"
#include "hotops/cublaslt_gemm.h"
#include "hotops/cuda_util.h"
#include "kernels/lstm_cell/lstm_cell.h"

namespace hotops::lstm_cell {
namespace {

constexpr int kThreads = 256;

using gpu::from_float;
using gpu::load;
using gpu::Pack;
using gpu::store;
using gpu::to_float;

__device__ __forceinline__ float sigmoid(float x) { return 1.f / (1.f + __expf(-x)); }

// The four activated gates of V columns: pre (f32) + bias.
template <class T, int V>
__device__ __forceinline__ void activations(const float* pre, const T* bias, std::int64_t H, float (&i)[V],
                                            float (&f)[V], float (&g)[V], float (&o)[V]) {
  float p[4][V], b[4][V];
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    load<float, V>(pre + q * H, p[q]);
    load<T, V>(bias + q * H, b[q]);
  }
#pragma unroll
  for (int v = 0; v < V; ++v) {
    i[v] = sigmoid(p[0][v] + b[0][v]);
    f[v] = sigmoid(p[1][v] + b[1][v]);
    g[v] = tanhf(p[2][v] + b[2][v]);
    o[v] = sigmoid(p[3][v] + b[3][v]);
  }
}

// fwd pointwise: one thread per V columns of one sample; B * H / V threads in all.
template <class T, int V>
__global__ void __launch_bounds__(kThreads) lstm_fwd_pointwise(const float* __restrict__ pre, const T* __restrict__ bias,
                                                               const T* __restrict__ c, T* __restrict__ h_out,
                                                               T* __restrict__ c_out, std::int64_t B, std::int64_t H) {
  const std::int64_t per_row = H / V;
  const std::int64_t t = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
  if (t >= B * per_row) return;
  const std::int64_t b = t / per_row, j = (t % per_row) * V;
  float i[V], f[V], g[V], o[V], cv[V], cn[V], hn[V];
  activations<T, V>(pre + b * 4 * H + j, bias + j, H, i, f, g, o);
  load<T, V>(c + b * H + j, cv);
#pragma unroll
  for (int v = 0; v < V; ++v) {
    cn[v] = f[v] * cv[v] + i[v] * g[v];
    hn[v] = o[v] * tanhf(cn[v]);
  }
  store<T, V>(c_out + b * H + j, cn);
  store<T, V>(h_out + b * H + j, hn);
}

// bwd pointwise: dgates (pre-activation gradients, storage dtype: the GEMMs' operand) and dc.
template <class T, int V>
__global__ void __launch_bounds__(kThreads) lstm_bwd_pointwise(const float* __restrict__ pre, const T* __restrict__ bias,
                                                               const T* __restrict__ c, const T* __restrict__ dh,
                                                               const T* __restrict__ dc, T* __restrict__ dgates,
                                                               T* __restrict__ dc_out, std::int64_t B, std::int64_t H) {
  const std::int64_t per_row = H / V;
  const std::int64_t t = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
  if (t >= B * per_row) return;
  const std::int64_t b = t / per_row, j = (t % per_row) * V;
  float i[V], f[V], g[V], o[V], cv[V], dhv[V], dcv[V];
  activations<T, V>(pre + b * 4 * H + j, bias + j, H, i, f, g, o);
  load<T, V>(c + b * H + j, cv);
  load<T, V>(dh + b * H + j, dhv);
  load<T, V>(dc + b * H + j, dcv);
  float d[4][V], dco[V];
#pragma unroll
  for (int v = 0; v < V; ++v) {
    const float tc = tanhf(f[v] * cv[v] + i[v] * g[v]);
    const float dct = dcv[v] + dhv[v] * o[v] * (1.f - tc * tc);
    d[0][v] = dct * g[v] * i[v] * (1.f - i[v]);
    d[1][v] = dct * cv[v] * f[v] * (1.f - f[v]);
    d[2][v] = dct * i[v] * (1.f - g[v] * g[v]);
    d[3][v] = dhv[v] * tc * o[v] * (1.f - o[v]);
    dco[v] = dct * f[v];
  }
  T* out = dgates + b * 4 * H + j;
#pragma unroll
  for (int q = 0; q < 4; ++q) store<T, V>(out + q * H, d[q]);
  store<T, V>(dc_out + b * H + j, dco);
}

// db[n] = sum over the B rows of dgates[:, n], in f32: 32 columns per block (coalesced), the rows
// split over threadIdx.y and combined in shared memory; deterministic.
constexpr int kSumCols = 32, kSumRows = 8;
template <class T>
__global__ void __launch_bounds__(kSumCols * kSumRows) column_sum(const T* __restrict__ dgates, T* __restrict__ db,
                                                                 std::int64_t rows, std::int64_t cols) {
  __shared__ float part[kSumRows][kSumCols];
  const std::int64_t n = blockIdx.x * static_cast<std::int64_t>(kSumCols) + threadIdx.x;
  float acc = 0.f;
  if (n < cols)
    for (std::int64_t r = threadIdx.y; r < rows; r += kSumRows) acc += to_float(dgates[r * cols + n]);
  part[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y != 0 || n >= cols) return;
#pragma unroll
  for (int y = 1; y < kSumRows; ++y) acc += part[y][threadIdx.x];
  db[n] = from_float<T>(acc);
}

cudaDataType_t cuda_type(DType t) { return t == DType::bf16 ? CUDA_R_16BF : CUDA_R_32F; }
cublasComputeType_t compute_type(DType t) {
  return t == DType::tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
}

// One column-major GEMM D[m, n] = op(A) op(B) through gpu::LtGemm, its algorithm chosen once; the
// operands are given to run().
class Gemm {
 public:
  // a_rows x a_cols and b_rows x b_cols are the stored (untransposed) column-major shapes.
  Gemm(DType t, cudaDataType_t d_type, cublasOperation_t opa, std::int64_t a_rows, std::int64_t a_cols,
       cublasOperation_t opb, std::int64_t b_rows, std::int64_t b_cols, std::int64_t m, std::int64_t n,
       const std::string& what)
      : g_(desc(t, d_type, opa, a_rows, a_cols, opb, b_rows, m, n), "lstm_cell " + what),
        label_(what + " cublasLt " + g_.algo_label()) {
    HOTOPS_CHECK((opb == CUBLAS_OP_N ? b_cols : b_rows) == n, "lstm_cell: the " + what + " GEMM's B does not have n columns");
  }

  void run(const void* a, const void* b, void* d) const { g_.run(a, b, d); }
  const std::string& label() const { return label_; }

 private:
  static gpu::GemmDesc desc(DType t, cudaDataType_t d_type, cublasOperation_t opa, std::int64_t a_rows, std::int64_t a_cols,
                            cublasOperation_t opb, std::int64_t b_rows, std::int64_t m, std::int64_t n) {
    gpu::GemmDesc d;
    d.opa = opa, d.opb = opb, d.m = m, d.n = n, d.k = opa == CUBLAS_OP_N ? a_cols : a_rows;
    d.lda = a_rows, d.ldb = b_rows, d.ldd = m;
    d.ab = cuda_type(t), d.cd = d_type, d.compute = compute_type(t);
    return d;
  }
  gpu::LtGemm g_;
  std::string label_;
};

unsigned blocks_for(std::int64_t threads, int per_block) {
  return static_cast<unsigned>((threads + per_block - 1) / per_block);
}

class CudaCell final : public Plan {
 public:
  explicit CudaCell(const Shape& s) : s_(s) {
    const std::int64_t B = s_.B, K = s_.K(), G = s_.G();
    const DType t = s_.dtype;
    // Widest vector that divides H: 16 bytes of pre per gate (f32), 8 or 16 bytes of the rest.
    vec_ = s_.H % 4 == 0 ? 4 : 1;
    pre_ = gpu::DeviceBuffer(static_cast<std::size_t>(B * G) * sizeof(float));
    // pre^T[G, B] = (W as col-major [K, G])^T . (xh as col-major [K, B])
    gates_.emplace(t, CUDA_R_32F, CUBLAS_OP_T, K, G, CUBLAS_OP_N, K, B, G, B, "gates");
    if (s_.dir == Direction::fwd) return;
    dgates_ = gpu::DeviceBuffer(static_cast<std::size_t>(B * G) * dtype_size(t));
    // dxh^T[K, B] = (W as col-major [K, G]) . (dgates as col-major [G, B])
    dxh_gemm_.emplace(t, cuda_type(t), CUBLAS_OP_N, K, G, CUBLAS_OP_N, G, B, K, B, "d[x,h]");
    // dW^T[K, G] = (xh as col-major [K, B]) . (dgates as col-major [G, B])^T
    dW_gemm_.emplace(t, cuda_type(t), CUBLAS_OP_N, K, B, CUBLAS_OP_T, G, B, K, G, "dW");
  }

  // fwd: the step. bwd: the saved state, the fwd GEMM.
  void forward(const Args& a) override {
    if (s_.dir == Direction::fwd) return run(a);
    gates_->run(a.W, a.xh, pre_.get());
    seen_ = {a.xh, a.W};
  }

  void run(const Args& a) override {
    if (s_.dir == Direction::bwd && seen_ != Seen{a.xh, a.W}) forward(a);
    if (s_.dtype == DType::bf16) run_as<__nv_bfloat16>(a);
    else run_as<float>(a);
  }

  std::string label() const override {
    const std::string pw = "hotops pointwise kernel (" + std::to_string(vec_) + " columns per thread)";
    if (s_.dir == Direction::fwd)
      return "hotops: " + gates_->label() + " + " + pw + ", x,h given as one [B, I+H]";
    return "hotops: " + pw + " + " + dxh_gemm_->label() + " + " + dW_gemm_->label() +
           " + hotops column_sum for db, x,h given as one [B, I+H]";
  }

 private:
  // The tensors of the last fwd GEMM: what pre holds.
  using Seen = std::array<const void*, 2>;

  template <class T> void run_as(const Args& a) {
    const std::int64_t B = s_.B, H = s_.H, G = s_.G();
    const unsigned blocks = blocks_for(B * H / vec_, kThreads);
    cudaStream_t st = gpu::stream();
    const auto* pre = pre_.as<const float>();
    const auto* bias = static_cast<const T*>(a.b);
    const auto* c = static_cast<const T*>(a.c);
    if (s_.dir == Direction::fwd) {
      gates_->run(a.W, a.xh, pre_.get());
      auto kernel = vec_ == 4 ? lstm_fwd_pointwise<T, 4> : lstm_fwd_pointwise<T, 1>;
      kernel<<<blocks, kThreads, 0, st>>>(pre, bias, c, static_cast<T*>(a.h_new), static_cast<T*>(a.c_new), B, H);
      HOTOPS_CHECK_LAUNCH();
      return;
    }
    auto kernel = vec_ == 4 ? lstm_bwd_pointwise<T, 4> : lstm_bwd_pointwise<T, 1>;
    kernel<<<blocks, kThreads, 0, st>>>(pre, bias, c, static_cast<const T*>(a.dh_new), static_cast<const T*>(a.dc_new),
                                        dgates_.as<T>(), static_cast<T*>(a.dc), B, H);
    HOTOPS_CHECK_LAUNCH();
    dxh_gemm_->run(a.W, dgates_.get(), a.dxh);
    dW_gemm_->run(a.xh, dgates_.get(), a.dW);
    column_sum<T><<<blocks_for(G, kSumCols), dim3(kSumCols, kSumRows), 0, st>>>(dgates_.as<const T>(),
                                                                               static_cast<T*>(a.db), B, G);
    HOTOPS_CHECK_LAUNCH();
  }

  Shape s_;
  int vec_ = 1;
  gpu::DeviceBuffer pre_, dgates_;
  std::optional<Gemm> gates_, dxh_gemm_, dW_gemm_;
  Seen seen_{};
};

}  // namespace

std::unique_ptr<Plan> make_cuda_plan(const Shape& s) { return std::make_unique<CudaCell>(s); }

}  // namespace hotops::lstm_cell
