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
cpu::Eltwise plan(const Shape& s) {
  constexpr float kAlpha = 0.f;  // the slope for x < 0: plain relu
  return cpu::Eltwise(dnnl::algorithm::eltwise_relu, cpu::md({s.elements}, s.dtype, dnnl::memory::format_tag::a),
                      kAlpha, s.dir == Direction::bwd);
}

class CpuRelu final : public cpu::EltwiseCase<Shape, Inputs> {
 public:
  explicit CpuRelu(const Problem& p) : CpuRelu(shape_of(p), p) {}

 private:
  CpuRelu(const Shape& s, const Problem& p)
      : EltwiseCase(s, plan(s), make_inputs(s, p), make_output(s),
                    [](const Shape& t, const Inputs& in, const HostBuffer& out) { return pointwise::verify(t, in, out); },
                    std::string("oneDNN eltwise_relu ") +
                        (s.dir == Direction::fwd ? "forward_training " : "backward (from src) ")) {}
};

}  // namespace

HOTOPS_ONEDNN_CASE(CpuRelu, make_cpu_relu, relu_onednn_unsupported_reason, "relu")

}  // namespace hotops::pointwise
