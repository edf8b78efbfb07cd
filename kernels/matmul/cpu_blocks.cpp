// matmul with A in blocks (Shape::a_blocks) on the CPU: hotops' loops for a small dense head (N at
// most kBlocksMaxN, a few thousand multiply-adds at a model's batch, where a oneDNN call's fixed cost
// would be most of the time), f32 sums, each output rounded once to its dtype:
//   fwd        out[m, n] = alpha sum_k A(m, k) B[k, n] + beta bias[n]: a dot product per element
//   bwd_data   dA(m, k)  = alpha sum_n dOut[m, n] B[k, n], written in A's blocks
//   bwd_weight dB[k, n]  = alpha sum_m A(m, k) dOut[m, n], m ascending (addmm: dbias[n] = beta sum_m dOut[m, n])
// OpenMP over rows (fwd, bwd_data) or over dB's columns (bwd_weight) above a grain of work, else one
// thread; the loops compiled per x86-64 level.
#include <algorithm>
#include <string>
#include <vector>

#include "hotops/cpu.h"
#include "hotops/cpu_vector.h"
#include "kernels/matmul/matmul.h"

namespace hotops::matmul {
namespace {

constexpr std::int64_t kParallelGrain = 1 << 16;  // multiply-adds

using vec::load;
using vec::store;

// A is a_blocks row-major [M, kb] matrices one after another: A(m, k) is block k / kb's row m, column
// k % kb. The loops walk a block's row as one contiguous run of kb, so that they vectorise over it.

// fwd, the rows [m0, m1): out[m, n] a dot product of A's row (its blocks' rows, contiguous) with
// BT's row n (B transposed, f32: N x K, made once a call), summed in kLanes interleaved partial sums
// so that it vectorises, then those sums in order, then each block's tail: a sum over k in order
// would be one chain of dependent adds.
constexpr std::int64_t kLanes = 8;
template <class T, class TO>
HOTOPS_VECTOR_INLINE void forward_rows(const T* A, const float* BT, const T* bias, TO* out, std::int64_t m0, std::int64_t m1,
                                       std::int64_t M, std::int64_t N, std::int64_t K, std::int64_t kb, std::int64_t blocks,
                                       float alpha, float beta) {
  const std::int64_t body = kb / kLanes * kLanes;
  for (std::int64_t m = m0; m < m1; ++m)
    for (std::int64_t n = 0; n < N; ++n) {
      float lane[kLanes] = {};
      float tail = 0.f;
      for (std::int64_t b = 0; b < blocks; ++b) {
        const T* a = A + (b * M + m) * kb;
        const float* bt = BT + n * K + b * kb;
        for (std::int64_t j = 0; j < body; j += kLanes)
          for (std::int64_t l = 0; l < kLanes; ++l) lane[l] += load(a[j + l]) * bt[j + l];
        for (std::int64_t j = body; j < kb; ++j) tail += load(a[j]) * bt[j];
      }
      float sum = 0.f;
      for (std::int64_t l = 0; l < kLanes; ++l) sum += lane[l];
      out[m * N + n] = store<TO>(alpha * (sum + tail) + (bias ? beta * load(bias[n]) : 0.f));
    }
}

// bwd_data, the rows [m0, m1): dA(m, k) = alpha sum_n dOut[m, n] BT[n, k], a block's row summed over
// n in order in a run of kRun floats at a time, each term a vector over the run.
constexpr std::int64_t kRun = 64;
template <class T, class TO>
HOTOPS_VECTOR_INLINE void data_rows(const T* dout, const float* BT, TO* dA, std::int64_t m0, std::int64_t m1, std::int64_t M,
                                    std::int64_t N, std::int64_t K, std::int64_t kb, std::int64_t blocks, float alpha) {
  for (std::int64_t m = m0; m < m1; ++m) {
    float d[kBlocksMaxN];
    for (std::int64_t n = 0; n < N; ++n) d[n] = load(dout[m * N + n]);
    for (std::int64_t b = 0; b < blocks; ++b)
      for (std::int64_t j0 = 0; j0 < kb; j0 += kRun) {
        const std::int64_t len = std::min(kRun, kb - j0);
        float acc[kRun] = {};
        for (std::int64_t n = 0; n < N; ++n) {
          const float* bt = BT + n * K + b * kb + j0;
          for (std::int64_t j = 0; j < len; ++j) acc[j] += d[n] * bt[j];
        }
        TO* row = dA + (b * M + m) * kb + j0;
        for (std::int64_t j = 0; j < len; ++j) row[j] = store<TO>(alpha * acc[j]);
      }
  }
}

// bwd_weight, the columns [n0, n1) of dB: sums kept transposed in accT (N x K floats), a column of dB
// contiguous along k, each sum over m in order; then dB[k, n] = alpha accT[n, k].
template <class T, class TO>
HOTOPS_VECTOR_INLINE void weight_cols(const T* A, const T* dout, TO* dB, float* accT, std::int64_t n0, std::int64_t n1,
                                      std::int64_t M, std::int64_t N, std::int64_t K, std::int64_t kb, std::int64_t blocks,
                                      float alpha) {
  for (std::int64_t n = n0; n < n1; ++n) {
    float* acc = accT + n * K;
    std::fill_n(acc, K, 0.f);
    for (std::int64_t m = 0; m < M; ++m) {
      const float d = load(dout[m * N + n]);
      for (std::int64_t b = 0; b < blocks; ++b) {
        const T* a = A + (b * M + m) * kb;
        float* ab = acc + b * kb;
        for (std::int64_t j = 0; j < kb; ++j) ab[j] += load(a[j]) * d;
      }
    }
    for (std::int64_t k = 0; k < K; ++k) dB[k * N + n] = store<TO>(alpha * acc[k]);
  }
}

// The loops of each (operands, output) storage pair, compiled per x86-64 level (bf16's conversions
// want AVX2 or AVX-512 to vectorise).
#define HOTOPS_BLOCKS_LOOPS(T, TO)                                                                                      \
  HOTOPS_CPU_CLONES void forward_loop(const T* A, const float* BT, const T* bias, TO* out, std::int64_t m0,            \
                                      std::int64_t m1, std::int64_t M, std::int64_t N, std::int64_t K, std::int64_t kb,  \
                                      std::int64_t blocks, float alpha, float beta) {                                   \
    forward_rows(A, BT, bias, out, m0, m1, M, N, K, kb, blocks, alpha, beta);                                           \
  }                                                                                                                     \
  HOTOPS_CPU_CLONES void data_loop(const T* dout, const float* BT, TO* dA, std::int64_t m0, std::int64_t m1,            \
                                   std::int64_t M, std::int64_t N, std::int64_t K, std::int64_t kb, std::int64_t blocks, \
                                   float alpha) {                                                                       \
    data_rows(dout, BT, dA, m0, m1, M, N, K, kb, blocks, alpha);                                                        \
  }                                                                                                                     \
  HOTOPS_CPU_CLONES void weight_loop(const T* A, const T* dout, TO* dB, float* accT, std::int64_t n0, std::int64_t n1,  \
                                     std::int64_t M, std::int64_t N, std::int64_t K, std::int64_t kb, std::int64_t blocks, \
                                     float alpha) {                                                                     \
    weight_cols(A, dout, dB, accT, n0, n1, M, N, K, kb, blocks, alpha);                                                 \
  }
HOTOPS_BLOCKS_LOOPS(float, float)
HOTOPS_BLOCKS_LOOPS(std::uint16_t, std::uint16_t)
HOTOPS_BLOCKS_LOOPS(std::uint16_t, float)
#undef HOTOPS_BLOCKS_LOOPS

class CpuBlocks final : public Plan {
 public:
  explicit CpuBlocks(const Shape& s) : s_(s) {
    product(s);  // checks the shape
    scratch_.resize(static_cast<std::size_t>(s_.K * s_.N));  // BT, or dB's sums transposed
  }

