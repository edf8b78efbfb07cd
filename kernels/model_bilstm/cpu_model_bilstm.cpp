// model_bilstm on the CPU: the op families' plans (embedding, oneDNN's LSTM through kernels/lstm,
// matmul's small dense head, the loss family's cross_entropy_dbias or cross_entropy with matmul's
// bias_grad, copy's bf16 cast, AdamW); the step op by op, and its bf16 form: docs/models.md, "How
// each model step runs".
#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>

#include "hotops/check.h"
#include "hotops/cpu.h"
#include "hotops/trace.h"
#include "kernels/copy/copy.h"
#include "kernels/loss/loss.h"
#include "kernels/lstm/lstm.h"
#include "kernels/model_bilstm/model_bilstm.h"

namespace hotops::model_bilstm {
namespace {

// The LSTM layer as kernels/lstm's problem: the model's mixed precision keeps oneDNN's gradients f32.
lstm::Shape lstm_shape(const Shape& s) {
  lstm::Shape l;
  l.dir = s.train() ? Direction::bwd : Direction::fwd;
  l.dtype = s.dtype;
  l.T = s.cfg.T, l.B = s.batch, l.I = s.cfg.E, l.H = s.cfg.H;
  l.bidirectional = s.cfg.D == 2;
  l.f32_gradients = true;
  return l;
}

HostBuffer bytes(std::size_t n) { return HostBuffer(DType::f32, (n + 3) / 4); }

void copy_into(HostBuffer& dst, const HostBuffer& src) { std::copy_n(src.as<float>(), src.count(), dst.as<float>()); }

HostBuffer zeros(std::size_t n, DType t = DType::f32) {
  HostBuffer b(t, n);
  std::memset(b.data(), 0, b.bytes());
  return b;
}

class CpuBilstm final : public ModelCase {
 public:
  explicit CpuBilstm(const Problem& p)
      : s_(shape_of(p)), c_(s_.cfg), l_(layout_of(c_)), st_(make_state(s_, l_, models::step_seed(p))),
        threads_(s_.variant == Variant::threads ? s_.threads : 0) {
    cpu::ThreadScope scope(threads_);
    const lstm::Shape ls = lstm_shape(s_);
    lstm_ = lstm::make_cpu_plan(ls);
    masters_ = lstm::make_cpu_masters(ls);
    const std::unique_ptr<lstm::Layout> layout = lstm::make_cpu_layout(ls);
    const std::int64_t T = c_.T, B = s_.batch, E = c_.E, H = c_.H, D = c_.D;
    params_ = st_.params, m_ = st_.m, v_ = st_.v;
    grads_ = zeros(l_.total);  // the padding is never written: zero, as AdamW needs
    const DType t = s_.dtype;  // the LSTM's data
    x_ = c_.one_hot ? st_.x : zeros(static_cast<std::size_t>(T * B * E), t);  // one-hot: the batch itself
    h0_ = zeros(static_cast<std::size_t>(D * B * H), t);
    c0_ = h0_, hT_ = h0_, cT_ = h0_;
    y_ = zeros(static_cast<std::size_t>(T * B * D * H), t);
    logits_ = zeros(static_cast<std::size_t>(B * c_.C), t);  // bf16: stored bf16, as the CUDA step's
    weights_ = bytes(layout->weight_bytes());
    // The lookup, and the dense head on the masters (f32) or their bf16 copy (dense W, then b).
    if (!c_.one_hot) {
      embed_ = embedding::make_cpu_plan(embedding_shape(s_, Direction::fwd, t));
      embed_args_.idx = st_.tokens.data(), embed_args_.W = P() + l_.embed, embed_args_.out = x_.data();
    }
    head_ = matmul::make_cpu_plan(head_shape(s_, Direction::fwd));
    const void* W = P() + l_.dense_w;
    const void* b = P() + l_.dense_b;
    if (s_.bf16()) {
      copy::Shape cs;
      cs.kind = copy::Kind::f32_to_bf16, cs.src = DType::f32, cs.dst = DType::bf16;
      cs.count = l_.dense_b + static_cast<std::size_t>(c_.C) - l_.dense_w;  // W | padding | b
      cs.impl = copy::default_cpu_impl(cs.kind);
      cast_ = copy::make_cpu_plan(cs);
      low_ = zeros(cs.count, DType::bf16);
      cast_args_ = {P() + l_.dense_w, low_.data()};
      W = low_.data();
      b = low_.as<std::uint16_t>() + (l_.dense_b - l_.dense_w);
    }
    head_args_.a = hT_.data(), head_args_.b = W, head_args_.bias = b, head_args_.out = logits_.data();
    lstm_args_ = {x_.data(), h0_.data(), c0_.data(), weights_.data(), y_.data(), hT_.data(), cT_.data()};
    masters_args_.w_ih = P() + l_.w_ih, masters_args_.w_hh = P() + l_.w_hh;
    masters_args_.b_ih = P() + l_.b_ih, masters_args_.b_hh = P() + l_.b_hh;
    masters_args_.weights = weights_.data();
    if (!s_.train()) {
      prepare_weights();  // infer: once, as autocast's weight cache holds them
      return;
    }
    dlogits_ = zeros(logits_.count(), t);
    dhT_ = zeros(hT_.count());  // the gradients: f32
    dcT_ = zeros(hT_.count());
    dy_ = zeros(y_.count());
    dx_ = zeros(x_.count());
    dh0_ = zeros(hT_.count());
    dc0_ = zeros(hT_.count());
    dweights_ = bytes(layout->gradient_bytes());
    loss_out_ = zeros(1);
    float* Gr = grads_.as<float>();
    if (c_.fused_loss()) {
      xent_ = loss::make_cpu_plan(loss::dbias_shape(t, B, c_.C));
      xent_args_.labels = st_.labels.data(), xent_args_.dlogits = dlogits_.data(), xent_args_.db = Gr + l_.dense_b;
    } else {
      xent_ = loss::make_cpu_plan(loss_shape(s_, Direction::fwd));
      xent_bwd_ = loss::make_cpu_plan(loss_shape(s_, Direction::bwd));
      bias_ = matmul::bias_grad::make_cpu_plan(bias_grad_shape(s_));
      lse_ = zeros(static_cast<std::size_t>(B));
      one_ = zeros(1);
      one_.as<float>()[0] = 1;
      xent_args_.target = st_.targets.data(), xent_args_.lse = lse_.data();
      xent_bwd_args_.logits = logits_.data(), xent_bwd_args_.target = st_.targets.data();
      xent_bwd_args_.saved_lse = lse_.data(), xent_bwd_args_.dloss = one_.data(), xent_bwd_args_.dlogits = dlogits_.data();
      bias_args_.dy = dlogits_.data(), bias_args_.db = Gr + l_.dense_b;
    }
    xent_args_.logits = logits_.data(), xent_args_.loss = loss_out_.data();
    head_wgrad_ = matmul::make_cpu_plan(head_shape(s_, Direction::bwd_weight));
    head_wgrad_args_.a = hT_.data(), head_wgrad_args_.dout = dlogits_.data(), head_wgrad_args_.out = Gr + l_.dense_w;
    head_dgrad_ = matmul::make_cpu_plan(head_shape(s_, Direction::bwd_data, DType::f32));  // oneDNN takes f32 dhT
    head_dgrad_args_.dout = dlogits_.data(), head_dgrad_args_.b = W, head_dgrad_args_.out = dhT_.data();
    if (!c_.one_hot) {
      embed_bwd_ = embedding::make_cpu_plan(embedding_shape(s_, Direction::bwd, DType::f32));  // oneDNN's dx: f32
      embed_bwd_args_.idx = st_.tokens.data(), embed_bwd_args_.dout = dx_.data(), embed_bwd_args_.dW = Gr + l_.embed;
    }
    lstm_args_.dy = dy_.data(), lstm_args_.dhT = dhT_.data(), lstm_args_.dcT = dcT_.data();
    lstm_args_.dx = dx_.data(), lstm_args_.dh0 = dh0_.data(), lstm_args_.dc0 = dc0_.data();
    lstm_args_.dweights = dweights_.data();
    masters_args_.dweights = dweights_.data();
    masters_args_.dw_ih = Gr + l_.w_ih, masters_args_.dw_hh = Gr + l_.w_hh;
    masters_args_.db_ih = Gr + l_.b_ih, masters_args_.db_hh = Gr + l_.b_hh;
  }

