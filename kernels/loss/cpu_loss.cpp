// cross_entropy on the CPU, hand-written (oneDNN 2.6 has no cross-entropy primitive): an OpenMP
// loop over blocks of rows, each row in two passes over its logits (the max, then the sum of
// exp(x - max)) for fwd and one pass for bwd. The per-row loops are plain code that GCC vectorises,
// 16 interleaved lanes kept in small arrays (a float reduction does not vectorise without
// reassociation), and exp is our own (Cody-Waite reduction and Cephes expf's polynomial): a libm
// call would keep the loop scalar. They are compiled three times (target_clones: x86-64-v4 =
// AVX-512, x86-64-v3 = AVX2 + FMA, baseline) and the loader picks the best for this CPU.
// Math in f32; the mean over rows is accumulated in double: one partial sum per block of rows (a
// fixed partition that does not depend on the thread count), the partials added in block order,
// so the loss is the same bit for bit on every run and every thread count.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "hotops/cpu.h"
#include "hotops/cpu_vector.h"
#include "kernels/loss/loss.h"

namespace hotops::loss {
namespace kernel {

#define LOSS_INLINE HOTOPS_VECTOR_INLINE

using vec::bf16_to_f32;
using vec::bits;
using vec::f32_to_bf16;
using vec::from_bits;
using vec::if_set;

// Branch-free max and min (std::max on floats leaves a branch that keeps the loop scalar; see
// cpu_vector.h).
LOSS_INLINE float max_f32(float a, float b) { return if_set(a > b, a, b); }
LOSS_INLINE float min_f32(float a, float b) { return if_set(a < b, a, b); }

constexpr int kLanes = 16;

// exp(y) for y in [-87.3, 88.7] (clamped there; below, 2^-126 scale changes no sum that has a 1 in
// it), within 2 ulp: y = n ln2 + r with |r| <= ln2 / 2 (ln2 in two parts, so r is exact), exp(r)
// from Cephes expf's polynomial, 2^n added to the exponent bits.
LOSS_INLINE float exp_f32(float y) {
  constexpr float kLog2e = 1.44269504088896341f;
  constexpr float kLn2Hi = 0.693359375f, kLn2Lo = -2.12194440e-4f;
  constexpr float kRound = 12582912.f;  // 1.5 * 2^23: adding it rounds to an integer, in the low bits
  y = min_f32(max_f32(y, -87.3f), 88.7f);
  const float j = y * kLog2e + kRound;
  const float n = j - kRound;
  const float r = (y - n * kLn2Hi) - n * kLn2Lo;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const float e = (p * r) * r + r + 1.f;
  const std::uint32_t ni = bits(j) - bits(kRound);  // n, two's complement
  return from_bits(bits(e) + (ni << 23));
}

using vec::Elem;

// The lanes' total in a fixed pairwise order.
LOSS_INLINE float lane_sum(float* a) {
  for (int w = kLanes / 2; w > 0; w /= 2)
    for (int k = 0; k < w; ++k) a[k] += a[k + w];
  return a[0];
}

// lse of one row of n logits.
template <DType D>
LOSS_INLINE float row_lse(const typename Elem<D>::T* __restrict x, std::int64_t n) {
  const std::int64_t full = n / kLanes * kLanes;
  float mv[kLanes];
  for (int k = 0; k < kLanes; ++k) mv[k] = -std::numeric_limits<float>::infinity();
  for (std::int64_t i = 0; i < full; i += kLanes)
    for (int k = 0; k < kLanes; ++k) mv[k] = max_f32(mv[k], Elem<D>::load(x[i + k]));
  for (std::int64_t i = full; i < n; ++i) mv[0] = max_f32(mv[0], Elem<D>::load(x[i]));
  float m = mv[0];
  for (int k = 1; k < kLanes; ++k) m = max_f32(m, mv[k]);
  float sv[kLanes] = {};
  for (std::int64_t i = 0; i < full; i += kLanes)
    for (int k = 0; k < kLanes; ++k) sv[k] += exp_f32(Elem<D>::load(x[i + k]) - m);
  for (std::int64_t i = full; i < n; ++i) sv[i - full] += exp_f32(Elem<D>::load(x[i]) - m);
  return m + std::log(lane_sum(sv));
}

// fwd over rows [r0, r1): each row's lse into lse[], the sum of the row losses returned (double).
template <DType D>
LOSS_INLINE double fwd_rows(const void* x_v, const std::int64_t* target, float* lse, std::int64_t classes,
                            std::int64_t r0, std::int64_t r1) {
  const auto* x = static_cast<const typename Elem<D>::T*>(x_v);
  double sum = 0;
  for (std::int64_t r = r0; r < r1; ++r) {
    const auto* row = x + r * classes;
    const float l = row_lse<D>(row, classes);
    lse[r] = l;
    sum += static_cast<double>(l - Elem<D>::load(row[target[r]]));
  }
  return sum;
}

// bwd over rows [r0, r1): dx = (exp(x - lse) - onehot) * scale, the target's element redone after.
template <DType D>
LOSS_INLINE void bwd_rows(const void* x_v, const std::int64_t* target, const float* lse, float scale, void* dx_v,
                          std::int64_t classes, std::int64_t r0, std::int64_t r1) {
  using T = typename Elem<D>::T;
  const auto* x = static_cast<const T*>(x_v);
  auto* dx = static_cast<T*>(dx_v);
  for (std::int64_t r = r0; r < r1; ++r) {
    const T* __restrict row = x + r * classes;
    T* __restrict out = dx + r * classes;
    const float l = lse[r];
    for (std::int64_t j = 0; j < classes; ++j) out[j] = Elem<D>::store(exp_f32(Elem<D>::load(row[j]) - l) * scale);
    const std::int64_t t = target[r];
    out[t] = Elem<D>::store((exp_f32(Elem<D>::load(row[t]) - l) - 1.f) * scale);
  }
}

HOTOPS_CPU_CLONES double ce_fwd_f32(const void* x, const std::int64_t* t, float* lse, std::int64_t c, std::int64_t r0,
                                    std::int64_t r1) {
  return fwd_rows<DType::f32>(x, t, lse, c, r0, r1);
}
HOTOPS_CPU_CLONES double ce_fwd_bf16(const void* x, const std::int64_t* t, float* lse, std::int64_t c, std::int64_t r0,
                                     std::int64_t r1) {
  return fwd_rows<DType::bf16>(x, t, lse, c, r0, r1);
}
HOTOPS_CPU_CLONES void ce_bwd_f32(const void* x, const std::int64_t* t, const float* lse, float scale, void* dx,
                                  std::int64_t c, std::int64_t r0, std::int64_t r1) {
  bwd_rows<DType::f32>(x, t, lse, scale, dx, c, r0, r1);
}
HOTOPS_CPU_CLONES void ce_bwd_bf16(const void* x, const std::int64_t* t, const float* lse, float scale, void* dx,
                                   std::int64_t c, std::int64_t r0, std::int64_t r1) {
  bwd_rows<DType::bf16>(x, t, lse, scale, dx, c, r0, r1);
}

}  // namespace kernel

namespace {

// Rows per block: about 8192 logits (32 KiB of f32), at least 1 and at most 256 rows. A function of
// the shape only, so that the partial sums, and the loss, do not depend on the thread count.
std::int64_t rows_per_block(std::int64_t classes) { return std::clamp<std::int64_t>(8192 / classes, 1, 256); }

class CpuCrossEntropy final : public Plan {
 public:
  explicit CpuCrossEntropy(const Shape& s)
      : s_(s),
        block_(rows_per_block(s_.classes)),
        blocks_((s_.rows + block_ - 1) / block_),
        partial_(static_cast<std::size_t>(blocks_)) {}

