// The fused attention kernels (cuda_fused.h): mma.sync m16n8k16 bf16 -> f32 on fragments loaded by
// ldmatrix from shared memory. A block holds one (sample, head)'s Q, K and V (and dO) whole, padded
// with zeros to 16 KT rows, and has KT warps, a warp 16 rows against all of them. Blocks stay
// resident and take the heads one after another, the next one's rows copied in (cp.async) while
// they compute on this one's where two fit in shared memory. Rows of 64 bf16 are stored 72 apart
// (144 bytes), so that the eight rows of an ldmatrix fall in different banks; results leave through
// shared memory in 16-byte stores.
//
// Fragment layouts (PTX ISA, mma.m16n8k16 with .bf16): lane = 4 g + t; A 16x16 row-major: a0 (g,
// 2t..2t+1), a1 (g+8, 2t..), a2 (g, 2t+8..), a3 (g+8, 2t+8..); B 16x8 (k x n): b0 (k 2t..2t+1, n g),
// b1 (k 2t+8.., n g); C 16x8 f32: c0 c1 (g, 2t..2t+1), c2 c3 (g+8, 2t..). Two C tiles side by side
// are, rounded to bf16, the A fragment of the next product over those 16 columns, which is how the
// probabilities (and their gradients) go from one product to the next without leaving registers.
#include "kernels/attention/cuda_fused.h"

#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <initializer_list>

#include "hotops/check.h"
#include "hotops/cuda_elem.cuh"
#include "hotops/cuda_util.h"

namespace hotops::attention::fused {
namespace {

using bf16 = __nv_bfloat16;
using gpu::mma_bf16;
using gpu::pack_bf16x2;
using gpu::shared_address;

constexpr int kD = 64;              // head_dim
constexpr int kStride = kD + 8;     // a row in shared memory, in bf16
constexpr float kScale = 0.125f;    // 1 / sqrt(64)
constexpr float kLog2e = 1.4426950408889634f;

struct Dims {
  int batch, seq, heads;
  long long qkv_row;  // elements from one token's qkv to the next: 3 hidden
  long long hidden;   // heads x 64: one token's ctx row
};

// Four 8x8 bf16 matrices, lane l giving the address of row l % 8 of matrix l / 8.
__device__ __forceinline__ void ldmatrix_x4(unsigned r[4], const bf16* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(shared_address(p)));
}
__device__ __forceinline__ void ldmatrix_x4_trans(unsigned r[4], const bf16* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(shared_address(p)));
}

// The A fragment of the 16x16 tile whose first element is p (rows kStride apart).
__device__ __forceinline__ void load_a(unsigned a[4], const bf16* p, int lane) {
  ldmatrix_x4(a, p + ((lane & 7) + ((lane >> 3) & 1) * 8) * kStride + (lane >> 4) * 8);
}
// B fragments where B^T is stored (rows = B's n, columns = B's k): 8 rows from p, 32 columns;
// b[0] b[1] the k-step of columns 0..15, b[2] b[3] that of 16..31.
__device__ __forceinline__ void load_b_rows(unsigned b[4], const bf16* p, int lane) {
  ldmatrix_x4(b, p + (lane & 7) * kStride + (lane >> 3) * 8);
}
// B fragments where B itself is stored (rows = k): the 16 rows from p, 16 columns; b[0] b[1] the
// n-tile of columns 0..7, b[2] b[3] that of 8..15.
__device__ __forceinline__ void load_b_cols(unsigned b[4], const bf16* p, int lane) {
  ldmatrix_x4_trans(b, p + ((lane & 7) + ((lane >> 3) & 1) * 8) * kStride + (lane >> 4) * 8);
}

