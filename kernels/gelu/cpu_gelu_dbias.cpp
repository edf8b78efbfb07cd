// gelu_dbias on the CPU: dx = dy * gelu'(x) (erf) in one OpenMP loop, f32 math on the stored values,
// then the column sums of the stored dx (hotops/cpu_colsum.h). Storage float, or bf16 as its bits.
#include <cmath>
#include <cstdint>
#include <memory>
#include <string>

#include "hotops/cpu.h"
#include "hotops/cpu_colsum.h"
#include "kernels/gelu/gelu_dbias.h"

namespace hotops::gelu::dbias {
namespace {

using bf16 = std::uint16_t;  // bf16's bits
using cpu::stored;

float gelu_grad(float z) {
  return 0.5f * (1.f + std::erf(z * 0.70710678118654752f)) + z * 0.39894228040143268f * std::exp(-0.5f * z * z);
}

template <class T>
class CpuGeluDbias final : public Plan {
 public:
  explicit CpuGeluDbias(const Shape& s) : s_(s) {}

  void run(const Args& a) override {
    const T* x = static_cast<const T*>(a.x);
    const T* dy = static_cast<const T*>(a.dy);
    T* dx = static_cast<T*>(a.dx);
    const std::int64_t n = s_.rows * s_.cols;
    const int threads = cpu::threads();
#pragma omp parallel for num_threads(threads) schedule(static)
    for (std::int64_t i = 0; i < n; ++i) dx[i] = stored<T>(cpu::f32_value(dy[i]) * gelu_grad(cpu::f32_value(x[i])));
    cpu::column_sums(dx, s_.rows, s_.cols, a.dbias, threads);
  }

  std::string label() const override { return "hotops OpenMP GELU (erf) backward, then column sums"; }

 private:
  Shape s_;
};

}  // namespace

std::unique_ptr<Plan> make_cpu_plan(const Shape& s) {
  if (s.dtype == DType::bf16) return std::make_unique<CpuGeluDbias<bf16>>(s);
  return std::make_unique<CpuGeluDbias<float>>(s);
}

}  // namespace hotops::gelu::dbias
