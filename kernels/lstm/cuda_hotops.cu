// lstm on CUDA, hotops' own layer for bf16 at a hidden size H that is a multiple of 16 up to 128:
// every step's input projection x_t W_ih^T in one GEMM (matmul's plan, f32 out) before the
// recurrence, then one kernel that runs all T steps. A block carries 8 samples of one direction and
// has H / 16 warps; a warp holds in registers, as mma.sync A fragments, the rows of W_hh of all four
// gates of its 16 hidden units (4 x H/16 fragments: 128 registers at H = 128), so that a step reads
// no weights: its product h_{t-1} W_hh^T is 4 x H/16 mma.sync (m16n8k16, bf16 operands, f32 sums)
// on the 8 samples' h_{t-1} from shared memory, and each lane ends up with all four gates of the same
// two units of two samples: the cell's update, c in f32, stays in registers. h is rounded to bf16
// once a step (the next product's operand and y). One __syncthreads a step, h double-buffered; the
// rows a step reads from memory arrive in shared memory (cp.async) five steps ahead, since a step
// is shorter than the memory's latency. The gates' nonlinearities are the hardware's tanh.approx
// (sigmoid(x) = (1 + tanh(x / 2)) / 2), whose relative error, about 2^-11 (PTX ISA), is below the
// 2^-9 of bf16's rounding of h.
//
// The backward runs the steps in reverse the same way, W_hh^T in registers (A[unit][gate row]):
// from dh (dy_t plus the previous step's dh_{t-1} = dgates W_hh), the saved gates and c_{t-1}, the gate
// gradients, kept in bf16 [T*B, D*4H]; then the weight and input gradients are three GEMMs over all
// steps at once: dx = dG W_ih, dW_ih = dG^T x with db as its bias gradient, dW_hh = dG^T h_{t-1}
// per direction. Batches of any size: blocks of 8 samples, the last one padded with zeros.
//
// The weight space is PyTorch's tensors one after another, W_ih [D,4H,I] | W_hh [D,4H,H] | b_ih |
// b_hh (bf16), and the gradient space likewise (db in both bias slots).
#include <cuda_bf16.h>

#include <array>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "hotops/check.h"
#include "hotops/cuda_elem.cuh"
#include "hotops/cuda_util.h"
#include "kernels/lstm/lstm.h"
#include "kernels/matmul/matmul.h"

