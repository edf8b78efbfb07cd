// gelu_dbias on the CPU: dx = dy * gelu'(x) (erf) by the gelu op's own CPU backward plan (its
// vectorised loop, the dtype's default implementation), then the column sums of the stored dx
// (hotops/cpu_colsum.h). Storage float, or bf16 as its bits. In place (dx = dy) as the gelu plan
// runs it: each element is read before it is written.
#include <cstdint>
#include <memory>
#include <string>

#include "hotops/cpu.h"
#include "hotops/cpu_colsum.h"
#include "kernels/gelu/gelu.h"
#include "kernels/gelu/gelu_dbias.h"

namespace hotops::gelu::dbias {
namespace {

using bf16 = std::uint16_t;  // bf16's bits

gelu::Shape backward_of(const Shape& s) {
  gelu::Shape g;
  g.dir = Direction::bwd, g.dtype = s.dtype, g.approx = Approx::none, g.elements = s.rows * s.cols;
  return g;
}

template <class T>
class CpuGeluDbias final : public Plan {
 public:
  explicit CpuGeluDbias(const Shape& s) : s_(s), gelu_(gelu::make_cpu_plan(backward_of(s))) {}

  void run(const Args& a) override {
    gelu_->run(gelu::Args{a.x, a.dy, a.dx});
    cpu::column_sums(static_cast<const T*>(a.dx), s_.rows, s_.cols, a.dbias, cpu::threads());
  }

  std::string label() const override { return "the gelu op's CPU backward plan (" + gelu_->label() + "), then column sums"; }

 private:
  Shape s_;
  std::unique_ptr<gelu::Plan> gelu_;
};

}  // namespace

std::unique_ptr<Plan> make_cpu_plan(const Shape& s) {
  if (s.dtype == DType::bf16) return std::make_unique<CpuGeluDbias<bf16>>(s);
  return std::make_unique<CpuGeluDbias<float>>(s);
}

}  // namespace hotops::gelu::dbias
