// conv2d on the CPU: one oneDNN convolution primitive per direction (algorithm::convolution_direct,
// as PyTorch's mkldnn path uses), with format_tag::any so the primitive picks its blocked layouts.
// With Shape::onednn_layouts (the benchmark) the plan runs on tensors already in those layouts: the
// reorders from and to the user's NCHW/NHWC buffers are the caller's, outside the run (conv2d.h).
// Without it, a run reorders the user's tensors in and the output back where the layouts differ.
// A model's layers add what their steps need (conv2d.h): a ReLU post-op, forward_inference, f32
// master parameters for bf16, activations fixed in NCHW or NHWC, and weights reordered by the run
// beside activations in oneDNN's layouts; cpu_onednn.h gives the layouts the plan's primitive took.
#include <algorithm>
#include <cstring>
#include <unordered_map>
#include <vector>

#include <oneapi/dnnl/dnnl_debug.h>

#include "hotops/check.h"
#include "hotops/cpu.h"
#include "kernels/conv2d/conv2d.h"
#include "kernels/conv2d/cpu_onednn.h"

namespace hotops::conv2d {
namespace {

using dnnl::memory;
using tag = memory::format_tag;

// The user's tensors: activations NCHW or NHWC (`layout`, or the layout an activation is fixed in),
// weights OIHW or OHWI; w, b, dw and db f32 with f32_params. Grouped weights are oneDNN's 5-D
// [groups, K / groups, C / groups, R, S] (GOIHW or GOHWI): the same bytes as PyTorch's [K, C / groups,
// R, S], the output channels of one group together.
memory::desc user_act(const Shape& s, Shape::Pick pick, std::int64_t c, std::int64_t h, std::int64_t w) {
  const bool nchw = pick == Shape::Pick::onednn ? s.layout == Layout::nchw : pick == Shape::Pick::nchw;
  return cpu::md({s.N, c, h, w}, s.dtype, nchw ? tag::nchw : tag::nhwc);
}
memory::desc user_x(const Shape& s) { return user_act(s, s.x_pick, s.C, s.H, s.W); }
memory::desc user_y(const Shape& s) { return user_act(s, s.y_pick, s.K, s.P(), s.Q()); }
DType param_type(const Shape& s) { return s.f32_params ? DType::f32 : s.dtype; }
memory::desc user_w(const Shape& s) {
  const bool nchw = s.layout == Layout::nchw;
  if (s.groups == 1) return cpu::md({s.K, s.C, s.R, s.S}, param_type(s), nchw ? tag::oihw : tag::ohwi);
  return cpu::md({s.groups, s.Kg(), s.Cg(), s.R, s.S}, param_type(s), nchw ? tag::goihw : tag::gohwi);
}
memory::desc user_b(const Shape& s) { return cpu::md({s.K}, param_type(s), tag::x); }

// The same shape with format_tag::any (the primitive chooses), in type `t`.
memory::desc any(const memory::desc& d, DType t) { return memory::desc(d.dims(), cpu::dnnl_type(t), tag::any); }
// An activation as the primitive is asked for it: in its fixed layout, or any.
memory::desc asked(const memory::desc& user, Shape::Pick pick) {
  return pick == Shape::Pick::onednn ? memory::desc(user.dims(), user.data_type(), tag::any) : user;
}

// The layout oneDNN chose, by name where it is one of the usual ones.
std::string format_name(const memory::desc& d) {
  for (tag t : {tag::nchw, tag::nhwc, tag::nChw8c, tag::nChw16c, tag::oihw, tag::ohwi, tag::OIhw8i8o, tag::OIhw8o8i,
                tag::OIhw16i16o, tag::OIhw16o16i, tag::Ohwi8o, tag::Ohwi16o, tag::OIhw8i16o2i, tag::OIhw16i16o2i,
                tag::OIhw8o16i2o, tag::OIhw16o16i2o, tag::goihw, tag::gohwi, tag::Goihw8g, tag::Goihw16g})
    if (memory::desc(d.dims(), d.data_type(), t, /*allow_empty=*/true) == d)  // empty where the ranks differ
      return dnnl_fmt_tag2str(static_cast<dnnl_format_tag_t>(t));
  return "blocked";
}

// The primitive descriptors of one problem (no memory touched): creating them is also the support
// probe, since oneDNN answers `unimplemented` for what this CPU cannot do. The backward ones need
// the forward one as a hint, as in a training step.
struct Descriptors {
  dnnl::convolution_forward::primitive_desc fwd;
  dnnl::convolution_backward_data::primitive_desc bwd_data;
  dnnl::convolution_backward_weights::primitive_desc bwd_weights;
};

Descriptors descriptors(const Shape& s) {
  dnnl::engine& eng = cpu::engine();
  // oneDNN's dilation counts the gaps (PyTorch's minus one). The right padding is what makes
  // PyTorch's output size exact; where the last input rows are unused (stride > 1) it would be
  // negative, and 0 gives the same output size.
  const memory::dims strides{s.stride_h, s.stride_w}, dilates{s.dil_h - 1, s.dil_w - 1};
  const memory::dims pad_l{s.pad_h, s.pad_w};
  const memory::dims pad_r{std::max<std::int64_t>(0, (s.P() - 1) * s.stride_h + (s.R - 1) * s.dil_h + 1 - s.H - s.pad_h),
                           std::max<std::int64_t>(0, (s.Q() - 1) * s.stride_w + (s.S - 1) * s.dil_w + 1 - s.W - s.pad_w)};
  // w in the activations' type; dw (and b, db) in the parameters'.
  const memory::desc x = asked(user_x(s), s.x_pick), y = asked(user_y(s), s.y_pick);
  const memory::desc w = any(user_w(s), s.dtype), dw = any(user_w(s), param_type(s));
  const memory::desc b = s.bias ? user_b(s) : memory::desc();
  const auto alg = dnnl::algorithm::convolution_direct;
  const bool infer = s.inference && s.dir == Direction::fwd;
  Descriptors d;
  const auto fd = HOTOPS_CHECK_DNNL(dnnl::convolution_forward::desc(
      infer ? dnnl::prop_kind::forward_inference : dnnl::prop_kind::forward_training, alg, x, w, b, y, strides,
      dilates, pad_l, pad_r));
  dnnl::primitive_attr attr;
  if (s.relu) {
    dnnl::post_ops po;
    po.append_eltwise(1.f, dnnl::algorithm::eltwise_relu, 0.f, 0.f);
    attr.set_post_ops(po);
  }
  d.fwd = HOTOPS_CHECK_DNNL(dnnl::convolution_forward::primitive_desc(fd, attr, eng));
  if (s.dir == Direction::bwd_data) {
    const auto bd = HOTOPS_CHECK_DNNL(
        dnnl::convolution_backward_data::desc(alg, x, w, y, strides, dilates, pad_l, pad_r));
    d.bwd_data = HOTOPS_CHECK_DNNL(dnnl::convolution_backward_data::primitive_desc(bd, eng, d.fwd));
  } else if (s.dir == Direction::bwd_weight) {
    const auto bd = HOTOPS_CHECK_DNNL(
        dnnl::convolution_backward_weights::desc(alg, x, dw, b, y, strides, dilates, pad_l, pad_r));
    d.bwd_weights = HOTOPS_CHECK_DNNL(dnnl::convolution_backward_weights::primitive_desc(bd, eng, d.fwd));
  }
  return d;
}

// The user's layout of a tensor, and the one the pass's primitive chose for it.
memory::desc user_desc(const Shape& s, Tensor t) {
  return t == Tensor::x ? user_x(s) : t == Tensor::w ? user_w(s) : user_y(s);
}
memory::desc chosen_desc(const Shape& s, const Descriptors& d, Tensor t) {
  switch (s.dir) {
    case Direction::bwd_data:
      return t == Tensor::x ? d.bwd_data.diff_src_desc() : t == Tensor::w ? d.bwd_data.weights_desc()
                                                                          : d.bwd_data.diff_dst_desc();
    case Direction::bwd_weight:
      return t == Tensor::x ? d.bwd_weights.src_desc() : t == Tensor::w ? d.bwd_weights.diff_weights_desc()
                                                                        : d.bwd_weights.diff_dst_desc();
    default: return t == Tensor::x ? d.fwd.src_desc() : t == Tensor::w ? d.fwd.weights_desc() : d.fwd.dst_desc();
  }
}

// One argument of the pass's primitive: which tensor it is (none: the bias or db, [K] in both
// layouts), whether the pass writes it, and, where a run reorders it (the user's layout differs from
// the primitive's), the plan's copy in the primitive's layout and the reorder to or from it.
struct Operand {
  int arg;
  bool output;
  bool plain;  // the bias or db
  Tensor tensor;
  memory staged;
  cpu::Primitive reorder;
};

// The pass's arguments in the order run() passes their buffers.
std::vector<Operand> operands(const Shape& s) {
  const auto t = [](int arg, Tensor tensor, bool output = false) { return Operand{arg, output, false, tensor, {}, {}}; };
  const auto plain = [](int arg, bool output) { return Operand{arg, output, true, Tensor::y, {}, {}}; };
  std::vector<Operand> o;
  switch (s.dir) {
    case Direction::bwd_data:
      o = {t(DNNL_ARG_DIFF_DST, Tensor::y), t(DNNL_ARG_WEIGHTS, Tensor::w), t(DNNL_ARG_DIFF_SRC, Tensor::x, true)};
      break;
    case Direction::bwd_weight:
      o = {t(DNNL_ARG_SRC, Tensor::x), t(DNNL_ARG_DIFF_DST, Tensor::y), t(DNNL_ARG_DIFF_WEIGHTS, Tensor::w, true)};
      if (s.bias) o.push_back(plain(DNNL_ARG_DIFF_BIAS, true));
      break;
    default:
      o = {t(DNNL_ARG_SRC, Tensor::x), t(DNNL_ARG_WEIGHTS, Tensor::w)};
      if (s.bias) o.push_back(plain(DNNL_ARG_BIAS, false));
      o.push_back(t(DNNL_ARG_DST, Tensor::y, true));
  }
  return o;
}

class CpuConv2d final : public Plan {
 public:
  // x_user: where given, x (fwd, bwd_weight) is in that layout, reordered by the run where it differs
  // from the primitive's.
  explicit CpuConv2d(const Shape& s, const memory::desc& x_user = {}) : s_(s), d_(descriptors(s)), ops_(operands(s)) {
    dnnl::engine& eng = cpu::engine();
    std::vector<std::pair<int, memory::desc>> args;
    for (Operand& o : ops_) {
      const memory::desc chosen = o.plain ? user_b(s_) : chosen_desc(s_, d_, o.tensor);
      args.emplace_back(o.arg, chosen);
      const bool caller_x = !o.plain && o.tensor == Tensor::x && !o.output && !x_user.is_zero();
      const bool given = s_.onednn_layouts && !(s_.w_from_user && o.tensor == Tensor::w) && !caller_x;  // in oneDNN's layout
      const memory::desc user = caller_x ? x_user : o.plain ? memory::desc() : user_desc(s_, o.tensor);
      if (o.plain || given || user == chosen) continue;
      x_reordered_ = x_reordered_ || caller_x;
      o.staged = memory(chosen, eng);
      const memory::desc& from = o.output ? chosen : user;
      const memory::desc& to = o.output ? user : chosen;
      o.reorder = cpu::Primitive(dnnl::reorder(HOTOPS_CHECK_DNNL(dnnl::reorder::primitive_desc(eng, from, eng, to))),
                                 {{DNNL_ARG_FROM, from}, {DNNL_ARG_TO, to}});
      ++reorders_;
    }
    switch (s_.dir) {
      case Direction::fwd: {
        const auto& pd = d_.fwd;
        conv_ = cpu::Primitive(dnnl::convolution_forward(pd), args);
        impl_ = pd.impl_info_str();
        formats_ = "src " + format_name(pd.src_desc()) + ", wei " + format_name(pd.weights_desc()) + ", dst " +
                   format_name(pd.dst_desc());
        break;
      }
      case Direction::bwd_data: {
        const auto& pd = d_.bwd_data;
        conv_ = cpu::Primitive(dnnl::convolution_backward_data(pd), args);
        impl_ = pd.impl_info_str();
        formats_ = "diff_dst " + format_name(pd.diff_dst_desc()) + ", wei " + format_name(pd.weights_desc()) +
                   ", diff_src " + format_name(pd.diff_src_desc());
        break;
      }
      default: {
        const auto& pd = d_.bwd_weights;
        conv_ = cpu::Primitive(dnnl::convolution_backward_weights(pd), args);
        impl_ = pd.impl_info_str();
        formats_ = "src " + format_name(pd.src_desc()) + ", diff_dst " + format_name(pd.diff_dst_desc()) +
                   ", diff_wei " + format_name(pd.diff_weights_desc());
      }
    }
  }

