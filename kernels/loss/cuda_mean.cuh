// The deterministic two-stage mean that the loss family's elementwise losses (mse, bce_logits) end
// with on CUDA: each block's sum of its threads' partial sums in a fixed order, then one block's sum
// of the blocks' partials over n.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "hotops/cuda_elem.cuh"

namespace hotops::loss {

constexpr unsigned kMeanThreads = 256;  // the block size of a stage-1 kernel that calls block_sum_to

// The sum of `s` over a block of kMeanThreads threads, called by all of them with their own: warp
// shuffles, then the block's warps in order. Thread 0 gets the sum (the others, their warp's part).
__device__ inline float block_sum(float s) {
  __shared__ float warps[kMeanThreads / 32];
  s = gpu::warp_sum(s);
  if (threadIdx.x % 32 == 0) warps[threadIdx.x / 32] = s;
  __syncthreads();
  if (threadIdx.x != 0) return s;
  float b = 0.f;
  for (unsigned i = 0; i < kMeanThreads / 32; ++i) b += warps[i];
  return b;
}

// Stage 1, called by every thread of a block of kMeanThreads with its own sum `s`: the block's sum
// into partial[blockIdx.x].
__device__ inline void block_sum_to(float s, float* __restrict__ partial) {
  const float b = block_sum(s);
  if (threadIdx.x == 0) partial[blockIdx.x] = b;
}

// Stage 2: *mean = (the sum of partial[0, blocks)) / n, one block of kMeanThreads on `stream`
// (cuda_mean.cu).
void launch_mean_of_partials(const float* partial, int blocks, std::int64_t n, float* mean, cudaStream_t stream);

}  // namespace hotops::loss
