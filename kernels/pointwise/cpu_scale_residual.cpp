// scale_residual on the CPU, hand-written. fwd: y = x + gamma z, OpenMP over rows. bwd: dz = gamma dy
// with dgamma and dbias summed per 256-row chunk into the plan's partial sums (OpenMP over chunks),
// then each column's chunks added in chunk order: the sums are the same on any number of threads.
// One thread below a grain of work, where forking costs more than it saves.
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

template <DType D>
void forward(const Shape& s, const Args& a) {
  using E = vec::Elem<D>;
  using T = typename E::T;
  const T* x = static_cast<const T*>(a.x);
  const T* z = static_cast<const T*>(a.z);
  T* y = static_cast<T*>(a.out);
  const float* g = a.gamma;
  const std::int64_t n = s.cols, rows = s.rows;
#pragma omp parallel for num_threads(s.count() >= kParallelGrain ? cpu::threads() : 1) schedule(static)
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t c = 0; c < n; ++c) y[r * n + c] = E::store(E::load(x[r * n + c]) + g[c] * E::load(z[r * n + c]));
}

template <DType D>
void backward(const Shape& s, const Args& a, float* partial) {
  using E = vec::Elem<D>;
  using T = typename E::T;
  const T* z = static_cast<const T*>(a.z);
  const T* dy = static_cast<const T*>(a.dy);
  T* dz = static_cast<T*>(a.out);  // may be dy: each element read before it is written
  const float* g = a.gamma;
  const std::int64_t n = s.cols, rows = s.rows, chunks = (rows + kChunkRows - 1) / kChunkRows;
  const int team = s.count() >= kParallelGrain ? cpu::threads() : 1;
#pragma omp parallel for num_threads(team) schedule(static)
  for (std::int64_t k = 0; k < chunks; ++k) {
    float* pg = partial + k * 2 * n;  // dgamma | dbias of chunk k
    float* pb = pg + n;
    std::fill_n(pg, 2 * n, 0.f);
    for (std::int64_t r = k * kChunkRows; r < std::min(rows, (k + 1) * kChunkRows); ++r)
      for (std::int64_t c = 0; c < n; ++c) {
        const float d = E::load(dy[r * n + c]);
        const T stored = E::store(g[c] * d);
        pg[c] += d * E::load(z[r * n + c]);
        pb[c] += E::load(stored);
        dz[r * n + c] = stored;
      }
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
    if (s_.dir == Direction::fwd) return bf16 ? forward<DType::bf16>(s_, a) : forward<DType::f32>(s_, a);
    bf16 ? backward<DType::bf16>(s_, a, partial_.data()) : backward<DType::f32>(s_, a, partial_.data());
  }

  std::string label() const override {
    return cpu::with_threads(s_.dir == Direction::fwd ? "hotops scale_residual loop (OpenMP over rows)"
                                                      : "hotops scale_residual bwd loop (OpenMP over 256-row chunks, "
                                                        "f32 partial sums added in chunk order)");
  }

 private:
  Shape s_;
  std::vector<float> partial_;  // bwd: [chunks][dgamma | dbias]
};

}  // namespace

std::unique_ptr<Plan> make_cpu_plan(const Shape& s) { return std::make_unique<CpuScaleResidual>(s); }

}  // namespace hotops::pointwise::scale_residual
