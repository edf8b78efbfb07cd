// Column sums on CUDA, the second of two deterministic stages: a first stage (a kernel of its own, or
// one fused into the kernel that writes the summed tensor) leaves per-split partial sums
// partial[split][n], and col_finish adds each column's splits into its destination.
#pragma once
#include <cstdint>

namespace hotops::gpu {

// The destinations of col_finish's columns, in segments of `width`: column c goes to
// out[c / width][c % width] (e.g. LayerNorm's gamma | beta | the next bias); a null one is skipped.
struct ColOut {
  int width;
  float* out[3];
};

// Each column's sum over the splits, launched on ceil(n / 32) blocks of kThreads threads. A block
// takes 32 columns; its kThreads / 32 warps take every (kThreads / 32)th split, and their sums are
// added in warp order (deterministic). Each warp's loads go out 8 at a time (the loop unrolled; its
// adds stay in split order): a sum over a few hundred splits waits on a few loads' latency, not on
// one per split.
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

// The blocks of col_finish for n columns.
inline unsigned col_finish_blocks(std::int64_t n) { return static_cast<unsigned>((n + 31) / 32); }

}  // namespace hotops::gpu
