// The device code of a model's train step that every model family with a softmax cross-entropy head
// shares (kernels/models, kernels/model_bilstm, kernels/model_cnn): the optimizer's step state on the
// device, the storage conversions and bf16's cast of the parameters. Included by .cu files only;
// everything here has internal linkage, one copy per file that uses it.
#pragma once
#include <cuda_bf16.h>

#include <cstdint>

#include "hotops/cuda_elem.cuh"
#include "kernels/adamw/adamw.h"
#include "kernels/loss/loss.h"

namespace hotops::models {
namespace {

constexpr int kMaxClasses = static_cast<int>(loss::kDbiasMaxClasses);  // the loss plan's CUDA limit

// The optimizer's step count, and the scalars of the step the next AdamW launch takes (written by the
// loss plan, cross_entropy_dbias, that the step runs before it).
using StepState = adamw::DeviceStep;

// Storage <-> f32 for the kernels templated on the logits' type: f32 as is; bf16 widened exactly,
// narrowed rounding to nearest even.
__device__ inline float widen(float v) { return v; }
__device__ inline float widen(__nv_bfloat16 v) { return __bfloat162float(v); }
template <class T> __device__ inline T narrow(float v);
template <> __device__ inline float narrow<float>(float v) { return v; }
template <> __device__ inline __nv_bfloat16 narrow<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }

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