// The A fragments of the warp's 16 rows of a 64-wide tensor in shared memory (from `rows`), as four
// k-steps of 16 columns.
__device__ __forceinline__ void load_a_rows(unsigned a[4][4], const bf16* rows, int lane) {
#pragma unroll
  for (int k = 0; k < 4; ++k) load_a(a[k], rows + k * 16, lane);
}
// c[0], c[1] += A . B over the 16 columns whose B^T rows start at `rows` (the two 8-column tiles),
// A the warp's 16 x 64 operand as four k-steps of fragments: a product of the warp's rows with 16
// rows of another tensor (Q K^T, dO V^T and their transposes).
__device__ __forceinline__ void times_rows(float c[2][4], const unsigned a[4][4], const bf16* rows, int lane) {
#pragma unroll
  for (int jj = 0; jj < 2; ++jj)
#pragma unroll
    for (int kp = 0; kp < 2; ++kp) {
      unsigned bb[4];
      load_b_rows(bb, rows + jj * 8 * kStride + kp * 32, lane);
      mma_bf16(c[jj], a[2 * kp], bb[0], bb[1]);
      mma_bf16(c[jj], a[2 * kp + 1], bb[2], bb[3]);
    }
}
// acc += A . B, A one 16 x 16 fragment, B the 16 rows x 64 columns stored from `rows`: a 16-row
// step of a product into the warp's 16 x 64 result (P V, dS K, P^T dO, dS^T Q).
__device__ __forceinline__ void accumulate(float acc[8][4], const unsigned a[4], const bf16* rows, int lane) {
#pragma unroll
  for (int np = 0; np < 4; ++np) {
    unsigned bb[4];
    load_b_cols(bb, rows + np * 16, lane);
    mma_bf16(acc[2 * np], a, bb[0], bb[1]);
    mma_bf16(acc[2 * np + 1], a, bb[2], bb[3]);
  }
}
// Two C tiles side by side, rows g and g + 8 scaled by r0 and r1, as the bf16 A fragment of their 16 columns.
__device__ __forceinline__ void to_fragment(unsigned a[4], const float c[2][4], float r0 = 1.f, float r1 = 1.f) {
  a[0] = pack_bf16x2(c[0][0] * r0, c[0][1] * r0);
  a[1] = pack_bf16x2(c[0][2] * r1, c[0][3] * r1);
  a[2] = pack_bf16x2(c[1][0] * r0, c[1][1] * r0);
  a[3] = pack_bf16x2(c[1][2] * r1, c[1][3] * r1);
}

// The first `count` rows of one head's Q, K, V (or dO) into shared memory, 16 bytes a thread at a
// time, copied asynchronously (cp.async: every copy of the block in flight at once; rows at or past
// seq filled with zeros); commit_rows() closes a group of them, wait_rows() waits for every group.
__device__ __forceinline__ void load_rows(bf16* dst, const bf16* src, long long stride, int count, int seq) {
  for (int i = threadIdx.x; i < count * (kD / 8); i += blockDim.x) {
    const int r = i / (kD / 8), c = (i % (kD / 8)) * 8;
    const bool in = r < seq;
    gpu::copy16_async(dst + r * kStride + c, src + (in ? r : 0) * stride + c, in);
  }
}
__device__ __forceinline__ void commit_rows() { gpu::commit_async(); }
__device__ __forceinline__ void wait_rows() { gpu::wait_async_groups<0>(); }
// Waits for every group but the last one committed.
__device__ __forceinline__ void wait_rows_but_last() { gpu::wait_async_groups<1>(); }

// A warp's 16 x 64 result (8 C tiles) as bf16 into rows row0 .. row0 + 15 of out (rows `stride`
// apart), those below seq, through the warp's 16 staging rows in shared memory (kStride apart), so
// that it leaves in 16-byte stores, a row's 128 bytes by 8 lanes.
__device__ __forceinline__ void store_tile(const float acc[8][4], bf16* stage, bf16* out, long long stride, int row0, int seq,
                                           int lane) {
  const int g = lane / 4, t = lane % 4;
#pragma unroll
  for (int n = 0; n < 8; ++n) {
    *reinterpret_cast<__nv_bfloat162*>(stage + g * kStride + n * 8 + 2 * t) = __floats2bfloat162_rn(acc[n][0], acc[n][1]);
    *reinterpret_cast<__nv_bfloat162*>(stage + (g + 8) * kStride + n * 8 + 2 * t) = __floats2bfloat162_rn(acc[n][2], acc[n][3]);
  }
  __syncwarp();
#pragma unroll
  for (int i = lane; i < 16 * (kD / 8); i += 32) {
    const int r = i / (kD / 8), c = (i % (kD / 8)) * 8;
    if (row0 + r < seq) *reinterpret_cast<uint4*>(out + (row0 + r) * stride + c) = *reinterpret_cast<const uint4*>(stage + r * kStride + c);
  }
  __syncwarp();
}

