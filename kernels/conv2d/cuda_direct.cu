// conv2d on CUDA: hotops' direct forward kernel for few input channels (cuda_direct.h).
#include <cuda_bf16.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include "hotops/check.h"
#include "hotops/cuda_elem.cuh"
#include "hotops/cuda_util.h"
#include "kernels/conv2d/cuda_direct.h"

namespace hotops::conv2d::direct {
namespace {

constexpr unsigned kThreads = 256;
constexpr int kMaxTaps = 7 * 7;  // R * S

using bf16 = __nv_bfloat16;
using gpu::to_float;

struct Geom {
  int H, W, P, Q, R, S, sh, sw, ph, pw;
  std::int64_t pairs;  // N * P * ceil(Q / 2): a thread's unit of work
};

// y [N, P, Q, K] = conv(x [N, H, W, C], w [K, R, S, C]) (+ b [K]), NHWC. Thread t of the grid's
// strided range takes output pixels q0 = 2 (t % ceil(Q/2)) and q0 + 1 (when Q holds it) of row p of
// image n, all K channels: for each tap (r, s) and channel c, the two pixels' inputs times the tap's
// K weights (four at a time from shared memory, the same address across the warp: a broadcast) into
// 2 K f32 sums, in tap order. Padding reads as 0. The bias starts the sums.
template <class T, int C, int K>
__global__ void __launch_bounds__(kThreads) fwd(const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ b,
                                               T* __restrict__ y, Geom g) {
  static_assert(K % 8 == 0, "K in 16-byte output vectors");
  constexpr int kVec = 16 / static_cast<int>(sizeof(T));
  __shared__ float4 wsm[kMaxTaps * C * K / 4];  // [r][s][c][k]
  const int taps = g.R * g.S;
  float* wf = reinterpret_cast<float*>(wsm);
  for (int i = threadIdx.x; i < taps * C * K; i += blockDim.x) {
    const int k = i % K, tc = i / K;  // tc = (r S + s) C + c: w's index within filter k
    wf[i] = to_float(w[k * taps * C + tc]);
  }
  __syncthreads();
  const int Qh = (g.Q + 1) / 2;
  for (std::int64_t t = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; t < g.pairs;
       t += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t np = t / Qh;
    const int q0 = 2 * static_cast<int>(t - np * Qh);
    const std::int64_t n = np / g.P;
    const int p = static_cast<int>(np - n * g.P);
    const bool two = q0 + 1 < g.Q;
    float a0[K], a1[K];
#pragma unroll
    for (int k = 0; k < K; ++k) a0[k] = a1[k] = b ? to_float(b[k]) : 0.f;
    const int h0 = p * g.sh - g.ph, wa0 = q0 * g.sw - g.pw;
    for (int r = 0; r < g.R; ++r) {
      const int h = h0 + r;
      if (h < 0 || h >= g.H) continue;
      const T* row = x + (n * g.H + h) * static_cast<std::int64_t>(g.W) * C;
      for (int s = 0; s < g.S; ++s) {
        const int wa = wa0 + s, wb = wa + g.sw;
        const bool ina = wa >= 0 && wa < g.W, inb = two && wb >= 0 && wb < g.W;
        float xa[C], xb[C];
#pragma unroll
        for (int c = 0; c < C; ++c) {
          xa[c] = ina ? to_float(row[wa * C + c]) : 0.f;
          xb[c] = inb ? to_float(row[wb * C + c]) : 0.f;
        }
        const float4* wt = wsm + (r * g.S + s) * C * (K / 4);
#pragma unroll
        for (int c = 0; c < C; ++c)
#pragma unroll
          for (int k4 = 0; k4 < K / 4; ++k4) {
            const float4 v = wt[c * (K / 4) + k4];
            a0[4 * k4] = fmaf(xa[c], v.x, a0[4 * k4]), a1[4 * k4] = fmaf(xb[c], v.x, a1[4 * k4]);
            a0[4 * k4 + 1] = fmaf(xa[c], v.y, a0[4 * k4 + 1]), a1[4 * k4 + 1] = fmaf(xb[c], v.y, a1[4 * k4 + 1]);
            a0[4 * k4 + 2] = fmaf(xa[c], v.z, a0[4 * k4 + 2]), a1[4 * k4 + 2] = fmaf(xb[c], v.z, a1[4 * k4 + 2]);
            a0[4 * k4 + 3] = fmaf(xa[c], v.w, a0[4 * k4 + 3]), a1[4 * k4 + 3] = fmaf(xb[c], v.w, a1[4 * k4 + 3]);
          }
      }
    }
    T* out = y + ((n * g.P + p) * static_cast<std::int64_t>(g.Q) + q0) * K;
#pragma unroll
    for (int k = 0; k < K; k += kVec) {
      float v[kVec];
#pragma unroll
      for (int j = 0; j < kVec; ++j) v[j] = a0[k + j];
      gpu::store<T, kVec>(out + k, v);
      if (two) {
#pragma unroll
        for (int j = 0; j < kVec; ++j) v[j] = a1[k + j];
        gpu::store<T, kVec>(out + K + k, v);
      }
    }
  }
}

int dim(std::int64_t v) {
  HOTOPS_CHECK(v >= 0 && v <= 0x7fffffff, "conv2d: a dimension does not fit the direct kernel's int");
  return static_cast<int>(v);
}

template <class T, int C, int K>
void launch(const Shape& s, const Args& a) {
  Geom g{dim(s.H), dim(s.W), dim(s.P()), dim(s.Q()), dim(s.R), dim(s.S), dim(s.stride_h), dim(s.stride_w), dim(s.pad_h),
         dim(s.pad_w), s.N * s.P() * ((s.Q() + 1) / 2)};
  static const unsigned wave = gpu::resident_blocks(fwd<T, C, K>, kThreads, std::int64_t{1} << 30);
  const auto blocks = static_cast<unsigned>(std::min<std::int64_t>(wave, (g.pairs + kThreads - 1) / kThreads));
  fwd<T, C, K><<<std::max(blocks, 1u), kThreads, 0, gpu::stream()>>>(static_cast<const T*>(a.x), static_cast<const T*>(a.w),
                                                                      s.bias ? static_cast<const T*>(a.b) : nullptr,
                                                                      static_cast<T*>(a.out), g);
  HOTOPS_CHECK_LAUNCH();
}

template <class T>
void launch(const Shape& s, const Args& a) {
  if (s.C == 1) return s.K == 16 ? launch<T, 1, 16>(s, a) : launch<T, 1, 32>(s, a);
  return s.K == 16 ? launch<T, 3, 16>(s, a) : launch<T, 3, 32>(s, a);
}

}  // namespace

bool takes(const Shape& s) {
  return s.dir == Direction::fwd && s.layout == Layout::nhwc && s.groups == 1 && (s.C == 1 || s.C == 3) &&
         (s.K == 16 || s.K == 32) && s.dil_h == 1 && s.dil_w == 1 && s.R * s.S <= kMaxTaps &&
         (s.dtype == DType::f32 || s.dtype == DType::bf16);
}

void run(const Shape& s, const Args& a) {
  HOTOPS_CHECK(takes(s), "conv2d: the direct kernel does not take this pass");
  HOTOPS_CHECK(gpu::all_aligned(16, {a.out}), "conv2d: the direct kernel writes 16-byte vectors: y must be 16-byte aligned");
  if (s.dtype == DType::bf16) launch<bf16>(s, a);
  else launch<float>(s, a);
}

std::string label(const Shape& s) {
  return "hotops direct conv (" + std::to_string(s.C) + " input channel" + (s.C > 1 ? "s" : "") +
         ": a thread two output pixels x all " + std::to_string(s.K) + " channels, the filter in shared memory, f32 sums" +
         (s.bias ? ", the bias first" : "") + ")";
}

}  // namespace hotops::conv2d::direct
