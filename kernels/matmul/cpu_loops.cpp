// matmul on the CPU below kCpuLoopMacs multiply-adds: hand-written single-thread loops (a dense
// layer of a tiny MLP), where a oneDNN primitive's fixed cost per call is most of the time. Rows of
// the product outermost, the inner loops over the contiguous output axis so that they vectorise
// (compiled per x86-64 level: HOTOPS_CPU_CLONES); f32 math on the stored values (bf16 widened
// exactly), f32 accumulation, one rounding into the output.
#include <algorithm>
#include <cstdint>
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

// y[M, N] = alpha * a[M, K] . W[K, N] (+ beta * bias[N]) (then max(., 0) with relu). An f32 output
// accumulates in y itself; a bf16 one in `acc`, a row of N floats.
template <class T, class O>
HOTOPS_VECTOR_INLINE void forward(const T* a, const T* W, const T* bias, O* y, std::int64_t M, std::int64_t K, std::int64_t N, float alpha,
             float beta, bool relu, float* acc) {
  for (std::int64_t r = 0; r < M; ++r) {
    float* yr;
    if constexpr (std::is_same_v<O, float>) yr = y + r * N;
    else yr = acc;
    if (bias)
      for (std::int64_t o = 0; o < N; ++o) yr[o] = beta * load(bias[o]);
    else
      std::fill_n(yr, N, 0.f);
    for (std::int64_t i = 0; i < K; ++i) {
      const float ai = alpha * load(a[r * K + i]);
      const T* Wi = W + i * N;
      for (std::int64_t o = 0; o < N; ++o) yr[o] += ai * load(Wi[o]);
    }
    if (relu)
      for (std::int64_t o = 0; o < N; ++o) yr[o] = std::max(yr[o], 0.f);
    if constexpr (!std::is_same_v<O, float>)
      for (std::int64_t o = 0; o < N; ++o) y[r * N + o] = store<O>(yr[o]);
  }
}

// dW[K, N] = alpha * a[M, K]^T . dz[M, N], accumulated in `acc` (K x N floats: dW itself where it
// is f32).
template <class T, class O>
HOTOPS_VECTOR_INLINE void weight_grad(const T* a, const T* dz, O* dW, std::int64_t M, std::int64_t K, std::int64_t N, float alpha, float* acc) {
  float* sum;
  if constexpr (std::is_same_v<O, float>) sum = dW;
  else sum = acc;
  std::fill_n(sum, K * N, 0.f);
  for (std::int64_t r = 0; r < M; ++r)
    for (std::int64_t i = 0; i < K; ++i) {
      const float ai = alpha * load(a[r * K + i]);
      float* si = sum + i * N;
      const T* dzr = dz + r * N;
      for (std::int64_t o = 0; o < N; ++o) si[o] += ai * load(dzr[o]);
    }
  if constexpr (!std::is_same_v<O, float>)
    for (std::int64_t j = 0; j < K * N; ++j) dW[j] = store<O>(sum[j]);
}

// da[M, K] = alpha * dz[M, N] . W[K, N]^T: a dot product per element over rows of dz and W (both
// contiguous), summed in kLanes interleaved partial sums so that the loop vectorises (a single serial
// f32 sum would not), then those sums in order, then the tail.
constexpr std::int64_t kLanes = 8;
template <class T, class O>
HOTOPS_VECTOR_INLINE void data_grad(const T* dz, const T* W, O* da, std::int64_t M, std::int64_t K, std::int64_t N, float alpha) {
  const std::int64_t body = N / kLanes * kLanes;
  for (std::int64_t r = 0; r < M; ++r)
    for (std::int64_t i = 0; i < K; ++i) {
      const T* Wi = W + i * N;
      const T* dzr = dz + r * N;
      float s = 0.f;
      if (body > 0) {  // (a narrow N, such as a 2-class head's, is the tail alone)
        float lane[kLanes] = {};
        for (std::int64_t o = 0; o < body; o += kLanes)
          for (std::int64_t j = 0; j < kLanes; ++j) lane[j] += load(dzr[o + j]) * load(Wi[o + j]);
        for (std::int64_t j = 0; j < kLanes; ++j) s += lane[j];
      }
      for (std::int64_t o = body; o < N; ++o) s += load(dzr[o]) * load(Wi[o]);
      da[r * K + i] = store<O>(alpha * s);
    }
}

// The loops of each (operands, output) storage pair the plans run, one function per x86-64 level.
#define HOTOPS_MATMUL_LOOPS(T, O)                                                                                   \
  HOTOPS_CPU_CLONES void forward_loop(const T* a, const T* W, const T* bias, O* y, std::int64_t M, std::int64_t K,  \
                                      std::int64_t N, float alpha, float beta, bool relu, float* acc) {             \
    forward<T, O>(a, W, bias, y, M, K, N, alpha, beta, relu, acc);                                                 \
  }                                                                                                                 \
  HOTOPS_CPU_CLONES void weight_grad_loop(const T* a, const T* dz, O* dW, std::int64_t M, std::int64_t K,          \
                                          std::int64_t N, float alpha, float* acc) {                                \
    weight_grad<T, O>(a, dz, dW, M, K, N, alpha, acc);                                                             \
  }                                                                                                                 \
  HOTOPS_CPU_CLONES void data_grad_loop(const T* dz, const T* W, O* da, std::int64_t M, std::int64_t K,            \
                                        std::int64_t N, float alpha) {                                              \
    data_grad<T, O>(dz, W, da, M, K, N, alpha);                                                                    \
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
    if (s.dir == Direction::bwd_weight && !std::is_same_v<O, float>) acc_.resize(static_cast<std::size_t>(s.K * s.N));
    if (has_dbias()) dbias_acc_.resize(static_cast<std::size_t>(s.N));
  }

  void run(const Args& t) override {
    const std::int64_t M = s_.M, K = s_.K, N = s_.N;
    switch (s_.dir) {
      case Direction::fwd:
        forward_loop(in(t.a), in(t.b), s_.op == Op::addmm ? in(t.bias) : nullptr, static_cast<O*>(t.out), M, K, N, alpha_,
                     beta_, s_.relu, acc_.data());
        break;
      case Direction::bwd_data:
        data_grad_loop(in(t.dout), in(t.b), static_cast<O*>(t.out), M, K, N, alpha_);
        break;
      default:
        weight_grad_loop(in(t.a), in(t.dout), static_cast<O*>(t.out), M, K, N, alpha_, acc_.data());
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
  std::vector<float> acc_;        // bf16 output: fwd a row, bwd_weight dW, in f32
  std::vector<float> dbias_acc_;  // addmm bwd_weight: dbias in f32
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