  void run() override {
    cpu::ThreadScope scope(threads_);
    if (embed_) {
      trace::op("embedding");
      embed_->run(embed_args_);
    }
    if (s_.train()) prepare_weights();  // the weights the last step's AdamW changed
    trace::op("lstm");
    if (s_.train()) lstm_->forward(lstm_args_);
    else lstm_->run(lstm_args_);
    trace::op("addmm");
    head_->run(head_args_);
    if (!s_.train()) return;
    trace::op("cross_entropy");  // loss and dlogits (fused_loss: and the dense bias gradient)
    xent_->run(xent_args_);
    if (xent_bwd_) {
      xent_bwd_->run(xent_bwd_args_);
      trace::op("bias_grad");
      bias_->run(bias_args_);
    }
    loss_ = loss_out_.as<float>()[0];
    trace::op("mm");
    head_wgrad_->run(head_wgrad_args_);
    head_dgrad_->run(head_dgrad_args_);
    trace::op("lstm_bwd");  // the backward, its weight gradients into PyTorch's layouts (db into both biases)
    lstm_->run(lstm_args_);
    masters_->unpack(masters_args_);
    if (embed_bwd_) {
      trace::op("embedding_bwd");
      embed_bwd_->run(embed_bwd_args_);
    }
    trace::op("adamw");
    adamw_step();
  }

