// lstm_cell on the CPU through oneDNN's LSTM primitive: lstm_forward / lstm_backward with one time
// step, one layer, one direction. x and h are read in place from the [B, I+H] input (strided views),
// W is reordered once at setup into the formats the primitives ask for, and bwd's workspace is
// made at setup by a forward_training run. Inside the timed bwd run, besides lstm_backward: zeroing
// its weight and bias gradients (the RNN primitive accumulates into them) and reordering them to
// the [4H, I+H] / [4H] outputs, which is what a caller with PyTorch's layout pays.
#include <cstring>

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

struct Plan {
  Descs d;
  dnnl::lstm_forward::primitive_desc fwd;
  dnnl::lstm_backward::primitive_desc bwd;
  memory::desc dW_layer_f32, dW_iter_f32, db_out;  // bwd: caller-layout gradients
};

Plan plan(const Shape& s) {
  Plan p;
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

class OnednnCell final : public Case {
 public:
  explicit OnednnCell(const Problem& p)
      : s_(shape_of(p)), plan_(plan(s_)), in_(make_inputs(s_, input_seed(p))), out_(make_outputs(s_)) {
    dnnl::engine& eng = cpu::engine();
    const Descs& d = plan_.d;
    const auto I = static_cast<std::size_t>(s_.I), e = dtype_size(s_.dtype);
    auto* xh = static_cast<std::byte*>(in_.xh.data());
    auto* W = static_cast<std::byte*>(in_.W.data());
    const memory x = cpu::mem(d.x, xh), h = cpu::mem(d.h, xh + I * e), c = cpu::mem(d.c, in_.c.data());

    // The bias in f32; x's and h's weights reordered to what each primitive asks for.
    bias_ = HostBuffer(DType::f32, in_.b.count());
    for (std::size_t i = 0; i < bias_.count(); ++i) bias_.set(i, in_.b.get(i));
    const memory bias = cpu::mem(d.bias, bias_.data());
    auto reordered = [&](const memory::desc& from, void* data, const memory::desc& to) {
      return cpu::reordered(cpu::mem(from, data), to);
    };
    const memory W_layer_fwd = reordered(d.W_layer, W, plan_.fwd.weights_layer_desc());
    const memory W_iter_fwd = reordered(d.W_iter, W + I * e, plan_.fwd.weights_iter_desc());

    h_iter_ = memory(d.h_iter, eng);
    workspace_ = memory(plan_.fwd.workspace_desc(), eng);
    if (s_.dir == Direction::fwd) {
      fwd_ = dnnl::lstm_forward(plan_.fwd);
      fwd_args_ = {{DNNL_ARG_SRC_LAYER, x},           {DNNL_ARG_SRC_ITER, h},
                   {DNNL_ARG_SRC_ITER_C, c},          {DNNL_ARG_WEIGHTS_LAYER, W_layer_fwd},
                   {DNNL_ARG_WEIGHTS_ITER, W_iter_fwd}, {DNNL_ARG_BIAS, bias},
                   {DNNL_ARG_DST_LAYER, cpu::mem(d.h_new, out_.h.data())},
                   {DNNL_ARG_DST_ITER, h_iter_},      {DNNL_ARG_DST_ITER_C, cpu::mem(d.c_new, out_.c.data())},
                   {DNNL_ARG_WORKSPACE, workspace_}};
      return;
    }

    // bwd: the forward state (h', c' and the workspace), once, outside timing.
    const auto B = static_cast<std::size_t>(s_.B), H = static_cast<std::size_t>(s_.H);
    h_new_ = HostBuffer(s_.dtype, B * H);
    c_new_ = HostBuffer(s_.dtype, B * H);
    const memory h_new = cpu::mem(d.h_new, h_new_.data()), c_new = cpu::mem(d.c_new, c_new_.data());
    cpu::execute(dnnl::lstm_forward(plan_.fwd),
                 {{DNNL_ARG_SRC_LAYER, x}, {DNNL_ARG_SRC_ITER, h}, {DNNL_ARG_SRC_ITER_C, c},
                  {DNNL_ARG_WEIGHTS_LAYER, W_layer_fwd}, {DNNL_ARG_WEIGHTS_ITER, W_iter_fwd}, {DNNL_ARG_BIAS, bias},
                  {DNNL_ARG_DST_LAYER, h_new}, {DNNL_ARG_DST_ITER, h_iter_}, {DNNL_ARG_DST_ITER_C, c_new},
                  {DNNL_ARG_WORKSPACE, workspace_}});
    const memory W_layer_bwd = reordered(d.W_layer, W, plan_.bwd.weights_layer_desc());
    const memory W_iter_bwd = reordered(d.W_iter, W + I * e, plan_.bwd.weights_iter_desc());
    zeros_ = HostBuffer(s_.dtype, B * H);
    std::memset(zeros_.data(), 0, zeros_.bytes());

    auto* dxh = static_cast<std::byte*>(out_.dxh.data());
    auto* dW = static_cast<std::byte*>(out_.dW.data());
    dW_layer_ = memory(plan_.dW_layer_f32, eng);
    dW_iter_ = memory(plan_.dW_iter_f32, eng);
    db_ = memory(d.bias, eng);
    bwd_ = dnnl::lstm_backward(plan_.bwd);
    bwd_args_ = {{DNNL_ARG_SRC_LAYER, x},
                 {DNNL_ARG_SRC_ITER, h},
                 {DNNL_ARG_SRC_ITER_C, c},
                 {DNNL_ARG_WEIGHTS_LAYER, W_layer_bwd},
                 {DNNL_ARG_WEIGHTS_ITER, W_iter_bwd},
                 {DNNL_ARG_BIAS, bias},
                 {DNNL_ARG_DST_LAYER, h_new},
                 {DNNL_ARG_DST_ITER, h_iter_},
                 {DNNL_ARG_DST_ITER_C, c_new},
                 {DNNL_ARG_DIFF_SRC_LAYER, cpu::mem(d.x, dxh)},
                 {DNNL_ARG_DIFF_SRC_ITER, cpu::mem(d.h, dxh + I * e)},
                 {DNNL_ARG_DIFF_SRC_ITER_C, cpu::mem(d.c, out_.dc.data())},
                 {DNNL_ARG_DIFF_WEIGHTS_LAYER, dW_layer_},
                 {DNNL_ARG_DIFF_WEIGHTS_ITER, dW_iter_},
                 {DNNL_ARG_DIFF_BIAS, db_},
                 {DNNL_ARG_DIFF_DST_LAYER, cpu::mem(d.h_new, in_.dh.data())},
                 {DNNL_ARG_DIFF_DST_ITER, cpu::mem(d.h_iter, zeros_.data())},
                 {DNNL_ARG_DIFF_DST_ITER_C, cpu::mem(d.c_new, in_.dc.data())},
                 {DNNL_ARG_WORKSPACE, workspace_}};
    dW_layer_out_ = cpu::mem(d.W_layer, dW);
    dW_iter_out_ = cpu::mem(d.W_iter, dW + I * e);
    db_out_ = cpu::mem(plan_.db_out, out_.db.data());
    to_dW_layer_ = dnnl::reorder(dW_layer_, dW_layer_out_);
    to_dW_iter_ = dnnl::reorder(dW_iter_, dW_iter_out_);
    to_db_ = dnnl::reorder(db_, db_out_);
  }

  void run() override {
    if (s_.dir == Direction::fwd) {
      cpu::execute(fwd_, fwd_args_);
      return;
    }
    dnnl::stream& st = cpu::stream();
    for (memory* m : {&dW_layer_, &dW_iter_, &db_})
      std::memset(m->get_data_handle(), 0, m->get_desc().get_size());
    HOTOPS_CHECK_DNNL(bwd_.execute(st, bwd_args_));
    HOTOPS_CHECK_DNNL(to_dW_layer_.execute(st, dW_layer_, dW_layer_out_));
    HOTOPS_CHECK_DNNL(to_dW_iter_.execute(st, dW_iter_, dW_iter_out_));
    HOTOPS_CHECK_DNNL(to_db_.execute(st, db_, db_out_));
    HOTOPS_CHECK_DNNL(st.wait());
  }

  Check verify() override {
    out_.h.poison(), out_.c.poison(), out_.dxh.poison(), out_.dc.poison(), out_.dW.poison(), out_.db.poison();
    run();
    return lstm_cell::verify(s_, in_, out_);
  }

  std::string label() const override {
    const char* impl = s_.dir == Direction::fwd ? plan_.fwd.impl_info_str() : plan_.bwd.impl_info_str();
    std::string l = std::string("oneDNN lstm_") + (s_.dir == Direction::fwd ? "forward (training) " : "backward ") +
                    impl + ", T=1, x,h read in place from one [B, I+H]";
    if (s_.dir == Direction::bwd) l += " + zeroing and reorders of dW, db";
    return cpu::with_threads(l);
  }

 private:
  Shape s_;
  Plan plan_;
  Inputs in_;
  Outputs out_;
  HostBuffer bias_, h_new_, c_new_, zeros_;
  memory h_iter_, workspace_, dW_layer_, dW_iter_, db_, dW_layer_out_, dW_iter_out_, db_out_;
  dnnl::lstm_forward fwd_;
  dnnl::lstm_backward bwd_;
  dnnl::reorder to_dW_layer_, to_dW_iter_, to_db_;
  cpu::Args fwd_args_, bwd_args_;
};

}  // namespace

HOTOPS_ONEDNN_CASE(OnednnCell, make_cpu_onednn, onednn_unsupported_reason, "LSTM", " and these layouts")

}  // namespace hotops::lstm_cell
