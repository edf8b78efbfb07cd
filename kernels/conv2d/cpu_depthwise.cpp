// conv2d on the CPU: the weight gradient of a depthwise convolution (groups = C = K) wider than 3
// columns, in NHWC, as hotops' own loops. oneDNN 2.6's depthwise backward-weights kernel takes
// filters of at most 3 columns (jit_uni_dw_conv_bwd_weights_kernel::init_conf: kw <= 3); a wider
// one, ConvNeXt's 7x7, falls to its im2col GEMM over plain layouts, which on the H200 host's Xeon
// took 14.5 ms at ConvNeXt-T's stage 1 and batch 8 (f32, 16 threads) against 0.39 ms for oneDNN's
// forward of the same convolution.
//
//   dw[c, r, s] = sum over n, p, q of x[n, p*sh - ph + r, q*sw - pw + s, c] * dy[n, p, q, c]
//   db[c]       = sum over n, p, q of dy[n, p, q, c]                          (with the bias)
//
// The channels are the vector lanes (NHWC keeps them contiguous). Each thread takes a contiguous
// share of the N x P output rows and sums them into its own f32 [R, S, C] block, a multiply-add over
// the channels at a time (bf16 widened as it is loaded). The threads' blocks are then added in thread order
// (deterministic at a given thread count) and written transposed into dw's [C, R, S] (OHWI with
// one input channel a group), in the weights' dtype (f32 with f32_params).
#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "hotops/check.h"
#include "hotops/cpu.h"
#include "hotops/cpu_vector.h"
#include "kernels/conv2d/conv2d.h"

namespace hotops::conv2d {
namespace {

using bf16 = std::uint16_t;  // bf16's bits

using vec::load;  // storage -> f32: f32 as is, bf16 widened exactly
using vec::store;  // and back, bf16 rounded to nearest even

// acc[(r * S + t) * C + c] += the terms of output rows [row_begin, row_end) (row = n * P + p), and
// dbias[c] += dy's (where given): for each filter tap, the row's columns in order, each a multiply-add
// over the C channels into the tap's row of acc (in L1 while the row's columns go by).
template <class T>
HOTOPS_VECTOR_INLINE void tap_sums(const Shape& s, const T* __restrict x, const T* __restrict dy, std::int64_t row_begin,
                                   std::int64_t row_end, float* __restrict acc, float* __restrict dbias) {
  const std::int64_t C = s.C, H = s.H, W = s.W, P = s.P(), Q = s.Q(), R = s.R, S = s.S, sh = s.stride_h, sw = s.stride_w;
  const std::int64_t ph = s.pad_h, pw = s.pad_w;
  for (std::int64_t row = row_begin; row < row_end; ++row) {
    const std::int64_t n = row / P, p = row % P;
    const T* dy_row = dy + (n * P + p) * Q * C;
    if (dbias)
      for (std::int64_t q = 0; q < Q; ++q)
        for (std::int64_t c = 0; c < C; ++c) dbias[c] += load(dy_row[q * C + c]);
    for (std::int64_t r = 0; r < R; ++r) {
      const std::int64_t h = p * sh - ph + r;
      if (h < 0 || h >= H) continue;
      const T* x_row = x + (n * H + h) * W * C;
      for (std::int64_t t = 0; t < S; ++t) {
        // the output columns q whose input column q * sw + off lies inside the row
        const std::int64_t off = t - pw;
        const std::int64_t q0 = off >= 0 ? 0 : (-off + sw - 1) / sw;
        const std::int64_t q1 = W - 1 - off < 0 ? 0 : std::min(Q, (W - 1 - off) / sw + 1);
        float* __restrict a = acc + (r * S + t) * C;
        for (std::int64_t q = q0; q < q1; ++q) {
          const T* __restrict xq = x_row + (q * sw + off) * C;
          const T* __restrict dq = dy_row + q * C;
          for (std::int64_t c = 0; c < C; ++c) a[c] += load(xq[c]) * load(dq[c]);
        }
      }
    }
  }
}

#define HOTOPS_DEPTHWISE_LOOPS(T)                                                                                      \
  HOTOPS_CPU_CLONES void tap_sums_loop(const Shape& s, const T* x, const T* dy, std::int64_t row_begin,               \
                                       std::int64_t row_end, float* acc, float* dbias) {                              \
    tap_sums<T>(s, x, dy, row_begin, row_end, acc, dbias);                                                            \
  }
HOTOPS_DEPTHWISE_LOOPS(float)
HOTOPS_DEPTHWISE_LOOPS(bf16)
#undef HOTOPS_DEPTHWISE_LOOPS

// T: x's and dy's storage; O: dw's and db's (f32 with f32_params).
template <class T, class O>
class CpuDepthwiseWeightGrad final : public Plan {
 public:
  explicit CpuDepthwiseWeightGrad(const Shape& s) : s_(s) {
    HOTOPS_CHECK(cpu_depthwise_loops_take(s), "conv2d: the depthwise loops take an NHWC depthwise bwd_weight wider than 3");
  }

