// The batchnorm family's fused convnet kernels over NCHW activations (a channel's P x Q plane
// contiguous; scalar, as P Q need not divide by 4): batchnorm_relu_maxpool's NCHW form (reduce_nchw's
// stats and pooled sums, act_pool_nchw, dz_nchw of a pooled layer) and the stages of an unpooled
// layer (act_nchw, reduce_nchw's dense sums, dz_nchw). Launchers: cuda_fused.cuh.
#include <cuda_bf16.h>

#include <algorithm>
#include <cstdint>

#include "hotops/check.h"
#include "hotops/cuda_util.h"
#include "kernels/batchnorm/cuda_fused.cuh"

namespace hotops::batchnorm::cuda_fused {
namespace {

// The index of pooled element (n, c, ph, pw): NCHW, or NHWC where the pooled tensor is the flatten's.
__device__ inline std::int64_t pooled_at(const PoolGeom& g, std::int64_t n, int c, int ph, int pw, bool nhwc) {
  return nhwc ? ((n * g.PH + ph) * g.PW + pw) * g.C + c : ((n * g.C + c) * g.PH + ph) * static_cast<std::int64_t>(g.PW) + pw;
}

// a = relu(z * scale + shift) over NCHW z, `plane` pixels a channel (no dropout: it follows pools only).
template <class T, class O>
__global__ void act_nchw(const T* __restrict__ z, const float* __restrict__ scale, const float* __restrict__ shift, O* __restrict__ a,
                         std::int64_t n, int C, int plane) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n; i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const int c = static_cast<int>((i / plane) % C);
    a[i] = from_float<O>(fmaxf(as_float(z[i]) * scale[c] + shift[c], 0.f));
  }
}

// act_pool for NCHW z, thread per pooled element in NCHW order; the output and its argmax byte at
// pooled_at(out_nhwc).
template <class T>
__global__ void act_pool_nchw(const T* __restrict__ z, const float* __restrict__ scale, const float* __restrict__ shift, T* __restrict__ p,
                              unsigned char* __restrict__ arg, std::int64_t n, PoolGeom g, Drop drop, bool out_nhwc) {
  const MaskPeriod period = drop.mask_period();
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n; i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const int pw = static_cast<int>(i % g.PW);
    std::int64_t rest = i / g.PW;
    const int ph = static_cast<int>(rest % g.PH);
    rest /= g.PH;
    const int c = static_cast<int>(rest % g.C);
    const std::int64_t nn = rest / g.C;
    const float s = scale[c], t = shift[c];
    const T* win = z + ((nn * g.C + c) * g.P + ph * g.k) * static_cast<std::int64_t>(g.Q) + pw * g.k;
    float best = -1.f;
    unsigned char at = 0;
    for (int r = 0; r < g.k; ++r)
      for (int q = 0; q < g.k; ++q) {
        const float y = fmaxf(as_float(win[r * g.Q + q]) * s + t, 0.f);
        if (y > best) best = y, at = static_cast<unsigned char>(r * g.k + q);
      }
    if (drop.on) best *= keep(drop.key, (static_cast<std::int64_t>(ph) * g.PW + pw) * g.C + c, nn, period) ? drop.key.scale : 0.f;
    const std::int64_t o = pooled_at(g, nn, c, ph, pw, out_nhwc);
    p[o] = from_float<T>(best);
    arg[o] = at;
  }
}

