// cross_entropy_dbias on the CPU, hand-written for the small heads of the dense models: one pass over
// each row (softmax, its loss term, dlogits = (softmax - onehot) / rows in f32, bf16 rounded once),
// OpenMP over rows above a grain of work with the loss summed in double; then db, the column sums of
// the stored dlogits, in one f32 chain down the rows.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "hotops/cpu.h"
#include "hotops/cpu_vector.h"
#include "kernels/loss/loss.h"

namespace hotops::loss {
namespace {

// Below this much work (rows x classes x 8) the loop runs on one thread.
constexpr std::int64_t kParallelGrain = 1 << 15;
// bf16: up to this many classes a row's exponentials are kept between its two passes.
constexpr std::int64_t kKeptClasses = 256;

// The mean loss; dlogits written.
template <DType D>
double loss_and_dlogits(const void* logits, const std::int32_t* y, void* dlogits, std::int64_t B, std::int64_t C) {
  using E = vec::Elem<D>;
  using T = typename E::T;
  const T* z = static_cast<const T*>(logits);
  T* dz = static_cast<T*>(dlogits);
  const float inv_b = 1.f / static_cast<float>(B);
  double total = 0;
  const int team = B * C * 8 >= kParallelGrain ? cpu::threads() : 1;
#pragma omp parallel for num_threads(team) reduction(+ : total) schedule(static)
  for (std::int64_t r = 0; r < B; ++r) {
    const T* zr = z + r * C;
    T* dr = dz + r * C;
    if constexpr (D == DType::f32) {
      const float mx = *std::max_element(zr, zr + C);
      float sum = 0.f;
      for (std::int64_t c = 0; c < C; ++c) sum += (dr[c] = std::exp(zr[c] - mx));
      const float inv = 1.f / sum;
      for (std::int64_t c = 0; c < C; ++c) dr[c] = dr[c] * inv * inv_b;
      dr[y[r]] -= inv_b;
      total += static_cast<double>(std::log(sum) - (zr[y[r]] - mx));
    } else {
      float mx = E::load(zr[0]);
      for (std::int64_t c = 1; c < C; ++c) mx = std::max(mx, E::load(zr[c]));
      // The row's exponentials, kept where the row fits (the heads these are for), else computed again.
      float e[kKeptClasses];
      const bool keep = C <= kKeptClasses;
      float sum = 0.f;
      for (std::int64_t c = 0; c < C; ++c) {
        const float v = std::exp(E::load(zr[c]) - mx);
        if (keep) e[c] = v;
        sum += v;
      }
      const float inv = 1.f / sum;
      for (std::int64_t c = 0; c < C; ++c)
        dr[c] = E::store((keep ? e[c] : std::exp(E::load(zr[c]) - mx)) * inv * inv_b - (c == y[r] ? inv_b : 0.f));
      total += static_cast<double>(std::log(sum) - (E::load(zr[y[r]]) - mx));
    }
  }
  return total / static_cast<double>(B);
}

template <DType D>
void bias_grad(const void* dlogits, float* db, std::int64_t B, std::int64_t C) {
  using E = vec::Elem<D>;
  const auto* dz = static_cast<const typename E::T*>(dlogits);
  std::fill_n(db, C, 0.f);
  for (std::int64_t r = 0; r < B; ++r)
    for (std::int64_t c = 0; c < C; ++c) db[c] += E::load(dz[r * C + c]);
}

class CpuCrossEntropyDbias final : public Plan {
 public:
  explicit CpuCrossEntropyDbias(const Shape& s) : s_(s) {}

  void run(const Args& a) override {
    double loss;
    if (s_.dtype == DType::bf16) {
      loss = loss_and_dlogits<DType::bf16>(a.logits, a.labels, a.dlogits, s_.rows, s_.classes);
      bias_grad<DType::bf16>(a.dlogits, a.db, s_.rows, s_.classes);
    } else {
      loss = loss_and_dlogits<DType::f32>(a.logits, a.labels, a.dlogits, s_.rows, s_.classes);
      bias_grad<DType::f32>(a.dlogits, a.db, s_.rows, s_.classes);
    }
    static_cast<float*>(a.loss)[0] = static_cast<float>(loss);
  }

  std::string label() const override {
    return "hotops cross_entropy_dbias: one OpenMP pass a row (loss, dlogits), then db down the rows, f32 math, " +
           std::to_string(cpu::threads()) + " threads";
  }

 private:
  Shape s_;
};

}  // namespace

std::unique_ptr<Plan> make_cpu_dbias_plan(const Shape& s) { return std::make_unique<CpuCrossEntropyDbias>(s); }

}  // namespace hotops::loss