namespace hotops::lstm {
namespace {

using bf16 = __nv_bfloat16;
using gpu::mma_bf16;

constexpr int kTile = 8;  // the samples of a block: an mma's n

struct Dims {
  int T, B, D;
};

// The tensors of the recurrence, forward.
struct ForwardArgs {
  float* gates;      // [T*B, D*4H]: x W_ih^T on entry; training: the gates' activations on exit
  const bf16* w_hh;  // [D, 4H, H]
  const bf16* b_ih;  // [D, 4H]
  const bf16* b_hh;  // [D, 4H]
  const bf16* h0;    // [D, B, H], or null: zeros
  const bf16* c0;    // likewise
  bf16* y;           // [T, B, D*H]
  bf16* hT;          // [D, B, H], or null
  bf16* cT;          // likewise
  float* cprev;      // training: [D, T, B, H] the c each step read, at the step's time; else null
  bf16* hprev;       // training: [D, T, B, H] the h each step read
};

// The tensors of the recurrence, backward.
struct BackwardArgs {
  const float* gates;  // [T*B, D*4H] the forward's activations (i, f, g, o)
  const float* cprev;  // [D, T, B, H]
  const bf16* w_hh;    // [D, 4H, H]
  const bf16* dy;      // [T, B, D*H]
  const bf16* dhT;     // [D, B, H], or null: zeros
  const bf16* dcT;     // likewise
  bf16* dg;            // [T*B, D*4H] the gradients of the gates' pre-activations
  bf16* dh0;           // [D, B, H], or null
  bf16* dc0;           // likewise
};

// A step's rows of the tensors the recurrence reads come into shared memory kStages - 1 steps ahead
// of the step (cp.async), so that their memory latency, longer than a step, is hidden.
constexpr int kStages = 6;

__device__ __forceinline__ unsigned load_pair(const bf16* p) { return *reinterpret_cast<const unsigned*>(p); }
__device__ __forceinline__ unsigned pair_of(bf16 lo, bf16 hi) {
  const __nv_bfloat162 v = __halves2bfloat162(lo, hi);
  return *reinterpret_cast<const unsigned*>(&v);
}
__device__ __forceinline__ float fast_tanh(float x) {
  float y;
  asm("tanh.approx.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
__device__ __forceinline__ float sigmoid(float x) { return 0.5f + 0.5f * fast_tanh(0.5f * x); }

// A block's direction d and first sample b0 (blockIdx), and where a lane's four accumulator elements
// j sit: unit u(j >> 1) (16 warp + g, and + 8), sample s(j & 1) (b0 + 2t, and + 1); g = lane / 4,
// t = lane % 4. DG and DH: a row of the gates and of y.
struct Lane {
  int d, b0, g, t2, unit[2], sample[2];
  bool live[2];
  std::size_t DG, DH;
  __device__ Lane(Dims n, int H) {
    const int lane = threadIdx.x & 31, warp_base = 16 * (threadIdx.x >> 5);
    d = blockIdx.y, b0 = blockIdx.x * kTile;
    g = lane >> 2, t2 = 2 * (lane & 3);
    unit[0] = warp_base + g, unit[1] = warp_base + g + 8;
    sample[0] = b0 + t2, sample[1] = b0 + t2 + 1;
    live[0] = sample[0] < n.B, live[1] = sample[1] < n.B;
    DG = static_cast<std::size_t>(n.D) * 4 * H, DH = static_cast<std::size_t>(n.D) * H;
  }
};

// A lane's four elements of a state [D, B, H] (h0, c0, dhT, ...), read (zeros for a null state or a
// padding sample) and written (nothing for a null one).
__device__ __forceinline__ std::size_t state_at(const Lane& l, int d, int B, int H, int j) {
  return (static_cast<std::size_t>(d) * B + l.sample[j & 1]) * H + l.unit[j >> 1];
}
__device__ __forceinline__ void load_state(const Lane& l, int d, int B, int H, const bf16* in, float (&v)[4]) {
#pragma unroll
  for (int j = 0; j < 4; ++j) v[j] = in && l.live[j & 1] ? __bfloat162float(in[state_at(l, d, B, H, j)]) : 0.f;
}
__device__ __forceinline__ void store_state(const Lane& l, int d, int B, int H, const float (&v)[4], bf16* out) {
#pragma unroll
  for (int j = 0; j < 4; ++j)
    if (out && l.live[j & 1]) out[state_at(l, d, B, H, j)] = __float2bfloat16_rn(v[j]);
}

// Copies the block's 8 rows of Cols elements (16-byte chunks) into dst[sample][...] (rows `ld` apart),
// Threads threads taking the chunks in turn: the row of sample b0 + s starts at first + s * stride;
// zeros for the `rows`-th sample on (past the batch).
template <int Cols, int Threads, class T>
__device__ __forceinline__ void copy_rows(T* dst, int ld, const T* first, std::size_t stride, int rows) {
  constexpr int per = 16 / sizeof(T), chunks = Cols / per, total = kTile * chunks;
#pragma unroll
  for (int k = 0; k < (total + Threads - 1) / Threads; ++k) {
    const int c = static_cast<int>(threadIdx.x) + k * Threads;
    if (total % Threads != 0 && c >= total) break;
    const int s = c / chunks, col = (c % chunks) * per;
    const bool in = s < rows;
    gpu::copy16_async(dst + s * ld + col, first + (in ? s * stride : 0) + col, in);
  }
}

template <int H>
struct ForwardSmem {
  static constexpr int G = 4 * H, LG = G + 4, LH = H + 8;  // row strides: a lane's reads in distinct banks
  float x[kStages][kTile][LG];  // x W_ih^T of the steps in flight
  bf16 h[2][kTile][LH];         // h_{t-1}, double-buffered
};

template <int H>
__global__ void __launch_bounds__(2 * H, 1) forward_kernel(Dims n, ForwardArgs a) {
  using Smem = ForwardSmem<H>;
  constexpr int G = 4 * H, KS = H / 16;
  extern __shared__ __align__(16) unsigned char raw[];
  Smem& sm = *reinterpret_cast<Smem*>(raw);
  const Lane l(n, H);
  const int d = l.d, b0 = l.b0;
  const std::size_t DG = l.DG, DH = l.DH;
  const auto time = [&](int step) { return d == 0 ? step : n.T - 1 - step; };
  const int rows = min(kTile, n.B - b0);
  const auto fetch = [&](int step) {  // step's input projections into its stage
    if (step < n.T) {
      const std::size_t row0 = static_cast<std::size_t>(time(step)) * n.B + b0;
      copy_rows<G, 2 * H>(&sm.x[step % kStages][0][0], Smem::LG, a.gates + row0 * DG + static_cast<std::size_t>(d) * G, DG,
                          rows);
    }
    gpu::commit_async();  // an empty group past the end: the waits below count groups
  };
  for (int step = 0; step < kStages - 1; ++step) fetch(step);

  // This warp's rows of W_hh: gate q, units 16 warp .. + 16, as A fragments of k-steps of 16.
  unsigned w[4][KS][4];
  const bf16* W = a.w_hh + static_cast<std::size_t>(d) * G * H;
#pragma unroll
  for (int q = 0; q < 4; ++q)
#pragma unroll
    for (int k = 0; k < KS; ++k) {
      const bf16* r0 = W + static_cast<std::size_t>(q * H + l.unit[0]) * H + 16 * k + l.t2;
      const bf16* r1 = r0 + 8 * H;
      w[q][k][0] = load_pair(r0), w[q][k][1] = load_pair(r1);
      w[q][k][2] = load_pair(r0 + 8), w[q][k][3] = load_pair(r1 + 8);
    }
  float bias[4][2];
#pragma unroll
  for (int q = 0; q < 4; ++q)
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const std::size_t r = static_cast<std::size_t>(d) * G + q * H + l.unit[i];
      bias[q][i] = __bfloat162float(a.b_ih[r]) + __bfloat162float(a.b_hh[r]);
    }
  float c[4], hp[4];  // this lane's cells and the h it last read
  load_state(l, d, n.B, H, a.c0, c);
  load_state(l, d, n.B, H, a.h0, hp);
#pragma unroll
  for (int j = 0; j < 4; ++j) sm.h[0][l.t2 + (j & 1)][l.unit[j >> 1]] = __float2bfloat16_rn(hp[j]);

  // A step's outputs: from the step's first row, a sample's offset (the host checks that they fit an int).
  const int oy[2] = {l.sample[0] * static_cast<int>(DH), l.sample[1] * static_cast<int>(DH)},
            og[2] = {l.sample[0] * static_cast<int>(DG), l.sample[1] * static_cast<int>(DG)},
            oc[2] = {l.sample[0] * H, l.sample[1] * H};
  for (int step = 0; step < n.T; ++step) {
    const int tt = time(step), cur = step & 1, stage = step % kStages;
    const std::size_t row_t = static_cast<std::size_t>(tt) * n.B;
    bf16* const y_t = a.y + row_t * DH + d * H;
    float* const g_t = a.gates + row_t * DG + d * G;
    const std::size_t c_t = (static_cast<std::size_t>(d) * n.T + tt) * n.B * H;
    gpu::wait_async_groups<kStages - 2>();  // this thread's copies of the step are in
    __syncthreads();                        // everyone's, and h_{t-1}; the stage read last step is free
    fetch(step + kStages - 1);
    float acc[4][4];
#pragma unroll
    for (int q = 0; q < 4; ++q)
#pragma unroll
      for (int j = 0; j < 4; ++j) acc[q][j] = sm.x[stage][l.t2 + (j & 1)][q * H + l.unit[j >> 1]] + bias[q][j >> 1];
#pragma unroll
    for (int k = 0; k < KS; ++k) {
      const unsigned b0 = load_pair(&sm.h[cur][l.g][16 * k + l.t2]), b1 = load_pair(&sm.h[cur][l.g][16 * k + l.t2 + 8]);
#pragma unroll
      for (int q = 0; q < 4; ++q) mma_bf16(acc[q], w[q][k], b0, b1);
    }
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int u = l.unit[j >> 1], s = j & 1;
      const float i = sigmoid(acc[0][j]), f = sigmoid(acc[1][j]), g = fast_tanh(acc[2][j]), o = sigmoid(acc[3][j]);
      const float cp = c[j];
      c[j] = f * cp + i * g;
      const bf16 h = __float2bfloat16_rn(o * fast_tanh(c[j]));
      sm.h[cur ^ 1][l.t2 + s][u] = h;
      if (l.live[s]) {
        y_t[oy[s] + u] = h;
        if (a.cprev) {
          float* p = g_t + og[s] + u;
          p[0] = i, p[H] = f, p[2 * H] = g, p[3 * H] = o;
          a.cprev[c_t + oc[s] + u] = cp;
          a.hprev[c_t + oc[s] + u] = __float2bfloat16_rn(hp[j]);
        }
      }
      hp[j] = __bfloat162float(h);
    }
  }
  store_state(l, d, n.B, H, hp, a.hT);
  store_state(l, d, n.B, H, c, a.cT);
}

template <int H>
struct BackwardSmem {
  static constexpr int G = 4 * H, LG = G + 4, LH = H + 4, LY = H + 8, LD = G + 8;
  float gates[kStages][kTile][LG];  // the steps in flight: their gates, c_{t-1} and dy
  float cprev[kStages][kTile][LH];
  bf16 dy[kStages][kTile][LY];
  bf16 dg[2][kTile][LD];  // the step's gate gradients, the product's operand, double-buffered
};

template <int H>
__global__ void __launch_bounds__(2 * H, 1) backward_kernel(Dims n, BackwardArgs a) {
  using Smem = BackwardSmem<H>;
  constexpr int G = 4 * H, KS = G / 16;
  extern __shared__ __align__(16) unsigned char raw[];
  Smem& sm = *reinterpret_cast<Smem*>(raw);
  const Lane l(n, H);
  const int d = l.d, b0 = l.b0;
  const std::size_t DG = l.DG, DH = l.DH;
  const auto time = [&](int step) { return d == 0 ? n.T - 1 - step : step; };  // the forward's steps in reverse
  const int rows = min(kTile, n.B - b0);
  const auto fetch = [&](int step) {
    if (step < n.T) {
      const int tt = time(step), st = step % kStages;
      const std::size_t row0 = static_cast<std::size_t>(tt) * n.B + b0, c0 = (static_cast<std::size_t>(d) * n.T + tt) * n.B + b0;
      copy_rows<G, 2 * H>(&sm.gates[st][0][0], Smem::LG, a.gates + row0 * DG + static_cast<std::size_t>(d) * G, DG, rows);
      copy_rows<H, 2 * H>(&sm.cprev[st][0][0], Smem::LH, a.cprev + c0 * H, H, rows);
      copy_rows<H, 2 * H>(&sm.dy[st][0][0], Smem::LY, a.dy + row0 * DH + static_cast<std::size_t>(d) * H, DH, rows);
    }
    gpu::commit_async();
  };
  for (int step = 0; step < kStages - 1; ++step) fetch(step);

  // W_hh^T's rows of this warp's units, as A fragments of k-steps of 16 gate rows.
  unsigned w[KS][4];
  const bf16* W = a.w_hh + static_cast<std::size_t>(d) * G * H;
#pragma unroll
  for (int k = 0; k < KS; ++k) {
    const bf16* r = W + static_cast<std::size_t>(16 * k + l.t2) * H;
    w[k][0] = pair_of(r[l.unit[0]], r[H + l.unit[0]]);
    w[k][1] = pair_of(r[l.unit[1]], r[H + l.unit[1]]);
    w[k][2] = pair_of(r[8 * H + l.unit[0]], r[9 * H + l.unit[0]]);
    w[k][3] = pair_of(r[8 * H + l.unit[1]], r[9 * H + l.unit[1]]);
  }
  float dh[4], dc[4];  // dh: the recurrent part, dh_{t-1} = dgates_t W_hh
  load_state(l, d, n.B, H, a.dhT, dh);
  load_state(l, d, n.B, H, a.dcT, dc);
  gpu::wait_async_groups<kStages - 2>();
  __syncthreads();
  const int og[2] = {l.sample[0] * static_cast<int>(DG), l.sample[1] * static_cast<int>(DG)};
  for (int step = 0; step < n.T; ++step) {
    const int tt = time(step), cur = step & 1, stage = step % kStages;
    bf16* const dg_t = a.dg + static_cast<std::size_t>(tt) * n.B * DG + d * G;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int u = l.unit[j >> 1], s = j & 1, r = l.t2 + s;
      const float i = sm.gates[stage][r][u], f = sm.gates[stage][r][H + u], g = sm.gates[stage][r][2 * H + u],
                  o = sm.gates[stage][r][3 * H + u], cp = sm.cprev[stage][r][u];
      const float dht = __bfloat162float(sm.dy[stage][r][u]) + dh[j], tc = fast_tanh(f * cp + i * g);
      const float dct = dc[j] + dht * o * (1.f - tc * tc);
      const float dgate[4] = {dct * g * i * (1.f - i), dct * cp * f * (1.f - f), dct * i * (1.f - g * g),
                              dht * tc * o * (1.f - o)};
      dc[j] = dct * f;
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const bf16 v = __float2bfloat16_rn(dgate[q]);  // zero for a padding sample
        sm.dg[cur][r][q * H + u] = v;
        if (l.live[s]) dg_t[og[s] + q * H + u] = v;
      }
    }
    gpu::wait_async_groups<kStages - 3>();  // the next step's copies are in
    __syncthreads();  // the gate gradients, and the next step's rows; this step's stage is free
    fetch(step + kStages - 1);
    // dh_{t-1} = dgates_t W_hh, over the 4H gate rows in four independent sums.
    float p[4][4] = {};
#pragma unroll
    for (int k = 0; k < KS; ++k) {
      const unsigned b0 = load_pair(&sm.dg[cur][l.g][16 * k + l.t2]), b1 = load_pair(&sm.dg[cur][l.g][16 * k + l.t2 + 8]);
      mma_bf16(p[k & 3], w[k], b0, b1);
    }
#pragma unroll
    for (int j = 0; j < 4; ++j) dh[j] = (p[0][j] + p[1][j]) + (p[2][j] + p[3][j]);
  }
  store_state(l, d, n.B, H, dh, a.dh0);
  store_state(l, d, n.B, H, dc, a.dc0);
}

