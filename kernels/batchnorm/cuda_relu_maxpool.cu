// batchnorm_relu_maxpool and batchnorm_relu on CUDA: hotops' fused kernels of a convnet (or dense)
// layer in NHWC, each thread 4 channels of a row (dz_pool: of a pooling window). batchnorm_relu runs act, reduce_dense and dz_dense
// where the pooled op runs act_pool, reduce_pool and dz_pool. fwd (training): bn_stats (per-block channel sums), bn_finalize (the statistics,
// the affine and the running update in double), act_pool (affine, ReLU, the window's first maximum
// and its index, dropout); infer: affine_prep, act_pool. bwd: reduce_pool (the sums of dy and
// dy xhat over the windows' maxima), finalize_bwd (dgamma, dbeta and dz's coefficients), dz_pool.
// NCHW z takes the scalar kernels of cuda_fused_nchw.cu in their places (reduce_nchw for the sums,
// act_pool_nchw, dz_nchw) around the same per-channel stages. Every sum is in a fixed order: the
// results do not change from run to run.
#include <cuda_bf16.h>

#include <memory>
#include <string>

#include "hotops/check.h"
#include "hotops/cuda_util.h"
#include "kernels/batchnorm/cuda_fused.cuh"
#include "kernels/batchnorm/relu_maxpool.h"