  void run(const Args& a) override {
    const int nt = cpu::threads();
    const std::int64_t taps = s_.R * s_.S * s_.C, rows = s_.N * s_.P();
    const std::int64_t per = taps + (s_.bias ? s_.C : 0);
    if (acc_.size() < static_cast<std::size_t>(per * nt)) acc_.resize(static_cast<std::size_t>(per * nt));
    const T* x = static_cast<const T*>(a.x);
    const T* dy = static_cast<const T*>(a.dy);
    float* total = acc_.data();
#pragma omp parallel num_threads(nt)
    {
      const int t = omp_get_thread_num(), team = omp_get_num_threads();
      const std::int64_t begin = rows * t / team, end = rows * (t + 1) / team;
      float* mine = total + per * t;
      std::fill_n(mine, per, 0.f);
      tap_sums_loop(s_, x, dy, begin, end, mine, s_.bias ? mine + taps : nullptr);
#pragma omp barrier
      // the threads' sums added in thread order, each thread a share of the taps
#pragma omp for schedule(static)
      for (std::int64_t i = 0; i < per; ++i)
        for (int u = 1; u < team; ++u) total[i] += total[per * u + i];
    }
    // written as dw[c][r][s] (and db[c])
    O* dw = static_cast<O*>(a.out);
    const std::int64_t RS = s_.R * s_.S;
    for (std::int64_t c = 0; c < s_.C; ++c)
      for (std::int64_t rs = 0; rs < RS; ++rs) dw[c * RS + rs] = store<O>(total[rs * s_.C + c]);
    if (s_.bias) {
      O* db = static_cast<O*>(a.db);
      for (std::int64_t c = 0; c < s_.C; ++c) db[c] = store<O>(total[taps + c]);
    }
  }

  std::string label() const override {
    return std::string("hotops depthwise weight-gradient loops (oneDNN's depthwise kernel takes filters of at most 3 "
                       "columns), NHWC, ") +
           vec::clone_name() + ", f32 accumulation, " + std::to_string(cpu::threads()) + " threads";
  }

 private:
  Shape s_;
  std::vector<float> acc_;  // each thread's [R, S, C] sums (and [C] of db)
};

}  // namespace

bool cpu_depthwise_loops_take(const Shape& s) {
  return s.dir == Direction::bwd_weight && s.groups == s.C && s.K == s.C && s.C > 1 && s.S > 3 &&
         s.layout == Layout::nhwc && !s.onednn_layouts && s.x_pick == Shape::Pick::nhwc &&
         s.y_pick == Shape::Pick::nhwc && s.dil_h == 1 && s.dil_w == 1 && !s.relu &&
         (s.dtype == DType::f32 || s.dtype == DType::bf16);
}

std::unique_ptr<Plan> make_cpu_depthwise_plan(const Shape& s) {
  if (s.dtype == DType::bf16) {
    if (s.f32_params) return std::make_unique<CpuDepthwiseWeightGrad<bf16, float>>(s);
    return std::make_unique<CpuDepthwiseWeightGrad<bf16, bf16>>(s);
  }
  return std::make_unique<CpuDepthwiseWeightGrad<float, float>>(s);
}

}  // namespace hotops::conv2d
