// The device code of a model's train step that every model family with a softmax cross-entropy head
// shares (kernels/models, kernels/model_bilstm, kernels/model_cnn): the optimizer's step state on the
// device, the storage conversions, bf16's cast of the parameters, and softmax_xent, the loss family's
// cross_entropy_dbias block with the step count's advance in the same launch. Included by .cu files
// only; everything here has internal linkage, one copy per file that uses it.
#pragma once
#include <cuda_bf16.h>

#include <cstdint>

#include "hotops/cuda_elem.cuh"
#include "kernels/adamw/adamw.h"
#include "kernels/loss/cross_entropy_dbias.cuh"
#include "kernels/loss/loss.h"

namespace hotops::models {
namespace {

constexpr int kMaxClasses = static_cast<int>(loss::kDbiasMaxClasses);  // the loss plan's CUDA limit
constexpr unsigned kLossThreads = loss::kDbiasThreads;

// The optimizer's step count, and the scalars of the step the next AdamW launch takes (written by
// softmax_xent, or by an AdamW launch that advances it itself).
using StepState = adamw::DeviceStep;

// Storage <-> f32 for the kernels templated on the logits' type: f32 as is; bf16 widened exactly,
// narrowed rounding to nearest even.
__device__ inline float widen(float v) { return v; }
__device__ inline float widen(__nv_bfloat16 v) { return __bfloat162float(v); }
template <class T> __device__ inline T narrow(float v);
template <> __device__ inline float narrow<float>(float v) { return v; }
template <> __device__ inline __nv_bfloat16 narrow<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }

using gpu::warp_sum;

// One block of kLossThreads: the loss family's cross_entropy_dbias (the mean loss, dlogits, the last
// layer's bias gradient), and step = step + 1 with that step's AdamW scalars, for a step whose AdamW
// launch reads them.
template <class T>
__global__ void __launch_bounds__(kLossThreads) softmax_xent(const T* __restrict__ logits,
                                                             const std::int32_t* __restrict__ labels,
                                                             T* __restrict__ dlogits, float* __restrict__ dbias,
                                                             float* __restrict__ loss, int B, int C, adamw::Hyper h,
                                                             StepState* state) {
  loss::cross_entropy_dbias_block(logits, labels, dlogits, dbias, loss, B, C);
  if (threadIdx.x == 0) {
    const std::int64_t t = state->step + 1;
    state->step = t;
    state->s = adamw::scalars_for(h, t);
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