namespace hotops::batchnorm {
namespace cuda_fused {
namespace {

// Per-channel sums of z - K and (z - K)^2 over rows [rows, C], K = z's first row (keeps the f32 sums
// small where the mean is large).
template <class T>
__global__ void __launch_bounds__(kThreads) bn_stats(const T* __restrict__ z, std::int64_t rows, int C, float* __restrict__ partial) {
  const int tpr = C / 4, rpi = blockDim.x / tpr, c4 = threadIdx.x % tpr, r0 = threadIdx.x / tpr;
  float4 s1 = make_float4(0, 0, 0, 0), s2 = s1;
  if (r0 < rpi) {
    const float4 K = load4(z, c4);
    for (std::int64_t r = static_cast<std::int64_t>(blockIdx.x) * rpi + r0; r < rows; r += static_cast<std::int64_t>(gridDim.x) * rpi) {
      const float4 v = load4(z, r * tpr + c4);
      const float4 d = make_float4(v.x - K.x, v.y - K.y, v.z - K.z, v.w - K.w);
      s1 = s1 + d;
      s2 = s2 + make_float4(d.x * d.x, d.y * d.y, d.z * d.z, d.w * d.w);
    }
  }
  block_sums(s1, s2, C, c4, r0, rpi, partial);
}

// The finalize kernels' sums: block (32 channels x 32 slots), grid ceil(C / 32); slot y adds the
// blocks' partial sums b = y, y + 32, ... in double, then slot 0 adds the 32 slots in order
// (deterministic). True for the thread (slot 0) that owns channel c, with *s1, *s2 its sums.
__device__ inline bool channel_sums(const float* __restrict__ partial, int blocks, int C, int* c_out, double* s1, double* s2) {
  __shared__ double sh[2][32][33];
  const int c = blockIdx.x * 32 + threadIdx.x;
  double a = 0, b = 0;
  if (c < C)
    for (int k = threadIdx.y; k < blocks; k += 32) a += partial[static_cast<std::int64_t>(k) * 2 * C + c], b += partial[static_cast<std::int64_t>(k) * 2 * C + C + c];
  sh[0][threadIdx.y][threadIdx.x] = a, sh[1][threadIdx.y][threadIdx.x] = b;
  __syncthreads();
  if (threadIdx.y != 0 || c >= C) return false;
  a = 0, b = 0;
  for (int y = 0; y < 32; ++y) a += sh[0][y][threadIdx.x], b += sh[1][y][threadIdx.x];
  *c_out = c, *s1 = a, *s2 = b;
  return true;
}
const dim3 kFinalizeBlock(32, 32);
unsigned finalize_grid(std::int64_t C) { return static_cast<unsigned>((C + 31) / 32); }

// Per channel: the batch statistics in double from the blocks' sums; the affine of the forward
// (y = z * scale + shift, z without the bias: batch norm removes it); mean and rstd for the backward;
// the running statistics (of z + bias, the variance unbiased). K: the shift of the sums (z's first
// element of the channel).
template <class T>
__global__ void __launch_bounds__(1024) bn_finalize(const float* __restrict__ partial, int blocks, int C, double M, const T* __restrict__ K,
                                                    std::int64_t k_stride, const float* __restrict__ gamma, const float* __restrict__ beta,
                                                    const float* __restrict__ bias, float* __restrict__ run_mean, float* __restrict__ run_var,
                                                    float* __restrict__ scale, float* __restrict__ shift, float* __restrict__ mean,
                                                    float* __restrict__ rstd, double eps, double momentum) {
  int c = 0;
  double s1 = 0, s2 = 0;
  if (!channel_sums(partial, blocks, C, &c, &s1, &s2)) return;
  const double d = s1 / M, var = fmax(s2 / M - d * d, 0.0), m = static_cast<double>(as_float(K[c * k_stride])) + d;
  const double rs = 1 / sqrt(var + eps);
  const double sc = gamma[c] * rs;
  scale[c] = static_cast<float>(sc);
  shift[c] = static_cast<float>(beta[c] - m * sc);
  mean[c] = static_cast<float>(m);
  rstd[c] = static_cast<float>(rs);
  run_mean[c] = static_cast<float>((1 - momentum) * run_mean[c] + momentum * (m + bias[c]));
  run_var[c] = static_cast<float>((1 - momentum) * run_var[c] + momentum * var * M / (M - 1));
}

// The affine without batch statistics: batch norm with the running ones (infer), or the bias alone.
__global__ void affine_prep(int C, const float* __restrict__ bias, const float* __restrict__ gamma, const float* __restrict__ beta,
                            const float* __restrict__ run_mean, const float* __restrict__ run_var, float* __restrict__ scale,
                            float* __restrict__ shift, float eps) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= C) return;
  if (!gamma) {
    scale[c] = 1.f, shift[c] = bias[c];
    return;
  }
  const float sc = gamma[c] / sqrtf(run_var[c] + eps);
  scale[c] = sc;
  shift[c] = (bias[c] - run_mean[c]) * sc + beta[c];
}

// Thread per pooled vector (n, ph, pw, c4): the first maximum of relu(z * scale + shift) over the k x k
// window, its index (r * k + t) as a byte, then dropout.
template <class T>
__global__ void act_pool(const T* __restrict__ z, const float4* __restrict__ scale, const float4* __restrict__ shift, T* __restrict__ p,
                         uchar4* __restrict__ arg, std::int64_t n4, PoolGeom g, Drop drop) {
  const MaskPeriod period = drop.mask_period();
  const int C4 = g.C / 4;
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n4; i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const int c4 = static_cast<int>(i % C4);
    std::int64_t rest = i / C4;
    const int pw = static_cast<int>(rest % g.PW);
    rest /= g.PW;
    const int ph = static_cast<int>(rest % g.PH);
    const std::int64_t n = rest / g.PH;
    const float4 s = scale[c4], t = shift[c4];
    float4 best = make_float4(-1.f, -1.f, -1.f, -1.f);
    unsigned char at[4] = {0, 0, 0, 0};
    for (int r = 0; r < g.k; ++r)
      for (int q = 0; q < g.k; ++q) {
        const float4 v = load4(z, ((n * g.P + ph * g.k + r) * g.Q + pw * g.k + q) * C4 + c4);
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const float y = fmaxf(lane(v, j) * lane(s, j) + lane(t, j), 0.f);
          if (y > lane(best, j)) lane(best, j) = y, at[j] = static_cast<unsigned char>(r * g.k + q);
        }
      }
    if (drop.on) {
      const std::int64_t e = ((static_cast<std::int64_t>(ph) * g.PW + pw) * g.C) + 4 * c4;
#pragma unroll
      for (int j = 0; j < 4; ++j) lane(best, j) *= keep(drop.key, e + j, n, period) ? drop.key.scale : 0.f;
    }
    store4(p, i, best);
    arg[i] = make_uchar4(at[0], at[1], at[2], at[3]);
  }
}

