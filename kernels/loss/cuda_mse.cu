// mse on CUDA, deterministic (fixed-order sums, no atomics), both launches on gpu::stream():
//   1. up to kCudaMaxBlocks (mse.h) blocks of 256 threads (about one wave on an H100) striding over the
//      elements in 16-byte vectors where y, t and dy are 16-byte aligned (else one element per
//      access; the first thread takes the last n mod VEC elements): dy = 2 (y - t) / n stored in the
//      dtype, and each block's sum of (y - t)^2 (f32: a thread's own sum, then warp shuffles, then
//      the block's warps in order) into partial[block];
//   2. one block: the partials' sum over n, the loss.
#include <cuda_bf16.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>

#include "hotops/check.h"
#include "hotops/cuda_elem.cuh"
#include "hotops/cuda_util.h"
#include "kernels/loss/cuda_mean.cuh"
#include "kernels/loss/mse.h"

namespace hotops::loss::mse {
namespace {

constexpr unsigned kThreads = kMeanThreads;

using bf16 = __nv_bfloat16;

// Stage 1: dy = 2 (y - t) / n, per-block sums of (y - t)^2; VEC elements per access.
template <class T, int VEC>
__global__ void __launch_bounds__(kThreads) mse(const T* __restrict__ y, const T* __restrict__ t, T* __restrict__ dy,
                                               float* __restrict__ partial, std::int64_t n) {
  const float k = 2.f / static_cast<float>(n);
  float s = 0.f;
  // dy's element for y = a, t = b; adds (a - b)^2 to the thread's sum.
  const auto term = [&](float a, float b) {
    const float e = a - b;
    s += e * e;
    return k * e;
  };
  const std::int64_t nvec = n / VEC;
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < nvec; i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    float a[VEC], b[VEC], d[VEC];
    gpu::load<T, VEC>(y + i * VEC, a);
    gpu::load<T, VEC>(t + i * VEC, b);
#pragma unroll
    for (int j = 0; j < VEC; ++j) d[j] = term(a[j], b[j]);
    gpu::store<T, VEC>(dy + i * VEC, d);
  }
  if (blockIdx.x == 0 && threadIdx.x == 0)
    for (std::int64_t i = nvec * VEC; i < n; ++i) dy[i] = gpu::from_float<T>(term(gpu::to_float(y[i]), gpu::to_float(t[i])));
  block_sum_to(s, partial);
}

// T: the storage, float or bf16.
template <class T>
class CudaMse final : public Plan {
  static constexpr int kVec = 16 / static_cast<int>(sizeof(T));

 public:
  explicit CudaMse(const Shape& s)
      : s_(s), blocks_(static_cast<int>(std::clamp<std::int64_t>((s.count() / kVec + kThreads - 1) / kThreads, 1, kCudaMaxBlocks))),
        partial_(static_cast<std::size_t>(blocks_) * sizeof(float)) {}

  void run(const Args& a) override {
    const T* y = static_cast<const T*>(a.y);
    const T* t = static_cast<const T*>(a.target);
    T* dy = static_cast<T*>(a.dy);
    if (gpu::all_aligned(16, {y, t, dy}))
      mse<T, kVec><<<blocks_, kThreads, 0, gpu::stream()>>>(y, t, dy, partial_.as<float>(), s_.count());
    else
      mse<T, 1><<<blocks_, kThreads, 0, gpu::stream()>>>(y, t, dy, partial_.as<float>(), s_.count());
    HOTOPS_CHECK_LAUNCH();
    launch_mean_of_partials(partial_.as<const float>(), blocks_, s_.count(), a.loss, gpu::stream());
  }

  std::string label() const override {
    return "hotops kernels: MSE loss and gradient, 16-byte vectors, " + std::to_string(blocks_) +
           " blocks' partial sums, one block's mean";
  }

 private:
  Shape s_;
  int blocks_;
  gpu::DeviceBuffer partial_;  // [blocks_]
};

}  // namespace

std::unique_ptr<Plan> make_cuda_plan(const Shape& s) {
  if (s.dtype == DType::bf16) return std::make_unique<CudaMse<bf16>>(s);
  return std::make_unique<CudaMse<float>>(s);
}

}  // namespace hotops::loss::mse
