// lstm_cell on the CPU through oneDNN's LSTM primitive: lstm_forward / lstm_backward with one time
// step, one layer, one direction. x and h are read in place from the [B, I+H] input (strided views),
// W is reordered into the formats the primitives ask for (and b made f32) on the first run on them,
// and bwd's workspace is made then by a forward_training run, outside the timed work (see the Plan in
// lstm_cell.h). Inside the timed bwd run, besides lstm_backward: zeroing
// its weight and bias gradients (the RNN primitive accumulates into them) and reordering them to
// the [4H, I+H] / [4H] outputs, which is what a caller with PyTorch's layout pays.
#include <array>
#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

#include "hotops/check.h"
#include "hotops/cpu.h"
#include "kernels/lstm_cell/lstm_cell.h"

namespace hotops::lstm_cell {
namespace {

using dnnl::memory;
using tag = memory::format_tag;
using dt = memory::data_type;

// The memory descriptors of one problem in the caller's layouts.
struct Descs {
  memory::desc x, h, c, c_new, h_new, h_iter;  // x, h: strided views into xh; h_iter: dst_iter scratch
  memory::desc W_layer, W_iter;                // views of W [4H, K] as ldigo (strides)
  memory::desc bias;                           // f32 ldgo
  memory::desc any_W_layer, any_W_iter;
};

Descs descs_of(const Shape& s) {
  const memory::dim B = s.B, I = s.I, H = s.H, K = s.K();
  const dt t = cpu::dnnl_type(s.dtype);
  Descs d;
  d.x = memory::desc({1, B, I}, t, memory::dims{B * K, K, 1});
  d.h = memory::desc({1, 1, B, H}, t, memory::dims{B * K, B * K, K, 1});
  d.c = cpu::md({1, 1, B, H}, s.dtype, tag::ldnc);
  d.c_new = d.c;
  d.h_iter = d.c;
  d.h_new = cpu::md({1, B, H}, s.dtype, tag::tnc);
  // ldigo: [layer, direction, input channel, gate, output channel]; W[g * H + o, i] is at g H K + o K + i.
  d.W_layer = memory::desc({1, 1, I, 4, H}, t, memory::dims{4 * H * K, 4 * H * K, 1, H * K, K});
  d.W_iter = memory::desc({1, 1, H, 4, H}, t, memory::dims{4 * H * K, 4 * H * K, 1, H * K, K});
  d.bias = cpu::md({1, 1, 4, H}, DType::f32, tag::ldgo);
  d.any_W_layer = cpu::md({1, 1, I, 4, H}, s.dtype, tag::any);
  d.any_W_iter = cpu::md({1, 1, H, 4, H}, s.dtype, tag::any);
  return d;
}

struct Descriptors {
  Descs d;
  dnnl::lstm_forward::primitive_desc fwd;
  dnnl::lstm_backward::primitive_desc bwd;
  memory::desc dW_layer_f32, dW_iter_f32, db_out;  // bwd: caller-layout gradients
};

Descriptors descriptors(const Shape& s) {
  Descriptors p;
  p.d = descs_of(s);
  const Descs& d = p.d;
  dnnl::engine& eng = cpu::engine();
  const auto fd = HOTOPS_CHECK_DNNL(dnnl::lstm_forward::desc(
      dnnl::prop_kind::forward_training, dnnl::rnn_direction::unidirectional_left2right, d.x, d.h, d.c, d.any_W_layer,
      d.any_W_iter, d.bias, d.h_new, d.h_iter, d.c_new));
  p.fwd = HOTOPS_CHECK_DNNL(dnnl::lstm_forward::primitive_desc(fd, eng));
  if (s.dir == Direction::bwd) {
    const memory::dim I = s.I, H = s.H;
    // Gradients of the weights and bias in f32 (oneDNN's accumulation type), in its own format.
    const auto bd = HOTOPS_CHECK_DNNL(dnnl::lstm_backward::desc(
        dnnl::prop_kind::backward, dnnl::rnn_direction::unidirectional_left2right, d.x, d.h, d.c, d.any_W_layer,
        d.any_W_iter, d.bias, d.h_new, d.h_iter, d.c_new,
        d.x, d.h, d.c,  // diff_src_layer / diff_src_iter (views into dxh) / diff_src_iter_c: same layouts
        cpu::md({1, 1, I, 4, H}, DType::f32, tag::any), cpu::md({1, 1, H, 4, H}, DType::f32, tag::any), d.bias,
        d.h_new, d.h_iter, d.c_new));
    p.bwd = HOTOPS_CHECK_DNNL(dnnl::lstm_backward::primitive_desc(bd, eng, p.fwd));
    p.dW_layer_f32 = p.bwd.diff_weights_layer_desc();
    p.dW_iter_f32 = p.bwd.diff_weights_iter_desc();
    p.db_out = cpu::md({1, 1, 4, H}, s.dtype, tag::ldgo);
  }
  return p;
}

class OnednnCell final : public Plan {
 public:
  explicit OnednnCell(const Shape& s) : s_(s), p_(descriptors(s)) {
    dnnl::engine& eng = cpu::engine();
    const Descs& d = p_.d;
    const auto B = static_cast<std::size_t>(s_.B), H = static_cast<std::size_t>(s_.H);
    bias_ = HostBuffer(DType::f32, static_cast<std::size_t>(s_.G()));
    W_layer_fwd_ = memory(p_.fwd.weights_layer_desc(), eng);
    W_iter_fwd_ = memory(p_.fwd.weights_iter_desc(), eng);
    h_iter_ = memory(d.h_iter, eng);
    workspace_ = memory(p_.fwd.workspace_desc(), eng);
    const std::vector<std::pair<int, memory::desc>> fwd_args = {
        {DNNL_ARG_SRC_LAYER, d.x},     {DNNL_ARG_SRC_ITER, d.h},          {DNNL_ARG_SRC_ITER_C, d.c},
        {DNNL_ARG_DST_LAYER, d.h_new}, {DNNL_ARG_DST_ITER_C, d.c_new},
        {DNNL_ARG_WEIGHTS_LAYER, W_layer_fwd_.get_desc()}, {DNNL_ARG_WEIGHTS_ITER, W_iter_fwd_.get_desc()},
        {DNNL_ARG_BIAS, d.bias},       {DNNL_ARG_DST_ITER, d.h_iter},     {DNNL_ARG_WORKSPACE, workspace_.get_desc()}};
    fwd_ = cpu::Primitive(dnnl::lstm_forward(p_.fwd), fwd_args);
    if (s_.dir == Direction::fwd) return;

    // bwd: the forward state (h', c' and the workspace) is the plan's own.
    h_new_ = HostBuffer(s_.dtype, B * H);
    c_new_ = HostBuffer(s_.dtype, B * H);
    W_layer_bwd_ = memory(p_.bwd.weights_layer_desc(), eng);
    W_iter_bwd_ = memory(p_.bwd.weights_iter_desc(), eng);
    zeros_ = HostBuffer(s_.dtype, B * H);
    std::memset(zeros_.data(), 0, zeros_.bytes());
    dW_layer_ = memory(p_.dW_layer_f32, eng);
    dW_iter_ = memory(p_.dW_iter_f32, eng);
    db_ = memory(d.bias, eng);
    bwd_ = cpu::Primitive(dnnl::lstm_backward(p_.bwd),
                          {{DNNL_ARG_SRC_LAYER, d.x},
                           {DNNL_ARG_SRC_ITER, d.h},
                           {DNNL_ARG_SRC_ITER_C, d.c},
                           {DNNL_ARG_DIFF_SRC_LAYER, d.x},
                           {DNNL_ARG_DIFF_SRC_ITER, d.h},
                           {DNNL_ARG_DIFF_SRC_ITER_C, d.c},
                           {DNNL_ARG_DIFF_DST_LAYER, d.h_new},
                           {DNNL_ARG_DIFF_DST_ITER_C, d.c_new},
                           {DNNL_ARG_WEIGHTS_LAYER, W_layer_bwd_.get_desc()},
                           {DNNL_ARG_WEIGHTS_ITER, W_iter_bwd_.get_desc()},
                           {DNNL_ARG_BIAS, d.bias},
                           {DNNL_ARG_DST_LAYER, d.h_new},
                           {DNNL_ARG_DST_ITER, d.h_iter},
                           {DNNL_ARG_DST_ITER_C, d.c_new},
                           {DNNL_ARG_DIFF_WEIGHTS_LAYER, dW_layer_.get_desc()},
                           {DNNL_ARG_DIFF_WEIGHTS_ITER, dW_iter_.get_desc()},
                           {DNNL_ARG_DIFF_BIAS, db_.get_desc()},
                           {DNNL_ARG_DIFF_DST_ITER, d.h_iter},
                           {DNNL_ARG_WORKSPACE, workspace_.get_desc()}});
    to_dW_layer_ = cpu::Primitive(dnnl::reorder(dW_layer_, memory(d.W_layer, eng, DNNL_MEMORY_NONE)),
                                  {{DNNL_ARG_FROM, dW_layer_.get_desc()}, {DNNL_ARG_TO, d.W_layer}});
    to_dW_iter_ = cpu::Primitive(dnnl::reorder(dW_iter_, memory(d.W_iter, eng, DNNL_MEMORY_NONE)),
                                 {{DNNL_ARG_FROM, dW_iter_.get_desc()}, {DNNL_ARG_TO, d.W_iter}});
    to_db_ = cpu::Primitive(dnnl::reorder(db_, memory(p_.db_out, eng, DNNL_MEMORY_NONE)),
                            {{DNNL_ARG_FROM, d.bias}, {DNNL_ARG_TO, p_.db_out}});
  }

