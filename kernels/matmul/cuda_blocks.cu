// matmul with A in blocks (Shape::a_blocks) on CUDA: hotops' kernels for a small dense head (N at
// most kBlocksMaxN), one launch per direction, f32 sums, each output rounded once to its dtype (a
// bf16 head as cublasLt GEMMs would take one GEMM per block adding into D: two roundings, and the
// blocks of a tiny shape are not 16-byte aligned as its bf16 kernels assume):
//   fwd        a warp per row m: lanes over k, N f32 sums, warp sums; out = alpha acc + beta bias
//   bwd_data   a thread per element of dA (in A's blocks): N products
//   bwd_weight a warp per element of dB (and, for addmm, of dbias): lanes over m, a warp sum
// The warp sums add in a fixed order: the results are the same every run.
#include <cuda_bf16.h>

#include <cstdint>
#include <string>

#include "hotops/cuda_elem.cuh"
#include "hotops/cuda_util.h"
#include "kernels/matmul/matmul.h"

namespace hotops::matmul {
namespace {

constexpr unsigned kThreads = 256, kWarps = kThreads / 32;
constexpr int kMaxN = static_cast<int>(kBlocksMaxN);

using gpu::from_float;
using gpu::to_float;
using gpu::warp_sum;

// Where A(m, k) lies in its blocks of kb columns.
__device__ inline std::int64_t at(std::int64_t m, std::int64_t k, std::int64_t M, std::int64_t kb) {
  return (k / kb * M + m) * kb + k % kb;
}

template <class T, class TO>
__global__ void __launch_bounds__(kThreads) blocks_fwd(const T* __restrict__ A, const T* __restrict__ B,
                                                       const T* __restrict__ bias, TO* __restrict__ out, int M, int N,
                                                       int K, int kb, float alpha, float beta) {
  const int m = blockIdx.x * kWarps + threadIdx.x / 32, lane = threadIdx.x % 32;
  if (m >= M) return;
  float acc[kMaxN];
#pragma unroll
  for (int n = 0; n < kMaxN; ++n) acc[n] = 0.f;
  for (int k = lane; k < K; k += 32) {
    const float x = to_float(A[at(m, k, M, kb)]);
#pragma unroll
    for (int n = 0; n < kMaxN; ++n)
      if (n < N) acc[n] += x * to_float(B[static_cast<std::int64_t>(k) * N + n]);
  }
#pragma unroll
  for (int n = 0; n < kMaxN; ++n) acc[n] = warp_sum(acc[n]);
  if (lane == 0)
    for (int n = 0; n < N; ++n)
      out[static_cast<std::int64_t>(m) * N + n] = from_float<TO>(alpha * acc[n] + (bias ? beta * to_float(bias[n]) : 0.f));
}

template <class T, class TO>
__global__ void __launch_bounds__(kThreads) blocks_bwd_data(const T* __restrict__ dout, const T* __restrict__ B,
                                                            TO* __restrict__ dA, int M, int N, int K, int kb, float alpha) {
  const std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (i >= static_cast<std::int64_t>(M) * K) return;
  const std::int64_t m = i / kb % M, k = i / (static_cast<std::int64_t>(M) * kb) * kb + i % kb;  // i = at(m, k)
  float acc = 0.f;
  for (int n = 0; n < N; ++n) acc += to_float(dout[m * N + n]) * to_float(B[k * N + n]);
  dA[i] = from_float<TO>(alpha * acc);
}

// Warp j < K * N: dB[k, n]; beyond, with dbias: dbias[j - K * N].
template <class T, class TO>
__global__ void __launch_bounds__(kThreads) blocks_bwd_weight(const T* __restrict__ A, const T* __restrict__ dout,
                                                              TO* __restrict__ dB, T* __restrict__ dbias, int M, int N,
                                                              int K, int kb, float alpha, float beta) {
  const std::int64_t j = static_cast<std::int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const std::int64_t outputs = static_cast<std::int64_t>(K) * N;
  if (j >= outputs + (dbias ? N : 0)) return;
  float acc = 0.f;
  if (j < outputs) {
    const std::int64_t k = j / N, n = j % N;
    for (int m = lane; m < M; m += 32) acc += to_float(A[at(m, k, M, kb)]) * to_float(dout[static_cast<std::int64_t>(m) * N + n]);
  } else {
    const std::int64_t n = j - outputs;
    for (int m = lane; m < M; m += 32) acc += to_float(dout[static_cast<std::int64_t>(m) * N + n]);
  }
  acc = warp_sum(acc);
  if (lane != 0) return;
  if (j < outputs) dB[j] = from_float<TO>(alpha * acc);
  else dbias[j - outputs] = from_float<T>(beta * acc);
}

unsigned blocks_for(std::int64_t units, unsigned per_block) {
  return static_cast<unsigned>((units + per_block - 1) / per_block);
}

class CudaBlocks final : public Plan {
 public:
  explicit CudaBlocks(const Shape& s) : s_(s) {
    product(s);  // checks the shape
    HOTOPS_CHECK(s_.M * s_.K < (std::int64_t{1} << 31), "matmul: an A in blocks holds fewer than 2^31 elements");
  }