  Check verify() override {
    copy_into(params_, st_.params), copy_into(m_, st_.m), copy_into(v_, st_.v);
    step_ = 0;
    logits_.poison();
    if (s_.train())
      for (const Tensor& t : gradient_tensors(c_, l_)) std::fill_n(grads_.as<float>() + t.at, t.count, std::nanf(""));
    else
      prepare_weights();
    run();
    Outcome o;
    if (!s_.train() || s_.bf16()) o.logits = logits_;  // bf16 train checks the step's logits too
    if (s_.train()) {
      o.loss = static_cast<float>(loss_);
      o.grads = grads_, o.params = params_;
    }
    return verify_outcome(s_, l_, st_, o);
  }

  std::string label() const override {
    std::string l = std::string(s_.bf16() ? "bf16 autocast (f32 master weights; the weight reorders cast to bf16, f32 "
                                            "bias b_ih+b_hh); " : "") +
                    "oneDNN " + (s_.bf16() ? "bf16 " : "") + "lstm " +
                    (c_.D == 2 ? "bidirectional_concat " : "unidirectional_left2right ") +
                    (s_.train() ? "forward_training + backward" : "forward_inference") +
                    " (kernels/lstm's plan), weights reordered from the flat PyTorch layout " +
                    (s_.train() ? "every step" : "once") + ", bias b_ih+b_hh";
    if (s_.bf16() && s_.train()) l += " (gradients f32)";
    l += embed_ ? "; embedding plan (" + embed_->label() + "); " : std::string("; one-hot input; ");
    l += std::string(s_.bf16() ? "copy plan (dense W, b to bf16); " : "") + "dense head plans (" + head_->label() + ")";
    if (s_.train()) {
      l += xent_bwd_ ? "; cross_entropy fwd and bwd plans, bias_grad plan (" + bias_->label() + ")" : std::string("; cross_entropy_dbias plan");
      if (embed_bwd_) l += "; embedding bwd plan (" + embed_bwd_->label() + ")";
      l += "; AdamW 1 flat pass";
    }
    return l + ", " + std::to_string(threads_ > 0 ? threads_ : cpu::threads()) + " threads";
  }