// A kernel's launch on the batch's blocks, its shared memory past the default 48 KiB allowed once.
template <auto Kernel, class Smem, class A>
void launch(Dims n, const A& a, int threads) {
  static const bool sized = [] {
    HOTOPS_CHECK_CUDA(
        cudaFuncSetAttribute(Kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(sizeof(Smem))));
    return true;
  }();
  (void)sized;
  Kernel<<<dim3((n.B + kTile - 1) / kTile, n.D), threads, sizeof(Smem), gpu::stream()>>>(n, a);
}
// The kernels' instances, by H.
template <class F>
void by_hidden(std::int64_t H, F&& f) {
  switch (H) {
    case 16: return f(std::integral_constant<int, 16>{});
    case 32: return f(std::integral_constant<int, 32>{});
    case 48: return f(std::integral_constant<int, 48>{});
    case 64: return f(std::integral_constant<int, 64>{});
    case 80: return f(std::integral_constant<int, 80>{});
    case 96: return f(std::integral_constant<int, 96>{});
    case 112: return f(std::integral_constant<int, 112>{});
    case 128: return f(std::integral_constant<int, 128>{});
    default: throw Error("lstm: hotops' kernels take a hidden size of 16 to 128 in steps of 16", ErrorKind::unsupported);
  }
}