// Batch-norm (or bias) backward, stage 1, for a pooled layer: rows are the pooled pixels. dy at a
// window's argmax is the pooled gradient through dropout and the ReLU (recomputed from z); s1 = sum dy,
// s2 = sum dy * xhat (batch norm only).
template <class T>
__global__ void __launch_bounds__(kThreads) reduce_pool(const T* __restrict__ dp, const uchar4* __restrict__ arg, const T* __restrict__ z,
                                                        const float* __restrict__ scale, const float* __restrict__ shift,
                                                        const float* __restrict__ mean, const float* __restrict__ rstd, std::int64_t rows,
                                                        PoolGeom g, Drop drop, float* __restrict__ partial) {
  const int C = g.C, tpr = C / 4, rpi = blockDim.x / tpr, c4 = threadIdx.x % tpr, r0 = threadIdx.x / tpr;
  const MaskPeriod period = drop.mask_period();
  float4 s1 = make_float4(0, 0, 0, 0), s2 = s1;
  if (r0 < rpi)
    for (std::int64_t r = static_cast<std::int64_t>(blockIdx.x) * rpi + r0; r < rows; r += static_cast<std::int64_t>(gridDim.x) * rpi) {
      std::int64_t nph = 0, n = 0;
      int pw = 0, ph = 0;
      split_row(r, g.PW, &nph, &pw);
      split_row(nph, g.PH, &n, &ph);
      const std::uint32_t sample = drop.on ? mask_sample(period, n) : 0;
      const float4 d = load4(dp, r * tpr + c4);
      const uchar4 a = arg[r * tpr + c4];
      const unsigned char at[4] = {a.x, a.y, a.z, a.w};
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int c = 4 * c4 + j;
        float gj = lane(d, j);
        if (drop.on) gj *= keep(drop.key, (static_cast<std::int64_t>(ph) * g.PW + pw) * C + c, sample) ? drop.key.scale : 0.f;
        const float zv = as_float(z[((n * g.P + ph * g.k + at[j] / g.k) * g.Q + pw * g.k + at[j] % g.k) * C + c]);
        const float dy = zv * scale[c] + shift[c] > 0.f ? gj : 0.f;
        lane(s1, j) += dy;
        if (mean) lane(s2, j) += dy * (zv - mean[c]) * rstd[c];
      }
    }
  block_sums(s1, s2, C, c4, r0, rpi, partial);
}

// Stage 2, per channel (channel_sums): batch norm writes dgamma, dbeta and a zero bias gradient, and
// the coefficients of dz = A dy + b0 + c0 xhat; without batch norm, the bias gradient and A = 1.
__global__ void __launch_bounds__(1024) finalize_bwd(const float* __restrict__ partial, int blocks, int C, double M, const float* __restrict__ gamma,
                                                     const float* __restrict__ rstd, float* __restrict__ dgamma, float* __restrict__ dbeta,
                                                     float* __restrict__ dbias, float* __restrict__ coef) {
  int c = 0;
  double s1 = 0, s2 = 0;
  if (!channel_sums(partial, blocks, C, &c, &s1, &s2)) return;
  if (!gamma) {
    dbias[c] = static_cast<float>(s1);
    coef[c] = 1.f, coef[C + c] = 0.f, coef[2 * C + c] = 0.f;
    return;
  }
  dgamma[c] = static_cast<float>(s2);
  dbeta[c] = static_cast<float>(s1);
  dbias[c] = 0.f;
  const double a = gamma[c] * static_cast<double>(rstd[c]);
  coef[c] = static_cast<float>(a);
  coef[C + c] = static_cast<float>(-a * s1 / M);
  coef[2 * C + c] = static_cast<float>(-a * s2 / M);
}

// dz at one pixel of z (4 channels, v their z): the pooled gradient gd where this pixel is the
// channel's window argmax (rq, its place in the window; -1: no window's) and the ReLU passed it, else
// 0; dz = A dy + b0 + c0 xhat (batch norm: bn) or dy.
struct DzCoef {
  float4 s, t, A, B0, C0, m, rs;
  bool bn;
};
__device__ inline float4 dz_at(const float4& v, int rq, const unsigned char (&at)[4], const float4& gd, const DzCoef& k) {
  float4 dy = make_float4(0, 0, 0, 0);
#pragma unroll
  for (int j = 0; j < 4; ++j)
    if (at[j] == rq && lane(v, j) * lane(k.s, j) + lane(k.t, j) > 0.f) lane(dy, j) = lane(gd, j);
  float4 out = make_float4(k.A.x * dy.x, k.A.y * dy.y, k.A.z * dy.z, k.A.w * dy.w);
  if (k.bn) {
#pragma unroll
    for (int j = 0; j < 4; ++j) lane(out, j) += lane(k.B0, j) + lane(k.C0, j) * (lane(v, j) - lane(k.m, j)) * lane(k.rs, j);
  }
  return out;
}