  double last_loss() override { return loss_; }

 private:
  int team(std::int64_t work) const { return work >= (1 << 15) ? cpu::threads() : 1; }
  float* P() { return params_.as<float>(); }

  // The weights as the step's primitives take them: the LSTM's packed into oneDNN's layouts from the
  // f32 masters (the summed biases; bf16: cast), and bf16's dense W and b cast. Train: every step;
  // infer: once.
  void prepare_weights() {
    trace::op("reorder");
    masters_->pack(masters_args_);
    if (cast_) {
      trace::op("copy");
      cast_->run(cast_args_);
    }
  }

  void adamw_step() {
    const auto n = static_cast<std::int64_t>(l_.total);
    adamw::cpu_step(params_.as<float>(), grads_.as<const float>(), m_.as<float>(), v_.as<float>(), n,
                    adamw::scalars_for(models::hyper(), ++step_), team(n));
  }

  Shape s_;
  Config c_;
  Layout l_;
  State st_;  // the seeded start: verify() restores from it
  int threads_;
  std::unique_ptr<lstm::Plan> lstm_;        // the BiLSTM on oneDNN's weight space
  std::unique_ptr<lstm::Masters> masters_;  // that space packed from the f32 masters, its gradients back
  HostBuffer params_, grads_, m_, v_;
  HostBuffer x_, h0_, c0_, hT_, cT_, y_, logits_, weights_;
  HostBuffer dlogits_, dhT_, dcT_, dy_, dx_, dh0_, dc0_, dweights_;
  HostBuffer low_;       // bf16: the dense W | padding | b (cast each train step, once for infer)
  HostBuffer loss_out_;  // train: the loss plan's f32 scalar
  lstm::Args lstm_args_;
  lstm::MasterArgs masters_args_;
  std::unique_ptr<embedding::Plan> embed_, embed_bwd_;  // not one_hot
  std::unique_ptr<copy::Plan> cast_;  // bf16 only
  std::unique_ptr<matmul::Plan> head_, head_wgrad_, head_dgrad_;
  std::unique_ptr<loss::Plan> xent_, xent_bwd_;            // xent_bwd_: not fused_loss (then xent_ is its fwd)
  std::unique_ptr<matmul::bias_grad::Plan> bias_;          // not fused_loss: the dense bias gradient
  HostBuffer lse_, one_;                                   // not fused_loss: the saved lse, dloss = 1
  embedding::Args embed_args_, embed_bwd_args_;            // not one_hot
  copy::Args cast_args_;
  matmul::Args head_args_, head_wgrad_args_, head_dgrad_args_;
  loss::Args xent_args_, xent_bwd_args_;
  matmul::bias_grad::Args bias_args_;
  std::int64_t step_ = 0;
  double loss_ = 0;
};

}  // namespace

std::string cpu_unsupported_reason(const Problem& p) {
  const Shape s = shape_of(p);
  if (const std::string why = models::threads_reason(models::step_args(p, "model_bilstm", true, /*allow_bf16=*/true)); !why.empty()) return why;
  try {
    lstm::make_cpu_layout(lstm_shape(s));
  } catch (const Error& e) {
    if (e.kind() == ErrorKind::unsupported)
      return std::string("oneDNN has no ") + dtype_name(s.dtype) + (s.cfg.D == 2 ? " bidirectional" : " unidirectional") + " lstm " +
             (s.train() ? "forward_training + backward" : "forward_inference") +
             (s.bf16() ? (s.train() ? " (bf16 data, f32 bias and gradients)" : " (bf16 data, f32 bias)") : "") + " for this CPU (ISA " + cpu::isa_name() + ")";
    throw;
  }
  return "";
}

std::unique_ptr<ModelCase> make_cpu(const Problem& p) { return std::make_unique<CpuBilstm>(p); }

}  // namespace hotops::model_bilstm
