// softmax on the CPU: oneDNN's softmax_forward (forward_training) and softmax_backward over axis 1
// of a [rows, cols] row-major tensor. bwd runs from the destination y and dy, as PyTorch's
// _softmax_backward_data does.
#include "hotops/check.h"
#include "hotops/cpu.h"
#include "kernels/softmax/softmax.h"

namespace hotops::softmax {
namespace {

using dnnl::memory;

// The primitive descriptors of one problem (no memory touched): creating them is also the support
// probe, since oneDNN answers `unimplemented` for a dtype this CPU cannot do.
struct Descriptors {
  memory::desc md;
  dnnl::softmax_forward::primitive_desc fwd;
  dnnl::softmax_backward::primitive_desc bwd;  // bwd only
};

Descriptors descriptors(const Shape& s) {
  dnnl::engine& eng = cpu::engine();
  Descriptors d;
  d.md = cpu::md({s.rows, s.cols}, s.dtype, memory::format_tag::ab);
  const auto fd = HOTOPS_CHECK_DNNL(dnnl::softmax_forward::desc(dnnl::prop_kind::forward_training, d.md, 1));
  d.fwd = HOTOPS_CHECK_DNNL(dnnl::softmax_forward::primitive_desc(fd, eng));
  if (s.dir == Direction::bwd) {
    const auto bd = HOTOPS_CHECK_DNNL(dnnl::softmax_backward::desc(d.md, d.md, 1));
    d.bwd = HOTOPS_CHECK_DNNL(dnnl::softmax_backward::primitive_desc(bd, eng, d.fwd));
  }
  return d;
}

class CpuSoftmax final : public Plan {
 public:
  explicit CpuSoftmax(const Shape& s) : s_(s), d_(descriptors(s)) {
    if (s_.dir == Direction::fwd)
      prim_ = cpu::Primitive(dnnl::softmax_forward(d_.fwd), {{DNNL_ARG_SRC, d_.md}, {DNNL_ARG_DST, d_.md}});
    else
      prim_ = cpu::Primitive(dnnl::softmax_backward(d_.bwd),
                             {{DNNL_ARG_DST, d_.md}, {DNNL_ARG_DIFF_DST, d_.md}, {DNNL_ARG_DIFF_SRC, d_.md}});
  }

  void run(const Args& a) override {
    if (s_.dir == Direction::fwd)
      prim_.run({a.x, a.out});
    else
      prim_.run({a.y, a.dy, a.out});
  }

  std::string label() const override {
    const bool fwd = s_.dir == Direction::fwd;
    return cpu::with_threads(std::string("oneDNN softmax_") + (fwd ? "forward forward_training " : "backward ") +
                             (fwd ? d_.fwd.impl_info_str() : d_.bwd.impl_info_str()));
  }

 private:
  Shape s_;
  Descriptors d_;
  cpu::Primitive prim_;
};

}  // namespace

std::string onednn_unsupported_reason(const Problem& p) {
  return cpu::onednn_unsupported_reason([&] { descriptors(shape_of(p)); }, p, "softmax");
}
std::unique_ptr<Plan> make_cpu_plan(const Shape& s) { return std::make_unique<CpuSoftmax>(s); }

}  // namespace hotops::softmax
