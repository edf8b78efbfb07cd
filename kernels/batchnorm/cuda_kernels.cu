// batchnorm on CUDA, hand-written: two kernels per direction, built for a tensor that fits in L2.
//
//   1. reduce: per-channel partial sums, each channel split over many blocks (64 channels are far
//      too few blocks for 132 SMs). fwd sums (x - K) and (x - K)^2 with K a value of the channel
//      (its first element), so that a large mean costs no precision; bwd sums dy and dy*(x - mean).
//      Each block reduces in f32 and writes one partial; the last block of a channel to finish
//      (a counter per channel, reset by that block) combines the partials in double and writes the
//      per-channel results: fwd the saved mean/invstd, the running-stat update and y's scale and
//      shift; bwd dgamma, dbeta and dx's three coefficients.
//   2. apply: one elementwise pass, y = x*scale + shift or dx = k1*dy + k2*x + k3, reading x (and
//      dy) a second time, mostly from L2.
//   infer is the apply pass alone, with the coefficients from the running statistics.
// Mappings: NCHW walks each channel's N planes of H*W contiguous values with 16-byte vectors where
// H*W allows; NHWC and 1-D ([rows, C], channel fastest) give each thread a vector of channels and
// split the rows over threadIdx.y and blocks.
#include <cuda_bf16.h>

#include <algorithm>
#include <string>

#include "hotops/cuda_elem.cuh"
#include "hotops/cuda_util.h"
#include "kernels/batchnorm/batchnorm.h"

namespace hotops::batchnorm {
namespace {

constexpr int kThreads = 256;

using gpu::from_float;
using gpu::load;
using gpu::Pack;
using gpu::store;
using gpu::to_float;

enum class Mode { fwd, infer, bwd };

// Everything a kernel of either pass needs; passed by value.
struct Params {
  const void* x = nullptr;
  const void* dy = nullptr;
  void* out = nullptr;  // y or dx
  const float* gamma = nullptr;
  const float* beta = nullptr;
  float* running_mean = nullptr;
  float* running_var = nullptr;
  float* save_mean = nullptr;    // fwd: written; bwd: read
  float* save_invstd = nullptr;  // fwd: written; bwd: read
  float* dgamma = nullptr;
  float* dbeta = nullptr;
  float4* coef = nullptr;        // per channel: fwd {scale, shift}; bwd {k1, k2, k3}
  float2* partials = nullptr;    // NCHW [C][splits]; NHWC [splits][C]
  unsigned* counters = nullptr;  // NCHW one per channel; NHWC one per column of blocks
  long long N = 0, C = 0, HW = 0, rows = 0;  // rows = N*H*W (NHWC)
  long long per_block = 0;       // NCHW: vectors of a channel per block; NHWC: rows per block
  int splits = 1;
  float eps = 0, momentum = 0;
};

// Sums a and b over the block; the totals are valid in thread 0.
template <class A>
__device__ __forceinline__ void block_sum2(A& a, A& b) {
  __shared__ A sa[32], sb[32];
  const int tid = threadIdx.x + threadIdx.y * blockDim.x;
  const int nthreads = blockDim.x * blockDim.y;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    a += __shfl_xor_sync(0xffffffffu, a, o);
    b += __shfl_xor_sync(0xffffffffu, b, o);
  }
  if ((tid & 31) == 0) sa[tid >> 5] = a, sb[tid >> 5] = b;
  __syncthreads();
  if (tid < 32) {
    const int warps = (nthreads + 31) >> 5;
    a = tid < warps ? sa[tid] : A(0);
    b = tid < warps ? sb[tid] : A(0);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      a += __shfl_xor_sync(0xffffffffu, a, o);
      b += __shfl_xor_sync(0xffffffffu, b, o);
    }
  }
  __syncthreads();  // sa/sb may be reused by a later call
}

// Sums each of the K values over threadIdx.y through shared memory `sm` (K entries per thread);
// the totals are valid in the threads with threadIdx.y == 0.
template <int K, class A>
__device__ __forceinline__ void sum_over_y(A* sm, A (&v)[K]) {
  const int nt = blockDim.x * blockDim.y, tid = threadIdx.y * blockDim.x + threadIdx.x;
#pragma unroll
  for (int i = 0; i < K; ++i) sm[i * nt + tid] = v[i];
  __syncthreads();
  for (unsigned h = blockDim.y; h > 1;) {  // odd counts included
    const unsigned half = (h + 1) / 2;
    if (threadIdx.y < h - half)
#pragma unroll
      for (int i = 0; i < K; ++i) sm[i * nt + tid] += sm[i * nt + tid + half * blockDim.x];
    __syncthreads();
    h = half;
  }
#pragma unroll
  for (int i = 0; i < K; ++i) v[i] = sm[i * nt + tid];
  __syncthreads();
}

