// scale_residual on the CPU, hand-written. fwd: y = x + gamma z, OpenMP over rows. bwd: dz = gamma dy
// with dgamma and dbias summed per 256-row chunk into the plan's partial sums (OpenMP over chunks),
// then each column's chunks added in chunk order: the sums are the same on any number of threads.
// One thread below a grain of work, where forking costs more than it saves. The row loops but f32's
// forward are compiled per x86-64 level.
#include <omp.h>

#include <algorithm>
#include <string>
#include <vector>

#include "hotops/cpu.h"
#include "hotops/cpu_vector.h"
#include "kernels/pointwise/scale_residual.h"

namespace hotops::pointwise::scale_residual {
namespace {

constexpr std::int64_t kParallelGrain = 1 << 15;  // elements
constexpr std::int64_t kChunkRows = 256;

// The rows [r0, r1) of y = x + gamma z.
template <DType D>
HOTOPS_VECTOR_INLINE void forward_rows(const void* xv, const void* zv, const float* g, void* yv, std::int64_t r0,
                                       std::int64_t r1, std::int64_t n) {
  using E = vec::Elem<D>;
  using T = typename E::T;
  const T* x = static_cast<const T*>(xv);
  const T* z = static_cast<const T*>(zv);
  T* y = static_cast<T*>(yv);
  for (std::int64_t r = r0; r < r1; ++r)
    for (std::int64_t c = 0; c < n; ++c) y[r * n + c] = E::store(E::load(x[r * n + c]) + g[c] * E::load(z[r * n + c]));
}

// The rows [r0, r1) of dz = gamma dy, their dgamma and dbias terms added into pg and pb (a chunk's
// partial sums). kInPlace: dy is dz, read and written through one pointer, so that the compiler sees
// the loop's only overlap as one it checks for at run time and still vectorises.
template <DType D, bool kInPlace>
HOTOPS_VECTOR_INLINE void backward_rows(const void* zv, const void* dyv, const float* g, void* dzv, float* pg, float* pb,
                                        std::int64_t r0, std::int64_t r1, std::int64_t n) {
  using E = vec::Elem<D>;
  using T = typename E::T;
  const T* z = static_cast<const T*>(zv);
  const T* dy = static_cast<const T*>(dyv);
  T* dz = static_cast<T*>(dzv);
  for (std::int64_t r = r0; r < r1; ++r)
    for (std::int64_t c = 0; c < n; ++c) {
      const float d = E::load((kInPlace ? dz : dy)[r * n + c]);
      const T stored = E::store(g[c] * d);
      pg[c] += d * E::load(z[r * n + c]);
      pb[c] += E::load(stored);
      dz[r * n + c] = stored;
    }
}

// The loops compiled per x86-64 level (HOTOPS_CPU_CLONES): in the baseline build bf16's conversions
// ran an element at a time (the bf16 forward took 2.5 times the f32 one's time at convnext.s1).
// f32's forward stays the baseline build's loop: its clones measured 1.08-1.37 times its time.
HOTOPS_CPU_CLONES void forward_bf16(const void* x, const void* z, const float* g, void* y, std::int64_t r0, std::int64_t r1,
                                    std::int64_t n) {
  forward_rows<DType::bf16>(x, z, g, y, r0, r1, n);
}
#define HOTOPS_SCALE_RESIDUAL_BACKWARD(NAME, D)                                                                       \
  HOTOPS_CPU_CLONES void backward_##NAME(const void* z, const void* dy, const float* g, void* dz, float* pg, float* pb, \
                                         std::int64_t r0, std::int64_t r1, std::int64_t n) {                         \
    backward_rows<DType::D, false>(z, dy, g, dz, pg, pb, r0, r1, n);                                                 \
  }                                                                                                                   \
  HOTOPS_CPU_CLONES void backward_in_place_##NAME(const void* z, const void* dy, const float* g, void* dz, float* pg,  \
                                                  float* pb, std::int64_t r0, std::int64_t r1, std::int64_t n) {      \
    backward_rows<DType::D, true>(z, dy, g, dz, pg, pb, r0, r1, n);                                                  \
  }
HOTOPS_SCALE_RESIDUAL_BACKWARD(f32, f32)
HOTOPS_SCALE_RESIDUAL_BACKWARD(bf16, bf16)
#undef HOTOPS_SCALE_RESIDUAL_BACKWARD

using ForwardFn = void (*)(const void*, const void*, const float*, void*, std::int64_t, std::int64_t, std::int64_t);
using BackwardFn = void (*)(const void*, const void*, const float*, void*, float*, float*, std::int64_t, std::int64_t,
                            std::int64_t);

void forward(ForwardFn rows_of, const Shape& s, const Args& a) {
  cpu::in_shares(s.count() >= kParallelGrain ? cpu::threads() : 1, s.rows, [&](std::int64_t r0, std::int64_t r1) {
    rows_of(a.x, a.z, a.gamma, a.out, r0, r1, s.cols);
  });
}

void backward(BackwardFn rows_of, const Shape& s, const Args& a, float* partial) {
  const std::int64_t n = s.cols, rows = s.rows, chunks = (rows + kChunkRows - 1) / kChunkRows;
  const int team = s.count() >= kParallelGrain ? cpu::threads() : 1;
#pragma omp parallel for num_threads(team) schedule(static)
  for (std::int64_t k = 0; k < chunks; ++k) {
    float* pg = partial + k * 2 * n;  // dgamma | dbias of chunk k
    float* pb = pg + n;
    std::fill_n(pg, 2 * n, 0.f);
    rows_of(a.z, a.dy, a.gamma, a.out, pg, pb, k * kChunkRows, std::min(rows, (k + 1) * kChunkRows), n);
  }
#pragma omp parallel for num_threads(team) schedule(static)
  for (std::int64_t c = 0; c < 2 * n; ++c) {
    float sum = 0.f;
    for (std::int64_t k = 0; k < chunks; ++k) sum += partial[k * 2 * n + c];
    float* dst = c < n ? a.dgamma + c : a.dbias ? a.dbias + (c - n) : nullptr;
    if (dst) *dst = sum;
  }
}

class CpuScaleResidual final : public Plan {
 public:
  explicit CpuScaleResidual(const Shape& s) : s_(s) {
    if (s_.dir == Direction::bwd) partial_.resize(static_cast<std::size_t>((s.rows + kChunkRows - 1) / kChunkRows * 2 * s.cols));
  }

  void run(const Args& a) override {
    const bool bf16 = s_.dtype == DType::bf16;
    if (s_.dir == Direction::fwd) return forward(bf16 ? forward_bf16 : forward_rows<DType::f32>, s_, a);
    const bool in_place = a.out == a.dy;
    const BackwardFn rows_of = bf16 ? (in_place ? backward_in_place_bf16 : backward_bf16)
                                    : (in_place ? backward_in_place_f32 : backward_f32);
    backward(rows_of, s_, a, partial_.data());
  }

  std::string label() const override {
    return cpu::with_threads(std::string(s_.dir == Direction::fwd ? "hotops scale_residual loop (OpenMP over rows), "
                                                                  : "hotops scale_residual bwd loop (OpenMP over 256-row "
                                                                    "chunks, f32 partial sums added in chunk order), ") +
                             vec::clone_name());
  }

 private:
  Shape s_;
  std::vector<float> partial_;  // bwd: [chunks][dgamma | dbias]
};

}  // namespace

std::unique_ptr<Plan> make_cpu_plan(const Shape& s) { return std::make_unique<CpuScaleResidual>(s); }

}  // namespace hotops::pointwise::scale_residual
