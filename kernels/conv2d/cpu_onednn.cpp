// conv2d on the CPU: one oneDNN convolution primitive per direction (algorithm::convolution_direct,
// as PyTorch's mkldnn path uses), with format_tag::any so the primitive picks its blocked layouts.
// The user's NCHW/NHWC buffers are reordered into those layouts once at setup; the output is
// reordered back only by verify(). run() is the convolution alone (see conv2d.h for why).
#include <algorithm>
#include <cstring>
#include <unordered_map>

#include <oneapi/dnnl/dnnl_debug.h>

#include "hotops/check.h"
#include "hotops/cpu.h"
#include "kernels/conv2d/conv2d.h"

namespace hotops::conv2d {
namespace {

using dnnl::memory;
using tag = memory::format_tag;

// The user's tensors: activations NCHW or NHWC, weights OIHW or OHWI.
memory::desc user_act(const Shape& s, std::int64_t c, std::int64_t h, std::int64_t w) {
  return cpu::md({s.N, c, h, w}, s.dtype, s.layout == Layout::nchw ? tag::nchw : tag::nhwc);
}
memory::desc user_x(const Shape& s) { return user_act(s, s.C, s.H, s.W); }
memory::desc user_y(const Shape& s) { return user_act(s, s.K, s.P(), s.Q()); }
memory::desc user_w(const Shape& s) {
  return cpu::md({s.K, s.C, s.R, s.S}, s.dtype, s.layout == Layout::nchw ? tag::oihw : tag::ohwi);
}
memory::desc user_b(const Shape& s) { return cpu::md({s.K}, s.dtype, tag::x); }

// The same shapes with format_tag::any: the primitive chooses.
memory::desc any(const memory::desc& d) { return memory::desc(d.dims(), d.data_type(), tag::any); }

// The layout oneDNN chose, by name where it is one of the usual ones.
std::string format_name(const memory::desc& d) {
  for (tag t : {tag::nchw, tag::nhwc, tag::nChw8c, tag::nChw16c, tag::oihw, tag::ohwi, tag::OIhw8i8o, tag::OIhw8o8i,
                tag::OIhw16i16o, tag::OIhw16o16i, tag::Ohwi8o, tag::Ohwi16o, tag::OIhw8i16o2i, tag::OIhw16i16o2i,
                tag::OIhw8o16i2o, tag::OIhw16o16i2o})
    if (memory::desc(d.dims(), d.data_type(), t) == d) return dnnl_fmt_tag2str(static_cast<dnnl_format_tag_t>(t));
  return "blocked";
}

// The primitive descriptors of one problem (no memory touched): creating them is also the support
// probe, since oneDNN answers `unimplemented` for what this CPU cannot do. The backward ones need
// the forward one as a hint, as in a training step.
struct Plan {
  dnnl::convolution_forward::primitive_desc fwd;
  dnnl::convolution_backward_data::primitive_desc bwd_data;
  dnnl::convolution_backward_weights::primitive_desc bwd_weights;
};

Plan plan(const Shape& s) {
  dnnl::engine& eng = cpu::engine();
  // oneDNN's dilation counts the gaps (PyTorch's minus one). The right padding is what makes
  // PyTorch's output size exact; where the last input rows are unused (stride > 1) it would be
  // negative, and 0 gives the same output size.
  const memory::dims strides{s.stride_h, s.stride_w}, dilates{s.dil_h - 1, s.dil_w - 1};
  const memory::dims pad_l{s.pad_h, s.pad_w};
  const memory::dims pad_r{std::max<std::int64_t>(0, (s.P() - 1) * s.stride_h + (s.R - 1) * s.dil_h + 1 - s.H - s.pad_h),
                           std::max<std::int64_t>(0, (s.Q() - 1) * s.stride_w + (s.S - 1) * s.dil_w + 1 - s.W - s.pad_w)};
  const memory::desc x = any(user_x(s)), w = any(user_w(s)), y = any(user_y(s));
  const memory::desc b = s.bias ? user_b(s) : memory::desc();
  const auto alg = dnnl::algorithm::convolution_direct;
  Plan p;
  const auto fd = HOTOPS_CHECK_DNNL(dnnl::convolution_forward::desc(dnnl::prop_kind::forward_training, alg, x, w, b,
                                                                    y, strides, dilates, pad_l, pad_r));
  p.fwd = HOTOPS_CHECK_DNNL(dnnl::convolution_forward::primitive_desc(fd, eng));
  if (s.dir == Direction::bwd_data) {
    const auto d = HOTOPS_CHECK_DNNL(
        dnnl::convolution_backward_data::desc(alg, x, w, y, strides, dilates, pad_l, pad_r));
    p.bwd_data = HOTOPS_CHECK_DNNL(dnnl::convolution_backward_data::primitive_desc(d, eng, p.fwd));
  } else if (s.dir == Direction::bwd_weight) {
    const auto d = HOTOPS_CHECK_DNNL(
        dnnl::convolution_backward_weights::desc(alg, x, w, b, y, strides, dilates, pad_l, pad_r));
    p.bwd_weights = HOTOPS_CHECK_DNNL(dnnl::convolution_backward_weights::primitive_desc(d, eng, p.fwd));
  }
  return p;
}

class CpuConv2d final : public Case {
 public:
  explicit CpuConv2d(const Problem& p)
      : s_(shape_of(p)), plan_(plan(s_)), in_(make_inputs(s_, p.seed())), out_(make_outputs(s_)) {
    dnnl::engine& eng = cpu::engine();
    // An input: the user's buffer reordered, here at setup, into the layout the primitive wants.
    auto input = [&](const memory::desc& user, HostBuffer& host, const memory::desc& want) {
      return cpu::reordered(cpu::mem(user, host.data()), want);
    };
    switch (s_.dir) {
      case Direction::fwd: {
        const auto& pd = plan_.fwd;
        conv_ = dnnl::convolution_forward(pd);
        out_mem_ = memory(pd.dst_desc(), eng);
        out_user_ = cpu::mem(user_y(s_), out_.primary.data());
        args_ = {{DNNL_ARG_SRC, input(user_x(s_), in_.x, pd.src_desc())},
                 {DNNL_ARG_WEIGHTS, input(user_w(s_), in_.w, pd.weights_desc())},
                 {DNNL_ARG_DST, out_mem_}};
        if (s_.bias) args_[DNNL_ARG_BIAS] = cpu::mem(pd.bias_desc(), in_.b.data());
        impl_ = pd.impl_info_str();
        formats_ = "src " + format_name(pd.src_desc()) + ", wei " + format_name(pd.weights_desc()) + ", dst " +
                   format_name(pd.dst_desc());
        break;
      }
      case Direction::bwd_data: {
        const auto& pd = plan_.bwd_data;
        conv_ = dnnl::convolution_backward_data(pd);
        out_mem_ = memory(pd.diff_src_desc(), eng);
        out_user_ = cpu::mem(user_x(s_), out_.primary.data());
        args_ = {{DNNL_ARG_DIFF_DST, input(user_y(s_), in_.dy, pd.diff_dst_desc())},
                 {DNNL_ARG_WEIGHTS, input(user_w(s_), in_.w, pd.weights_desc())},
                 {DNNL_ARG_DIFF_SRC, out_mem_}};
        impl_ = pd.impl_info_str();
        formats_ = "diff_dst " + format_name(pd.diff_dst_desc()) + ", wei " + format_name(pd.weights_desc()) +
                   ", diff_src " + format_name(pd.diff_src_desc());
        break;
      }
      default: {
        const auto& pd = plan_.bwd_weights;
        conv_ = dnnl::convolution_backward_weights(pd);
        out_mem_ = memory(pd.diff_weights_desc(), eng);
        out_user_ = cpu::mem(user_w(s_), out_.primary.data());
        args_ = {{DNNL_ARG_SRC, input(user_x(s_), in_.x, pd.src_desc())},
                 {DNNL_ARG_DIFF_DST, input(user_y(s_), in_.dy, pd.diff_dst_desc())},
                 {DNNL_ARG_DIFF_WEIGHTS, out_mem_}};
        if (s_.bias) args_[DNNL_ARG_DIFF_BIAS] = cpu::mem(pd.diff_bias_desc(), out_.db.data());
        impl_ = pd.impl_info_str();
        formats_ = "src " + format_name(pd.src_desc()) + ", diff_dst " + format_name(pd.diff_dst_desc()) +
                   ", diff_wei " + format_name(pd.diff_weights_desc());
      }
    }
  }