// dz over every pixel of z, a thread per pooled element (n, ph, pw, c4: 4 channels of a window): the
// window's k x k pixels, and on the last row and column of windows the pixels past them that no window
// covers (dy 0 there). The window's argmax and pooled gradient (through dropout) are read once, and
// its z loads all go out before the first store (K: k known at compile time, 2 and 3; 0: any k).
template <class T, int K>
__global__ void __launch_bounds__(kThreads) dz_pool(const T* __restrict__ dp, const uchar4* __restrict__ arg, const T* __restrict__ z,
                                                    const float4* __restrict__ scale, const float4* __restrict__ shift, const float* __restrict__ coef,
                                                    const float4* __restrict__ mean, const float4* __restrict__ rstd, T* __restrict__ dz,
                                                    std::int64_t windows, PoolGeom g, Drop drop) {
  const int C = g.C, C4 = C / 4, k = K ? K : g.k;
  const MaskPeriod period = drop.mask_period();
  const float4 zero = make_float4(0, 0, 0, 0);
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < windows;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    std::int64_t t = i / C4;
    const int c4 = static_cast<int>(i - t * C4);
    std::int64_t nph = t / g.PW;
    const int pw = static_cast<int>(t - nph * g.PW);
    const std::int64_t n = nph / g.PH;
    const int ph = static_cast<int>(nph - n * g.PH);
    DzCoef kc;
    kc.s = scale[c4], kc.t = shift[c4], kc.A = reinterpret_cast<const float4*>(coef)[c4], kc.bn = mean != nullptr;
    kc.B0 = kc.bn ? reinterpret_cast<const float4*>(coef + C)[c4] : zero, kc.C0 = kc.bn ? reinterpret_cast<const float4*>(coef + 2 * C)[c4] : zero;
    kc.m = kc.bn ? mean[c4] : zero, kc.rs = kc.bn ? rstd[c4] : zero;
    const uchar4 a = arg[i];
    const unsigned char at[4] = {a.x, a.y, a.z, a.w};
    float4 gd = load4(dp, i);
    if (drop.on) {
      const std::uint32_t sample = mask_sample(period, n);
      const std::int64_t e = (static_cast<std::int64_t>(ph) * g.PW + pw) * C + 4 * c4;
#pragma unroll
      for (int j = 0; j < 4; ++j) lane(gd, j) *= keep(drop.key, e + j, sample) ? drop.key.scale : 0.f;
    }
    const int h0 = ph * k, w0 = pw * k;
    const std::int64_t row0 = n * g.P;  // the sample's first row of z
    const auto at_pixel = [&](int h, int w) { return ((row0 + h) * g.Q + w) * C4 + c4; };
    if constexpr (K > 0) {
      float4 v[K * K];
#pragma unroll
      for (int r = 0; r < K; ++r)
#pragma unroll
        for (int q = 0; q < K; ++q) v[r * K + q] = load4(z, at_pixel(h0 + r, w0 + q));
#pragma unroll
      for (int r = 0; r < K; ++r)
#pragma unroll
        for (int q = 0; q < K; ++q) store4(dz, at_pixel(h0 + r, w0 + q), dz_at(v[r * K + q], r * K + q, at, gd, kc));
    } else {
      for (int r = 0; r < k; ++r)
        for (int q = 0; q < k; ++q) {
          const std::int64_t p = at_pixel(h0 + r, w0 + q);
          store4(dz, p, dz_at(load4(z, p), r * k + q, at, gd, kc));
        }
    }
    // The pixels no window covers: right of the last column of windows, below the last row.
    const int h1 = ph == g.PH - 1 ? g.P : h0 + k, w1 = pw == g.PW - 1 ? g.Q : w0 + k;
    for (int h = h0; h < h1; ++h)
      for (int w = h < h0 + k ? w0 + k : w0; w < w1; ++w) {
        const std::int64_t p = at_pixel(h, w);
        store4(dz, p, dz_at(load4(z, p), -1, at, gd, kc));
      }
  }
}