  void run(const Args& a) override {
    // The caller's buffers in operand order, then, where a run reorders, the plan's copies instead.
    const void* p[4] = {};
    std::size_t n = 0;
    switch (s_.dir) {
      case Direction::bwd_data: p[n++] = a.dy, p[n++] = a.w, p[n++] = a.out; break;
      case Direction::bwd_weight:
        p[n++] = a.x, p[n++] = a.dy, p[n++] = a.out;
        if (s_.bias) p[n++] = a.db;
        break;
      default:
        p[n++] = a.x, p[n++] = a.w;
        if (s_.bias) p[n++] = a.b;
        p[n++] = a.out;
    }
    const void* conv[4] = {p[0], p[1], p[2], p[3]};
    for (std::size_t i = 0; i < n && reorders_; ++i) {
      Operand& o = ops_[i];
      if (!o.staged) continue;
      conv[i] = o.staged.get_data_handle();
      if (!o.output) o.reorder.run({p[i], conv[i]});
    }
    if (n == 4)
      conv_.run({conv[0], conv[1], conv[2], conv[3]});
    else
      conv_.run({conv[0], conv[1], conv[2]});
    for (std::size_t i = 0; i < n && reorders_; ++i)
      if (ops_[i].staged && ops_[i].output) ops_[i].reorder.run({conv[i], p[i]});
  }

