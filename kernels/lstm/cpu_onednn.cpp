// lstm on the CPU: oneDNN's lstm_forward / lstm_backward primitives (one layer, left-to-right or
// bidirectional_concat), weights in the layout oneDNN picks (format_tag::any, reordered at setup).
//
// oneDNN has one bias per gate: it gets b_ih + b_hh (summed in f32 at setup, as oneDNN's bias is f32).
// fwd runs forward_inference. bwd runs forward_training once at setup (it fills the workspace that
// lstm_backward reads, and y, hT, cT); the timed run() is the zeroing of the weight gradients
// (oneDNN 2.6 accumulates into them) plus lstm_backward, as PyTorch's backward excludes the forward.
#include <cstring>

#include "hotops/check.h"
#include "hotops/cpu.h"
#include "kernels/lstm/lstm.h"

namespace hotops::lstm {
namespace {

using dnnl::memory;
using tag = memory::format_tag;

dnnl::rnn_direction direction_of(const Shape& s) {
  return s.bidirectional ? dnnl::rnn_direction::bidirectional_concat : dnnl::rnn_direction::unidirectional_left2right;
}

// The memory descriptors of one problem; `w` is the weights' format (any for the primitive, ldigo
// for the user's copy) and `diff` the data type of the gradients.
struct Descs {
  memory::desc src_layer, src_iter, src_iter_c, w_layer, w_iter, bias, dst_layer, dst_iter, dst_iter_c;
  memory::desc d_src_layer, d_src_iter, d_src_iter_c, d_w_layer, d_w_iter, d_bias, d_dst_layer, d_dst_iter,
      d_dst_iter_c;
};

Descs descs(const Shape& s, DType diff) {
  const memory::dim T = s.T, B = s.B, I = s.I, H = s.H, D = s.D();
  const DType t = s.dtype;
  Descs m;
  m.src_layer = cpu::md({T, B, I}, t, tag::tnc);
  m.src_iter = cpu::md({1, D, B, H}, t, tag::ldnc);
  m.src_iter_c = cpu::md({1, D, B, H}, t, tag::ldnc);
  m.w_layer = cpu::md({1, D, I, 4, H}, t, tag::any);
  m.w_iter = cpu::md({1, D, H, 4, H}, t, tag::any);
  m.bias = cpu::md({1, D, 4, H}, DType::f32, tag::ldgo);
  m.dst_layer = cpu::md({T, B, D * H}, t, tag::tnc);
  m.dst_iter = m.src_iter;
  m.dst_iter_c = m.src_iter_c;
  m.d_src_layer = cpu::md({T, B, I}, diff, tag::tnc);
  m.d_src_iter = cpu::md({1, D, B, H}, diff, tag::ldnc);
  m.d_src_iter_c = m.d_src_iter;
  m.d_w_layer = cpu::md({1, D, I, 4, H}, diff, tag::ldigo);
  m.d_w_iter = cpu::md({1, D, H, 4, H}, diff, tag::ldigo);
  m.d_bias = cpu::md({1, D, 4, H}, diff, tag::ldgo);
  m.d_dst_layer = cpu::md({T, B, D * H}, diff, tag::tnc);
  m.d_dst_iter = m.d_src_iter;
  m.d_dst_iter_c = m.d_src_iter;
  return m;
}

// The primitive descriptors of one problem (no memory touched): creating them is also the support
// probe, since oneDNN answers `unimplemented` for what this CPU cannot do.
struct Plan {
  Descs m;
  dnnl::lstm_forward::primitive_desc fwd;
  dnnl::lstm_backward::primitive_desc bwd;  // bwd problems only
  DType diff = DType::f32;                  // the gradients' dtype
};

Plan plan(const Shape& s) {
  dnnl::engine& eng = cpu::engine();
  Plan p;
  const bool training = s.dir != Direction::fwd;
  const auto fwd_pd = [&](const Descs& m) {
    const auto d = HOTOPS_CHECK_DNNL(dnnl::lstm_forward::desc(
        training ? dnnl::prop_kind::forward_training : dnnl::prop_kind::forward_inference, direction_of(s),
        m.src_layer, m.src_iter, m.src_iter_c, m.w_layer, m.w_iter, m.bias, m.dst_layer, m.dst_iter, m.dst_iter_c));
    return HOTOPS_CHECK_DNNL(dnnl::lstm_forward::primitive_desc(d, eng));
  };
  if (!training) {
    p.m = descs(s, DType::f32);
    p.fwd = fwd_pd(p.m);
    return p;
  }
  // bf16 training: the gradients in bf16 where oneDNN has that, else in f32 (the label says which).
  const DType storage = storage_of(s.dtype);
  std::vector<DType> diffs{storage};
  if (storage != DType::f32) diffs.push_back(DType::f32);
  for (std::size_t k = 0; k < diffs.size(); ++k) {
    try {
      p.m = descs(s, diffs[k]);
      p.diff = diffs[k];
      p.fwd = fwd_pd(p.m);
      const Descs& m = p.m;
      const auto d = HOTOPS_CHECK_DNNL(dnnl::lstm_backward::desc(
          dnnl::prop_kind::backward, direction_of(s), m.src_layer, m.src_iter, m.src_iter_c, m.w_layer, m.w_iter,
          m.bias, m.dst_layer, m.dst_iter, m.dst_iter_c, m.d_src_layer, m.d_src_iter, m.d_src_iter_c, m.d_w_layer,
          m.d_w_iter, m.d_bias, m.d_dst_layer, m.d_dst_iter, m.d_dst_iter_c));
      p.bwd = HOTOPS_CHECK_DNNL(dnnl::lstm_backward::primitive_desc(d, eng, p.fwd));
      return p;
    } catch (const Error& e) {
      if (e.kind() != ErrorKind::unsupported || k + 1 == diffs.size()) throw;
    }
  }
  return p;
}

// PyTorch's W [D, 4H, K] as oneDNN's ldigo [1, D, K, 4, H].
HostBuffer to_ldigo(const HostBuffer& w, std::int64_t D, std::int64_t H, std::int64_t K) {
  HostBuffer out(w.dtype(), w.count());
  for (std::int64_t d = 0; d < D; ++d)
    for (std::int64_t r = 0; r < 4 * H; ++r)
      for (std::int64_t k = 0; k < K; ++k)
        out.set(static_cast<std::size_t>((d * K + k) * 4 * H + r), w.get(static_cast<std::size_t>((d * 4 * H + r) * K + k)));
  return out;
}

// oneDNN's ldigo [1, D, K, 4, H] back to PyTorch's [D, 4H, K].
HostBuffer from_ldigo(const HostBuffer& w, std::int64_t D, std::int64_t H, std::int64_t K) {
  HostBuffer out(w.dtype(), w.count());
  for (std::int64_t d = 0; d < D; ++d)
    for (std::int64_t r = 0; r < 4 * H; ++r)
      for (std::int64_t k = 0; k < K; ++k)
        out.set(static_cast<std::size_t>((d * 4 * H + r) * K + k), w.get(static_cast<std::size_t>((d * K + k) * 4 * H + r)));
  return out;
}

// A copy of `b` in dtype `t` (the values are exact in both).
HostBuffer as_dtype(const HostBuffer& b, DType t) {
  if (b.dtype() == t) return b;
  HostBuffer out(t, b.count());
  for (std::size_t i = 0; i < b.count(); ++i) out.set(i, b.get(i));
  return out;
}

class CpuLstm final : public Case {
 public:
  explicit CpuLstm(const Problem& p) : s_(shape_of(p)), plan_(plan(s_)), in_(make_inputs(s_, p.seed())) {
    const std::int64_t T = s_.T, B = s_.B, I = s_.I, H = s_.H, D = s_.D();
    const DType t = storage_of(s_.dtype);
    const Descs& m = plan_.m;
    auto mem = [&](const memory::desc& d, HostBuffer& b) { return cpu::mem(d, b.data()); };

    // Weights: the user's ldigo copies, reordered once into the primitive's formats.
    w_layer_user_ = to_ldigo(in_.w_ih, D, H, I);
    w_iter_user_ = to_ldigo(in_.w_hh, D, H, H);
    const memory::desc wl_user = cpu::md({1, D, I, 4, H}, t, tag::ldigo),
                       wi_user = cpu::md({1, D, H, 4, H}, t, tag::ldigo);
    const auto reordered = [&](const memory::desc& want, const memory::desc& user_d, HostBuffer& user) {
      const memory user_m = mem(user_d, user);
      return want == user_d ? user_m : cpu::reordered(user_m, want);
    };
    bias_ = HostBuffer(DType::f32, in_.b_ih.count());
    for (std::size_t i = 0; i < bias_.count(); ++i)
      bias_.set(i, static_cast<double>(static_cast<float>(in_.b_ih.get(i)) + static_cast<float>(in_.b_hh.get(i))));

    out_.y = HostBuffer(t, static_cast<std::size_t>(T * B * D * H));
    out_.hT = HostBuffer(t, static_cast<std::size_t>(D * B * H));
    out_.cT = HostBuffer(t, static_cast<std::size_t>(D * B * H));
    fwd_ = dnnl::lstm_forward(plan_.fwd);
    fwd_args_ = {{DNNL_ARG_SRC_LAYER, mem(m.src_layer, in_.x)},
                 {DNNL_ARG_SRC_ITER, mem(m.src_iter, in_.h0)},
                 {DNNL_ARG_SRC_ITER_C, mem(m.src_iter_c, in_.c0)},
                 {DNNL_ARG_WEIGHTS_LAYER, reordered(plan_.fwd.weights_layer_desc(), wl_user, w_layer_user_)},
                 {DNNL_ARG_WEIGHTS_ITER, reordered(plan_.fwd.weights_iter_desc(), wi_user, w_iter_user_)},
                 {DNNL_ARG_BIAS, mem(m.bias, bias_)},
                 {DNNL_ARG_DST_LAYER, mem(m.dst_layer, out_.y)},
                 {DNNL_ARG_DST_ITER, mem(m.dst_iter, out_.hT)},
                 {DNNL_ARG_DST_ITER_C, mem(m.dst_iter_c, out_.cT)}};
    if (s_.dir == Direction::fwd) return;
    workspace_ = memory(plan_.fwd.workspace_desc(), cpu::engine());
    fwd_args_[DNNL_ARG_WORKSPACE] = workspace_;

    const DType g = plan_.diff;
    dy_ = as_dtype(in_.dy, g);
    dhT_ = as_dtype(in_.dhT, g);
    dcT_ = as_dtype(in_.dcT, g);
    out_.dx = HostBuffer(g, static_cast<std::size_t>(T * B * I));
    out_.dh0 = HostBuffer(g, static_cast<std::size_t>(D * B * H));
    out_.dc0 = HostBuffer(g, static_cast<std::size_t>(D * B * H));
    dw_layer_ = HostBuffer(g, in_.w_ih.count());
    dw_iter_ = HostBuffer(g, in_.w_hh.count());
    out_.db = HostBuffer(g, in_.b_ih.count());
    bwd_ = dnnl::lstm_backward(plan_.bwd);
    bwd_args_ = {{DNNL_ARG_SRC_LAYER, fwd_args_[DNNL_ARG_SRC_LAYER]},
                 {DNNL_ARG_SRC_ITER, fwd_args_[DNNL_ARG_SRC_ITER]},
                 {DNNL_ARG_SRC_ITER_C, fwd_args_[DNNL_ARG_SRC_ITER_C]},
                 {DNNL_ARG_WEIGHTS_LAYER, reordered(plan_.bwd.weights_layer_desc(), wl_user, w_layer_user_)},
                 {DNNL_ARG_WEIGHTS_ITER, reordered(plan_.bwd.weights_iter_desc(), wi_user, w_iter_user_)},
                 {DNNL_ARG_BIAS, fwd_args_[DNNL_ARG_BIAS]},
                 {DNNL_ARG_DST_LAYER, fwd_args_[DNNL_ARG_DST_LAYER]},
                 {DNNL_ARG_DST_ITER, fwd_args_[DNNL_ARG_DST_ITER]},
                 {DNNL_ARG_DST_ITER_C, fwd_args_[DNNL_ARG_DST_ITER_C]},
                 {DNNL_ARG_WORKSPACE, workspace_},
                 {DNNL_ARG_DIFF_DST_LAYER, mem(m.d_dst_layer, dy_)},
                 {DNNL_ARG_DIFF_DST_ITER, mem(m.d_dst_iter, dhT_)},
                 {DNNL_ARG_DIFF_DST_ITER_C, mem(m.d_dst_iter_c, dcT_)},
                 {DNNL_ARG_DIFF_SRC_LAYER, mem(m.d_src_layer, out_.dx)},
                 {DNNL_ARG_DIFF_SRC_ITER, mem(m.d_src_iter, out_.dh0)},
                 {DNNL_ARG_DIFF_SRC_ITER_C, mem(m.d_src_iter_c, out_.dc0)},
                 {DNNL_ARG_DIFF_WEIGHTS_LAYER, mem(m.d_w_layer, dw_layer_)},
                 {DNNL_ARG_DIFF_WEIGHTS_ITER, mem(m.d_w_iter, dw_iter_)},
                 {DNNL_ARG_DIFF_BIAS, mem(m.d_bias, out_.db)}};
    forward_training();
  }

