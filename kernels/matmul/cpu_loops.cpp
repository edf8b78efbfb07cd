// matmul on the CPU below kCpuLoopMacs multiply-adds: hand-written single-thread loops (a dense
// layer of a tiny MLP), where a oneDNN primitive's fixed cost per call is most of the time. Each of
// the three products is a sum of rows of a contiguous operand (blocked_sums: 4 x 16 blocks of the
// output in vector registers, compiled per x86-64 level: HOTOPS_CPU_CLONES); f32 math on the stored
// values (bf16 widened exactly, the operand read many times once a call), f32 accumulation, one
// rounding into the output.
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
HOTOPS_VECTOR_INLINE float load(float v) { return v; }
HOTOPS_VECTOR_INLINE float load(bf16 v) { return vec::bf16_to_f32(v); }
template <class T> HOTOPS_VECTOR_INLINE T store(float f);
template <> HOTOPS_VECTOR_INLINE float store<float>(float f) { return f; }
template <> HOTOPS_VECTOR_INLINE bf16 store<bf16>(float f) { return vec::f32_to_bf16(f); }

// c(r, j) = init(j) + the sum over k in order of a(r, k) B[k ldb + j], for r < rows and j < cols, each
// handed once to put(r, j, c). Blocks of 4 rows x 16 columns are summed in four vector registers
// (four independent chains, each 16 floats of B loaded once for the four rows); the columns past
// the last whole block, and the rows past the last whole block, in a plain loop, a row at a time
// into `acc` (cols floats).
template <class A, class Init, class Put>
HOTOPS_VECTOR_INLINE void blocked_sums(std::int64_t rows, std::int64_t cols, std::int64_t depth, A a, const float* B, std::int64_t ldb,
                  Init init, Put put, float* acc) {
  using v16 = float __attribute__((vector_size(64)));  // 16 floats: one AVX-512 register, two AVX2 ones
  constexpr std::int64_t kRows = 4, kCols = 16;
  const std::int64_t R4 = rows / kRows * kRows, C16 = cols / kCols * kCols;
  for (std::int64_t r0 = 0; r0 < R4; r0 += kRows)
    for (std::int64_t j0 = 0; j0 < C16; j0 += kCols) {
      v16 first;
      for (std::int64_t j = 0; j < kCols; ++j) first[j] = init(j0 + j);
      v16 s[kRows] = {first, first, first, first};
      for (std::int64_t k = 0; k < depth; ++k) {
        v16 b;
        std::memcpy(&b, B + k * ldb + j0, sizeof b);
        for (std::int64_t q = 0; q < kRows; ++q) s[q] += a(r0 + q, k) * b;
      }
      for (std::int64_t q = 0; q < kRows; ++q) {
        float out[kCols];
        std::memcpy(out, &s[q], sizeof out);
        for (std::int64_t j = 0; j < kCols; ++j) put(r0 + q, j0 + j, out[j]);
      }
    }
  for (std::int64_t r = 0; r < rows; ++r) {
    const std::int64_t from = r < R4 ? C16 : 0;
    float* __restrict c = acc;  // (never B)
    for (std::int64_t j = from; j < cols; ++j) c[j] = init(j);
    for (std::int64_t k = 0; k < depth; ++k) {
      const float ak = a(r, k);
      const float* __restrict Bk = B + k * ldb;
      for (std::int64_t j = from; j < cols; ++j) c[j] += ak * Bk[j];
    }
    for (std::int64_t j = from; j < cols; ++j) put(r, j, c[j]);
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
// summed from the bias over i in order. `wide`: K x N floats (bf16 W).
template <class T, class O>
HOTOPS_VECTOR_INLINE void forward(const T* a, const T* W, const T* bias, O* y, std::int64_t M, std::int64_t K, std::int64_t N, float alpha,
             float beta, bool relu, float* acc, float* wide) {
  blocked_sums(
      M, N, K, [&](std::int64_t r, std::int64_t i) HOTOPS_LAMBDA_INLINE { return alpha * load(a[r * K + i]); }, widened(W, K * N, wide),
      N, [&](std::int64_t o) HOTOPS_LAMBDA_INLINE { return bias ? beta * load(bias[o]) : 0.f; },
      [&](std::int64_t r, std::int64_t o, float v) HOTOPS_LAMBDA_INLINE { y[r * N + o] = store<O>(relu ? std::max(v, 0.f) : v); },
      acc);
}

// dW[K, N] = alpha * a[M, K]^T . dz[M, N], each element summed over the rows in order. `wide`: M x N
// floats (bf16 dz).
template <class T, class O>
HOTOPS_VECTOR_INLINE void weight_grad(const T* a, const T* dz, O* dW, std::int64_t M, std::int64_t K, std::int64_t N, float alpha, float* acc,
                 float* wide) {
  blocked_sums(
      K, N, M, [&](std::int64_t i, std::int64_t r) HOTOPS_LAMBDA_INLINE { return alpha * load(a[r * K + i]); }, widened(dz, M * N, wide),
      N, [](std::int64_t) HOTOPS_LAMBDA_INLINE { return 0.f; },
      [&](std::int64_t i, std::int64_t o, float v) HOTOPS_LAMBDA_INLINE { dW[i * N + o] = store<O>(v); }, acc);
}

// da[M, K] = alpha * dz[M, N] . W[K, N]^T, each element summed over N in order, on W transposed
// (and widened) into `wide` (N x K floats) so that a row of da is a sum of rows, as in forward.
template <class T, class O>
HOTOPS_VECTOR_INLINE void data_grad(const T* dz, const T* W, O* da, std::int64_t M, std::int64_t K, std::int64_t N, float alpha, float* acc,
               float* wide) {
  for (std::int64_t i = 0; i < K; ++i)
    for (std::int64_t o = 0; o < N; ++o) wide[o * K + i] = load(W[i * N + o]);
  blocked_sums(
      M, K, N, [&](std::int64_t r, std::int64_t o) HOTOPS_LAMBDA_INLINE { return load(dz[r * N + o]); }, wide, K,
      [](std::int64_t) HOTOPS_LAMBDA_INLINE { return 0.f; },
      [&](std::int64_t r, std::int64_t i, float v) HOTOPS_LAMBDA_INLINE { da[r * K + i] = store<O>(alpha * v); }, acc);
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
                                        std::int64_t N, float alpha, float* acc, float* wide) {                      \
    data_grad<T, O>(dz, W, da, M, K, N, alpha, acc, wide);                                                          \
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
    acc_.resize(static_cast<std::size_t>(std::max(s.N, s.K)));  // a row of the blocked sums' plain loop
    // The operand the loops read many times, as f32: bf16 W (fwd) or dz (bwd_weight); W transposed (bwd_data).
    const bool widens = !std::is_same_v<T, float>;
    const std::int64_t wide = s.dir == Direction::bwd_data ? s.K * s.N : !widens ? 0 : s.dir == Direction::fwd ? s.K * s.N : s.M * s.N;
    wide_.resize(static_cast<std::size_t>(wide));
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
        data_grad_loop(in(t.dout), in(t.b), static_cast<O*>(t.out), M, K, N, alpha_, acc_.data(), wide_.data());
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
  std::vector<float> acc_;        // a row of the blocked sums' plain loop
  std::vector<float> dbias_acc_;  // addmm bwd_weight: dbias in f32
  std::vector<float> wide_;       // the operand the loops read many times, as f32
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
