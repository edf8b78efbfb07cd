// gelu on the CPU: oneDNN's eltwise primitive (eltwise_gelu_erf / eltwise_gelu_tanh), forward_training
// for fwd and eltwise_backward from the source (not the destination) for bwd, over the tensor seen
// as one flat dimension: the op is elementwise, so its shape does not matter to it.
#include "hotops/check.h"
#include "hotops/cpu.h"
#include "hotops/cpu_eltwise.h"
#include "kernels/gelu/gelu.h"

namespace hotops::gelu {
namespace {

dnnl::algorithm dnnl_algorithm(Approx a) {
  return a == Approx::none ? dnnl::algorithm::eltwise_gelu_erf : dnnl::algorithm::eltwise_gelu_tanh;
}

// The primitive descriptors of one problem (no memory touched): creating them is also the
// support probe, since oneDNN answers `unimplemented` for a dtype this CPU cannot do.
cpu::Eltwise descriptors(const Shape& s) {
  return cpu::Eltwise(dnnl_algorithm(s.approx), cpu::md({s.elements}, s.dtype, dnnl::memory::format_tag::a), 0.f,
                      s.dir == Direction::bwd);
}

}  // namespace

std::string onednn_unsupported_reason(const Problem& p) {
  return cpu::onednn_unsupported_reason([&] { descriptors(shape_of(p)); }, p, "gelu");
}

std::unique_ptr<Plan> make_cpu_onednn_plan(const Shape& s) {
  return std::make_unique<cpu::EltwisePlan<Shape, Args>>(
      s, descriptors(s),
      std::string("oneDNN eltwise_") + (s.approx == Approx::none ? "gelu_erf " : "gelu_tanh ") +
          (s.dir == Direction::fwd ? "forward_training " : "backward "));
}

}  // namespace hotops::gelu