  void run() override {
    if (s_.dir == Direction::fwd) {
      cpu::execute(fwd_, fwd_args_);
      return;
    }
    std::memset(dw_layer_.data(), 0, dw_layer_.bytes());
    std::memset(dw_iter_.data(), 0, dw_iter_.bytes());
    std::memset(out_.db.data(), 0, out_.db.bytes());
    cpu::execute(bwd_, bwd_args_);
  }

  Check verify() override {
    if (s_.dir == Direction::fwd) {
      out_.y.poison();
      out_.hT.poison();
      out_.cT.poison();
      run();
      return lstm::verify(s_, in_, out_, cache_);
    }
    forward_training();  // a fresh workspace, whatever earlier runs left in it
    for (HostBuffer* b : {&out_.dx, &out_.dh0, &out_.dc0, &dw_layer_, &dw_iter_, &out_.db}) b->poison();
    run();
    out_.dw_ih = from_ldigo(dw_layer_, s_.D(), s_.H, s_.I);
    out_.dw_hh = from_ldigo(dw_iter_, s_.D(), s_.H, s_.H);
    return lstm::verify(s_, in_, out_, cache_);
  }

  std::string label() const override {
    std::string l = std::string("oneDNN lstm ") + (s_.dir == Direction::fwd ? "forward_inference " : "backward ") +
                    (s_.dir == Direction::fwd ? plan_.fwd.impl_info_str() : plan_.bwd.impl_info_str());
    if (s_.dir != Direction::fwd)
      l += std::string(" (forward_training at setup; timed: zero dW + backward; gradients in ") +
           dtype_name(plan_.diff) + ")";
    return l + ", bias b_ih+b_hh, " + std::to_string(cpu::threads()) + " threads";
  }

 private:
  void forward_training() { cpu::execute(fwd_, fwd_args_); }

  Shape s_;
  Plan plan_;
  Inputs in_;
  Outputs out_;
  ReferenceCache cache_;
  HostBuffer w_layer_user_, w_iter_user_, bias_, dy_, dhT_, dcT_, dw_layer_, dw_iter_;
  memory workspace_;
  dnnl::lstm_forward fwd_;
  dnnl::lstm_backward bwd_;
  cpu::Args fwd_args_, bwd_args_;
};

}  // namespace

std::string cpu_unsupported_reason(const Problem& p) {
  if (p.dtype != DType::f32 && p.dtype != DType::bf16)
    return std::string("the CPU backend has no ") + dtype_name(p.dtype) + " lstm";
  return cpu::onednn_unsupported_reason([&] { plan(shape_of(p)); }, p, "lstm");
}

std::unique_ptr<Case> make_cpu(const Problem& p) { return std::make_unique<CpuLstm>(p); }

}  // namespace hotops::lstm
