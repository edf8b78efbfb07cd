// bce_logits on the CPU: one OpenMP loop over the elements, f32 math on the stored values; fwd sums the
// terms in double (OpenMP's reduction), bwd stores dlogits in the dtype. Storage float, or bf16 as its bits.
#include <cmath>
#include <cstdint>
#include <memory>
#include <string>

#include "hotops/cpu.h"
#include "hotops/cpu_colsum.h"
#include "hotops/cpu_vector.h"
#include "kernels/loss/bce.h"

namespace hotops::loss::bce {
namespace {

using bf16 = std::uint16_t;  // bf16's bits

// The mean of the terms max(z, 0) − z·y + log1p(exp(−|z|)).
template <class T>
float mean_loss(const T* z, const float* y, std::int64_t n) {
  double total = 0;
#pragma omp parallel for num_threads(cpu::threads()) reduction(+ : total) schedule(static)
  for (std::int64_t i = 0; i < n; ++i) {
    const float v = vec::load(z[i]);
    total += static_cast<double>(std::fmax(v, 0.f) - v * y[i] + std::log1p(std::exp(-std::fabs(v))));
  }
  return static_cast<float>(total / static_cast<double>(n));
}

// d = (sigmoid(z) − y) / n, the sigmoid as 1 / (1 + e) or e / (1 + e) with e = exp(−|z|) (no overflow).
template <class T>
void gradient(const T* z, const float* y, T* d, std::int64_t n) {
  const float len = static_cast<float>(n);
#pragma omp parallel for num_threads(cpu::threads()) schedule(static)
  for (std::int64_t i = 0; i < n; ++i) {
    const float v = vec::load(z[i]);
    const float e = std::exp(-std::fabs(v));
    const float sig = v >= 0.f ? 1.f / (1.f + e) : e / (1.f + e);
    d[i] = vec::store<T>((sig - y[i]) / len);
  }
}

class CpuBce final : public Plan {
 public:
  explicit CpuBce(const Shape& s) : s_(s) {}

  void run(const Args& a) override {
    const bool bf = s_.dtype == DType::bf16;
    const std::int64_t n = s_.count();
    if (s_.dir == Direction::fwd)
      *a.loss = bf ? mean_loss(static_cast<const bf16*>(a.logits), a.target, n)
                   : mean_loss(static_cast<const float*>(a.logits), a.target, n);
    else if (bf)
      gradient(static_cast<const bf16*>(a.logits), a.target, static_cast<bf16*>(a.dlogits), n);
    else
      gradient(static_cast<const float*>(a.logits), a.target, static_cast<float*>(a.dlogits), n);
  }

  std::string label() const override {
    return cpu::with_threads(s_.dir == Direction::fwd ? "hotops OpenMP loop: BCE-with-logits loss, the sum in double"
                                                      : "hotops OpenMP loop: BCE-with-logits gradient");
  }

 private:
  Shape s_;
};

}  // namespace

std::unique_ptr<Plan> make_cpu_plan(const Shape& s) { return std::make_unique<CpuBce>(s); }

}  // namespace hotops::loss::bce