__device__ __forceinline__ float quad_max(float v) {
  v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
  return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}
__device__ __forceinline__ float quad_sum(float v) {
  v += __shfl_xor_sync(0xffffffffu, v, 1);
  return v + __shfl_xor_sync(0xffffffffu, v, 2);
}

// One head of the forward, from its Q, K and V rows in shared memory (sq, then sk and sv after it).
template <int KT>
__device__ __forceinline__ void forward_head(const Dims& d, int bh, const bf16* sq, bf16* __restrict__ ctx,
                                             float* __restrict__ lse) {
  const bf16* sk = sq + 16 * KT * kStride;
  const bf16* sv = sk + 16 * KT * kStride;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  unsigned qa[4][4];
  load_a_rows(qa, sq + warp * 16 * kStride, lane);
  float s[KT][2][4] = {};  // 16 keys a step
#pragma unroll
  for (int kk = 0; kk < KT; ++kk) times_rows(s[kk], qa, sk + kk * 16 * kStride, lane);
  // Rows g and g + 8 of the warp: their maxima and sums over the quad's columns.
  float m0 = -INFINITY, m1 = -INFINITY;
#pragma unroll
  for (int kk = 0; kk < KT; ++kk)
#pragma unroll
    for (int jj = 0; jj < 2; ++jj)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        float* c = s[kk][jj];
        const bool key = (2 * kk + jj) * 8 + 2 * t + e < d.seq;
        c[e] = key ? c[e] * (kScale * kLog2e) : -INFINITY;
        c[2 + e] = key ? c[2 + e] * (kScale * kLog2e) : -INFINITY;
        m0 = fmaxf(m0, c[e]), m1 = fmaxf(m1, c[2 + e]);
      }
  m0 = quad_max(m0), m1 = quad_max(m1);
  float l0 = 0, l1 = 0;
#pragma unroll
  for (int kk = 0; kk < KT; ++kk)
#pragma unroll
    for (int jj = 0; jj < 2; ++jj)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        float* c = s[kk][jj];
        c[e] = exp2f(c[e] - m0), c[2 + e] = exp2f(c[2 + e] - m1);
        l0 += c[e], l1 += c[2 + e];
      }
  l0 = quad_sum(l0), l1 = quad_sum(l1);
  float o[8][4] = {};
#pragma unroll
  for (int kk = 0; kk < KT; ++kk) {
    unsigned pa[4];  // P in bf16
    to_fragment(pa, s[kk], 1.f / l0, 1.f / l1);
    accumulate(o, pa, sv + kk * 16 * kStride, lane);
  }
  const int row = warp * 16 + g;
  store_tile(o, const_cast<bf16*>(sq) + warp * 16 * kStride,  // the warp's own Q rows, read by it alone and done with
             ctx + static_cast<long long>(bh / d.heads) * d.seq * d.hidden + (bh % d.heads) * kD, d.hidden, warp * 16, d.seq, lane);
  if (t == 0) {
    float* out = lse + static_cast<long long>(bh) * d.seq;
    if (row < d.seq) out[row] = m0 + log2f(l0);
    if (row + 8 < d.seq) out[row + 8] = m1 + log2f(l1);
  }
}