  // W and b in the primitives' formats; then fwd: the step, bwd: the forward state.
  void forward(const Args& a) override {
    prepare_weights(a);
    const auto I = static_cast<std::size_t>(s_.I), e = dtype_size(s_.dtype);
    const auto* xh = static_cast<const std::byte*>(a.xh);
    const bool fwd = s_.dir == Direction::fwd;
    fwd_.run({a.xh, xh + I * e, a.c, fwd ? a.h_new : h_new_.data(), fwd ? a.c_new : c_new_.data(),
              W_layer_fwd_.get_data_handle(), W_iter_fwd_.get_data_handle(), bias_.data(), h_iter_.get_data_handle(),
              workspace_.get_data_handle()});
    seen_ = {a.xh, a.W, a.b, a.c};
  }

  void run(const Args& a) override {
    const bool seen = seen_ == Seen{a.xh, a.W, a.b, a.c};
    if (s_.dir == Direction::bwd) {
      if (!seen) forward(a);
      backward(a);
      return;
    }
    if (!seen) {
      prepare_weights(a);
      seen_ = {a.xh, a.W, a.b, a.c};
    }
    const auto I = static_cast<std::size_t>(s_.I), e = dtype_size(s_.dtype);
    const auto* xh = static_cast<const std::byte*>(a.xh);
    fwd_.run({a.xh, xh + I * e, a.c, a.h_new, a.c_new, W_layer_fwd_.get_data_handle(), W_iter_fwd_.get_data_handle(),
              bias_.data(), h_iter_.get_data_handle(), workspace_.get_data_handle()});
  }