// a = relu(z * scale + shift) over n4 vectors of rows of C (C4 = C / 4 vectors); with dropout (per4
// vectors per sample) a *= keep ? scale : 0.
// T: z's storage, O: a's (the verification's hints are f32 whatever T is).
template <class T, class O>
__global__ void act(const T* __restrict__ z, const float4* __restrict__ scale, const float4* __restrict__ shift, O* __restrict__ a,
                    std::int64_t n4, int C4, Drop drop, std::int64_t per4) {
  const MaskPeriod period = drop.mask_period();
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n4; i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const int c4 = static_cast<int>(i % C4);
    const float4 v = load4(z, i), s = scale[c4], t = shift[c4];
    float4 y = make_float4(fmaxf(v.x * s.x + t.x, 0.f), fmaxf(v.y * s.y + t.y, 0.f), fmaxf(v.z * s.z + t.z, 0.f), fmaxf(v.w * s.w + t.w, 0.f));
    if (drop.on) {
      const std::int64_t b = i / per4, e = (i % per4) * 4;
#pragma unroll
      for (int j = 0; j < 4; ++j) lane(y, j) *= keep(drop.key, e + j, b, period) ? drop.key.scale : 0.f;
    }
    store4(a, i, y);
  }
}

// Stage 1 for an unpooled layer (rows x C, every element): dy = relu'(z) * da (through dropout when on,
// per4 vectors per sample).
template <class T>
__global__ void __launch_bounds__(kThreads) reduce_dense(const T* __restrict__ da, const T* __restrict__ z, const float4* __restrict__ scale,
                                                         const float4* __restrict__ shift, const float4* __restrict__ mean,
                                                         const float4* __restrict__ rstd, std::int64_t rows, int C, Drop drop,
                                                         std::int64_t per4, float* __restrict__ partial) {
  const int tpr = C / 4, rpi = blockDim.x / tpr, c4 = threadIdx.x % tpr, r0 = threadIdx.x / tpr;
  const MaskPeriod period = drop.mask_period();
  float4 s1 = make_float4(0, 0, 0, 0), s2 = s1;
  if (r0 < rpi) {
    const float4 s = scale[c4], t = shift[c4];
    const float4 m = mean ? mean[c4] : s1, rs = rstd ? rstd[c4] : s1;
    for (std::int64_t r = static_cast<std::int64_t>(blockIdx.x) * rpi + r0; r < rows; r += static_cast<std::int64_t>(gridDim.x) * rpi) {
      const std::int64_t i = r * tpr + c4;
      const float4 v = load4(z, i), d = load4(da, i);
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        float gj = lane(d, j);
        if (drop.on) gj *= keep(drop.key, (i % per4) * 4 + j, i / per4, period) ? drop.key.scale : 0.f;
        const float dy = lane(v, j) * lane(s, j) + lane(t, j) > 0.f ? gj : 0.f;
        lane(s1, j) += dy;
        lane(s2, j) += dy * (lane(v, j) - lane(m, j)) * lane(rs, j);
      }
    }
  }
  block_sums(s1, s2, C, c4, r0, rpi, partial);
}

// dz for an unpooled layer: dy = relu'(z) da (through dropout when on); dz = A dy + b0 + c0 xhat or dy.
template <class T>
__global__ void dz_dense(const T* __restrict__ da, const T* __restrict__ z, const float4* __restrict__ scale, const float4* __restrict__ shift,
                         const float* __restrict__ coef, const float4* __restrict__ mean, const float4* __restrict__ rstd,
                         T* __restrict__ dz, std::int64_t n4, int C, Drop drop, std::int64_t per4) {
  const MaskPeriod period = drop.mask_period();
  const int C4 = C / 4;
  const float4* A = reinterpret_cast<const float4*>(coef);
  const float4* B0 = reinterpret_cast<const float4*>(coef + C);
  const float4* C0 = reinterpret_cast<const float4*>(coef + 2 * C);
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n4; i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const int c4 = static_cast<int>(i % C4);
    const float4 v = load4(z, i), d = load4(da, i), s = scale[c4], t = shift[c4], a = A[c4];
    float4 out;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      float gj = lane(d, j);
      if (drop.on) gj *= keep(drop.key, (i % per4) * 4 + j, i / per4, period) ? drop.key.scale : 0.f;
      lane(out, j) = lane(a, j) * (lane(v, j) * lane(s, j) + lane(t, j) > 0.f ? gj : 0.f);
    }
    if (mean) {
      const float4 b0 = B0[c4], c0 = C0[c4], m = mean[c4], rs = rstd[c4];
#pragma unroll
      for (int j = 0; j < 4; ++j) lane(out, j) += lane(b0, j) + lane(c0, j) * (lane(v, j) - lane(m, j)) * lane(rs, j);
    }
    store4(dz, i, out);
  }
}

}  // namespace