// The per-channel sums of an NCHW layer, block (c, j) of grid (C, blocks) over the samples j, j +
// blocks, ... into partial[j][2C] (as block_sums):
//   stats:  s1 = sum (z - K), s2 = sum (z - K)^2, K = the channel's first element of z;
//   dense:  dy = relu'(z) d, d NCHW as z; s1 = sum dy, s2 = sum dy xhat (batch norm);
//   pooled: over the pooled pixels; dy at a window's argmax is d (at pooled_at(d_nhwc)) through
//           dropout and the ReLU.
// Each thread's sum, then warp shuffles, then the warps in order: deterministic.
template <Sum M, class T>
__global__ void __launch_bounds__(kThreads) reduce_nchw(const T* __restrict__ d, const unsigned char* __restrict__ arg, const T* __restrict__ z,
                                                        const float* __restrict__ scale, const float* __restrict__ shift,
                                                        const float* __restrict__ mean, const float* __restrict__ rstd, std::int64_t B, PoolGeom g,
                                                        Drop drop, bool d_nhwc, float* __restrict__ partial) {
  const int c = blockIdx.x, C = g.C, j = blockIdx.y, nb = gridDim.y, zplane = g.P * g.Q;
  const int plane = M == Sum::pooled ? g.PH * g.PW : zplane;
  const MaskPeriod period = drop.mask_period();
  const float s = M == Sum::stats ? 0.f : scale[c], t = M == Sum::stats ? 0.f : shift[c];
  const float m = mean ? mean[c] : 0.f, rs = rstd ? rstd[c] : 0.f;
  const float K = M == Sum::stats ? as_float(z[static_cast<std::int64_t>(c) * zplane]) : 0.f;
  float s1 = 0.f, s2 = 0.f;
  for (std::int64_t n = j; n < B; n += nb) {
    const T* zc = z + (n * C + c) * zplane;
    const std::uint32_t sample = M == Sum::pooled && drop.on ? mask_sample(period, n) : 0;
    for (int e = threadIdx.x; e < plane; e += blockDim.x) {
      if (M == Sum::stats) {
        const float v = as_float(zc[e]) - K;
        s1 += v, s2 += v * v;
        continue;
      }
      float gj, zv;
      if (M == Sum::dense) {
        zv = as_float(zc[e]), gj = as_float(d[(n * C + c) * zplane + e]);
      } else {
        const int ph = e / g.PW, pw = e % g.PW;
        const std::int64_t pi = pooled_at(g, n, c, ph, pw, d_nhwc);
        const int a = arg[pi];
        gj = as_float(d[pi]);
        if (drop.on) gj *= keep(drop.key, (static_cast<std::int64_t>(ph) * g.PW + pw) * C + c, sample) ? drop.key.scale : 0.f;
        zv = as_float(zc[(ph * g.k + a / g.k) * g.Q + pw * g.k + a % g.k]);
      }
      const float dy = zv * s + t > 0.f ? gj : 0.f;
      s1 += dy;
      if (mean) s2 += dy * (zv - m) * rs;
    }
  }
  for (int o = 16; o > 0; o >>= 1) s1 += __shfl_down_sync(0xffffffffu, s1, o), s2 += __shfl_down_sync(0xffffffffu, s2, o);
  __shared__ float w1[kThreads / 32], w2[kThreads / 32];
  if (threadIdx.x % 32 == 0) w1[threadIdx.x / 32] = s1, w2[threadIdx.x / 32] = s2;
  __syncthreads();
  if (threadIdx.x != 0) return;
  float a = 0.f, b = 0.f;
  for (unsigned w = 0; w < blockDim.x / 32; ++w) a += w1[w], b += w2[w];
  partial[static_cast<std::int64_t>(j) * 2 * C + c] = a;
  partial[static_cast<std::int64_t>(j) * 2 * C + C + c] = b;
}

// dz over NCHW z, as dz_pool (Pooled: d is the pooled gradient at pooled_at(d_nhwc)) or dz_dense (d NCHW
// as z; no dropout).
// I: the type the element's coordinates are taken apart in (int where the tensor's elements fit one).
template <bool Pooled, class I, class T>
__global__ void dz_nchw(const T* __restrict__ d, const unsigned char* __restrict__ arg, const T* __restrict__ z, const float* __restrict__ scale,
                        const float* __restrict__ shift, const float* __restrict__ coef, const float* __restrict__ mean, const float* __restrict__ rstd,
                        T* __restrict__ dz, std::int64_t n, PoolGeom g, Drop drop, bool d_nhwc) {
  const MaskPeriod period = drop.mask_period();
  const int C = g.C, plane = g.P * g.Q;
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n; i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const I ii = static_cast<I>(i), nc = ii / plane;
    const int c = static_cast<int>(nc % C);
    const float v = as_float(z[i]);
    const bool live = v * scale[c] + shift[c] > 0.f;
    float dy = 0.f;
    if (Pooled) {
      const int e = static_cast<int>(ii - nc * plane), h = e / g.Q, w = e - h * g.Q, ph = h / g.k, pw = w / g.k;
      if (live && ph < g.PH && pw < g.PW) {
        const std::int64_t nn = nc / C;
        const std::int64_t pi = pooled_at(g, nn, c, ph, pw, d_nhwc);
        if (arg[pi] == (h - ph * g.k) * g.k + w - pw * g.k) {
          dy = as_float(d[pi]);
          if (drop.on) dy *= keep(drop.key, (static_cast<std::int64_t>(ph) * g.PW + pw) * C + c, nn, period) ? drop.key.scale : 0.f;
        }
      }
    } else if (live) {
      dy = as_float(d[i]);
    }
    float out = coef[c] * dy;
    if (mean) out += coef[C + c] + coef[2 * C + c] * (v - mean[c]) * rstd[c];
    dz[i] = from_float<T>(out);
  }
}

}  // namespace