  void run(const Args& a) override {
    const bool bf16 = s_.dtype == DType::bf16;
    const void* x = a.logits;
    const std::int64_t* t = a.target;
    const std::int64_t rows = s_.rows, classes = s_.classes, block = block_, blocks = blocks_;
    if (s_.dir == Direction::fwd) {
      auto* lse = static_cast<float*>(a.lse);
      double* partial = partial_.data();
#pragma omp parallel for schedule(static) num_threads(cpu::threads()) if (blocks > 1)
      for (std::int64_t b = 0; b < blocks; ++b) {
        const std::int64_t r0 = b * block, r1 = std::min(rows, r0 + block);
        partial[b] = bf16 ? kernel::ce_fwd_bf16(x, t, lse, classes, r0, r1) : kernel::ce_fwd_f32(x, t, lse, classes, r0, r1);
      }
      double sum = 0;
      for (std::int64_t b = 0; b < blocks; ++b) sum += partial[b];
      static_cast<float*>(a.loss)[0] = static_cast<float>(sum / static_cast<double>(rows));
      return;
    }
    const auto* lse = static_cast<const float*>(a.saved_lse);
    const float scale = static_cast<const float*>(a.dloss)[0] / static_cast<float>(rows);
    void* dx = a.dlogits;
#pragma omp parallel for schedule(static) num_threads(cpu::threads()) if (blocks > 1)
    for (std::int64_t b = 0; b < blocks; ++b) {
      const std::int64_t r0 = b * block, r1 = std::min(rows, r0 + block);
      if (bf16) kernel::ce_bwd_bf16(x, t, lse, scale, dx, classes, r0, r1);
      else kernel::ce_bwd_f32(x, t, lse, scale, dx, classes, r0, r1);
    }
  }

  std::string label() const override {
    return std::string("hotops cross_entropy ") + direction_name(s_.dir) +
           ", hand-written OpenMP row loop (oneDNN 2.6 has no cross-entropy primitive), f32 math" +
           (s_.dir == Direction::fwd ? ", mean in double over fixed blocks of " + std::to_string(block_) + " rows"
                                     : std::string()) +
           ", " + vec::clone_name() + ", " + std::to_string(cpu::threads()) + " threads";
  }

 private:
  Shape s_;
  std::int64_t block_, blocks_;
  std::vector<double> partial_;  // fwd: each block's sum of row losses
};

}  // namespace

std::unique_ptr<Plan> make_cpu_plan(const Shape& s) {
  if (s.kind == Kind::cross_entropy_dbias) return make_cpu_dbias_plan(s);
  return std::make_unique<CpuCrossEntropy>(s);
}

}  // namespace hotops::loss