// How many heads' tensors a block holds at once: two (the next one's copies in flight while it
// computes on this one's) where they fit in shared memory beside the kernel's other `extra_bytes`,
// else one.
constexpr std::size_t kMaxSmem = 227 * 1024;
__host__ __device__ constexpr int stages(std::size_t stage_bytes, std::size_t extra_bytes = 0) {
  return 2 * stage_bytes + extra_bytes <= kMaxSmem ? 2 : 1;
}
__host__ __device__ constexpr std::size_t fwd_stage(int kt) { return static_cast<std::size_t>(48 * kt) * kStride * sizeof(bf16); }
__host__ __device__ constexpr std::size_t bwd_stage(int kt) { return static_cast<std::size_t>(64 * kt) * kStride * sizeof(bf16); }
// The backward's shared memory after its stages: 16 staging rows a warp, then each row's lse and D.
__host__ __device__ constexpr std::size_t bwd_extra(int kt) {
  return static_cast<std::size_t>(16 * kt) * kStride * sizeof(bf16) + 32 * kt * sizeof(float);
}

// The forward: a block per SM share of the (sample, head) pairs, one after another, a warp per 16
// query rows; KT: the keys padded to 16 KT, KT warps. saved[bh * seq + row]: the row's
// log2-sum-exp2 of its scores in log2 units (scores x scale x log2 e), from which the backward
// recomputes P = exp2(s - lse).
template <int KT>
__global__ void __launch_bounds__(32 * KT, KT <= 8 ? 2 : 1) forward_kernel(Dims d, const bf16* __restrict__ qkv, bf16* __restrict__ ctx,
                                                            float* __restrict__ lse) {
  extern __shared__ __align__(16) unsigned char smem[];
  constexpr int kStages = stages(fwd_stage(KT));
  const int pairs = d.batch * d.heads;
  auto fetch = [&](int bh, int stage) {  // Q, K and V of one head into one stage
    bf16* sq = reinterpret_cast<bf16*>(smem + stage * fwd_stage(KT));
    const bf16* head = qkv + static_cast<long long>(bh / d.heads) * d.seq * d.qkv_row + (bh % d.heads) * kD;
    for (int m = 0; m < 3; ++m) load_rows(sq + m * 16 * KT * kStride, head + m * d.hidden, d.qkv_row, 16 * KT, d.seq);
    commit_rows();
  };
  if (blockIdx.x < pairs) fetch(blockIdx.x, 0);
  for (int bh = blockIdx.x, it = 0; bh < pairs; bh += gridDim.x, ++it) {
    const int stage = kStages == 2 ? it % 2 : 0;
    if (kStages == 2) {
      if (bh + static_cast<int>(gridDim.x) < pairs) fetch(bh + gridDim.x, 1 - stage);
      else commit_rows();  // an empty group: the wait below is for this head's either way
      wait_rows_but_last();
    } else {
      wait_rows();
    }
    __syncthreads();
    forward_head<KT>(d, bh, reinterpret_cast<const bf16*>(smem + stage * fwd_stage(KT)), ctx, lse);
    __syncthreads();  // every warp done with the stage before it is filled again
    if (kStages == 1 && bh + static_cast<int>(gridDim.x) < pairs) fetch(bh + gridDim.x, 0);
  }
}

