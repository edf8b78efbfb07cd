// bce_logits on CUDA, deterministic (fixed-order sums, no atomics), on gpu::stream():
//   fwd: 1. up to 256 blocks of 256 threads striding over the elements, each block's sum of the terms
//           max(z, 0) − z·y + log1p(exp(−|z|)) into partial[block] (cuda_mean.cuh's block_sum_to);
//        2. one block: the partials' sum over n, the loss (as mse's);
//   bwd: one grid-stride kernel, dlogits = (sigmoid(z) − y) / n stored in the dtype.
#include <cuda_bf16.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>

#include "hotops/check.h"
#include "hotops/cuda_elem.cuh"
#include "hotops/cuda_util.h"
#include "kernels/loss/bce.h"
#include "kernels/loss/cuda_mean.cuh"

namespace hotops::loss::bce {
namespace {

constexpr unsigned kThreads = kMeanThreads;
constexpr std::int64_t kMaxBlocks = 256;

using bf16 = __nv_bfloat16;

// The blocks a launch over n elements takes: one a 256 elements, at most kMaxBlocks.
int blocks_for(std::int64_t n) { return static_cast<int>(std::min<std::int64_t>((n + kThreads - 1) / kThreads, kMaxBlocks)); }

// fwd stage 1: per-block sums of the terms.
template <class T>
__global__ void __launch_bounds__(kThreads) bce_terms(const T* __restrict__ z, const float* __restrict__ y,
                                                      float* __restrict__ partial, std::int64_t n) {
  float s = 0.f;
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const float v = gpu::to_float(z[i]);
    s += fmaxf(v, 0.f) - v * y[i] + log1pf(expf(-fabsf(v)));
  }
  block_sum_to(s, partial);
}

// bwd: dlogits = (sigmoid(z) − y) / n, the sigmoid as 1 / (1 + e) or e / (1 + e), e = exp(−|z|).
template <class T>
__global__ void __launch_bounds__(kThreads) bce_grad(const T* __restrict__ z, const float* __restrict__ y,
                                                     T* __restrict__ d, std::int64_t n) {
  const float len = static_cast<float>(n);
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const float v = gpu::to_float(z[i]);
    const float e = expf(-fabsf(v));
    const float sig = v >= 0.f ? 1.f / (1.f + e) : e / (1.f + e);
    d[i] = gpu::from_float<T>((sig - y[i]) / len);
  }
}

// T: the storage of z and dlogits, float or bf16.
template <class T>
class CudaBce final : public Plan {
 public:
  explicit CudaBce(const Shape& s) : s_(s), blocks_(blocks_for(s.count())), partial_(kMaxBlocks * sizeof(float)) {}

  void run(const Args& a) override {
    const cudaStream_t st = gpu::stream();
    const T* z = static_cast<const T*>(a.logits);
    if (s_.dir == Direction::bwd) {
      bce_grad<T><<<blocks_, kThreads, 0, st>>>(z, a.target, static_cast<T*>(a.dlogits), s_.count());
      HOTOPS_CHECK_LAUNCH();
      return;
    }
    bce_terms<T><<<blocks_, kThreads, 0, st>>>(z, a.target, partial_.as<float>(), s_.count());
    HOTOPS_CHECK_LAUNCH();
    launch_mean_of_partials(partial_.as<const float>(), blocks_, s_.count(), a.loss, st);
  }

  std::string label() const override {
    const std::string blocks = std::to_string(blocks_) + (blocks_ == 1 ? " block" : " blocks");
    return s_.dir == Direction::fwd ? "hotops kernels: BCE-with-logits loss, " + blocks + "' partial sums, one block's mean"
                                    : "hotops kernel: BCE-with-logits gradient, " + blocks;
  }

 private:
  Shape s_;
  int blocks_;
  gpu::DeviceBuffer partial_;  // fwd: [blocks_]
};

}  // namespace

std::unique_ptr<Plan> make_cuda_plan(const Shape& s) {
  if (s.dtype == DType::bf16) return std::make_unique<CudaBce<bf16>>(s);
  return std::make_unique<CudaBce<float>>(s);
}

}  // namespace hotops::loss::bce