// The per-channel results, from the channel's two sums over n values (see the file comment).
template <Mode M>
__device__ void finalize_channel(const Params& p, long long c, double s1, double s2, double n, float shift) {
  const double gamma = p.gamma[c];
  if (M == Mode::fwd) {
    const double dm = s1 / n;
    const double mean = shift + dm;
    const double var = fmax(s2 / n - dm * dm, 0.0);
    const double invstd = 1.0 / sqrt(var + p.eps);
    const double m = p.momentum;
    p.save_mean[c] = static_cast<float>(mean);
    p.save_invstd[c] = static_cast<float>(invstd);
    p.running_mean[c] = static_cast<float>((1 - m) * p.running_mean[c] + m * mean);
    p.running_var[c] = static_cast<float>((1 - m) * p.running_var[c] + m * var * n / (n - 1));
    const double scale = gamma * invstd;
    p.coef[c] = make_float4(static_cast<float>(scale), static_cast<float>(p.beta[c] - mean * scale), 0.f, 0.f);
  } else {
    const double mean = p.save_mean[c], invstd = p.save_invstd[c];
    const double dbeta = s1, dgamma = s2 * invstd;
    p.dbeta[c] = static_cast<float>(dbeta);
    p.dgamma[c] = static_cast<float>(dgamma);
    const double k1 = gamma * invstd, k2 = -k1 * invstd * dgamma / n, k3 = -k1 * dbeta / n - k2 * mean;
    p.coef[c] = make_float4(static_cast<float>(k1), static_cast<float>(k2), static_cast<float>(k3), 0.f);
  }
}

// Adds VEC values' contribution to the two sums.
template <Mode M, int VEC>
__device__ __forceinline__ void accumulate(const float (&x)[VEC], const float (&dy)[VEC], float k, float& s1,
                                           float& s2) {
#pragma unroll
  for (int i = 0; i < VEC; ++i) {
    const float d = x[i] - k;
    if (M == Mode::fwd) {
      s1 += d;
      s2 = fmaf(d, d, s2);
    } else {
      s1 += dy[i];
      s2 = fmaf(dy[i], d, s2);
    }
  }
}

// ---- NCHW ----------------------------------------------------------------------------------------

// Walks vectors j0, j0 + step, ... of one channel (N planes of hwv vectors, planes C*hwv apart),
// keeping the tensor offset (in vectors) without a division per step.
struct ChannelWalk {
  long long k, off, dk, doff, hwv, wrap;
  __device__ ChannelWalk(long long j0, long long step, long long c, long long C, long long hwv_)
      : hwv(hwv_), wrap(C * hwv_ - hwv_) {
    const long long n = j0 / hwv;
    k = j0 - n * hwv;
    off = n * C * hwv + c * hwv + k;
    dk = step % hwv;
    doff = (step / hwv) * C * hwv + dk;
  }
  __device__ __forceinline__ void next() {
    k += dk;
    off += doff;
    if (k >= hwv) k -= hwv, off += wrap;
  }
};

