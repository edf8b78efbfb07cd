// The device code of a model's train step that every model family with a softmax cross-entropy head
// shares (kernels/models, kernels/model_bilstm): the optimizer's step state on the device, the loss
// kernel that advances it, and bf16's cast of the parameters (the flat AdamW pass is adamw::cuda_step). Included by .cu files only; everything here has
// internal linkage, one copy per file that uses it.
#pragma once
#include <cuda_bf16.h>

#include <cstdint>

#include "hotops/cuda_elem.cuh"
#include "kernels/adamw/adamw.h"

namespace hotops::models {
namespace {

constexpr int kMaxClasses = 16;
constexpr unsigned kLossThreads = 512;

// The optimizer's step count, and the scalars of the step just taken (the loss kernel writes them).
using StepState = adamw::DeviceStep;

// Storage <-> f32 for the kernels templated on the logits' type: f32 as is; bf16 widened exactly,
// narrowed rounding to nearest even.
__device__ inline float widen(float v) { return v; }
__device__ inline float widen(__nv_bfloat16 v) { return __bfloat162float(v); }
template <class T> __device__ inline T narrow(float v);
template <> __device__ inline float narrow<float>(float v) { return v; }
template <> __device__ inline __nv_bfloat16 narrow<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }

using gpu::warp_sum;

// One block. Row r of the batch: softmax of the logits, loss_r = log(sum exp) - (z_y - max),
// dlogits_r = (softmax - onehot(y)) / B. Then the mean loss, the last layer's bias gradient (the
// column sums of dlogits), and step = step + 1 with that step's AdamW scalars. T: the logits' and
// dlogits' storage, float or __nv_bfloat16 (mixed precision: the math in f32, dlogits rounded once,
// the bias gradient summed from the rounded dlogits that the weight gradient also uses).
template <class T>
__global__ void __launch_bounds__(kLossThreads) softmax_xent(const T* __restrict__ logits,
                                                             const std::int32_t* __restrict__ labels,
                                                             T* __restrict__ dlogits, float* __restrict__ dbias,
                                                             float* __restrict__ loss, int B, int C, adamw::Hyper h,
                                                             StepState* state) {
  float db[kMaxClasses];
#pragma unroll
  for (int c = 0; c < kMaxClasses; ++c) db[c] = 0.f;
  float lsum = 0.f;
  const float inv_b = 1.f / static_cast<float>(B);
  for (int r = threadIdx.x; r < B; r += blockDim.x) {
    const T* z = logits + static_cast<std::int64_t>(r) * C;
    T* d = dlogits + static_cast<std::int64_t>(r) * C;
    float mx = widen(z[0]);
    for (int c = 1; c < C; ++c) mx = fmaxf(mx, widen(z[c]));
    float sum = 0.f;
    for (int c = 0; c < C; ++c) sum += expf(widen(z[c]) - mx);
    const int y = labels[r];
    const float inv = 1.f / sum;
#pragma unroll
    for (int c = 0; c < kMaxClasses; ++c)
      if (c < C) {
        const T g = narrow<T>(expf(widen(z[c]) - mx) * inv * inv_b - (c == y ? inv_b : 0.f));
        d[c] = g;
        db[c] += widen(g);
      }
    lsum += logf(sum) - (widen(z[y]) - mx);
  }
  __shared__ float part[kLossThreads / 32][kMaxClasses + 1];
  const unsigned warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  lsum = warp_sum(lsum);
#pragma unroll
  for (int c = 0; c < kMaxClasses; ++c) db[c] = warp_sum(db[c]);
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
    if (c == kMaxClasses) {
      *loss = s * inv_b;
      const std::int64_t t = state->step + 1;
      state->step = t;
      state->s = adamw::scalars_for(h, t);
    } else {
      dbias[c] = s;
    }
  }
}

// The step's bf16 copy of the flat f32 parameters (autocast's cast of the weights): n4 vectors of 4.
__global__ void cast_params(const float4* __restrict__ p, __nv_bfloat162* __restrict__ low, std::int64_t n4) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n4;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const float4 v = p[i];
    low[2 * i] = __floats2bfloat162_rn(v.x, v.y);
    low[2 * i + 1] = __floats2bfloat162_rn(v.z, v.w);
  }
}

}  // namespace
}  // namespace hotops::models