using Offsets = TorchOffsets;  // the weight and gradient spaces (make_torch_layout)

// A Linear layer's GEMM over every step: x [T*B, I] against W_ih [D*4H, I] (trans_b).
matmul::Shape linear(const Shape& s, matmul::Op op, Direction dir) {
  matmul::Shape m;
  m.op = op, m.dir = dir, m.dtype = DType::bf16;
  m.M = s.T * s.B, m.N = s.D() * 4 * s.H, m.K = s.I;
  m.trans_b = true;
  m.reduce_in_compute = true;
  return m;
}

class HotopsLstm final : public Plan {
 public:
  explicit HotopsLstm(const Shape& s) : s_(s), o_(s) {
    HOTOPS_CHECK(cuda_takes_hotops(s), "lstm: hotops' kernels do not take this layer");
    HOTOPS_CHECK(s.T * s.B < (std::int64_t{1} << 31) && s.B * s.D() * 4 * s.H < (std::int64_t{1} << 31) && s.T > 0 && s.B > 0,
                 "lstm: T x batch, and a step's gates, must fit an int");
    n_ = Dims{static_cast<int>(s.T), static_cast<int>(s.B), static_cast<int>(s.D())};
    const auto rows = static_cast<std::size_t>(s.T * s.B), G = static_cast<std::size_t>(4 * s.H),
               D = static_cast<std::size_t>(s.D()), state = D * rows * static_cast<std::size_t>(s.H);
    gates_ = gpu::DeviceBuffer(rows * D * G * sizeof(float));
    matmul::Shape proj = linear(s, matmul::Op::mm, Direction::fwd);
    proj.f32_out = true;
    project_ = matmul::make_cuda_plan(proj);
    label_ = "hotops LSTM: the input projections one GEMM (" + project_->label() +
             "), the recurrence one kernel (mma.sync bf16 with f32 sums, W_hh in registers, 8 samples a block, " +
             std::to_string((s.B + kTile - 1) / kTile * s.D()) + " blocks)";
    if (!training()) return;
    cprev_ = gpu::DeviceBuffer(state * sizeof(float));
    hprev_ = gpu::DeviceBuffer(state * sizeof(bf16));
    dg_ = gpu::DeviceBuffer(rows * D * G * sizeof(bf16));
    dx_ = matmul::make_cuda_plan(linear(s, matmul::Op::mm, Direction::bwd_data));
    dw_ih_ = matmul::make_cuda_plan(linear(s, matmul::Op::addmm, Direction::bwd_weight));
    // dW_hh[d] = dG_d^T h_{t-1}: per direction, its gate columns of dG against its hprev.
    matmul::Shape wh;
    wh.dir = Direction::bwd_weight, wh.dtype = DType::bf16, wh.trans_b = true, wh.reduce_in_compute = true;
    wh.M = s.T * s.B, wh.N = static_cast<std::int64_t>(G), wh.K = s.H;
    if (s.D() == 1) {
      wh.op = matmul::Op::mm;
    } else {
      wh.op = matmul::Op::bmm;
      wh.batch_count = s.D();
      wh.views.heads = s.D();
      wh.views.a = matmul::View{0, s.T * s.B * s.H, s.H};
      wh.views.b = matmul::View{0, static_cast<std::int64_t>(G) * s.H, s.H};
      wh.views.out = matmul::View{0, static_cast<std::int64_t>(G), s.D() * static_cast<std::int64_t>(G)};
    }
    dw_hh_ = matmul::make_cuda_plan(wh);
    label_ += "; backward: the recurrence one kernel, then dx (" + dx_->label() + "), dW_ih and db (" + dw_ih_->label() +
              "), dW_hh (" + dw_hh_->label() + "); the TRAINING forward that saves the gates runs at setup, not timed";
  }