// grid (splits, C): block `split` of channel c sums vectors [split*per_block, +per_block) of the
// channel's N*(HW/VEC) vectors.
template <class T, int VEC, Mode M>
__global__ void __launch_bounds__(kThreads) nchw_reduce(Params p) {
  const long long c = blockIdx.y;
  const long long hwv = p.HW / VEC, total = p.N * hwv;
  const long long begin = blockIdx.x * p.per_block, end = min(begin + p.per_block, total);
  const T* x = static_cast<const T*>(p.x);
  const T* dy = static_cast<const T*>(p.dy);
  const float k = M == Mode::fwd ? to_float(x[c * p.HW]) : p.save_mean[c];
  const long long step = blockDim.x;

  float s1 = 0.f, s2 = 0.f;
  float xv[4][VEC], dv[4][VEC];
  long long j = begin + threadIdx.x;
  ChannelWalk w(j, step, c, p.C, hwv);
  for (; j + 3 * step < end; j += 4 * step) {  // four vectors in flight per thread
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      load<T, VEC>(x + w.off * VEC, xv[u]);
      if (M == Mode::bwd) load<T, VEC>(dy + w.off * VEC, dv[u]);
      w.next();
    }
#pragma unroll
    for (int u = 0; u < 4; ++u) accumulate<M, VEC>(xv[u], dv[u], k, s1, s2);
  }
  for (; j < end; j += step) {
    load<T, VEC>(x + w.off * VEC, xv[0]);
    if (M == Mode::bwd) load<T, VEC>(dy + w.off * VEC, dv[0]);
    w.next();
    accumulate<M, VEC>(xv[0], dv[0], k, s1, s2);
  }
  block_sum2(s1, s2);

  __shared__ bool last;
  if (threadIdx.x == 0) {
    p.partials[c * p.splits + blockIdx.x] = make_float2(s1, s2);
    __threadfence();
    last = atomicAdd(&p.counters[c], 1u) == static_cast<unsigned>(p.splits - 1);
  }
  __syncthreads();
  if (!last) return;
  __threadfence();
  double d1 = 0, d2 = 0;
  for (int i = threadIdx.x; i < p.splits; i += blockDim.x) {
    const float2 q = __ldcg(&p.partials[c * p.splits + i]);
    d1 += q.x;
    d2 += q.y;
  }
  block_sum2(d1, d2);
  if (threadIdx.x == 0) {
    finalize_channel<M>(p, c, d1, d2, static_cast<double>(p.N * p.HW), k);
    p.counters[c] = 0;  // ready for the next run
  }
}

// The coefficients of channel c for the apply pass.
template <Mode M>
__device__ __forceinline__ float4 coefficients(const Params& p, long long c) {
  if (M != Mode::infer) return p.coef[c];
  const float scale = p.gamma[c] * rsqrtf(p.running_var[c] + p.eps);
  return make_float4(scale, p.beta[c] - p.running_mean[c] * scale, 0.f, 0.f);
}

// Grid-stride over all vectors; a vector lies in one plane (VEC divides H*W), whose channel is
// tracked as j advances rather than divided out.
template <class T, int VEC, Mode M>
__global__ void __launch_bounds__(kThreads) nchw_apply(Params p) {
  const long long hwv = p.HW / VEC, total = p.N * p.C * hwv;
  const T* x = static_cast<const T*>(p.x);
  const T* dy = static_cast<const T*>(p.dy);
  T* out = static_cast<T*>(p.out);
  const long long stride = static_cast<long long>(gridDim.x) * blockDim.x;
  const long long dr = stride % hwv, dc = (stride / hwv) % p.C;
  long long j = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x;
  long long r = j % hwv, c = (j / hwv) % p.C, cached = -1;
  float4 k = make_float4(0.f, 0.f, 0.f, 0.f);
  for (; j < total; j += stride) {
    if (c != cached) cached = c, k = coefficients<M>(p, c);
    float xv[VEC], dv[VEC], o[VEC];
    load<T, VEC>(x + j * VEC, xv);
    if (M == Mode::bwd) load<T, VEC>(dy + j * VEC, dv);
#pragma unroll
    for (int i = 0; i < VEC; ++i) o[i] = M == Mode::bwd ? fmaf(dv[i], k.x, fmaf(xv[i], k.y, k.z)) : fmaf(xv[i], k.x, k.y);
    store<T, VEC>(out + j * VEC, o);
    r += dr;
    c += dc;
    if (r >= hwv) r -= hwv, ++c;
    if (c >= p.C) c -= p.C;
  }
}

// ---- NHWC and 1-D: [rows, C] -----------------------------------------------------------------------