// One head of the backward, from its Q, K, V and dO rows in shared memory (sq, then sk, sv, sdo after
// it) and its rows' lse and D (sl, sd): a warp takes 16 query rows for dQ = dS . K x scale (dS = P
// (dP - D), dP = dO . V^T), then 16 key rows for dV = P^T . dO and dK = dS^T . Q x scale over every
// query (P^T and dP^T recomputed as K . Q^T and V . dO^T).
template <int KT>
__device__ __forceinline__ void backward_head(const Dims& d, int bh, const bf16* sq, const float* sl, const float* sd,
                                              bf16* staging, bf16* __restrict__ dqkv) {
  const bf16* sk = sq + 16 * KT * kStride;
  const bf16* sv = sk + 16 * KT * kStride;
  const bf16* sdo = sv + 16 * KT * kStride;
  bf16* out = dqkv + static_cast<long long>(bh / d.heads) * d.seq * d.qkv_row + (bh % d.heads) * kD;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int row = warp * 16 + g;  // the warp's rows: row and row + 8 (queries, then keys)
  {  // dQ of the warp's query rows
    unsigned qa[4][4], da[4][4];
    load_a_rows(qa, sq + warp * 16 * kStride, lane);
    load_a_rows(da, sdo + warp * 16 * kStride, lane);
    const float l0 = sl[row], l1 = sl[row + 8], d0 = sd[row], d1 = sd[row + 8];
    float dq[8][4] = {};
#pragma unroll 2
    for (int kk = 0; kk < KT; ++kk) {
      float s[2][4] = {}, dp[2][4] = {};
      times_rows(s, qa, sk + kk * 16 * kStride, lane);
      times_rows(dp, da, sv + kk * 16 * kStride, lane);
      float ds[2][4];
#pragma unroll
      for (int jj = 0; jj < 2; ++jj)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const bool key = (2 * kk + jj) * 8 + 2 * t + e < d.seq;
          const float p0 = key ? exp2f(s[jj][e] * (kScale * kLog2e) - l0) : 0.f;
          const float p1 = key ? exp2f(s[jj][2 + e] * (kScale * kLog2e) - l1) : 0.f;
          ds[jj][e] = p0 * (dp[jj][e] - d0) * kScale;
          ds[jj][2 + e] = p1 * (dp[jj][2 + e] - d1) * kScale;
        }
      unsigned sa[4];
      to_fragment(sa, ds);
      accumulate(dq, sa, sk + kk * 16 * kStride, lane);
    }
    store_tile(dq, staging + warp * 16 * kStride, out, d.qkv_row, warp * 16, d.seq, lane);
  }
  // dK and dV of the warp's key rows
  unsigned ka[4][4], va[4][4];
  load_a_rows(ka, sk + warp * 16 * kStride, lane);
  load_a_rows(va, sv + warp * 16 * kStride, lane);
  float dk[8][4] = {}, dv[8][4] = {};
#pragma unroll 2
  for (int qq = 0; qq < KT; ++qq) {
    float st[2][4] = {}, dpt[2][4] = {};  // rows: keys g, g + 8; columns: queries
    times_rows(st, ka, sq + qq * 16 * kStride, lane);
    times_rows(dpt, va, sdo + qq * 16 * kStride, lane);
    float p[2][4], ds[2][4];
#pragma unroll
    for (int jj = 0; jj < 2; ++jj)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int q = (2 * qq + jj) * 8 + 2 * t + e;
        const float lq = sl[q], dq = sd[q];
        p[jj][e] = exp2f(st[jj][e] * (kScale * kLog2e) - lq);
        p[jj][2 + e] = exp2f(st[jj][2 + e] * (kScale * kLog2e) - lq);
        ds[jj][e] = p[jj][e] * (dpt[jj][e] - dq) * kScale;
        ds[jj][2 + e] = p[jj][2 + e] * (dpt[jj][2 + e] - dq) * kScale;
      }
    unsigned pa[4], sa[4];
    to_fragment(pa, p);
    to_fragment(sa, ds);
    accumulate(dv, pa, sdo + qq * 16 * kStride, lane);
    accumulate(dk, sa, sq + qq * 16 * kStride, lane);
  }
  store_tile(dk, staging + warp * 16 * kStride, out + d.hidden, d.qkv_row, warp * 16, d.seq, lane);
  store_tile(dv, staging + warp * 16 * kStride, out + 2 * d.hidden, d.qkv_row, warp * 16, d.seq, lane);
}

