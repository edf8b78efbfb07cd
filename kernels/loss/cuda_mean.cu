// The loss family's stage-2 mean on CUDA (cuda_mean.cuh): one block adds the blocks' partial sums.
#include "hotops/check.h"
#include "kernels/loss/cuda_mean.cuh"

namespace hotops::loss {
namespace {

// Each thread adds every kMeanThreads-th partial in order, then block_sum: a grid of a thousand
// blocks costs each thread a few loads.
__global__ void __launch_bounds__(kMeanThreads) mean_of_partials(const float* __restrict__ partial, int blocks, std::int64_t n,
                                                                 float* __restrict__ mean) {
  float s = 0.f;
  for (int i = threadIdx.x; i < blocks; i += kMeanThreads) s += partial[i];
  s = block_sum(s);
  if (threadIdx.x == 0) *mean = s / static_cast<float>(n);
}

}  // namespace

void launch_mean_of_partials(const float* partial, int blocks, std::int64_t n, float* mean, cudaStream_t stream) {
  mean_of_partials<<<1, kMeanThreads, 0, stream>>>(partial, blocks, n, mean);
  HOTOPS_CHECK_LAUNCH();
}

}  // namespace hotops::loss
