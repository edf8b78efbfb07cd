// matmul on the CPU below kCpuLoopMacs multiply-adds: hand-written single-thread loops (a dense
// layer of a tiny MLP), where a oneDNN primitive's fixed cost per call is most of the time. The
// forward's rows are sums of rows of W (block_sums: blocks of the output in vector registers), the
// weight gradient the same blocks over a^T and dz, the data gradient the forward's sums over W^T; compiled per x86-64 level (HOTOPS_CPU_CLONES); f32 math on the stored values
// (bf16 widened exactly as it is loaded, or once into f32 scratch where it is read many times: the
// forward's rows of a, the gradients' rows of dz, bwd_data's W), f32 accumulation, one rounding into
// the output.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "hotops/check.h"
#include "hotops/cpu_colsum.h"
#include "hotops/cpu_vector.h"
#include "kernels/matmul/matmul.h"

namespace hotops::matmul {
namespace {

using bf16 = std::uint16_t;  // bf16's bits

// Storage <-> f32: f32 as is; bf16 widened exactly, narrowed rounding to nearest even.
using vec::load;
using vec::store;

// c(r, j) = init(j) + the sum over k in order of a(r, k) B[k ldb + j], for the rows [r_begin, r_end)
// (in blocks of Rows: the caller's rows make whole blocks) and the columns of whole blocks of 16,
// each handed once to put(r, j, c): a block of Rows x 16 summed in Rows vector registers (Rows
// independent chains, each 16 elements of B loaded, and widened, once for the block's rows). The
// columns past the last whole block are the caller's.
constexpr std::int64_t kBlockRows = 4, kBlockCols = 16;
// Below this many terms a sum, a block's set-up and hand-over cost more than its registers save.
constexpr std::int64_t kBlockDepth = 8;
template <std::int64_t Rows = kBlockRows, class TB, class A, class Init, class Put>
HOTOPS_VECTOR_INLINE void block_sums(std::int64_t r_begin, std::int64_t r_end, std::int64_t cols, std::int64_t depth, A a, const TB* B,
                std::int64_t ldb, Init init, Put put) {
  using v16 = float __attribute__((vector_size(64)));  // 16 floats: one AVX-512 register, two AVX2 ones
  const std::int64_t C16 = cols / kBlockCols * kBlockCols;
  for (std::int64_t r0 = r_begin; r0 + Rows <= r_end; r0 += Rows)
    for (std::int64_t j0 = 0; j0 < C16; j0 += kBlockCols) {
      v16 s[Rows];
      for (std::int64_t j = 0; j < kBlockCols; ++j) s[0][j] = init(j0 + j);
      for (std::int64_t q = 1; q < Rows; ++q) s[q] = s[0];
      for (std::int64_t k = 0; k < depth; ++k) {
        v16 b;
        const TB* Bk = B + k * ldb + j0;
        for (std::int64_t j = 0; j < kBlockCols; ++j) b[j] = load(Bk[j]);  // (bf16 widened as it is loaded)
        for (std::int64_t q = 0; q < Rows; ++q) s[q] += a(r0 + q, k) * b;
      }
      for (std::int64_t q = 0; q < Rows; ++q) {
        float out[kBlockCols];
        std::memcpy(out, &s[q], sizeof out);
        for (std::int64_t j = 0; j < kBlockCols; ++j) put(r0 + q, j0 + j, out[j]);
      }
    }
}

// A bf16 operand read many times, widened once into `wide` (exact: bf16 is the top half of an f32),
// so that the inner loops multiply f32 by f32 as the f32 plan's do; an f32 one as it is.
template <class T>
HOTOPS_VECTOR_INLINE const float* widened(const T* v, std::int64_t n, float* wide) {
  if constexpr (std::is_same_v<T, float>) {
    return v;
  } else {
    for (std::int64_t i = 0; i < n; ++i) wide[i] = load(v[i]);
    return wide;
  }
}

// y[M, N] = alpha * a[M, K] . W[K, N] (+ beta * bias[N]) (then max(., 0) with relu), each element
// summed from the bias over i in order, a row at a time (an f32 output accumulates in y itself; a bf16
// one in `acc`, a row of N floats): for sums of fewer than kBlockDepth terms.
template <class T, class O>
HOTOPS_VECTOR_INLINE void forward_rows(const float* a, const T* W, const T* bias, O* y, std::int64_t M, std::int64_t K, std::int64_t N,
                  float alpha, float beta, bool relu, float* acc) {
  for (std::int64_t r = 0; r < M; ++r) {
    float* yr;
    if constexpr (std::is_same_v<O, float>) yr = y + r * N;
    else yr = acc;
    if (bias)
      for (std::int64_t o = 0; o < N; ++o) yr[o] = beta * load(bias[o]);
    else
      std::fill(yr, yr + N, 0.f);
    for (std::int64_t i = 0; i < K; ++i) {
      const float ai = alpha * a[r * K + i];
      const T* Wi = W + i * N;
      for (std::int64_t o = 0; o < N; ++o) yr[o] += ai * load(Wi[o]);
    }
    if (relu)
      for (std::int64_t o = 0; o < N; ++o) yr[o] = std::max(yr[o], 0.f);
    if constexpr (!std::is_same_v<O, float>)
      for (std::int64_t o = 0; o < N; ++o) y[r * N + o] = store<O>(yr[o]);
  }
}

// y's columns [from, N), fewer than a block of 16 (a 2-class head's, the columns past the last whole
// block), summed Rows rows at a time in Rows scalar registers per column: Rows independent chains.
// Summed in memory a row at a time (forward_rows), such a column is one chain of dependent adds that
// stalls on each load its own store feeds: mlp_tiny's 16 -> 2 layer at batch 1024 took 36-42 us of
// its 47 us step that way, 8-9 us this way (2-core AMD EPYC, AVX2 and AVX-512 clones).
constexpr std::int64_t kNarrowRows = 8;
template <std::int64_t Rows, class T, class O>
HOTOPS_VECTOR_INLINE void narrow_columns(const float* a, const T* W, const T* bias, O* y, std::int64_t r_begin, std::int64_t r_end,
                                         std::int64_t K, std::int64_t N, std::int64_t from, float alpha, float beta, bool relu) {
  for (std::int64_t r0 = r_begin; r0 + Rows <= r_end; r0 += Rows)
    for (std::int64_t o = from; o < N; ++o) {
      float s[Rows];
      for (std::int64_t q = 0; q < Rows; ++q) s[q] = bias ? beta * load(bias[o]) : 0.f;
      for (std::int64_t i = 0; i < K; ++i) {
        const float w = load(W[i * N + o]);
        for (std::int64_t q = 0; q < Rows; ++q) s[q] += alpha * a[(r0 + q) * K + i] * w;
      }
      for (std::int64_t q = 0; q < Rows; ++q) y[(r0 + q) * N + o] = store<O>(relu ? std::max(s[q], 0.f) : s[q]);
    }
}

// The whole forward: the columns of whole blocks of 16 in block_sums (rows 4 at a time, then the rows
// after the last 4 one at a time: a row summed in memory is one chain of dependent adds, and stalls on
// every load that its stores may alias), the rest in narrow_columns. Below kBlockDepth terms
// forward_rows alone. `a` in f32 (forward widens bf16 rows first).
template <class T, class O>
HOTOPS_VECTOR_INLINE void forward_f32a(const float* a, const T* W, const T* bias, O* y, std::int64_t M, std::int64_t K,
                                       std::int64_t N, float alpha, float beta, bool relu, float* acc) {
  const std::int64_t C16 = N / kBlockCols * kBlockCols;
  if (K < kBlockDepth) return forward_rows(a, W, bias, y, M, K, N, alpha, beta, relu, acc);
  const auto a_of = [&](std::int64_t r, std::int64_t i) HOTOPS_LAMBDA_INLINE { return alpha * a[r * K + i]; };
  const auto put = [&](std::int64_t r, std::int64_t o, float v) HOTOPS_LAMBDA_INLINE {
    y[r * N + o] = store<O>(relu ? std::max(v, 0.f) : v);
  };
  const std::int64_t R4 = M / kBlockRows * kBlockRows;
  const auto blocks = [&](auto init) HOTOPS_LAMBDA_INLINE {
    block_sums(0, R4, N, K, a_of, W, N, init, put);
    block_sums<1>(R4, M, N, K, a_of, W, N, init, put);
  };
  if (C16 > 0) {
    if (bias) blocks([&](std::int64_t o) HOTOPS_LAMBDA_INLINE { return beta * load(bias[o]); });
    else blocks([](std::int64_t) HOTOPS_LAMBDA_INLINE { return 0.f; });
  }
  if (C16 < N) {
    const std::int64_t R = M / kNarrowRows * kNarrowRows;
    narrow_columns<kNarrowRows>(a, W, bias, y, 0, R, K, N, C16, alpha, beta, relu);
    narrow_columns<1>(a, W, bias, y, R, M, K, N, C16, alpha, beta, relu);
  }
}

// The forward on the stored operands: bf16 rows of a widened (exact) kChunkRows at a time into
// `wide` (kChunkRows x K floats), so that each of a's elements is widened once instead of at each of
// its broadcasts (a block of 16 columns broadcasts it, and each element of a is in N / 16 blocks);
// f32 as it is. The same sums in the same order either way. W and bias in TW (T, or f32 where the
// caller has widened them).
constexpr std::int64_t kChunkRows = 64;
template <class T, class O, class TW = T>
HOTOPS_VECTOR_INLINE void forward(const T* a, const TW* W, const TW* bias, O* y, std::int64_t M, std::int64_t K, std::int64_t N,
                                  float alpha, float beta, bool relu, float* acc, float* wide) {
  if constexpr (std::is_same_v<T, float>) {
    forward_f32a(a, W, bias, y, M, K, N, alpha, beta, relu, acc);
  } else {
    for (std::int64_t r0 = 0; r0 < M; r0 += kChunkRows) {
      const std::int64_t rows = std::min(kChunkRows, M - r0);
      forward_f32a(widened(a + r0 * K, rows * K, wide), W, bias, y + r0 * N, rows, K, N, alpha, beta, relu, acc);
    }
  }
}

// dW's sums for N narrower than a block of 16 (a 2-class head's), kept transposed in sumT (N x K
// floats: a column of dW contiguous), so that a row's update is a vector over K instead of N scalar
// adds for each of K rows of dW; kSumRows rows added to each sum between its load and its store, in
// row order (the same sums as a row at a time).
constexpr std::int64_t kSumRows = 4;
template <class T>
HOTOPS_VECTOR_INLINE void narrow_weight_sums(const T* a, const T* dz, float* sumT, std::int64_t M, std::int64_t K, std::int64_t N,
                                             float alpha) {
  std::fill_n(sumT, K * N, 0.f);
  const auto rows = [&](std::int64_t r0, auto count) HOTOPS_LAMBDA_INLINE {
    for (std::int64_t o = 0; o < N; ++o) {
      float d[decltype(count)::value];
      for (std::int64_t q = 0; q < count; ++q) d[q] = load(dz[(r0 + q) * N + o]);
      float* so = sumT + o * K;
      for (std::int64_t i = 0; i < K; ++i) {
        float s = so[i];
        for (std::int64_t q = 0; q < count; ++q) s += alpha * load(a[(r0 + q) * K + i]) * d[q];
        so[i] = s;
      }
    }
  };
  std::int64_t r = 0;
  for (; r + kSumRows <= M; r += kSumRows) rows(r, std::integral_constant<std::int64_t, kSumRows>{});
  for (; r < M; ++r) rows(r, std::integral_constant<std::int64_t, 1>{});
}

// dW[K, N] = alpha * a[M, K]^T . dz[M, N]. The whole blocks of 16 columns: the forward's register
// blocks (block_sums) with dW's rows 4 at a time, each sum over the batch in row order, dz's rows the
// blocks' B: a row's sums in memory, loaded and stored again for every row of the batch, had been
// the loop's bound. The columns past the last whole block: accumulated in memory in `acc` (K x N
// floats: dW itself where it is f32), K independent sums; a narrow N's (fewer than 16 columns) in
// narrow_weight_sums, transposed in `acc`. Each element's products in row order: the same sums.
template <class T, class O>
HOTOPS_VECTOR_INLINE void weight_grad(const T* a, const T* dz, O* dW, std::int64_t M, std::int64_t K, std::int64_t N, float alpha,
                                      float* acc, float* wide) {
  if (N < kBlockCols) {
    narrow_weight_sums(a, dz, acc, M, K, N, alpha);
    for (std::int64_t i = 0; i < K; ++i)
      for (std::int64_t o = 0; o < N; ++o) dW[i * N + o] = store<O>(acc[o * K + i]);
    return;
  }
  const auto a_of = [&](std::int64_t i, std::int64_t r) HOTOPS_LAMBDA_INLINE { return alpha * load(a[r * K + i]); };
  const auto zero = [](std::int64_t) HOTOPS_LAMBDA_INLINE { return 0.f; };
  const auto put = [&](std::int64_t i, std::int64_t o, float v) HOTOPS_LAMBDA_INLINE { dW[i * N + o] = store<O>(v); };
  const std::int64_t R4 = K / kBlockRows * kBlockRows, C16 = N / kBlockCols * kBlockCols;
  block_sums(0, R4, N, M, a_of, dz, N, zero, put);
  block_sums<1>(R4, K, N, M, a_of, dz, N, zero, put);
  if (C16 == N) return;
  float* sum;
  if constexpr (std::is_same_v<O, float>) sum = dW;
  else sum = acc;
  for (std::int64_t i = 0; i < K; ++i) std::fill(sum + i * N + C16, sum + (i + 1) * N, 0.f);
  for (std::int64_t r = 0; r < M; ++r) {
    // bf16: the row's columns widened once (`wide`: N floats), not once for each of the K rows of dW.
    const float* dzr = widened(dz + r * N, N, wide);
    for (std::int64_t i = 0; i < K; ++i) {
      const float ai = alpha * load(a[r * K + i]);
      float* si = sum + i * N;
      for (std::int64_t o = C16; o < N; ++o) si[o] += ai * dzr[o];
    }
  }
  if constexpr (!std::is_same_v<O, float>)
    for (std::int64_t i = 0; i < K; ++i)
      for (std::int64_t o = C16; o < N; ++o) dW[i * N + o] = store<O>(sum[i * N + o]);
}

// da[M, K] = alpha * dz[M, N] . W[K, N]^T. Where da has a whole block of 16 columns, or the sums are
// short, the forward's sums (blocks of rows and columns in registers) over W^T, transposed and
// widened once into `wt` (N x K floats), dz's bf16 rows widened in `wide` and a bf16 row summed in
// `acc` as the forward has them: a dot product per element ends in a horizontal sum, which took
// mlp_tiny's backward GEMMs at batch 64 to 15 us of its 22 us CPU train step. Otherwise (fewer than
// 16 columns, as many terms as a lane group or more) a dot product per element over rows of dz and
// W^T (both contiguous), summed in kLanes interleaved partial sums so that it vectorises, then those
// sums in order, then the tail: the forward would sum those columns one at a time.
constexpr std::int64_t kLanes = 8;
template <class T, class O>
HOTOPS_VECTOR_INLINE void data_grad(const T* dz, const T* W, O* da, std::int64_t M, std::int64_t K, std::int64_t N, float alpha,
                                    float* wt, float* acc, float* wide) {
  if (K >= kBlockCols || N < kLanes) {
    for (std::int64_t i = 0; i < K; ++i)
      for (std::int64_t o = 0; o < N; ++o) wt[o * K + i] = load(W[i * N + o]);
    return forward<T, O, float>(dz, wt, nullptr, da, M, N, K, alpha, 0.f, false, acc, wide);
  }
  const std::int64_t body = N / kLanes * kLanes;
  const float* Wf = widened(W, K * N, wt);
  for (std::int64_t r = 0; r < M; ++r) {
    const float* dzr = widened(dz + r * N, N, wide);
    for (std::int64_t i = 0; i < K; ++i) {
      const float* Wi = Wf + i * N;
      float lane[kLanes] = {};
      for (std::int64_t o = 0; o < body; o += kLanes)
        for (std::int64_t j = 0; j < kLanes; ++j) lane[j] += dzr[o + j] * Wi[o + j];
      float s = 0.f;
      for (std::int64_t j = 0; j < kLanes; ++j) s += lane[j];
      for (std::int64_t o = body; o < N; ++o) s += dzr[o] * Wi[o];
      da[r * K + i] = store<O>(alpha * s);
    }
  }
}

// The loops of each (operands, output) storage pair the plans run, one function per x86-64 level.
#define HOTOPS_MATMUL_LOOPS(T, O)                                                                                    \
  HOTOPS_CPU_CLONES void forward_loop(const T* a, const T* W, const T* bias, O* y, std::int64_t M, std::int64_t K,   \
                                      std::int64_t N, float alpha, float beta, bool relu, float* acc, float* wide) { \
    forward<T, O>(a, W, bias, y, M, K, N, alpha, beta, relu, acc, wide);                                            \
  }                                                                                                                  \
  HOTOPS_CPU_CLONES void weight_grad_loop(const T* a, const T* dz, O* dW, std::int64_t M, std::int64_t K,           \
                                          std::int64_t N, float alpha, float* acc, float* wide) {                    \
    weight_grad<T, O>(a, dz, dW, M, K, N, alpha, acc, wide);                                                        \
  }                                                                                                                  \
  HOTOPS_CPU_CLONES void data_grad_loop(const T* dz, const T* W, O* da, std::int64_t M, std::int64_t K,             \
                                        std::int64_t N, float alpha, float* wt, float* acc, float* wide) {           \
    data_grad<T, O>(dz, W, da, M, K, N, alpha, wt, acc, wide);                                                      \
  }
HOTOPS_MATMUL_LOOPS(float, float)
HOTOPS_MATMUL_LOOPS(bf16, bf16)
HOTOPS_MATMUL_LOOPS(bf16, float)
#undef HOTOPS_MATMUL_LOOPS

// T: the operands' storage; O: the output's (f32 with f32_out).
template <class T, class O>
class CpuLoopMatmul final : public Plan {
 public:
  explicit CpuLoopMatmul(const Shape& s) : s_(s), alpha_(static_cast<float>(s.alpha)), beta_(static_cast<float>(s.beta)) {
    HOTOPS_CHECK(cpu_runs_loops(s), "matmul: the hand-written CPU loops take mm and addmm below kCpuLoopMacs, packed");
    product(s);  // checks the shape
    if (s.dir == Direction::fwd && !std::is_same_v<O, float>) acc_.resize(static_cast<std::size_t>(s.N));
    if (s.dir == Direction::bwd_data) {  // W^T in f32, and (bf16 output) a row of da in f32
      wt_.resize(static_cast<std::size_t>(s.K * s.N));
      if (!std::is_same_v<O, float>) acc_.resize(static_cast<std::size_t>(s.K));
    }
    if (s.dir == Direction::bwd_weight && (!std::is_same_v<O, float> || s.N < kBlockCols))
      acc_.resize(static_cast<std::size_t>(s.K * s.N));
    // bf16: the operands read many times, as f32 (fwd: kChunkRows rows of a; bwd_weight: a row of
    // dz; bwd_data: kChunkRows rows of dz)
    if (!std::is_same_v<T, float>) {
      const std::int64_t wide = s.dir == Direction::fwd           ? std::min(kChunkRows, s.M) * s.K
                                : s.dir == Direction::bwd_weight ? s.N
                                                                 : std::min(kChunkRows, s.M) * s.N;
      wide_.resize(static_cast<std::size_t>(wide));
    }
    if (has_dbias()) dbias_acc_.resize(static_cast<std::size_t>(s.N));
  }

