// The loss family's stage-2 mean on CUDA (cuda_mean.cuh): one warp adds the blocks' partial sums.
#include "hotops/check.h"
#include "kernels/loss/cuda_mean.cuh"

namespace hotops::loss {
namespace {

__global__ void mean_of_partials(const float* __restrict__ partial, int blocks, std::int64_t n, float* __restrict__ mean) {
  float s = 0.f;
  for (int i = threadIdx.x; i < blocks; i += 32) s += partial[i];
  s = gpu::warp_sum(s);
  if (threadIdx.x == 0) *mean = s / static_cast<float>(n);
}

}  // namespace

void launch_mean_of_partials(const float* partial, int blocks, std::int64_t n, float* mean, cudaStream_t stream) {
  mean_of_partials<<<1, 32, 0, stream>>>(partial, blocks, n, mean);
  HOTOPS_CHECK_LAUNCH();
}

}  // namespace hotops::loss
