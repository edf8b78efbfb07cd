// The batchnorm family's fused convnet kernels on CUDA (cuda_relu_maxpool.cu, cuda_fused_nchw.cu):
// the device helpers they share (NHWC rows of C channels, 4 a thread; per-block channel sums), and
// the launchers of their stages: the per-channel ones (batch statistics, the affine, the backward's
// coefficients), the NCHW kernels, and the activation a model recomputes to check its step.
#pragma once
#include <cuda_bf16.h>

#include <algorithm>
#include <cstdint>

#include "kernels/pointwise/pointwise.h"

namespace hotops::batchnorm::cuda_fused {

constexpr unsigned kThreads = 256;
constexpr int kMaxReduceBlocks = 1024;  // 8 a SM on an H100: the stats passes read the largest tensors
constexpr int kMaxChannels = 1024;      // channels (or hidden units) of a batch norm: C / 4 divides kThreads

using bf16 = __nv_bfloat16;

__device__ inline float4 operator+(float4 a, float4 b) { return make_float4(a.x + b.x, a.y + b.y, a.z + b.z, a.w + b.w); }
__device__ inline float lane(const float4& v, int j) { return j == 0 ? v.x : j == 1 ? v.y : j == 2 ? v.z : v.w; }
__device__ inline float& lane(float4& v, int j) { return j == 0 ? v.x : j == 1 ? v.y : j == 2 ? v.z : v.w; }

// Storage -> f32: f32 as is, bf16 widened exactly; and back, bf16 rounded to nearest even.
__device__ inline float as_float(float v) { return v; }
__device__ inline float as_float(bf16 v) { return __bfloat162float(v); }
template <class T> __device__ inline T from_float(float v);
template <> __device__ inline float from_float<float>(float v) { return v; }
template <> __device__ inline bf16 from_float<bf16>(float v) { return __float2bfloat16_rn(v); }

// Vector i of 4 consecutive activations of storage T (float, or bf16 widened exactly), and back
// (bf16 rounded to nearest even). The NHWC kernels read and write through these.
__device__ inline float4 load4(const float* p, std::int64_t i) { return reinterpret_cast<const float4*>(p)[i]; }
__device__ inline float4 load4(const bf16* p, std::int64_t i) {
  const uint2 u = reinterpret_cast<const uint2*>(p)[i];
  const float2 a = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&u.x));
  const float2 b = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&u.y));
  return make_float4(a.x, a.y, b.x, b.y);
}
__device__ inline void store4(float* p, std::int64_t i, float4 v) { reinterpret_cast<float4*>(p)[i] = v; }
__device__ inline void store4(bf16* p, std::int64_t i, float4 v) {
  const __nv_bfloat162 a = __floats2bfloat162_rn(v.x, v.y), b = __floats2bfloat162_rn(v.z, v.w);
  uint2 u;
  u.x = *reinterpret_cast<const unsigned*>(&a);
  u.y = *reinterpret_cast<const unsigned*>(&b);
  reinterpret_cast<uint2*>(p)[i] = u;
}

// The samples the masks are drawn for: sample b of the kernel's batch draws that of sample
// (first + b) % period.
struct MaskPeriod {
  int period;
  std::int64_t first;
};
__device__ inline std::uint32_t mask_sample(MaskPeriod mp, std::int64_t b) { return static_cast<std::uint32_t>((mp.first + b) % mp.period); }
__device__ inline bool keep(const pointwise::DropoutKey& k, std::int64_t e, std::uint32_t sample) {
  return pointwise::dropout_keep(k, static_cast<std::uint32_t>(e), sample);
}
__device__ inline bool keep(const pointwise::DropoutKey& k, std::int64_t e, std::int64_t b, MaskPeriod mp) { return keep(k, e, mask_sample(mp, b)); }

// A dropout after a pool or a dense layer: element e of sample b kept when keep(key, e, b, mask_period()).
struct Drop {
  pointwise::DropoutKey key;
  const int* period;  // device: the mask period (the batch, or a verification's period)
  bool on;
  std::int64_t first = 0;  // Args::first_sample
  __device__ MaskPeriod mask_period() const { return {on ? *period : 1, first}; }
};

// A conv layer's output z [n, P, Q, C] and its k x k pool (stride k) to [n, PH, PW, C].
struct PoolGeom {
  int P, Q, C, PH, PW, k;
};

// The per-block reduction of the row x channel kernels: s1, s2 of this thread's 4 channels (lane c4,
// row slot r0) summed over the block's row slots in order into partial[block][2C] (deterministic).
__device__ inline void block_sums(float4 s1, float4 s2, int C, int c4, int r0, int rpi, float* __restrict__ partial) {
  __shared__ float sm[2][kThreads * 4];
  if (r0 < rpi) {
#pragma unroll
    for (int j = 0; j < 4; ++j) sm[0][r0 * C + 4 * c4 + j] = lane(s1, j), sm[1][r0 * C + 4 * c4 + j] = lane(s2, j);
  }
  __syncthreads();
  for (int c = threadIdx.x; c < C; c += blockDim.x) {
    float a = 0.f, b = 0.f;
    for (int r = 0; r < rpi; ++r) a += sm[0][r * C + c], b += sm[1][r * C + c];
    partial[static_cast<std::int64_t>(blockIdx.x) * 2 * C + c] = a;
    partial[static_cast<std::int64_t>(blockIdx.x) * 2 * C + C + c] = b;
  }
}