int reduce_blocks_nchw(std::int64_t B, std::int64_t C) {
  return static_cast<int>(std::max<std::int64_t>(1, std::min<std::int64_t>({B, 2048 / C, kMaxReduceBlocks})));
}

template <class T, class O>
void launch_act_nchw(const T* z, const float* scale, const float* shift, O* a, std::int64_t n, int C, int plane) {
  act_nchw<<<grid_for(n), kThreads, 0, gpu::stream()>>>(z, scale, shift, a, n, C, plane);
  HOTOPS_CHECK_LAUNCH();
}

template <class T>
void launch_act_pool_nchw(const T* z, const float* scale, const float* shift, T* p, unsigned char* arg, std::int64_t n, PoolGeom g, Drop drop,
                          bool out_nhwc) {
  act_pool_nchw<<<grid_for(n), kThreads, 0, gpu::stream()>>>(z, scale, shift, p, arg, n, g, drop, out_nhwc);
  HOTOPS_CHECK_LAUNCH();
}

template <class T>
void launch_reduce_nchw(Sum m, const T* d, const unsigned char* arg, const T* z, const float* scale, const float* shift, const float* mean,
                        const float* rstd, std::int64_t B, PoolGeom g, Drop drop, bool d_nhwc, int blocks, float* partial) {
  const dim3 grid(static_cast<unsigned>(g.C), static_cast<unsigned>(blocks));
  cudaStream_t st = gpu::stream();
  switch (m) {
    case Sum::stats:
      reduce_nchw<Sum::stats><<<grid, kThreads, 0, st>>>(d, arg, z, scale, shift, mean, rstd, B, g, drop, d_nhwc, partial);
      break;
    case Sum::dense:
      reduce_nchw<Sum::dense><<<grid, kThreads, 0, st>>>(d, arg, z, scale, shift, mean, rstd, B, g, drop, d_nhwc, partial);
      break;
    case Sum::pooled:
      reduce_nchw<Sum::pooled><<<grid, kThreads, 0, st>>>(d, arg, z, scale, shift, mean, rstd, B, g, drop, d_nhwc, partial);
      break;
  }
  HOTOPS_CHECK_LAUNCH();
}

template <class T>
void launch_dz_nchw(bool pooled, const T* d, const unsigned char* arg, const T* z, const float* scale, const float* shift, const float* coef,
                    const float* mean, const float* rstd, T* dz, std::int64_t n, PoolGeom g, Drop drop, bool d_nhwc) {
  const unsigned grid = grid_for(n);
  cudaStream_t st = gpu::stream();
  const bool small = n <= 0x7fffffff;
  if (pooled && small) dz_nchw<true, int><<<grid, kThreads, 0, st>>>(d, arg, z, scale, shift, coef, mean, rstd, dz, n, g, drop, d_nhwc);
  else if (pooled) dz_nchw<true, std::int64_t><<<grid, kThreads, 0, st>>>(d, arg, z, scale, shift, coef, mean, rstd, dz, n, g, drop, d_nhwc);
  else if (small) dz_nchw<false, int><<<grid, kThreads, 0, st>>>(d, arg, z, scale, shift, coef, mean, rstd, dz, n, g, drop, d_nhwc);
  else dz_nchw<false, std::int64_t><<<grid, kThreads, 0, st>>>(d, arg, z, scale, shift, coef, mean, rstd, dz, n, g, drop, d_nhwc);
  HOTOPS_CHECK_LAUNCH();
}

template void launch_act_nchw<float, float>(const float*, const float*, const float*, float*, std::int64_t, int, int);
template void launch_act_nchw<bf16, bf16>(const bf16*, const float*, const float*, bf16*, std::int64_t, int, int);
template void launch_act_nchw<bf16, float>(const bf16*, const float*, const float*, float*, std::int64_t, int, int);
#define HOTOPS_NCHW_INSTANTIATE(T)                                                                                                      \
  template void launch_act_pool_nchw<T>(const T*, const float*, const float*, T*, unsigned char*, std::int64_t, PoolGeom, Drop, bool); \
  template void launch_reduce_nchw<T>(Sum, const T*, const unsigned char*, const T*, const float*, const float*, const float*,          \
                                      const float*, std::int64_t, PoolGeom, Drop, bool, int, float*);                                   \
  template void launch_dz_nchw<T>(bool, const T*, const unsigned char*, const T*, const float*, const float*, const float*,             \
                                  const float*, const float*, T*, std::int64_t, PoolGeom, Drop, bool);
HOTOPS_NCHW_INSTANTIATE(float)
HOTOPS_NCHW_INSTANTIATE(bf16)
#undef HOTOPS_NCHW_INSTANTIATE

}  // namespace hotops::batchnorm::cuda_fused