template <class T>
void launch_bn_stats(const T* z, std::int64_t rows, int C, int blocks, float* partial) {
  bn_stats<<<blocks, kThreads, 0, gpu::stream()>>>(z, rows, C, partial);
  HOTOPS_CHECK_LAUNCH();
}

template <class T>
void launch_bn_finalize(const float* partial, int blocks, int C, double M, const T* K, std::int64_t k_stride, const float* gamma,
                        const float* beta, const float* bias, float* run_mean, float* run_var, float* scale, float* shift, float* mean,
                        float* rstd, double eps, double momentum) {
  bn_finalize<<<finalize_grid(C), kFinalizeBlock, 0, gpu::stream()>>>(partial, blocks, C, M, K, k_stride, gamma, beta, bias, run_mean,
                                                                      run_var, scale, shift, mean, rstd, eps, momentum);
  HOTOPS_CHECK_LAUNCH();
}

void launch_affine_prep(int C, const float* bias, const float* gamma, const float* beta, const float* run_mean, const float* run_var,
                        float* scale, float* shift, double eps) {
  affine_prep<<<static_cast<unsigned>((C + 255) / 256), 256, 0, gpu::stream()>>>(C, bias, gamma, beta, run_mean, run_var, scale, shift,
                                                                                   static_cast<float>(eps));
  HOTOPS_CHECK_LAUNCH();
}

void launch_finalize_bwd(const float* partial, int blocks, int C, double M, const float* gamma, const float* rstd, float* dgamma,
                         float* dbeta, float* dbias, float* coef) {
  finalize_bwd<<<finalize_grid(C), kFinalizeBlock, 0, gpu::stream()>>>(partial, blocks, C, M, gamma, rstd, dgamma, dbeta, dbias, coef);
  HOTOPS_CHECK_LAUNCH();
}

template <class T, class O>
void launch_act(const T* z, const float* scale, const float* shift, O* a, std::int64_t n4, int C4, Drop drop, std::int64_t per4) {
  act<<<grid_for(n4), kThreads, 0, gpu::stream()>>>(z, reinterpret_cast<const float4*>(scale), reinterpret_cast<const float4*>(shift), a, n4, C4,
                                                    drop, per4);
  HOTOPS_CHECK_LAUNCH();
}

template void launch_act<float, float>(const float*, const float*, const float*, float*, std::int64_t, int, Drop, std::int64_t);
template void launch_act<bf16, bf16>(const bf16*, const float*, const float*, bf16*, std::int64_t, int, Drop, std::int64_t);
template void launch_act<bf16, float>(const bf16*, const float*, const float*, float*, std::int64_t, int, Drop, std::int64_t);
template void launch_bn_stats<float>(const float*, std::int64_t, int, int, float*);
template void launch_bn_stats<bf16>(const bf16*, std::int64_t, int, int, float*);
template void launch_bn_finalize<float>(const float*, int, int, double, const float*, std::int64_t, const float*, const float*,
                                        const float*, float*, float*, float*, float*, float*, float*, double, double);
template void launch_bn_finalize<bf16>(const float*, int, int, double, const bf16*, std::int64_t, const float*, const float*,
                                       const float*, float*, float*, float*, float*, float*, float*, double, double);

}  // namespace cuda_fused

namespace relu_maxpool {
namespace {

using namespace cuda_fused;  // NOLINT(build/namespaces): the kernels above

int dim(std::int64_t v) {
  HOTOPS_CHECK(v <= 0x7fffffff, std::string(kOp) + ": a dimension does not fit an int");
  return static_cast<int>(v);
}

// T: z's storage, float or bf16 (f32 math and sums).
template <class T>
class CudaReluMaxpool final : public Plan {
 public:
  explicit CudaReluMaxpool(const Shape& s)
      : s_(s), geom_{dim(s.H), dim(s.W), dim(s.C), dim(s.PH()), dim(s.PW()), dim(s.k)} {
    const std::string why = cuda_unsupported_reason(s);
    if (!why.empty()) throw Error(why, ErrorKind::unsupported);
    partial_ = gpu::DeviceBuffer(static_cast<std::size_t>(kMaxReduceBlocks) * 2 * static_cast<std::size_t>(s.C) * sizeof(float));
    if (s.dir == Direction::bwd) coef_ = gpu::DeviceBuffer(3 * static_cast<std::size_t>(s.C) * sizeof(float));
  }