  void run(const Args& a) override {
    const bool bf16 = s_.dtype == DType::bf16;
    if (bf16 && !s_.f32_out) return run_as<__nv_bfloat16, __nv_bfloat16>(a);
    if (bf16) return run_as<__nv_bfloat16, float>(a);
    run_as<float, float>(a);
  }

  std::string label() const override {
    static const char* what[] = {"a warp per row", "a thread per dA element", "a warp per dB element"};
    const int d = s_.dir == Direction::fwd ? 0 : s_.dir == Direction::bwd_data ? 1 : 2;
    return "hotops CUDA " + std::to_string(s_.a_blocks) + "-block small dense kernel, " + what[d] +
           " (f32 sums, one rounding" + (s_.f32_out ? ", f32 output" : "") + ")";
  }

 private:
  template <class T, class TO>
  void run_as(const Args& a) {
    const cudaStream_t st = gpu::stream();
    const int M = static_cast<int>(s_.M), N = static_cast<int>(s_.N), K = static_cast<int>(s_.K);
    const int kb = K / static_cast<int>(s_.a_blocks);
    const auto alpha = static_cast<float>(s_.alpha), beta = static_cast<float>(s_.beta);
    switch (s_.dir) {
      case Direction::fwd:
        blocks_fwd<T, TO><<<blocks_for(M, kWarps), kThreads, 0, st>>>(
            static_cast<const T*>(a.a), static_cast<const T*>(a.b), s_.op == Op::addmm ? static_cast<const T*>(a.bias) : nullptr,
            static_cast<TO*>(a.out), M, N, K, kb, alpha, beta);
        break;
      case Direction::bwd_data:
        blocks_bwd_data<T, TO><<<blocks_for(static_cast<std::int64_t>(M) * K, kThreads), kThreads, 0, st>>>(
            static_cast<const T*>(a.dout), static_cast<const T*>(a.b), static_cast<TO*>(a.out), M, N, K, kb, alpha);
        break;
      default: {
        T* dbias = s_.op == Op::addmm ? static_cast<T*>(a.dbias) : nullptr;
        const std::int64_t warps = static_cast<std::int64_t>(K) * N + (dbias ? N : 0);
        blocks_bwd_weight<T, TO><<<blocks_for(warps, kWarps), kThreads, 0, st>>>(
            static_cast<const T*>(a.a), static_cast<const T*>(a.dout), static_cast<TO*>(a.out), dbias, M, N, K, kb, alpha, beta);
      }
    }
    HOTOPS_CHECK_LAUNCH();
  }

  Shape s_;
};

}  // namespace

std::unique_ptr<Plan> make_cuda_blocks_plan(const Shape& s) { return std::make_unique<CudaBlocks>(s); }

}  // namespace hotops::matmul