  void run(const Args& t) override {
    const std::int64_t M = s_.M, K = s_.K, N = s_.N;
    switch (s_.dir) {
      case Direction::fwd:
        forward_loop(in(t.a), in(t.b), s_.op == Op::addmm ? in(t.bias) : nullptr, static_cast<O*>(t.out), M, K, N, alpha_,
                     beta_, s_.relu, acc_.data(), wide_.data());
        break;
      case Direction::bwd_data:
        data_grad_loop(in(t.dout), in(t.b), static_cast<O*>(t.out), M, K, N, alpha_, wt_.data(), acc_.data(), wide_.data());
        break;
      default:
        weight_grad_loop(in(t.a), in(t.dout), static_cast<O*>(t.out), M, K, N, alpha_, acc_.data(), wide_.data());
        if (has_dbias()) {  // dbias[N] = beta * the column sums of dOut, in the dtype
          cpu::column_sums(in(t.dout), M, N, dbias_acc_.data(), 1);
          T* db = static_cast<T*>(t.dbias);
          for (std::int64_t o = 0; o < N; ++o) db[o] = store<T>(beta_ * dbias_acc_[static_cast<std::size_t>(o)]);
        }
    }
  }

  std::string label() const override {
    std::string l = std::string("hotops single-thread loops (below ") + std::to_string(kCpuLoopMacs / 1024) +
                    "K multiply-adds, where oneDNN's fixed cost per call dominates), " + vec::clone_name() +
                    ", f32 accumulation";
    if (s_.relu) l += ", bias + ReLU";
    if (!std::is_same_v<O, T>) l += ", f32 output";
    if (has_dbias()) l += " + dbias column sums";
    return l;
  }