  void run(const Args& a) override {
    if (s_.dir == Direction::bwd) return backward(a);
    forward(a);
  }
  std::string label() const override {
    if (nchw() && s_.pool) return "hotops fused NCHW kernels (reduce_nchw, bn_finalize, act_pool_nchw; reduce_nchw, finalize_bwd, dz_nchw)";
    if (nchw()) return "hotops fused NCHW kernels (reduce_nchw, bn_finalize, act_nchw; reduce_nchw, finalize_bwd, dz_nchw)";
    if (!s_.pool) return "hotops fused kernels (bn_stats, bn_finalize, act; reduce_dense, finalize_bwd, dz_dense)";
    return "hotops fused kernels (bn_stats, bn_finalize, act_pool; reduce_pool, finalize_bwd, dz_pool)";
  }

 private:
  Drop drop(const Args& a) const { return Drop{s_.key, a.period, s_.drops(), a.first_sample}; }
  bool nchw() const { return s_.layout == Layout::nchw; }
  bool pooled_nhwc() const { return s_.pooled_layout == Layout::nhwc; }

  // scale and shift: from the batch statistics (which also update the running ones), or affine_prep.
  void affine(const Args& a) {
    const int C = dim(s_.C);
    const T* z = static_cast<const T*>(a.z);
    if (!s_.bn || s_.dir != Direction::fwd)
      return launch_affine_prep(C, a.bias, s_.bn ? a.gamma : nullptr, s_.bn ? a.beta : nullptr, s_.bn ? a.running_mean : nullptr,
                                s_.bn ? a.running_var : nullptr, a.scale, a.shift, s_.eps);
    const std::int64_t rows = s_.N * s_.H * s_.W;
    const int blocks = nchw() ? reduce_blocks_nchw(s_.N, C) : reduce_blocks(rows, C);
    if (nchw())
      launch_reduce_nchw<T>(Sum::stats, nullptr, nullptr, z, nullptr, nullptr, nullptr, nullptr, s_.N, geom_, Drop{}, false, blocks,
                            partial_.as<float>());
    else
      launch_bn_stats(z, rows, C, blocks, partial_.as<float>());
    launch_bn_finalize(partial_.as<const float>(), blocks, C, static_cast<double>(rows), z, nchw() ? s_.H * s_.W : 1, a.gamma, a.beta, a.bias,
                       a.running_mean, a.running_var, a.scale, a.shift, a.mean, a.rstd, s_.eps, s_.momentum);
  }

  void forward(const Args& a) {
    affine(a);
    const T* z = static_cast<const T*>(a.z);
    T* out = static_cast<T*>(a.out);
    const int C = dim(s_.C);
    if (nchw() && s_.pool) return launch_act_pool_nchw(z, a.scale, a.shift, out, a.arg, s_.pooled(), geom_, drop(a), pooled_nhwc());
    if (nchw()) return launch_act_nchw(z, a.scale, a.shift, out, s_.count(), C, dim(s_.H * s_.W));
    if (!s_.pool) return launch_act(z, a.scale, a.shift, out, s_.count() / 4, C / 4, drop(a), per4());
    const std::int64_t n4 = s_.pooled() / 4;
    act_pool<<<grid_for(n4), kThreads, 0, gpu::stream()>>>(z, reinterpret_cast<const float4*>(a.scale), reinterpret_cast<const float4*>(a.shift),
                                                           out, reinterpret_cast<uchar4*>(a.arg), n4, geom_, drop(a));
    HOTOPS_CHECK_LAUNCH();
  }