  std::string label() const override {
    const char* impl = s_.dir == Direction::fwd ? p_.fwd.impl_info_str() : p_.bwd.impl_info_str();
    std::string l = std::string("oneDNN lstm_") + (s_.dir == Direction::fwd ? "forward (training) " : "backward ") +
                    impl + ", T=1, x,h read in place from one [B, I+H]";
    if (s_.dir == Direction::bwd) l += " + zeroing and reorders of dW, db";
    return cpu::with_threads(l);
  }

 private:
  // The inputs of the last forward: what the reordered weights and the forward state are of.
  using Seen = std::array<const void*, 4>;

  // The bias in f32; x's and h's weights reordered to what each primitive asks for.
  void prepare_weights(const Args& a) {
    const Descs& d = p_.d;
    const auto I = static_cast<std::size_t>(s_.I), e = dtype_size(s_.dtype);
    auto* W = const_cast<std::byte*>(static_cast<const std::byte*>(a.W));
    auto* bias = bias_.as<float>();
    if (s_.dtype == DType::bf16)  // bf16 is f32's high half: widening is exact
      for (std::size_t i = 0; i < bias_.count(); ++i) {
        const std::uint32_t bits = std::uint32_t{static_cast<const std::uint16_t*>(a.b)[i]} << 16;
        std::memcpy(&bias[i], &bits, sizeof bits);
      }
    else
      std::memcpy(bias, a.b, bias_.bytes());
    const auto reorder = [&](const memory::desc& from, void* data, const memory& to) {
      const memory src = cpu::mem(from, data);
      cpu::execute(dnnl::reorder(src, to), {{DNNL_ARG_FROM, src}, {DNNL_ARG_TO, to}});
    };
    reorder(d.W_layer, W, W_layer_fwd_);
    reorder(d.W_iter, W + I * e, W_iter_fwd_);
    if (s_.dir == Direction::fwd) return;
    reorder(d.W_layer, W, W_layer_bwd_);
    reorder(d.W_iter, W + I * e, W_iter_bwd_);
  }