// block (tx, ty), grid (column blocks, splits): thread (tx, ty) of column block bx owns channels
// [(bx*tx_count + tx)*VEC, +VEC) and rows ty, ty + ty_count, ... of its split's per_block rows.
template <class T, int VEC, Mode M>
__global__ void __launch_bounds__(kThreads) nhwc_reduce(Params p) {
  const long long cv = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x;
  const long long c0 = cv * VEC;
  const bool active = c0 < p.C;
  const T* x = static_cast<const T*>(p.x);
  const T* dy = static_cast<const T*>(p.dy);
  const long long begin = blockIdx.y * p.per_block, end = min(begin + p.per_block, p.rows);
  const long long step = blockDim.y;

  float k[VEC], s1[VEC], s2[VEC];
#pragma unroll
  for (int i = 0; i < VEC; ++i) {
    k[i] = active ? (M == Mode::fwd ? to_float(x[c0 + i]) : p.save_mean[c0 + i]) : 0.f;
    s1[i] = 0.f;
    s2[i] = 0.f;
  }
  if (active) {
    float xv[2][VEC], dv[2][VEC];
    long long r = begin + threadIdx.y;
    for (; r + step < end; r += 2 * step) {  // two vectors in flight per thread
#pragma unroll
      for (int u = 0; u < 2; ++u) {
        load<T, VEC>(x + (r + u * step) * p.C + c0, xv[u]);
        if (M == Mode::bwd) load<T, VEC>(dy + (r + u * step) * p.C + c0, dv[u]);
      }
#pragma unroll
      for (int u = 0; u < 2; ++u)
#pragma unroll
        for (int i = 0; i < VEC; ++i) {
          const float d = xv[u][i] - k[i];
          if (M == Mode::fwd) s1[i] += d, s2[i] = fmaf(d, d, s2[i]);
          else s1[i] += dv[u][i], s2[i] = fmaf(dv[u][i], d, s2[i]);
        }
    }
    if (r < end) {
      load<T, VEC>(x + r * p.C + c0, xv[0]);
      if (M == Mode::bwd) load<T, VEC>(dy + r * p.C + c0, dv[0]);
#pragma unroll
      for (int i = 0; i < VEC; ++i) {
        const float d = xv[0][i] - k[i];
        if (M == Mode::fwd) s1[i] += d, s2[i] = fmaf(d, d, s2[i]);
        else s1[i] += dv[0][i], s2[i] = fmaf(dv[0][i], d, s2[i]);
      }
    }
  }

  // The block's sums over threadIdx.y, then one partial per channel.
  __shared__ double sm[2 * VEC * kThreads];  // the f32 stage uses the first half
  __shared__ bool last;
  float v[2 * VEC];
#pragma unroll
  for (int i = 0; i < VEC; ++i) v[i] = s1[i], v[VEC + i] = s2[i];
  sum_over_y<2 * VEC>(reinterpret_cast<float*>(sm), v);
  if (threadIdx.y == 0 && active)
#pragma unroll
    for (int i = 0; i < VEC; ++i) p.partials[blockIdx.y * p.C + c0 + i] = make_float2(v[i], v[VEC + i]);
  __threadfence();
  __syncthreads();
  const int tid = threadIdx.y * blockDim.x + threadIdx.x;
  if (tid == 0) last = atomicAdd(&p.counters[blockIdx.x], 1u) == static_cast<unsigned>(p.splits - 1);
  __syncthreads();
  if (!last) return;
  __threadfence();

  // The last block of this column: each thread sums its channels over splits ty, ty + ty_count, ...
  // in double, then the same tree over threadIdx.y.
  double d[2 * VEC];
#pragma unroll
  for (int i = 0; i < 2 * VEC; ++i) d[i] = 0;
  if (active) {
#pragma unroll 4
    for (long long s = threadIdx.y; s < p.splits; s += blockDim.y)
#pragma unroll
      for (int i = 0; i < VEC; ++i) {
        const float2 q = __ldcg(&p.partials[s * p.C + c0 + i]);
        d[i] += q.x;
        d[VEC + i] += q.y;
      }
  }
  sum_over_y<2 * VEC>(sm, d);
  if (threadIdx.y == 0 && active)
#pragma unroll
    for (int i = 0; i < VEC; ++i)
      finalize_channel<M>(p, c0 + i, d[i], d[VEC + i], static_cast<double>(p.rows), k[i]);
  if (tid == 0) p.counters[blockIdx.x] = 0;  // ready for the next run
}

// block (tx, ty), grid (column blocks, row blocks): each thread loads its channels' coefficients
// once, then walks rows.
template <class T, int VEC, Mode M>
__global__ void __launch_bounds__(kThreads) nhwc_apply(Params p) {
  const long long c0 = (blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x) * VEC;
  if (c0 >= p.C) return;
  const T* x = static_cast<const T*>(p.x);
  const T* dy = static_cast<const T*>(p.dy);
  T* out = static_cast<T*>(p.out);
  float4 k[VEC];
#pragma unroll
  for (int i = 0; i < VEC; ++i) k[i] = coefficients<M>(p, c0 + i);
  for (long long r = blockIdx.y * static_cast<long long>(blockDim.y) + threadIdx.y; r < p.rows;
       r += static_cast<long long>(gridDim.y) * blockDim.y) {
    float xv[VEC], dv[VEC], o[VEC];
    load<T, VEC>(x + r * p.C + c0, xv);
    if (M == Mode::bwd) load<T, VEC>(dy + r * p.C + c0, dv);
#pragma unroll
    for (int i = 0; i < VEC; ++i)
      o[i] = M == Mode::bwd ? fmaf(dv[i], k[i].x, fmaf(xv[i], k[i].y, k[i].z)) : fmaf(xv[i], k[i].x, k[i].y);
    store<T, VEC>(out + r * p.C + c0, o);
  }
}

