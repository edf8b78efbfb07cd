// gelu on the CPU: oneDNN's eltwise primitive (eltwise_gelu_erf / eltwise_gelu_tanh), forward_training
// for fwd and eltwise_backward from the source (not the destination) for bwd, over the tensor seen
// as one flat dimension: the op is elementwise, so its shape does not matter to it.
#include <unordered_map>

#include "hotops/check.h"
#include "hotops/cpu.h"
#include "kernels/gelu/gelu.h"

namespace hotops::gelu {
namespace {

using dnnl::memory;

memory::data_type dnnl_type(DType t) {
  switch (t) {
    case DType::bf16: return memory::data_type::bf16;
    case DType::f16: return memory::data_type::f16;
    default: return memory::data_type::f32;
  }
}

dnnl::algorithm dnnl_algorithm(Approx a) {
  return a == Approx::none ? dnnl::algorithm::eltwise_gelu_erf : dnnl::algorithm::eltwise_gelu_tanh;
}

// The primitive descriptors of one problem (no memory touched): creating them is also the
// support probe, since oneDNN answers `unimplemented` for a dtype this CPU cannot do.
struct Plan {
  memory::desc md;
  dnnl::eltwise_forward::primitive_desc fwd;
  dnnl::eltwise_backward::primitive_desc bwd;  // bwd only
};

Plan plan(const Shape& s) {
  dnnl::engine& eng = cpu::engine();
  Plan p;
  p.md = memory::desc({s.elements}, dnnl_type(s.dtype), memory::format_tag::a);
  const dnnl::algorithm alg = dnnl_algorithm(s.approx);
  const auto fd = HOTOPS_CHECK_DNNL(dnnl::eltwise_forward::desc(dnnl::prop_kind::forward_training, alg, p.md));
  p.fwd = HOTOPS_CHECK_DNNL(dnnl::eltwise_forward::primitive_desc(fd, eng));
  if (s.dir == Direction::bwd) {
    const auto bd = HOTOPS_CHECK_DNNL(dnnl::eltwise_backward::desc(alg, p.md, p.md));
    p.bwd = HOTOPS_CHECK_DNNL(dnnl::eltwise_backward::primitive_desc(bd, eng, p.fwd));
  }
  return p;
}

class CpuGelu final : public Case {
 public:
  explicit CpuGelu(const Problem& p)
      : s_(shape_of(p)), plan_(plan(s_)), in_(make_inputs(s_, input_seed(p))), out_(make_output(s_)) {
    dnnl::engine& eng = cpu::engine();
    // The tensors start `offset` elements into their buffers.
    auto mem = [&](HostBuffer& b) {
      return memory(plan_.md, eng, static_cast<std::byte*>(b.data()) + s_.offset * dtype_size(s_.dtype));
    };
    if (s_.dir == Direction::fwd) {
      prim_ = dnnl::eltwise_forward(plan_.fwd);
      args_ = {{DNNL_ARG_SRC, mem(in_.x)}, {DNNL_ARG_DST, mem(out_)}};
    } else {
      prim_ = dnnl::eltwise_backward(plan_.bwd);
      args_ = {{DNNL_ARG_SRC, mem(in_.x)}, {DNNL_ARG_DIFF_DST, mem(in_.dy)}, {DNNL_ARG_DIFF_SRC, mem(out_)}};
    }
  }

  void run() override { cpu::execute(prim_, args_); }

  Check verify() override {
    out_.poison();
    run();
    return gelu::verify(s_, in_, out_);
  }

  std::string label() const override {
    const char* impl = s_.dir == Direction::fwd ? plan_.fwd.impl_info_str() : plan_.bwd.impl_info_str();
    return std::string("oneDNN eltwise_") + (s_.approx == Approx::none ? "gelu_erf " : "gelu_tanh ") +
           (s_.dir == Direction::fwd ? "forward_training " : "backward ") + impl + ", " +
           std::to_string(cpu::threads()) + " threads";
  }

 private:
  Shape s_;
  Plan plan_;
  Inputs in_;
  HostBuffer out_;
  dnnl::primitive prim_;
  cpu::Args args_;
};

}  // namespace

std::string onednn_unsupported_reason(const Problem& p) {
  const Shape s = shape_of(p);
  try {
    plan(s);
  } catch (const Error& e) {
    if (e.kind() == ErrorKind::unsupported)
      return std::string("oneDNN has no ") + dtype_name(p.dtype) + " gelu " + direction_name(p.dir) +
             " for this CPU (ISA " + cpu::isa_name() + ")";
    throw;
  }
  return "";
}

std::unique_ptr<Case> make_cpu_onednn(const Problem& p) { return std::make_unique<CpuGelu>(p); }

}  // namespace hotops::gelu