// Row r of `per` rows a sample: its sample n and row h (in int where r fits one).
__device__ inline void split_row(std::int64_t r, int per, std::int64_t* n, int* h) {
  if (r <= 0x7fffffff) {
    const int q = static_cast<int>(r) / per;
    *n = q, *h = static_cast<int>(r) - q * per;
  } else {
    *n = r / per, *h = static_cast<int>(r - *n * per);
  }
}

inline unsigned grid_for(std::int64_t n, std::int64_t cap = 8192) {
  return static_cast<unsigned>(std::max<std::int64_t>(1, std::min<std::int64_t>((n + kThreads - 1) / kThreads, cap)));
}
// The blocks of a row x channel reduction over `rows` rows of C channels.
inline int reduce_blocks(std::int64_t rows, int C) {
  const std::int64_t rpi = kThreads / (C / 4);
  return static_cast<int>(std::max<std::int64_t>(1, std::min<std::int64_t>((rows + rpi - 1) / rpi, kMaxReduceBlocks)));
}

// The per-channel stages, queued on gpu::stream(). T: z's storage (float or bf16).
// Sums of z - K and (z - K)^2 over rows [rows, C] into partial[blocks][2C], K = z's first row.
template <class T>
void launch_bn_stats(const T* z, std::int64_t rows, int C, int blocks, float* partial);
// From partial's sums over M values a channel: scale, shift (y = z scale + shift), mean, rstd, and the
// running statistics (of z + bias, the variance unbiased) updated; K[c * k_stride]: the sums' shift.
template <class T>
void launch_bn_finalize(const float* partial, int blocks, int C, double M, const T* K, std::int64_t k_stride, const float* gamma,
                        const float* beta, const float* bias, float* run_mean, float* run_var, float* scale, float* shift, float* mean,
                        float* rstd, double eps, double momentum);
// a = relu(z * scale + shift) over n4 vectors of rows of C (C4 = C / 4 vectors); with dropout (per4
// vectors a sample) a *= keep ? scale : 0. O: a's storage.
template <class T, class O>
void launch_act(const T* z, const float* scale, const float* shift, O* a, std::int64_t n4, int C4, Drop drop, std::int64_t per4);
// The affine from the running statistics (infer), or the bias alone (gamma null).
void launch_affine_prep(int C, const float* bias, const float* gamma, const float* beta, const float* run_mean, const float* run_var,
                        float* scale, float* shift, double eps);
// The backward's per-channel stage from partial's sums of dy and dy xhat over M values a channel:
// batch norm (gamma) writes dgamma, dbeta, a zero dbias and coef = {A, b0, c0} [3C] of dz = A dy + b0
// + c0 xhat; without it, dbias and A = 1.
void launch_finalize_bwd(const float* partial, int blocks, int C, double M, const float* gamma, const float* rstd, float* dgamma,
                         float* dbeta, float* dbias, float* coef);

// ---- NCHW layers (cuda_fused_nchw.cu): z [B, C, P, Q]; a pool's output and gradient NCHW, or NHWC
// (the flatten's order) where the launcher's *_nhwc flag says so.

// The blocks a channel of reduce_nchw (about 2048 blocks in all, at most one a sample).
int reduce_blocks_nchw(std::int64_t B, std::int64_t C);
// a = relu(z * scale + shift) over n elements, `plane` a channel (O: a's storage).
template <class T, class O>
void launch_act_nchw(const T* z, const float* scale, const float* shift, O* a, std::int64_t n, int C, int plane);
// Thread per pooled element (n of them): the window's first maximum of relu(z * scale + shift), its
// index (r * k + t) into arg, then dropout, into p.
template <class T>
void launch_act_pool_nchw(const T* z, const float* scale, const float* shift, T* p, unsigned char* arg, std::int64_t n, PoolGeom g, Drop drop,
                          bool out_nhwc);
// The per-channel sums into partial[blocks][2C], grid (C, blocks) over the B samples:
//   stats:  s1 = sum (z - K), s2 = sum (z - K)^2, K = the channel's first element of z;
//   dense:  dy = relu'(z) d, d NCHW as z; s1 = sum dy, s2 = sum dy xhat (mean non-null: batch norm);
//   pooled: over the pooled pixels; dy at a window's argmax is d (NHWC where d_nhwc) through dropout
//           and the ReLU.
enum class Sum { stats, dense, pooled };
template <class T>
void launch_reduce_nchw(Sum m, const T* d, const unsigned char* arg, const T* z, const float* scale, const float* shift, const float* mean,
                        const float* rstd, std::int64_t B, PoolGeom g, Drop drop, bool d_nhwc, int blocks, float* partial);
// dz over the n elements of z: dy through the pool (pooled: d the pooled gradient, NHWC where d_nhwc)
// or not (d as z), the ReLU and dropout; dz = A dy + b0 + c0 xhat (coef = {A, b0, c0}; mean non-null)
// or A dy.
template <class T>
void launch_dz_nchw(bool pooled, const T* d, const unsigned char* arg, const T* z, const float* scale, const float* shift, const float* coef,
                    const float* mean, const float* rstd, T* dz, std::int64_t n, PoolGeom g, Drop drop, bool d_nhwc);

}  // namespace hotops::batchnorm::cuda_fused