// ---- launch configuration ------------------------------------------------------------------------

// The widest vector (elements, 16 bytes at most) that divides n.
int widest_vector(long long n, DType t) {
  for (int v = 16 / static_cast<int>(dtype_size(t)); v > 1; v /= 2)
    if (n % v == 0) return v;
  return 1;
}

long long ceil_div(long long a, long long b) { return (a + b - 1) / b; }

struct Launch {
  int vec = 1;
  dim3 reduce_grid, reduce_block, apply_grid, apply_block;
};

Launch plan_launch(const Shape& s, Params& p) {
  const int sms = gpu::limits().sms;
  Launch l;
  if (!s.channels_last()) {
    l.vec = widest_vector(p.HW, s.dtype);
    const long long per_channel = p.N * (p.HW / l.vec);  // vectors
    // About four blocks per SM in all, each with at least one vector per thread; at most 1024
    // partials per channel, so that the last block combines them in one step.
    const long long want = std::max(1LL, ceil_div(4LL * sms, p.C));
    const long long most = std::max(1LL, std::min(1024LL, per_channel / kThreads));
    const long long splits = std::min(want, most);
    // Whole unrolled steps (four vectors per thread) per block where there are that many, so that
    // no thread ends on a serial tail.
    const long long share = ceil_div(per_channel, splits);
    const long long grain = share >= 4 * kThreads ? 4 * kThreads : kThreads;
    p.per_block = splits == 1 ? per_channel : ceil_div(share, grain) * grain;
    p.splits = static_cast<int>(ceil_div(per_channel, p.per_block));
    l.reduce_grid = dim3(static_cast<unsigned>(p.splits), static_cast<unsigned>(p.C));
    l.reduce_block = dim3(kThreads);
    const long long vectors = p.N * p.C * (p.HW / l.vec);
    l.apply_grid = dim3(static_cast<unsigned>(std::min(ceil_div(vectors, kThreads), 8LL * sms)));
    l.apply_block = dim3(kThreads);
    return l;
  }
  l.vec = widest_vector(p.C, s.dtype);
  const long long cvec = p.C / l.vec;
  const int tx = static_cast<int>(std::min(cvec, 32LL));
  const int ty = kThreads / tx;
  const long long columns = ceil_div(cvec, tx);
  // About four blocks per SM in all, each thread with at least two rows; the last block of a
  // column reads splits / ty partials per thread, so keep that to 32 at most.
  const long long want = std::max(1LL, ceil_div(4LL * sms, columns));
  const long long most = std::max(1LL, std::min(32LL * ty, p.rows / (2LL * ty)));
  const long long splits = std::min(want, most);
  p.per_block = splits == 1 ? p.rows : ceil_div(ceil_div(p.rows, splits), 2LL * ty) * 2 * ty;
  p.splits = static_cast<int>(ceil_div(p.rows, p.per_block));
  l.reduce_block = l.apply_block = dim3(static_cast<unsigned>(tx), static_cast<unsigned>(ty));
  l.reduce_grid = dim3(static_cast<unsigned>(columns), static_cast<unsigned>(p.splits));
  const long long row_blocks = std::min(ceil_div(p.rows, ty), std::max(1LL, 8LL * sms / columns));
  l.apply_grid = dim3(static_cast<unsigned>(columns), static_cast<unsigned>(row_blocks));
  return l;
}