  void forward(const Args& a) override {
    const auto* w = static_cast<const bf16*>(a.weights);
    matmul::Args p;
    p.a = a.x, p.b = w + o_.w_ih, p.out = gates_.get();
    project_->run(p);
    ForwardArgs f{gates_.as<float>(), w + o_.w_hh, w + o_.b_ih, w + o_.b_hh,
                  static_cast<const bf16*>(a.h0), static_cast<const bf16*>(a.c0), static_cast<bf16*>(a.y),
                  static_cast<bf16*>(a.hT), static_cast<bf16*>(a.cT), nullptr, nullptr};
    if (training()) f.cprev = cprev_.as<float>(), f.hprev = hprev_.as<bf16>();
    by_hidden(s_.H, [&](auto h) {
      constexpr int H = decltype(h)::value;
      launch<forward_kernel<H>, ForwardSmem<H>>(n_, f, 2 * H);
    });
    HOTOPS_CHECK_LAUNCH();
    if (training()) seen_ = {a.x, a.h0, a.c0, a.weights, a.y, a.hT, a.cT};
  }

  void run(const Args& a) override {
    if (!training()) return forward(a);
    if (seen_ != Seen{a.x, a.h0, a.c0, a.weights, a.y, a.hT, a.cT}) forward(a);
    const auto* w = static_cast<const bf16*>(a.weights);
    auto* dw = static_cast<bf16*>(a.dweights);
    HOTOPS_CHECK(a.dy && reinterpret_cast<std::uintptr_t>(a.dy) % 16 == 0,
                 "lstm: hotops' kernels read dy 16 bytes at a time: dy must be given, 16-byte aligned");
    BackwardArgs b{gates_.as<float>(), cprev_.as<float>(), w + o_.w_hh,
                   static_cast<const bf16*>(a.dy), static_cast<const bf16*>(a.dhT), static_cast<const bf16*>(a.dcT),
                   dg_.as<bf16>(), static_cast<bf16*>(a.dh0), static_cast<bf16*>(a.dc0)};
    by_hidden(s_.H, [&](auto h) {
      constexpr int H = decltype(h)::value;
      launch<backward_kernel<H>, BackwardSmem<H>>(n_, b, 2 * H);
    });
    HOTOPS_CHECK_LAUNCH();
    matmul::Args g;
    g.dout = dg_.get(), g.b = w + o_.w_ih, g.out = a.dx;
    dx_->run(g);
    g = matmul::Args{};
    g.a = a.x, g.dout = dg_.get(), g.out = dw + o_.w_ih, g.dbias = dw + o_.b_ih;
    dw_ih_->run(g);
    g = matmul::Args{};
    g.a = hprev_.get(), g.dout = dg_.get(), g.out = dw + o_.w_hh;
    dw_hh_->run(g);
    HOTOPS_CHECK_CUDA(cudaMemcpyAsync(dw + o_.b_hh, dw + o_.b_ih, (o_.total - o_.b_hh) * sizeof(bf16),
                                      cudaMemcpyDeviceToDevice, gpu::stream()));
  }

  std::string label() const override { return label_; }

 private:
  using Seen = std::array<const void*, 7>;
  bool training() const { return s_.dir != Direction::fwd; }

  Shape s_;
  Offsets o_;
  Dims n_{};
  gpu::DeviceBuffer gates_, cprev_, hprev_, dg_;
  std::unique_ptr<matmul::Plan> project_, dx_, dw_ih_, dw_hh_;
  std::string label_;
  Seen seen_{};
};

}  // namespace

std::unique_ptr<Plan> make_hotops_plan(const Shape& s) { return std::make_unique<HotopsLstm>(s); }
std::unique_ptr<Layout> make_hotops_layout(const Shape& s) { return make_torch_layout(s, DType::bf16); }

std::unique_ptr<Plan> make_cuda_plan(const Shape& s) {
  return cuda_takes_hotops(s) ? make_hotops_plan(s) : make_cudnn_plan(s);
}
std::unique_ptr<Layout> make_cuda_layout(const Shape& s) {
  return cuda_takes_hotops(s) ? make_hotops_layout(s) : make_cudnn_layout(s);
}

}  // namespace hotops::lstm