// The backward: as the forward, a block per SM share of the (sample, head) pairs; D = rowsum(dO * O)
// of every row of a head before its products.
template <int KT>
__global__ void __launch_bounds__(32 * KT, 1) backward_kernel(Dims d, const bf16* __restrict__ qkv, const bf16* __restrict__ ctx,
                                                             const bf16* __restrict__ dctx, const float* __restrict__ lse,
                                                             bf16* __restrict__ dqkv) {
  extern __shared__ __align__(16) unsigned char smem[];
  constexpr int kStages = stages(bwd_stage(KT), bwd_extra(KT));
  bf16* staging = reinterpret_cast<bf16*>(smem + kStages * bwd_stage(KT));  // [16 KT] rows: a warp's results on their way out
  float* sl = reinterpret_cast<float*>(staging + 16 * KT * kStride);     // [16 KT]: lse, +inf past seq (P = 0)
  float* sd = sl + 16 * KT;                                              // [16 KT]: D, 0 past seq
  const int pairs = d.batch * d.heads;
  auto fetch = [&](int bh, int stage) {  // Q, K, V and dO of one head into one stage
    bf16* sq = reinterpret_cast<bf16*>(smem + stage * bwd_stage(KT));
    const long long tokens = static_cast<long long>(bh / d.heads) * d.seq;
    const bf16* head = qkv + tokens * d.qkv_row + (bh % d.heads) * kD;
    for (int m = 0; m < 3; ++m) load_rows(sq + m * 16 * KT * kStride, head + m * d.hidden, d.qkv_row, 16 * KT, d.seq);
    load_rows(sq + 3 * 16 * KT * kStride, dctx + tokens * d.hidden + (bh % d.heads) * kD, d.hidden, 16 * KT, d.seq);
    commit_rows();
  };
  if (blockIdx.x < pairs) fetch(blockIdx.x, 0);
  for (int bh = blockIdx.x, it = 0; bh < pairs; bh += gridDim.x, ++it) {
    const int stage = kStages == 2 ? it % 2 : 0;
    if (kStages == 2) {
      if (bh + static_cast<int>(gridDim.x) < pairs) fetch(bh + gridDim.x, 1 - stage);
      else commit_rows();
    }
    {  // lse and D of every row, read while the copies land: two threads a row, 32 columns each
      const int r = threadIdx.x / 2, half = threadIdx.x % 2;
      const bool in = r < d.seq;
      const long long at = (static_cast<long long>(bh / d.heads) * d.seq + r) * d.hidden + (bh % d.heads) * kD + half * 32;
      float acc = 0;
      if (in) {
#pragma unroll
        for (int c = 0; c < 32; c += 8) {
          const uint4 ov = *reinterpret_cast<const uint4*>(ctx + at + c), dv = *reinterpret_cast<const uint4*>(dctx + at + c);
          const __nv_bfloat162* o2 = reinterpret_cast<const __nv_bfloat162*>(&ov);
          const __nv_bfloat162* d2 = reinterpret_cast<const __nv_bfloat162*>(&dv);
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const float2 of = __bfloat1622float2(o2[e]), df = __bfloat1622float2(d2[e]);
            acc += of.x * df.x + of.y * df.y;
          }
        }
      }
      acc += __shfl_xor_sync(0xffffffffu, acc, 1);
      if (half == 0) {
        sd[r] = acc;
        sl[r] = in ? lse[static_cast<long long>(bh) * d.seq + r] : INFINITY;
      }
    }
    if (kStages == 2) wait_rows_but_last();
    else wait_rows();
    __syncthreads();
    backward_head<KT>(d, bh, reinterpret_cast<const bf16*>(smem + stage * bwd_stage(KT)), sl, sd, staging, dqkv);
    __syncthreads();  // every warp done with the stage, lse and D before they are filled again
    if (kStages == 1 && bh + static_cast<int>(gridDim.x) < pairs) fetch(bh + gridDim.x, 0);
  }
}

// The two kernels of one key padding (16 KT, KT warps a block), their shared memory allowed and
// their grids (the blocks resident on every SM at once) found once.
struct Kernels {
  void (*fwd)(Dims, const bf16*, bf16*, float*);
  void (*bwd)(Dims, const bf16*, const bf16*, const bf16*, const float*, bf16*);
  unsigned threads;
  std::size_t fwd_smem, bwd_smem;
  int fwd_blocks, bwd_blocks;
};