template <class T, int VEC>
void launch_typed(const Shape& s, const Launch& l, const Params& p) {
  cudaStream_t st = gpu::stream();
  const bool nchw = !s.channels_last();
  switch (s.dir) {
    case Direction::infer:
      if (nchw) nchw_apply<T, VEC, Mode::infer><<<l.apply_grid, l.apply_block, 0, st>>>(p);
      else nhwc_apply<T, VEC, Mode::infer><<<l.apply_grid, l.apply_block, 0, st>>>(p);
      HOTOPS_CHECK_LAUNCH();
      break;
    case Direction::bwd:
      if (nchw) nchw_reduce<T, VEC, Mode::bwd><<<l.reduce_grid, l.reduce_block, 0, st>>>(p);
      else nhwc_reduce<T, VEC, Mode::bwd><<<l.reduce_grid, l.reduce_block, 0, st>>>(p);
      HOTOPS_CHECK_LAUNCH();
      if (nchw) nchw_apply<T, VEC, Mode::bwd><<<l.apply_grid, l.apply_block, 0, st>>>(p);
      else nhwc_apply<T, VEC, Mode::bwd><<<l.apply_grid, l.apply_block, 0, st>>>(p);
      HOTOPS_CHECK_LAUNCH();
      break;
    default:
      if (nchw) nchw_reduce<T, VEC, Mode::fwd><<<l.reduce_grid, l.reduce_block, 0, st>>>(p);
      else nhwc_reduce<T, VEC, Mode::fwd><<<l.reduce_grid, l.reduce_block, 0, st>>>(p);
      HOTOPS_CHECK_LAUNCH();
      if (nchw) nchw_apply<T, VEC, Mode::fwd><<<l.apply_grid, l.apply_block, 0, st>>>(p);
      else nhwc_apply<T, VEC, Mode::fwd><<<l.apply_grid, l.apply_block, 0, st>>>(p);
      HOTOPS_CHECK_LAUNCH();
  }
}

template <class T>
void launch(const Shape& s, const Launch& l, const Params& p) {
  switch (l.vec) {
    case 1: return launch_typed<T, 1>(s, l, p);
    case 2: return launch_typed<T, 2>(s, l, p);
    case 4: return launch_typed<T, 4>(s, l, p);
    default:
      if constexpr (sizeof(T) == 2) return launch_typed<T, 8>(s, l, p);
      throw Error("batchnorm: no " + std::to_string(l.vec) + "-wide vector for this dtype");
  }
}

class CudaBatchnorm final : public Plan {
 public:
  explicit CudaBatchnorm(const Shape& s) : s_(s) {
    p_.N = s_.N;
    p_.C = s_.C;
    p_.HW = s_.H * s_.W;
    p_.rows = s_.per_channel();
    p_.eps = static_cast<float>(kEps);
    p_.momentum = static_cast<float>(kMomentum);
    launch_ = plan_launch(s_, p_);
    if (s_.dir != Direction::infer) {
      coef_ = gpu::DeviceBuffer(static_cast<std::size_t>(s_.C) * sizeof(float4));
      partials_ = gpu::DeviceBuffer(static_cast<std::size_t>(s_.C) * p_.splits * sizeof(float2));
      const std::size_t counters = s_.channels_last() ? launch_.reduce_grid.x : static_cast<std::size_t>(s_.C);
      counters_ = gpu::DeviceBuffer(counters * sizeof(unsigned));
      HOTOPS_CHECK_CUDA(cudaMemsetAsync(counters_.get(), 0, counters_.bytes(), gpu::stream()));
      p_.coef = coef_.as<float4>();
      p_.partials = partials_.as<float2>();
      p_.counters = counters_.as<unsigned>();
    }
  }

  void run(const Args& a) override {
    Params p = p_;
    p.x = a.x;
    p.dy = a.dy;
    p.out = a.out;
    p.gamma = a.gamma;
    p.beta = a.beta;
    p.running_mean = a.running_mean;
    p.running_var = a.running_var;
    p.save_mean = a.save_mean;
    p.save_invstd = a.save_invstd;
    p.dgamma = a.dgamma;
    p.dbeta = a.dbeta;
    if (s_.dtype == DType::bf16) launch<__nv_bfloat16>(s_, launch_, p);
    else launch<float>(s_, launch_, p);
  }

  std::string label() const override {
    const std::string vec = std::to_string(launch_.vec) + "-wide " + dtype_name(s_.dtype) + " vectors";
    const std::string map = s_.channels_last() ? "channels-last" : "NCHW";
    if (s_.dir == Direction::infer) return "hotops CUDA " + map + " apply, " + vec;
    return "hotops CUDA " + map + " reduce (" + std::to_string(p_.splits) + " blocks per " +
           (s_.channels_last() ? "channel column" : "channel") + ", last block combines) + apply, " + vec;
  }

 private:
  Shape s_;
  gpu::DeviceBuffer coef_, partials_, counters_;  // the reduce pass's scratch (fwd, bwd)
  Params p_;  // the sizes, launch split and scratch; run() adds the tensors
  Launch launch_;
};

}  // namespace

std::unique_ptr<Plan> make_kernels_plan(const Shape& s) { return std::make_unique<CudaBatchnorm>(s); }

}  // namespace hotops::batchnorm