  void run(const Args& a) override {
    const bool bf16 = s_.dtype == DType::bf16;
    if (bf16 && !s_.f32_out) return run_as<std::uint16_t, std::uint16_t>(a);
    if (bf16) return run_as<std::uint16_t, float>(a);
    run_as<float, float>(a);
  }

  std::string label() const override {
    return "hotops " + std::to_string(s_.a_blocks) + "-block small dense loop (f32 sums, one rounding" +
           std::string(s_.f32_out ? ", f32 output" : "") + "), " + vec::clone_name() + ", " + std::to_string(team()) +
           " threads";
  }

 private:
  int team() const { return s_.M * s_.N * s_.K >= kParallelGrain ? cpu::threads() : 1; }

  template <class T, class TO>
  void run_as(const Args& a) {
    const std::int64_t M = s_.M, N = s_.N, K = s_.K, blocks = s_.a_blocks, kb = K / blocks;
    const auto alpha = static_cast<float>(s_.alpha), beta = static_cast<float>(s_.beta);
    // Each thread of the team a contiguous share of [0, count): rows (fwd, bwd_data) or dB's columns.
    const auto split = [&](std::int64_t count, auto body) { cpu::in_shares(team(), count, body); };
    switch (s_.dir) {
      case Direction::fwd: {
        const T* A = static_cast<const T*>(a.a);
        const float* BT = transposed(static_cast<const T*>(a.b));
        const T* bias = s_.op == Op::addmm ? static_cast<const T*>(a.bias) : nullptr;
        TO* out = static_cast<TO*>(a.out);
        split(M, [&](std::int64_t m0, std::int64_t m1) {
          forward_loop(A, BT, bias, out, m0, m1, M, N, K, kb, blocks, alpha, beta);
        });
        break;
      }
      case Direction::bwd_data: {
        const float* BT = transposed(static_cast<const T*>(a.b));
        const T* dout = static_cast<const T*>(a.dout);
        TO* dA = static_cast<TO*>(a.out);
        split(M, [&](std::int64_t m0, std::int64_t m1) { data_loop(dout, BT, dA, m0, m1, M, N, K, kb, blocks, alpha); });
        break;
      }
      default: {
        const T* A = static_cast<const T*>(a.a);
        const T* dout = static_cast<const T*>(a.dout);
        TO* dB = static_cast<TO*>(a.out);
        float* accT = scratch_.data();
        split(N, [&](std::int64_t n0, std::int64_t n1) { weight_loop(A, dout, dB, accT, n0, n1, M, N, K, kb, blocks, alpha); });
        if (s_.op == Op::addmm) {
          T* db = static_cast<T*>(a.dbias);
          for (std::int64_t n = 0; n < N; ++n) {
            float sum = 0.f;
            for (std::int64_t m = 0; m < M; ++m) sum += load(dout[m * N + n]);
            db[n] = store<T>(beta * sum);
          }
        }
      }
    }
  }

  // B [K, N] transposed into the scratch, in f32 (N x K): a column of B contiguous.
  template <class T>
  const float* transposed(const T* B) {
    float* BT = scratch_.data();
    for (std::int64_t k = 0; k < s_.K; ++k)
      for (std::int64_t n = 0; n < s_.N; ++n) BT[n * s_.K + k] = load(B[k * s_.N + n]);
    return BT;
  }

  Shape s_;
  std::vector<float> scratch_;  // fwd, bwd_data: B transposed (N x K); bwd_weight: dB's sums transposed
};

}  // namespace

std::unique_ptr<Plan> make_cpu_blocks_plan(const Shape& s) { return std::make_unique<CpuBlocks>(s); }

}  // namespace hotops::matmul
