// lstm on the CPU: oneDNN's lstm_forward / lstm_backward primitives (one layer, left-to-right or
// bidirectional_concat), weights in the layout oneDNN picks (format_tag::any, reordered when packed).
//
// oneDNN has one bias per gate: the weight space holds b_ih + b_hh (summed in f32 when packed, as
// oneDNN's bias is f32). fwd runs forward_inference. bwd's forward() is forward_training (it fills
// the workspace that lstm_backward reads, and y, hT, cT); run() is the zeroing of the weight
// gradients (oneDNN 2.6 accumulates into them) plus lstm_backward, as PyTorch's backward excludes
// the forward.
#include <algorithm>
#include <array>
#include <cstring>
#include <utility>
#include <vector>

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
struct Descriptors {
  Descs m;
  dnnl::lstm_forward::primitive_desc fwd;
  dnnl::lstm_backward::primitive_desc bwd;  // bwd problems only
  DType diff = DType::f32;                  // the gradients' dtype
};

Descriptors descriptors(const Shape& s) {
  dnnl::engine& eng = cpu::engine();
  Descriptors p;
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
  std::vector<DType> diffs{s.f32_gradients ? DType::f32 : storage};
  if (diffs[0] != DType::f32) diffs.push_back(DType::f32);
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

// Offsets of a space's regions, each on a 64-byte boundary (a cache line, oneDNN's alignment).
std::size_t aligned(std::size_t bytes) { return (bytes + 63) / 64 * 64; }

// The weight space: W_ih and W_hh in the formats each primitive asks for (the backward's share the
// forward's where they agree), then the f32 bias b_ih + b_hh as ldgo. The gradient space: dW_ih and
// dW_hh as ldigo, then db as ldgo, in the gradients' dtype.
struct Spaces {
  memory::desc wl_user, wi_user;  // the weights as ldigo, the format pack() reorders from
  std::size_t wl_fwd = 0, wi_fwd = 0, wl_bwd = 0, wi_bwd = 0, bias = 0, weight_bytes = 0;
  std::size_t dwl = 0, dwi = 0, db = 0, gradient_bytes = 0;
};

Spaces spaces_of(const Shape& s, const Descriptors& d) {
  const std::int64_t I = s.I, H = s.H, D = s.D();
  Spaces sp;
  sp.wl_user = cpu::md({1, D, I, 4, H}, storage_of(s.dtype), tag::ldigo);
  sp.wi_user = cpu::md({1, D, H, 4, H}, storage_of(s.dtype), tag::ldigo);
  std::size_t at = 0;
  const auto take = [&](std::size_t bytes) {
    const std::size_t here = at;
    at += aligned(bytes);
    return here;
  };
  sp.wl_fwd = take(d.fwd.weights_layer_desc().get_size());
  sp.wi_fwd = take(d.fwd.weights_iter_desc().get_size());
  sp.wl_bwd = sp.wl_fwd, sp.wi_bwd = sp.wi_fwd;
  if (s.dir != Direction::fwd) {
    if (d.bwd.weights_layer_desc() != d.fwd.weights_layer_desc()) sp.wl_bwd = take(d.bwd.weights_layer_desc().get_size());
    if (d.bwd.weights_iter_desc() != d.fwd.weights_iter_desc()) sp.wi_bwd = take(d.bwd.weights_iter_desc().get_size());
  }
  sp.bias = take(d.m.bias.get_size());
  sp.weight_bytes = at;
  if (s.dir == Direction::fwd) return sp;
  at = 0;
  sp.dwl = take(d.m.d_w_layer.get_size());
  sp.dwi = take(d.m.d_w_iter.get_size());
  sp.db = take(d.m.d_bias.get_size());
  sp.gradient_bytes = at;
  return sp;
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

// oneDNN's ldigo [1, D, K, 4, H] (at `from`, dtype t) back to PyTorch's [D, 4H, K].
HostBuffer from_ldigo(const std::byte* from, DType t, std::int64_t D, std::int64_t H, std::int64_t K) {
  const std::size_t n = static_cast<std::size_t>(D * 4 * H * K);
  HostBuffer ldigo(t, n), out(t, n);
  std::memcpy(ldigo.data(), from, ldigo.bytes());
  for (std::int64_t d = 0; d < D; ++d)
    for (std::int64_t r = 0; r < 4 * H; ++r)
      for (std::int64_t k = 0; k < K; ++k)
        out.set(static_cast<std::size_t>((d * 4 * H + r) * K + k), ldigo.get(static_cast<std::size_t>((d * K + k) * 4 * H + r)));
  return out;
}

class CpuLayout final : public Layout {
 public:
  explicit CpuLayout(const Shape& s) : s_(s), d_(descriptors(s)), sp_(spaces_of(s, d_)) {}

  std::size_t weight_bytes() const override { return sp_.weight_bytes; }
  std::size_t gradient_bytes() const override { return sp_.gradient_bytes; }
  DType gradient_dtype() const override { return d_.diff; }

  HostBuffer pack(const HostBuffer& w_ih, const HostBuffer& w_hh, const HostBuffer& b_ih,
                  const HostBuffer& b_hh) const override {
    HostBuffer space(DType::f32, sp_.weight_bytes / 4);
    std::memset(space.data(), 0, space.bytes());
    auto* base = static_cast<std::byte*>(space.data());
    HostBuffer wl = to_ldigo(w_ih, s_.D(), s_.H, s_.I), wi = to_ldigo(w_hh, s_.D(), s_.H, s_.H);
    const auto put = [&](const memory::desc& user_d, HostBuffer& user, const memory::desc& want, std::size_t at) {
      if (want == user_d) {
        std::memcpy(base + at, user.data(), user.bytes());
        return;
      }
      memory from = cpu::mem(user_d, user.data()), to = cpu::mem(want, base + at);
      cpu::execute(dnnl::reorder(from, to), {{DNNL_ARG_FROM, from}, {DNNL_ARG_TO, to}});
    };
    put(sp_.wl_user, wl, d_.fwd.weights_layer_desc(), sp_.wl_fwd);
    put(sp_.wi_user, wi, d_.fwd.weights_iter_desc(), sp_.wi_fwd);
    if (s_.dir != Direction::fwd) {
      if (sp_.wl_bwd != sp_.wl_fwd) put(sp_.wl_user, wl, d_.bwd.weights_layer_desc(), sp_.wl_bwd);
      if (sp_.wi_bwd != sp_.wi_fwd) put(sp_.wi_user, wi, d_.bwd.weights_iter_desc(), sp_.wi_bwd);
    }
    auto* bias = reinterpret_cast<float*>(base + sp_.bias);
    for (std::size_t i = 0; i < b_ih.count(); ++i)
      bias[i] = static_cast<float>(b_ih.get(i)) + static_cast<float>(b_hh.get(i));
    return space;
  }

  void unpack(const HostBuffer& gradients, Outputs& out) const override {
    const auto* base = static_cast<const std::byte*>(gradients.data());
    const DType g = d_.diff;
    out.dw_ih = from_ldigo(base + sp_.dwl, g, s_.D(), s_.H, s_.I);
    out.dw_hh = from_ldigo(base + sp_.dwi, g, s_.D(), s_.H, s_.H);
    out.db = HostBuffer(g, static_cast<std::size_t>(s_.D() * 4 * s_.H));
    std::memcpy(out.db.data(), base + sp_.db, out.db.bytes());
  }

 private:
  Shape s_;
  Descriptors d_;
  Spaces sp_;
};

// PyTorch's W [D, 4H, K] in f32 as oneDNN's [1, D, K, 4, H] logical weights (strides, no copy).
memory::desc torch_weights(std::int64_t D, std::int64_t H, std::int64_t K) {
  return memory::desc({1, D, K, 4, H}, memory::data_type::f32, memory::dims{D * 4 * H * K, 4 * H * K, 1, H * K, K});
}

class CpuMasters final : public Masters {
 public:
  explicit CpuMasters(const Shape& s) : s_(s), d_(descriptors(s)), sp_(spaces_of(s, d_)) {
    const std::int64_t D = s.D(), H = s.H;
    const memory::desc wl = torch_weights(D, H, s.I), wi = torch_weights(D, H, H);
    const auto reorder = [](const memory::desc& from, const memory::desc& to) {
      return cpu::Primitive(dnnl::reorder(dnnl::reorder::primitive_desc(cpu::engine(), from, cpu::engine(), to)),
                            {{DNNL_ARG_FROM, from}, {DNNL_ARG_TO, to}});
    };
    to_space_.push_back({reorder(wl, d_.fwd.weights_layer_desc()), Tensor::w_ih, sp_.wl_fwd});
    to_space_.push_back({reorder(wi, d_.fwd.weights_iter_desc()), Tensor::w_hh, sp_.wi_fwd});
    if (s.dir == Direction::fwd) return;
    if (sp_.wl_bwd != sp_.wl_fwd) to_space_.push_back({reorder(wl, d_.bwd.weights_layer_desc()), Tensor::w_ih, sp_.wl_bwd});
    if (sp_.wi_bwd != sp_.wi_fwd) to_space_.push_back({reorder(wi, d_.bwd.weights_iter_desc()), Tensor::w_hh, sp_.wi_bwd});
    to_torch_.push_back({reorder(d_.m.d_w_layer, wl), Tensor::w_ih, sp_.dwl});
    to_torch_.push_back({reorder(d_.m.d_w_iter, wi), Tensor::w_hh, sp_.dwi});
  }

  void pack(const MasterArgs& a) override {
    auto* space = static_cast<std::byte*>(a.weights);
    for (Reorder& r : to_space_) r.prim.run({r.tensor == Tensor::w_ih ? a.w_ih : a.w_hh, space + r.at});
    auto* bias = reinterpret_cast<float*>(space + sp_.bias);
    for (std::int64_t i = 0; i < s_.D() * 4 * s_.H; ++i) bias[i] = a.b_ih[i] + a.b_hh[i];
  }

  void unpack(const MasterArgs& a) override {
    const auto* space = static_cast<const std::byte*>(a.dweights);
    for (Reorder& r : to_torch_) r.prim.run({space + r.at, r.tensor == Tensor::w_ih ? a.dw_ih : a.dw_hh});
    const std::size_t n = static_cast<std::size_t>(s_.D() * 4 * s_.H);
    if (d_.diff == DType::f32) {
      const auto* db = reinterpret_cast<const float*>(space + sp_.db);
      std::copy_n(db, n, a.db_ih);
      std::copy_n(db, n, a.db_hh);
    } else {
      const auto* db = reinterpret_cast<const std::uint16_t*>(space + sp_.db);
      for (std::size_t i = 0; i < n; ++i) a.db_ih[i] = a.db_hh[i] = bf16_to_float(db[i]);
    }
  }

 private:
  enum class Tensor { w_ih, w_hh };
  struct Reorder {
    cpu::Primitive prim;
    Tensor tensor;   // which master (pack: the source; unpack: the destination)
    std::size_t at;  // the region of the space, bytes from its start
  };
  Shape s_;
  Descriptors d_;
  Spaces sp_;
  std::vector<Reorder> to_space_, to_torch_;
};

class CpuLstm final : public Plan {
 public:
  explicit CpuLstm(const Shape& s) : s_(s), d_(descriptors(s)), sp_(spaces_of(s, d_)) {
    const Descs& m = d_.m;
    // What both primitives take, first and in this order (run() passes the buffers so), the weights
    // in the formats of `pd`.
    auto layer_args = [&m](const auto& pd) {
      return std::vector<std::pair<int, memory::desc>>{{DNNL_ARG_SRC_LAYER, m.src_layer},
                                                      {DNNL_ARG_SRC_ITER, m.src_iter},
                                                      {DNNL_ARG_SRC_ITER_C, m.src_iter_c},
                                                      {DNNL_ARG_WEIGHTS_LAYER, pd.weights_layer_desc()},
                                                      {DNNL_ARG_WEIGHTS_ITER, pd.weights_iter_desc()},
                                                      {DNNL_ARG_BIAS, m.bias},
                                                      {DNNL_ARG_DST_LAYER, m.dst_layer},
                                                      {DNNL_ARG_DST_ITER, m.dst_iter},
                                                      {DNNL_ARG_DST_ITER_C, m.dst_iter_c}};
    };
    std::vector<std::pair<int, memory::desc>> fwd_args = layer_args(d_.fwd);
    if (s_.dir == Direction::fwd) {
      fwd_ = cpu::Primitive(dnnl::lstm_forward(d_.fwd), fwd_args);
      return;
    }
    workspace_ = memory(d_.fwd.workspace_desc(), cpu::engine());
    fwd_args.emplace_back(DNNL_ARG_WORKSPACE, d_.fwd.workspace_desc());
    fwd_ = cpu::Primitive(dnnl::lstm_forward(d_.fwd), fwd_args);
    std::vector<std::pair<int, memory::desc>> bwd_args = layer_args(d_.bwd);
    bwd_args.insert(bwd_args.end(), {{DNNL_ARG_WORKSPACE, d_.fwd.workspace_desc()},
                                     {DNNL_ARG_DIFF_DST_LAYER, m.d_dst_layer},
                                     {DNNL_ARG_DIFF_DST_ITER, m.d_dst_iter},
                                     {DNNL_ARG_DIFF_DST_ITER_C, m.d_dst_iter_c},
                                     {DNNL_ARG_DIFF_SRC_LAYER, m.d_src_layer},
                                     {DNNL_ARG_DIFF_SRC_ITER, m.d_src_iter},
                                     {DNNL_ARG_DIFF_SRC_ITER_C, m.d_src_iter_c},
                                     {DNNL_ARG_DIFF_WEIGHTS_LAYER, m.d_w_layer},
                                     {DNNL_ARG_DIFF_WEIGHTS_ITER, m.d_w_iter},
                                     {DNNL_ARG_DIFF_BIAS, m.d_bias}});
    bwd_ = cpu::Primitive(dnnl::lstm_backward(d_.bwd), bwd_args);
  }

  void forward(const Args& a) override {
    const auto* w = static_cast<const std::byte*>(a.weights);
    if (s_.dir == Direction::fwd) {
      fwd_.run({a.x, a.h0, a.c0, w + sp_.wl_fwd, w + sp_.wi_fwd, w + sp_.bias, a.y, a.hT, a.cT});
      return;
    }
    fwd_.run({a.x, a.h0, a.c0, w + sp_.wl_fwd, w + sp_.wi_fwd, w + sp_.bias, a.y, a.hT, a.cT,
              workspace_.get_data_handle()});
    seen_ = {a.x, a.h0, a.c0, a.weights, a.y, a.hT, a.cT};
  }

  void run(const Args& a) override {
    if (s_.dir == Direction::fwd) return forward(a);
    if (seen_ != Seen{a.x, a.h0, a.c0, a.weights, a.y, a.hT, a.cT}) forward(a);
    auto* dw = static_cast<std::byte*>(a.dweights);
    std::memset(dw + sp_.dwl, 0, d_.m.d_w_layer.get_size());
    std::memset(dw + sp_.dwi, 0, d_.m.d_w_iter.get_size());
    std::memset(dw + sp_.db, 0, d_.m.d_bias.get_size());
    const auto* w = static_cast<const std::byte*>(a.weights);
    bwd_.run({a.x, a.h0, a.c0, w + sp_.wl_bwd, w + sp_.wi_bwd, w + sp_.bias, a.y, a.hT, a.cT,
              workspace_.get_data_handle(), a.dy, a.dhT, a.dcT, a.dx, a.dh0, a.dc0, dw + sp_.dwl, dw + sp_.dwi,
              dw + sp_.db});
  }

  std::string label() const override {
    std::string l = std::string("oneDNN lstm ") + (s_.dir == Direction::fwd ? "forward_inference " : "backward ") +
                    (s_.dir == Direction::fwd ? d_.fwd.impl_info_str() : d_.bwd.impl_info_str());
    if (s_.dir != Direction::fwd)
      l += std::string(" (forward_training at setup; timed: zero dW + backward; gradients in ") +
           dtype_name(d_.diff) + ")";
    return l + ", bias b_ih+b_hh, " + std::to_string(cpu::threads()) + " threads";
  }

 private:
  // The inputs and outputs of the last training forward: what the workspace holds the state of.
  using Seen = std::array<const void*, 7>;

  Shape s_;
  Descriptors d_;
  Spaces sp_;
  memory workspace_;
  cpu::Primitive fwd_, bwd_;
  Seen seen_{};
};

}  // namespace

std::string cpu_unsupported_reason(const Problem& p) {
  if (p.dtype != DType::f32 && p.dtype != DType::bf16)
    return std::string("the CPU backend has no ") + dtype_name(p.dtype) + " lstm";
  const Shape s = shape_of(p);
  if (cpu_takes_hotops(s)) return cpu_hotops_unsupported_reason(s);
  return cpu::onednn_unsupported_reason([&] { descriptors(s); }, p, "lstm");
}

std::unique_ptr<Plan> make_onednn_plan(const Shape& s) { return std::make_unique<CpuLstm>(s); }
std::unique_ptr<Layout> make_onednn_layout(const Shape& s) { return std::make_unique<CpuLayout>(s); }
std::unique_ptr<Masters> make_onednn_masters(const Shape& s) { return std::make_unique<CpuMasters>(s); }

std::unique_ptr<Plan> make_cpu_plan(const Shape& s) {
  return cpu_takes_hotops(s) ? make_cpu_hotops_plan(s) : make_onednn_plan(s);
}
std::unique_ptr<Layout> make_cpu_layout(const Shape& s) {
  return cpu_takes_hotops(s) ? make_cpu_hotops_layout(s) : make_onednn_layout(s);
}
std::unique_ptr<Masters> make_cpu_masters(const Shape& s) {
  return cpu_takes_hotops(s) ? make_cpu_hotops_masters(s) : make_onednn_masters(s);
}

}  // namespace hotops::lstm
