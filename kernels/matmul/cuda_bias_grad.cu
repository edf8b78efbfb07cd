// bias_grad on CUDA, in two deterministic stages: col_partial sums each column over a chain of rows
// (a thread per 4 columns, 8-byte bf16 or 16-byte f32 loads, where the columns are a multiple of 4
// and the tensor aligned to the vector; else a thread per column; a block row of threads per chain) into
// the plan's partials [chains, cols], then col_finish (hotops/cuda_colsum.cuh) adds each column's
// chains into db. The chains take 8 to 64 rows, as many as make the grid about one wave of the
// blocks the GPU holds at once (fewer rows a chain would only write more partial sums).
#include <cuda_bf16.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>

#include "hotops/check.h"
#include "hotops/cuda_colsum.cuh"
#include "hotops/cuda_elem.cuh"
#include "hotops/cuda_util.h"
#include "kernels/matmul/bias_grad.h"

namespace hotops::matmul::bias_grad {
namespace {

constexpr unsigned kThreads = 256;
constexpr std::int64_t kMinChain = 8, kMaxChain = 64;  // rows per partial sum
constexpr std::int64_t kMaxGridY = 65535;

__device__ inline float sum_of(float v) { return v; }
__device__ inline float sum_of(__nv_bfloat16 v) { return gpu::to_float(v); }
__device__ inline float4 sum_of(float4 v) { return v; }
__device__ inline float4 sum_of(gpu::Bf16x4 v) { return gpu::f32_of(v); }
__device__ inline void add(float& s, float v) { s += v; }
__device__ inline void add(float4& s, float4 v) { s.x += v.x, s.y += v.y, s.z += v.z, s.w += v.w; }

// partial[chain][c] = the sum of x's rows [chain * per, ...) in column c, x [rows, n]; V: one
// element, or a vector of 4 (Quad) with S its float4 sum.
template <class V, class S>
__global__ void __launch_bounds__(kThreads) col_partial(const V* __restrict__ x, S* __restrict__ partial, std::int64_t rows,
                                                        std::int64_t per, int n) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= n) return;
  const std::int64_t r0 = static_cast<std::int64_t>(blockIdx.y) * per, r1 = min(rows, r0 + per);
  S s{};
#pragma unroll 4
  for (std::int64_t r = r0; r < r1; ++r) add(s, sum_of(x[r * n + c]));
  partial[static_cast<std::int64_t>(blockIdx.y) * n + c] = s;
}

template <class T>
class CudaBiasGrad final : public Plan {
  using Q = typename gpu::Quad<T>::type;

 public:
  explicit CudaBiasGrad(const Shape& s) : s_(s) {
    HOTOPS_CHECK(s.rows > 0 && s.cols > 0, "bias_grad: rows and cols must be positive");
    HOTOPS_CHECK(s.cols <= 2147483647 && s.rows <= kCudaMaxRows, "bias_grad: CUDA takes up to 2^31 - 1 columns and 65535 x 64 rows");
    // The vector kernel's grid; a row of scalar threads has 4 times its blocks.
    const std::int64_t col_blocks = ((s.cols + 3) / 4 + kThreads - 1) / kThreads;
    const std::int64_t wave = gpu::resident_blocks(col_partial<Q, float4>, kThreads, std::int64_t{1} << 30);
    const std::int64_t chains = std::max<std::int64_t>(1, wave / col_blocks);  // in one wave
    per_ = std::clamp<std::int64_t>((s.rows + chains - 1) / chains, kMinChain, kMaxChain);
    per_ = std::max(per_, (s.rows + kMaxGridY - 1) / kMaxGridY);
    chains_ = (s.rows + per_ - 1) / per_;
    partial_ = gpu::DeviceBuffer(static_cast<std::size_t>(chains_ * s.cols) * sizeof(float));
  }

  void run(const Args& a) override {
    const int n = static_cast<int>(s_.cols);
    if (s_.cols % 4 == 0 && gpu::all_aligned(sizeof(Q), {a.dy})) {
      const dim3 grid(static_cast<unsigned>((s_.cols / 4 + kThreads - 1) / kThreads), static_cast<unsigned>(chains_));
      col_partial<Q, float4><<<grid, kThreads, 0, gpu::stream()>>>(static_cast<const Q*>(a.dy), partial_.as<float4>(), s_.rows,
                                                                   per_, n / 4);
    } else {
      const dim3 grid(static_cast<unsigned>((s_.cols + kThreads - 1) / kThreads), static_cast<unsigned>(chains_));
      col_partial<T, float><<<grid, kThreads, 0, gpu::stream()>>>(static_cast<const T*>(a.dy), partial_.as<float>(), s_.rows,
                                                                  per_, n);
    }
    HOTOPS_CHECK_LAUNCH();
    const gpu::ColOut o{n, {a.db, nullptr, nullptr}};
    gpu::col_finish<kThreads><<<gpu::col_finish_blocks(s_.cols), kThreads, 0, gpu::stream()>>>(
        partial_.as<float>(), static_cast<int>(chains_), n, o);
    HOTOPS_CHECK_LAUNCH();
  }

  std::string label() const override {
    return "hotops kernels: column sums over " + std::to_string(chains_) + " chains of " + std::to_string(per_) +
           " rows, a thread per 4 columns (or per column where the columns are not a multiple of 4 or the tensor not "
           "vector-aligned); col_finish";
  }

 private:
  Shape s_;
  std::int64_t per_ = kMaxChain, chains_ = 1;
  gpu::DeviceBuffer partial_;  // [chains, cols]
};

}  // namespace

std::unique_ptr<Plan> make_cuda_plan(const Shape& s) {
  if (s.dtype == DType::bf16) return std::make_unique<CudaBiasGrad<__nv_bfloat16>>(s);
  HOTOPS_CHECK(s.dtype == DType::f32, "bias_grad has f32 and bf16 only");
  return std::make_unique<CudaBiasGrad<float>>(s);
}

}  // namespace hotops::matmul::bias_grad
