// mse on CUDA, deterministic (fixed-order sums, no atomics), both launches on gpu::stream():
//   1. 256 blocks of 256 threads striding over the elements: dy = 2 (y - t) / n stored in the dtype,
//      and each block's sum of (y - t)^2 (f32: a thread's own sum, then warp shuffles, then the
//      block's warps in order) into partial[block];
//   2. one warp: the partials' sum over n, the loss.
#include <cuda_bf16.h>

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
constexpr int kBlocks = 256;

using bf16 = __nv_bfloat16;

// Stage 1: dy = 2 (y - t) / n, per-block sums of (y - t)^2.
template <class T>
__global__ void __launch_bounds__(kThreads) mse(const T* __restrict__ y, const T* __restrict__ t, T* __restrict__ dy,
                                               float* __restrict__ partial, std::int64_t n) {
  const float k = 2.f / static_cast<float>(n);
  float s = 0.f;
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n; i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const float e = gpu::to_float(y[i]) - gpu::to_float(t[i]);
    dy[i] = gpu::from_float<T>(k * e);
    s += e * e;
  }
  block_sum_to(s, partial);
}

// T: the storage, float or bf16.
template <class T>
class CudaMse final : public Plan {
 public:
  explicit CudaMse(const Shape& s) : s_(s), partial_(kBlocks * sizeof(float)) {}

  void run(const Args& a) override {
    mse<T><<<kBlocks, kThreads, 0, gpu::stream()>>>(static_cast<const T*>(a.y), static_cast<const T*>(a.target), static_cast<T*>(a.dy),
                                                    partial_.as<float>(), s_.count());
    HOTOPS_CHECK_LAUNCH();
    launch_mean_of_partials(partial_.as<const float>(), kBlocks, s_.count(), a.loss, gpu::stream());
  }

  std::string label() const override { return "hotops kernels: MSE loss and gradient, 256 blocks' partial sums, one warp's mean"; }

 private:
  Shape s_;
  gpu::DeviceBuffer partial_;  // [kBlocks]
};

}  // namespace

std::unique_ptr<Plan> make_cuda_plan(const Shape& s) {
  if (s.dtype == DType::bf16) return std::make_unique<CudaMse<bf16>>(s);
  return std::make_unique<CudaMse<float>>(s);
}

}  // namespace hotops::loss::mse