  void backward(const Args& a) {
    const auto I = static_cast<std::size_t>(s_.I), e = dtype_size(s_.dtype);
    const auto* xh = static_cast<const std::byte*>(a.xh);
    auto* dxh = static_cast<std::byte*>(a.dxh);
    auto* dW = static_cast<std::byte*>(a.dW);
    for (memory* m : {&dW_layer_, &dW_iter_, &db_})
      std::memset(m->get_data_handle(), 0, m->get_desc().get_size());
    bwd_.run({a.xh, xh + I * e, a.c, a.dxh, dxh + I * e, a.dc, a.dh_new, a.dc_new, W_layer_bwd_.get_data_handle(),
              W_iter_bwd_.get_data_handle(), bias_.data(), h_new_.data(), h_iter_.get_data_handle(), c_new_.data(),
              dW_layer_.get_data_handle(), dW_iter_.get_data_handle(), db_.get_data_handle(), zeros_.data(),
              workspace_.get_data_handle()});
    to_dW_layer_.run({dW_layer_.get_data_handle(), dW});
    to_dW_iter_.run({dW_iter_.get_data_handle(), dW + I * e});
    to_db_.run({db_.get_data_handle(), a.db});
  }

  Shape s_;
  Descriptors p_;
  HostBuffer bias_, h_new_, c_new_, zeros_;
  memory W_layer_fwd_, W_iter_fwd_, W_layer_bwd_, W_iter_bwd_, h_iter_, workspace_, dW_layer_, dW_iter_, db_;
  cpu::Primitive fwd_, bwd_, to_dW_layer_, to_dW_iter_, to_db_;
  Seen seen_{};
};

}  // namespace

std::string onednn_unsupported_reason(const Problem& p) {
  return cpu::onednn_unsupported_reason([&] { descriptors(shape_of(p)); }, p, "LSTM", " and these layouts");
}

std::unique_ptr<Plan> make_cpu_onednn_plan(const Shape& s) { return std::make_unique<OnednnCell>(s); }

}  // namespace hotops::lstm_cell