  std::string label() const override {
    const std::string reorders = x_reordered_ ? std::string("x reordered from the caller's layout") +
                                                    (reorders_ > 1 ? " and the weights" : "") + " in the run"
                                 : s_.onednn_layouts && reorders_ ? "weights reordered in the run, activations not"
                                 : s_.onednn_layouts           ? "user-layout reorders not timed"
                                 : reorders_                   ? "user-layout reorders in the run"
                                                               : "no reorders";
    return "oneDNN convolution " + impl_ + (s_.relu ? " + ReLU post-op" : "") + " (" + formats_ + "; " + reorders +
           "), " + std::to_string(cpu::threads()) + " threads";
  }

  memory::desc desc(Tensor t) const { return chosen_desc(s_, d_, t); }
  const std::string& impl() const { return impl_; }

 private:
  Shape s_;
  Descriptors d_;
  std::vector<Operand> ops_;
  int reorders_ = 0;
  bool x_reordered_ = false;  // x from the caller's layout (x_user) in the run
  cpu::Primitive conv_;
  std::string impl_, formats_;
};

}  // namespace

std::string cpu_unsupported_reason(const Problem& p) {
  if (p.dtype != DType::f32 && p.dtype != DType::bf16)
    return std::string("the CPU backend has no ") + dtype_name(p.dtype) + " conv2d";
  if (cpu_depthwise_loops_take(shape_of(p))) return "";  // hotops' loops: no oneDNN asked
  return cpu::onednn_unsupported_reason([&] { descriptors(shape_of(p)); }, p, "conv2d");
}

std::unique_ptr<Plan> make_cpu_plan(const Shape& s) {
  if (cpu_depthwise_loops_take(s)) return make_cpu_depthwise_plan(s);
  return std::make_unique<CpuConv2d>(s);
}
std::unique_ptr<Plan> make_cpu_plan(const Shape& s, const memory::desc& x) {
  HOTOPS_CHECK(s.onednn_layouts, "conv2d: a plan on the caller's x layout takes its other tensors in oneDNN's (onednn_layouts)");
  return std::make_unique<CpuConv2d>(s, x);
}

namespace {
const CpuConv2d& cpu_plan(const Plan& p) {
  const auto* c = dynamic_cast<const CpuConv2d*>(&p);
  HOTOPS_CHECK(c != nullptr, "conv2d: not a CPU conv2d plan");
  return *c;
}
}  // namespace

memory::desc onednn_desc(const Plan& p, Tensor t) { return cpu_plan(p).desc(t); }
std::string onednn_impl(const Plan& p) { return cpu_plan(p).impl(); }

std::size_t onednn_bytes(const Shape& s, Tensor t) { return chosen_desc(s, descriptors(s), t).get_size(); }

void to_onednn_layout(const Shape& s, Tensor t, const void* user, void* onednn) {
  cpu::reorder(cpu::mem(user_desc(s, t), const_cast<void*>(user)), cpu::mem(chosen_desc(s, descriptors(s), t), onednn));
}

void to_user_layout(const Shape& s, Tensor t, const void* onednn, void* user) {
  cpu::reorder(cpu::mem(chosen_desc(s, descriptors(s), t), const_cast<void*>(onednn)), cpu::mem(user_desc(s, t), user));
}

}  // namespace hotops::conv2d