template <class Kernel>
int resident(Kernel k, unsigned threads, std::size_t smem) {
  HOTOPS_CHECK_CUDA(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
  int per_sm = 0;
  HOTOPS_CHECK_CUDA(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, k, static_cast<int>(threads), smem));
  HOTOPS_CHECK(per_sm > 0, "fused attention: a block does not fit on an SM");
  return per_sm * gpu::limits().sms;
}

template <int KT>
const Kernels& kernels_of() {
  static const Kernels k = [] {
    Kernels r{forward_kernel<KT>, backward_kernel<KT>, 32 * KT, stages(fwd_stage(KT)) * fwd_stage(KT),
              stages(bwd_stage(KT), bwd_extra(KT)) * bwd_stage(KT) + bwd_extra(KT), 0, 0};
    r.fwd_blocks = resident(r.fwd, r.threads, r.fwd_smem);
    r.bwd_blocks = resident(r.bwd, r.threads, r.bwd_smem);
    return r;
  }();
  return k;
}

// The smallest padding of seq that an instance has: 64, 128 (BERT's), 208 (ViT's 197), 256.
const Kernels& kernels_for(std::int64_t seq) {
  if (seq <= 64) return kernels_of<4>();
  if (seq <= 128) return kernels_of<8>();
  if (seq <= 208) return kernels_of<13>();
  return kernels_of<16>();
}

Dims dims(std::int64_t batch, std::int64_t seq, std::int64_t heads) {
  return {static_cast<int>(batch), static_cast<int>(seq), static_cast<int>(heads), 3 * heads * kD, heads * kD};
}

void check_aligned(std::initializer_list<const void*> ptrs) {
  for (const void* p : ptrs)
    HOTOPS_CHECK(reinterpret_cast<std::uintptr_t>(p) % 16 == 0, "fused attention: tensors must be 16-byte aligned");
}

}  // namespace

std::string unsupported_reason(DType t, std::int64_t seq, std::int64_t head_dim) {
  if (t != DType::bf16) return "the fused kernels are bf16 only (tensor-core mma.sync)";
  if (head_dim != kD) return "the fused kernels take head_dim 64, not " + std::to_string(head_dim);
  if (seq < 1 || seq > kMaxSeq) return "the fused kernels take seq up to " + std::to_string(kMaxSeq) + ", not " + std::to_string(seq);
  return "";
}

std::size_t saved_bytes(std::int64_t batch, std::int64_t seq, std::int64_t heads) {
  return static_cast<std::size_t>(batch * heads * seq) * sizeof(float);
}

void forward(std::int64_t batch, std::int64_t seq, std::int64_t heads, const void* qkv, void* ctx, float* saved) {
  check_aligned({qkv, ctx, saved});
  const Kernels& k = kernels_for(seq);
  k.fwd<<<static_cast<unsigned>(std::min<std::int64_t>(batch * heads, k.fwd_blocks)), k.threads, k.fwd_smem, gpu::stream()>>>(
      dims(batch, seq, heads), static_cast<const bf16*>(qkv), static_cast<bf16*>(ctx), saved);
  HOTOPS_CHECK_LAUNCH();
}

void backward(std::int64_t batch, std::int64_t seq, std::int64_t heads, const void* qkv, const void* ctx, const void* dctx,
              const float* saved, void* dqkv) {
  check_aligned({qkv, ctx, dctx, saved, dqkv});
  const Kernels& k = kernels_for(seq);
  k.bwd<<<static_cast<unsigned>(std::min<std::int64_t>(batch * heads, k.bwd_blocks)), k.threads, k.bwd_smem, gpu::stream()>>>(
      dims(batch, seq, heads), static_cast<const bf16*>(qkv), static_cast<const bf16*>(ctx), static_cast<const bf16*>(dctx),
      saved, static_cast<bf16*>(dqkv));
  HOTOPS_CHECK_LAUNCH();
}

}  // namespace hotops::attention::fused
