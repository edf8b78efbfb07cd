// bias_grad on the CPU: the column sums of hotops/cpu_colsum.h (f32 accumulation, OpenMP over blocks
// of 64 columns, each block adding its rows in order). Storage float, or bf16 as its bits.
#include <cstdint>
#include <memory>
#include <string>

#include "hotops/cpu.h"
#include "hotops/cpu_colsum.h"
#include "kernels/matmul/bias_grad.h"

namespace hotops::matmul::bias_grad {
namespace {

template <class T>
class CpuBiasGrad final : public Plan {
 public:
  explicit CpuBiasGrad(const Shape& s) : s_(s) {}

  void run(const Args& a) override {
    cpu::column_sums(static_cast<const T*>(a.dy), s_.rows, s_.cols, a.db, cpu::threads());
  }

  std::string label() const override {
    return cpu::with_threads("hotops OpenMP column sums (blocks of 64 columns, f32 accumulation)");
  }

 private:
  Shape s_;
};

}  // namespace

std::unique_ptr<Plan> make_cpu_plan(const Shape& s) {
  HOTOPS_CHECK(s.rows > 0 && s.cols > 0, "bias_grad: rows and cols must be positive");
  if (s.dtype == DType::bf16) return std::make_unique<CpuBiasGrad<std::uint16_t>>(s);
  HOTOPS_CHECK(s.dtype == DType::f32, "bias_grad has f32 and bf16 only");
  return std::make_unique<CpuBiasGrad<float>>(s);
}

}  // namespace hotops::matmul::bias_grad
