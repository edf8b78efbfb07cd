// layernorm_dbias on the CPU: one OpenMP loop over rows, a row's passes compiled per x86-64 level
// (HOTOPS_CPU_CLONES), f32 math on the stored values, each thread adding its rows' dy * xhat and dy
// into partial dgamma / dbeta that are then added in thread order; then the column sums of the
// stored dx (hotops/cpu_colsum.h). Storage float, or bf16 as its bits.
#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "hotops/check.h"
#include "hotops/cpu.h"
#include "hotops/cpu_colsum.h"
#include "hotops/cpu_vector.h"
#include "kernels/layernorm/layernorm_dbias.h"

namespace hotops::layernorm::dbias {
namespace {

using bf16 = std::uint16_t;  // bf16's bits
using vec::load;
using vec::store;

// One row: dx = rstd (dy g - mean(dy g) - xhat mean(dy g xhat)) (+ dres) where dx is given, the row's
// dy * xhat and dy added into pg and pb, dy kept in d for the second pass. The row's two means are
// summed in kLanes interleaved partial sums, then those in order, then the tail (a single chain of
// dependent adds would bound the pass by the add's latency, and would not vectorise). The rows'
// tensors and the thread's scratch do not overlap (restrict): in f32, where all of them are floats,
// the compiler otherwise keeps every partial sum in memory.
constexpr std::int64_t kLanes = 16;
template <class T>
HOTOPS_VECTOR_INLINE void row_backward(const T* __restrict__ dy, const T* __restrict__ x, const T* __restrict__ dres,
                                       T* __restrict__ dx, const float* __restrict__ g, float m, float rs, std::int64_t H,
                                       float* __restrict__ pg, float* __restrict__ pb, float* __restrict__ d) {
  // Column c's part: dy kept, dgamma's and dbeta's terms added, the two means' terms into s1, s2.
  const auto column = [&](std::int64_t c, float& s1, float& s2) HOTOPS_LAMBDA_INLINE {
    const float dv = load(dy[c]), xh = (load(x[c]) - m) * rs;
    d[c] = dv;
    pg[c] += dv * xh, pb[c] += dv;
    s1 += dv * g[c], s2 += dv * g[c] * xh;
  };
  float l1[kLanes] = {}, l2[kLanes] = {};
  const std::int64_t body = H / kLanes * kLanes;
  for (std::int64_t c0 = 0; c0 < body; c0 += kLanes)
    for (std::int64_t j = 0; j < kLanes; ++j) column(c0 + j, l1[j], l2[j]);
  float m1 = 0, m2 = 0;
  for (std::int64_t j = 0; j < kLanes; ++j) m1 += l1[j], m2 += l2[j];
  for (std::int64_t c = body; c < H; ++c) column(c, m1, m2);
  m1 /= static_cast<float>(H), m2 /= static_cast<float>(H);
  if (dx)
    for (std::int64_t c = 0; c < H; ++c) {
      const float xh = (load(x[c]) - m) * rs;
      dx[c] = store<T>(rs * (d[c] * g[c] - m1 - xh * m2) + (dres ? load(dres[c]) : 0.f));
    }
}

// A row, compiled per x86-64 level.
#define HOTOPS_LN_ROW(T)                                                                                          \
  HOTOPS_CPU_CLONES void row_loop(const T* dy, const T* x, const T* dres, T* dx, const float* g, float m, float rs, \
                                  std::int64_t H, float* pg, float* pb, float* d) {                              \
    row_backward<T>(dy, x, dres, dx, g, m, rs, H, pg, pb, d);                                                    \
  }
HOTOPS_LN_ROW(float)
HOTOPS_LN_ROW(bf16)
#undef HOTOPS_LN_ROW

template <class T>
class CpuLayernormDbias final : public Plan {
 public:
  explicit CpuLayernormDbias(const Shape& s) : s_(s) { scratch(cpu::threads()); }

  void run(const Args& a) override {
    HOTOPS_CHECK(!a.dbias || a.dx, "layernorm_dbias: dbias is the column sums of dx, which needs dx");
    const int nt = cpu::threads();
    rows(a, scratch(nt), nt);
    if (a.dbias) cpu::column_sums(static_cast<const T*>(a.dx), s_.rows(), s_.hidden, a.dbias, nt);
  }

  std::string label() const override {
    return std::string("hotops OpenMP LayerNorm backward (+ dres), ") + vec::clone_name() +
           ", per-thread dgamma/dbeta, then column sums of dx";
  }

 private:
  // Per thread: its partial dgamma and dbeta, and one row's gradient (3H floats); allocated for
  // `threads` once.
  float* scratch(int threads) {
    const auto n = static_cast<std::size_t>(threads) * 3 * static_cast<std::size_t>(s_.hidden);
    if (scratch_.size() < n) scratch_.resize(n);
    return scratch_.data();
  }

  // dx = LN backward of dy (+ dres); dgamma and dbeta from the threads' partials.
  void rows(const Args& a, float* part, int nt) {
    const std::int64_t R = s_.rows(), H = s_.hidden;
    const T* dy = static_cast<const T*>(a.dy);
    const T* x = static_cast<const T*>(a.x);
    const T* dres = static_cast<const T*>(a.dres);
    T* dx = static_cast<T*>(a.dx);
    const float *mean = a.saved_mean, *rstd = a.saved_rstd, *g = a.gamma;
#pragma omp parallel num_threads(nt)
    {
      float* pg = part + static_cast<std::size_t>(omp_get_thread_num() * 3 * H);
      float* pb = pg + H;
      float* d = pb + H;
      std::fill(pg, pg + 2 * H, 0.f);
#pragma omp for schedule(static)
      for (std::int64_t r = 0; r < R; ++r)
        row_loop(dy + r * H, x + r * H, dres ? dres + r * H : nullptr, dx ? dx + r * H : nullptr, g, mean[r], rstd[r], H, pg, pb, d);
    }
    for (std::int64_t c = 0; c < 2 * H; ++c) {
      float sum = 0;
      for (int t = 0; t < nt; ++t) sum += part[static_cast<std::size_t>(t * 3 * H + c)];
      (c < H ? a.dgamma[c] : a.dbeta[c - H]) = sum;
    }
  }

  Shape s_;
  std::vector<float> scratch_;
};

}  // namespace

std::unique_ptr<Plan> make_cpu_plan(const Shape& s) {
  if (s.dtype == DType::bf16) return std::make_unique<CpuLayernormDbias<bf16>>(s);
  return std::make_unique<CpuLayernormDbias<float>>(s);
}

}  // namespace hotops::layernorm::dbias