  // Stage 1, the per-channel sums of dy and dy xhat into partial_ (returns its blocks); stage 2,
  // finalize_bwd; stage 3, dz over z.
  void backward(const Args& a) {
    const Drop d = drop(a);
    const int blocks = nchw() ? sums_nchw(a, d) : sums(a, d);
    launch_finalize_bwd(partial_.as<const float>(), blocks, dim(s_.C), static_cast<double>(s_.N * s_.H * s_.W), s_.bn ? a.gamma : nullptr,
                        a.rstd, s_.bn ? a.dgamma : nullptr, s_.bn ? a.dbeta : nullptr, a.dbias, coef_.as<float>());
    if (nchw()) return dz_nchw(a, d);
    const T* z = static_cast<const T*>(a.z);
    const T* dout = static_cast<const T*>(a.dout);
    const auto* scale = reinterpret_cast<const float4*>(a.scale);
    const auto* shift = reinterpret_cast<const float4*>(a.shift);
    const float4* mean = s_.bn ? reinterpret_cast<const float4*>(a.mean) : nullptr;
    const float4* rstd = s_.bn ? reinterpret_cast<const float4*>(a.rstd) : nullptr;
    const std::int64_t n4 = s_.count() / 4;
    if (s_.pool) {
      const std::int64_t windows = s_.pooled() / 4;
      const auto kernel = geom_.k == 2 ? dz_pool<T, 2> : geom_.k == 3 ? dz_pool<T, 3> : dz_pool<T, 0>;
      kernel<<<grid_for(windows), kThreads, 0, gpu::stream()>>>(dout, reinterpret_cast<const uchar4*>(a.arg), z, scale, shift,
                                                             coef_.as<const float>(), mean, rstd, static_cast<T*>(a.dz), windows, geom_, d);
    } else
      dz_dense<<<grid_for(n4), kThreads, 0, gpu::stream()>>>(dout, z, scale, shift, coef_.as<const float>(), mean, rstd, static_cast<T*>(a.dz), n4,
                                                             dim(s_.C), d, per4());
    HOTOPS_CHECK_LAUNCH();
  }

  // NHWC stage 1: over the pooled rows (each window's argmax), or every row of z.
  int sums(const Args& a, const Drop& d) {
    const int C = dim(s_.C);
    const T* z = static_cast<const T*>(a.z);
    const T* dout = static_cast<const T*>(a.dout);
    const std::int64_t rows = s_.N * s_.PH() * s_.PW();
    const int blocks = reduce_blocks(rows, C);
    if (s_.pool)
      reduce_pool<<<blocks, kThreads, 0, gpu::stream()>>>(dout, reinterpret_cast<const uchar4*>(a.arg), z, a.scale, a.shift, s_.bn ? a.mean : nullptr,
                                                          s_.bn ? a.rstd : nullptr, rows, geom_, d, partial_.as<float>());
    else
      reduce_dense<<<blocks, kThreads, 0, gpu::stream()>>>(dout, z, reinterpret_cast<const float4*>(a.scale), reinterpret_cast<const float4*>(a.shift),
                                                           s_.bn ? reinterpret_cast<const float4*>(a.mean) : nullptr,
                                                           s_.bn ? reinterpret_cast<const float4*>(a.rstd) : nullptr, rows, C, d, per4(),
                                                           partial_.as<float>());
    HOTOPS_CHECK_LAUNCH();
    return blocks;
  }

  // NCHW stage 1 (a block a channel and sample stride) and stage 3.
  int sums_nchw(const Args& a, const Drop& d) {
    const int blocks = reduce_blocks_nchw(s_.N, dim(s_.C));
    launch_reduce_nchw(s_.pool ? Sum::pooled : Sum::dense, static_cast<const T*>(a.dout), a.arg, static_cast<const T*>(a.z), a.scale, a.shift,
                       s_.bn ? a.mean : nullptr, s_.bn ? a.rstd : nullptr, s_.N, geom_, d, pooled_nhwc(), blocks, partial_.as<float>());
    return blocks;
  }
  void dz_nchw(const Args& a, const Drop& d) {
    launch_dz_nchw(s_.pool, static_cast<const T*>(a.dout), a.arg, static_cast<const T*>(a.z), a.scale, a.shift, coef_.as<const float>(),
                   s_.bn ? a.mean : nullptr, s_.bn ? a.rstd : nullptr, static_cast<T*>(a.dz), s_.count(), geom_, d, pooled_nhwc());
  }

  std::int64_t per4() const { return s_.H * s_.W * s_.C / 4; }  // NHWC: the 4-vectors of a sample

  Shape s_;
  PoolGeom geom_;
  gpu::DeviceBuffer partial_;  // the per-block channel sums
  gpu::DeviceBuffer coef_;     // bwd: A, b0, c0 per channel
};

}  // namespace

std::unique_ptr<Plan> make_cuda_plan(const Shape& s) {
  if (s.dtype == DType::bf16) return std::make_unique<CudaReluMaxpool<bf16>>(s);
  return std::make_unique<CudaReluMaxpool<float>>(s);
}

}  // namespace relu_maxpool
}  // namespace hotops::batchnorm
