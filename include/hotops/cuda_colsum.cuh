// Column sums on CUDA, the second of two deterministic stages: a first stage (a kernel of its own, or
// one fused into the kernel that writes the summed tensor) leaves per-split partial sums
// partial[split][n], and col_finish adds each column's splits into its destination.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "hotops/check.h"

namespace hotops::gpu {

// The destinations of col_finish's columns, in segments of `width`: column c goes to
// out[c / width][c % width] (e.g. LayerNorm's gamma | beta | the next bias); a null one is skipped.
struct ColOut {
  int width;
  float* out[3];
};

// Each column's sum over the splits, on ceil(n / 32) blocks of kThreads threads (finish_columns). A
// block takes 32 columns; its kThreads / 32 warps take every (kThreads / 32)th split, and their sums
// are added in warp order (deterministic). Each warp's loads go out 8 at a time (the loop unrolled;
// its adds stay in split order): a sum over a few hundred splits waits on one or two loads' latency,
// not on one per split.
template <unsigned kThreads>
__global__ void __launch_bounds__(kThreads) col_finish(const float* __restrict__ partial, int splits, int n, ColOut o) {
  constexpr int kGroups = kThreads / 32;
  __shared__ float acc[kGroups][32];
  const int lane = threadIdx.x % 32, group = threadIdx.x / 32, c = blockIdx.x * 32 + lane;
  float s = 0.f;
  if (c < n)
#pragma unroll 8
    for (int k = group; k < splits; k += kGroups) s += partial[static_cast<std::int64_t>(k) * n + c];
  acc[group][lane] = s;
  __syncthreads();
  if (group != 0 || c >= n) return;
  for (int g = 1; g < kGroups; ++g) s += acc[g][lane];
  if (float* dst = o.out[c / o.width]) dst[c % o.width] = s;
}

// col_finish over n columns of partial[splits][n], queued on `stream`: 8 warps a block, 16 from 65
// splits, 32 from 129, so that each warp has about 8 loads to make. The grid is a block per 32
// columns (72 for BERT's 2304), too few for 8 warps an SM to keep enough loads in flight over
// hundreds of splits (a ConvNeXt stage's 1568: 47.4 -> 39.4 us for scale_residual's backward on an
// H200 with 32 warps), while a 32-warp block over a few dozen splits costs more than it hides
// (bias_grad at BERT's 64: 6.0 -> 6.6 us).
inline void finish_columns(const float* partial, int splits, int n, const ColOut& o, cudaStream_t stream) {
  const auto blocks = static_cast<unsigned>((static_cast<std::int64_t>(n) + 31) / 32);
  if (splits > 128)
    col_finish<1024><<<blocks, 1024, 0, stream>>>(partial, splits, n, o);
  else if (splits > 64)
    col_finish<512><<<blocks, 512, 0, stream>>>(partial, splits, n, o);
  else
    col_finish<256><<<blocks, 256, 0, stream>>>(partial, splits, n, o);
  HOTOPS_CHECK_LAUNCH();
}

}  // namespace hotops::gpu