  void run() override { cpu::execute(conv_, args_); }

  Check verify() override {
    std::memset(out_mem_.get_data_handle(), 0xff, out_mem_.get_desc().get_size());  // NaN in f32 and bf16
    out_.primary.poison();
    out_.db.poison();
    run();
    cpu::reorder(out_mem_, out_user_);
    return conv2d::verify(s_, in_, out_);
  }

  std::string label() const override {
    return "oneDNN convolution " + impl_ + " (" + formats_ + "; user-layout reorders not timed), " +
           std::to_string(cpu::threads()) + " threads";
  }

 private:
  Shape s_;
  Plan plan_;
  Inputs in_;
  Outputs out_;
  dnnl::primitive conv_;
  memory out_mem_, out_user_;  // the output in the primitive's layout, and the user's view of it
  cpu::Args args_;
  std::string impl_, formats_;
};

}  // namespace

std::string cpu_unsupported_reason(const Problem& p) {
  if (p.dtype != DType::f32 && p.dtype != DType::bf16)
    return std::string("the CPU backend has no ") + dtype_name(p.dtype) + " conv2d";
  return cpu::onednn_unsupported_reason([&] { plan(shape_of(p)); }, p, "conv2d");
}

std::unique_ptr<Case> make_cpu(const Problem& p) { return std::make_unique<CpuConv2d>(p); }

}  // namespace hotops::conv2d