 private:
  static const T* in(const void* p) { return static_cast<const T*>(p); }
  bool has_dbias() const { return s_.op == Op::addmm && s_.dir == Direction::bwd_weight; }

  Shape s_;
  float alpha_, beta_;
  std::vector<float> acc_;        // bf16 output: fwd a row, bwd_weight dW, in f32; a narrow bwd_weight's dW transposed
  std::vector<float> dbias_acc_;  // addmm bwd_weight: dbias in f32
  std::vector<float> wide_;       // bf16: the operands read many times, widened
  std::vector<float> wt_;         // bwd_data: W^T in f32
};

}  // namespace

bool cpu_runs_loops(const Shape& s) {
  return (s.op == Op::mm || s.op == Op::addmm) && s.batch_count == 1 && !s.strided() && !s.trans_a && !s.trans_b &&
         !s.residual && !s.b_packed && (s.dtype == DType::f32 || s.dtype == DType::bf16) && s.M > 0 && s.N > 0 && s.K > 0 &&
         s.M * s.N * s.K < kCpuLoopMacs;
}

std::unique_ptr<Plan> make_cpu_loop_plan(const Shape& s) {
  if (s.dtype == DType::bf16) {
    if (s.f32_out) return std::make_unique<CpuLoopMatmul<bf16, float>>(s);
    return std::make_unique<CpuLoopMatmul<bf16, bf16>>(s);
  }
  return std::make_unique<CpuLoopMatmul<float, float>>(s);
}

}  // namespace hotops::matmul
