// mse on the CPU: one OpenMP loop over the elements, f32 math on the stored values, dy stored in the
// dtype and the squares summed in double (OpenMP's reduction). Storage float, or bf16 as its bits.
#include <cstdint>
#include <memory>
#include <string>

#include "hotops/cpu.h"
#include "hotops/cpu_colsum.h"
#include "kernels/loss/mse.h"

namespace hotops::loss::mse {
namespace {

using bf16 = std::uint16_t;  // bf16's bits

template <class T>
class CpuMse final : public Plan {
 public:
  explicit CpuMse(const Shape& s) : n_(s.count()) {}

  void run(const Args& a) override {
    const std::int64_t n = n_;
    const T* y = static_cast<const T*>(a.y);
    const T* t = static_cast<const T*>(a.target);
    T* dy = static_cast<T*>(a.dy);
    const float k = 2.f / static_cast<float>(n);
    double total = 0;
#pragma omp parallel for num_threads(cpu::threads()) reduction(+ : total) schedule(static)
    for (std::int64_t i = 0; i < n; ++i) {
      const float e = cpu::f32_value(y[i]) - cpu::f32_value(t[i]);
      dy[i] = cpu::stored<T>(k * e);
      total += static_cast<double>(e) * e;
    }
    *a.loss = static_cast<float>(total / static_cast<double>(n));
  }

  std::string label() const override { return "hotops OpenMP MSE loss and gradient, the sum in double"; }

 private:
  std::int64_t n_;  // elements
};

}  // namespace

std::unique_ptr<Plan> make_cpu_plan(const Shape& s) {
  if (s.dtype == DType::bf16) return std::make_unique<CpuMse<bf16>>(s);
  return std::make_unique<CpuMse<float>>(s);
}

}  // namespace hotops::loss::mse
