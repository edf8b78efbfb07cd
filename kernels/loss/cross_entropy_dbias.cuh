// cross_entropy_dbias's block on CUDA, the code of the loss family's kernel (and of any kernel that
// fuses more around it): one block of kDbiasThreads threads for a small head (at most
// kDbiasMaxClasses classes), thread r taking rows r, r + kDbiasThreads, ...: the row's softmax, its
// loss term and its dlogits (f32 math, stored in the dtype once); then the mean loss and db, the
// column sums of the stored dlogits, through warp sums and the warps' partials in shared memory, in
// a fixed order. Included by .cu files only.
#pragma once
#include <cuda_bf16.h>

#include <cstdint>

#include "hotops/cuda_elem.cuh"
#include "kernels/loss/loss.h"

namespace hotops::loss {

constexpr unsigned kDbiasThreads = 512;  // the block the code below runs in

// Row r: softmax of the logits, loss_r = log(sum exp) - (z_y - max), dlogits_r = (softmax -
// onehot(y)) / B. Then the mean loss and db = the column sums of dlogits. T: the logits' and dlogits'
// storage, float or __nv_bfloat16 (the math in f32, dlogits rounded once, db summed from the rounded
// dlogits that a weight gradient also reads).
template <class T>
__device__ __forceinline__ void cross_entropy_dbias_block(const T* __restrict__ logits,
                                                          const std::int32_t* __restrict__ labels,
                                                          T* __restrict__ dlogits, float* __restrict__ dbias,
                                                          float* __restrict__ loss, int B, int C) {
  constexpr int kMaxClasses = static_cast<int>(kDbiasMaxClasses);
  float db[kMaxClasses];
#pragma unroll
  for (int c = 0; c < kMaxClasses; ++c) db[c] = 0.f;
  float lsum = 0.f;
  const float inv_b = 1.f / static_cast<float>(B);
  for (int r = threadIdx.x; r < B; r += blockDim.x) {
    const T* z = logits + static_cast<std::int64_t>(r) * C;
    T* d = dlogits + static_cast<std::int64_t>(r) * C;
    float mx = gpu::to_float(z[0]);
    for (int c = 1; c < C; ++c) mx = fmaxf(mx, gpu::to_float(z[c]));
    float sum = 0.f;
    for (int c = 0; c < C; ++c) sum += expf(gpu::to_float(z[c]) - mx);
    const int y = labels[r];
    const float inv = 1.f / sum;
#pragma unroll
    for (int c = 0; c < kMaxClasses; ++c)
      if (c < C) {
        const T g = gpu::from_float<T>(expf(gpu::to_float(z[c]) - mx) * inv * inv_b - (c == y ? inv_b : 0.f));
        d[c] = g;
        db[c] += gpu::to_float(g);
      }
    lsum += logf(sum) - (gpu::to_float(z[y]) - mx);
  }
  __shared__ float part[kDbiasThreads / 32][kMaxClasses + 1];
  const unsigned warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  lsum = gpu::warp_sum(lsum);
#pragma unroll
  for (int c = 0; c < kMaxClasses; ++c) db[c] = gpu::warp_sum(db[c]);
  if (lane == 0) {
    part[warp][kMaxClasses] = lsum;
#pragma unroll
    for (int c = 0; c < kMaxClasses; ++c) part[warp][c] = db[c];
  }
  __syncthreads();
  if (threadIdx.x <= static_cast<unsigned>(C)) {  // thread c < C: column c; thread C: the loss
    const int c = threadIdx.x == static_cast<unsigned>(C) ? kMaxClasses : static_cast<int>(threadIdx.x);
    float s = 0.f;
    for (unsigned w = 0; w < blockDim.x / 32; ++w) s += part[w][c];
    if (c == kMaxClasses) *loss = s * inv_b;
    else dbias[c] = s;
  }
}

}  // namespace hotops::loss
