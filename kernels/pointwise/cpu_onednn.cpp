// relu on the CPU: oneDNN's eltwise primitive (eltwise_relu, alpha 0), forward_training for fwd and
// eltwise_backward from the source for bwd (dx = x > 0 ? dy : 0, as threshold_backward), over the
// tensor seen as one flat dimension: the op is elementwise, so its shape does not matter to it.
#include "hotops/check.h"
#include "hotops/cpu.h"
#include "hotops/cpu_eltwise.h"
#include "kernels/pointwise/pointwise.h"

namespace hotops::pointwise {
namespace {

// The primitive descriptors of one problem (no memory touched): creating them is also the support
// probe, since oneDNN answers `unimplemented` for a dtype this CPU cannot do.
cpu::Eltwise descriptors(const Shape& s) {
  constexpr float kAlpha = 0.f;  // the slope for x < 0: plain relu
  return cpu::Eltwise(dnnl::algorithm::eltwise_relu, cpu::md({s.elements}, s.dtype, dnnl::memory::format_tag::a),
                      kAlpha, s.dir == Direction::bwd);
}

}  // namespace

std::string relu_onednn_unsupported_reason(const Problem& p) {
  return cpu::onednn_unsupported_reason([&] { descriptors(shape_of(p)); }, p, "relu");
}

std::unique_ptr<Plan> make_cpu_relu_plan(const Shape& s) {
  return std::make_unique<cpu::EltwisePlan<Shape, Args>>(
      s, descriptors(s),
      std::string("oneDNN eltwise_relu ") + (s.dir == Direction::fwd ? "forward_training " : "backward (from src) "));
}

}  // namespace hotops::pointwise
