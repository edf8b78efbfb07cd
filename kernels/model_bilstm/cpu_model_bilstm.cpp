// model_bilstm on the CPU: oneDNN's LSTM forward and backward, OpenMP loops for the rest; the step op
// by op, and its bf16 form:
// docs/models.md, "How each model step runs".
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>

#include "hotops/check.h"
#include "hotops/cpu.h"
#include "hotops/trace.h"
#include "kernels/lstm/lstm.h"
#include "kernels/model_bilstm/model_bilstm.h"

namespace hotops::model_bilstm {
namespace {

// The BiLSTM layer as kernels/lstm's problem: the model's mixed precision keeps oneDNN's gradients f32.
lstm::Shape lstm_shape(const Shape& s) {
  lstm::Shape l;
  l.dir = s.train() ? Direction::bwd : Direction::fwd;
  l.dtype = s.dtype;
  l.T = s.cfg.T, l.B = s.batch, l.I = s.cfg.E, l.H = s.cfg.H;
  l.bidirectional = true;
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

// bf16: a value as bf16 storage holds it (round to nearest even).
float round_bf16(float v) { return bf16_to_float(float_to_bf16(v)); }

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
    const std::int64_t T = c_.T, B = s_.batch, E = c_.E, H = c_.H;
    params_ = st_.params, m_ = st_.m, v_ = st_.v;
    grads_ = zeros(l_.total);  // the padding is never written: zero, as AdamW needs
    const DType t = s_.dtype;  // the LSTM's data
    x_ = zeros(static_cast<std::size_t>(T * B * E), t);
    h0_ = zeros(static_cast<std::size_t>(2 * B * H), t);
    c0_ = h0_, hT_ = h0_, cT_ = h0_;
    y_ = zeros(static_cast<std::size_t>(T * B * 2 * H), t);
    logits_ = zeros(static_cast<std::size_t>(B * c_.C));
    weights_ = bytes(layout->weight_bytes());
    lstm_args_ = {x_.data(), h0_.data(), c0_.data(), weights_.data(), y_.data(), hT_.data(), cT_.data()};
    float* P = params_.as<float>();
    masters_args_.w_ih = P + l_.w_ih, masters_args_.w_hh = P + l_.w_hh;
    masters_args_.b_ih = P + l_.b_ih, masters_args_.b_hh = P + l_.b_hh;
    masters_args_.weights = weights_.data();
    if (!s_.train()) return;
    dlogits_ = zeros(logits_.count());
    dhT_ = zeros(hT_.count());  // the gradients: f32
    dcT_ = zeros(hT_.count());
    dy_ = zeros(y_.count());
    dx_ = zeros(x_.count());
    dh0_ = zeros(hT_.count());
    dc0_ = zeros(hT_.count());
    dweights_ = bytes(layout->gradient_bytes());
    lstm_args_.dy = dy_.data(), lstm_args_.dhT = dhT_.data(), lstm_args_.dcT = dcT_.data();
    lstm_args_.dx = dx_.data(), lstm_args_.dh0 = dh0_.data(), lstm_args_.dc0 = dc0_.data();
    lstm_args_.dweights = dweights_.data();
    float* Gr = grads_.as<float>();
    masters_args_.dweights = dweights_.data();
    masters_args_.dw_ih = Gr + l_.w_ih, masters_args_.dw_hh = Gr + l_.w_hh;
    masters_args_.db_ih = Gr + l_.b_ih, masters_args_.db_hh = Gr + l_.b_hh;
  }

  void run() override {
    cpu::ThreadScope scope(threads_);
    trace::op("embedding");
    gather();
    trace::op("reorder");  // the LSTM weights into oneDNN's layouts (the summed biases, a bf16 cast)
    masters_->pack(masters_args_);
    trace::op("lstm");
    if (s_.train()) lstm_->forward(lstm_args_);
    else lstm_->run(lstm_args_);
    trace::op("addmm");
    dense_forward();
    if (!s_.train()) return;
    trace::op("cross_entropy");
    loss_ = loss_and_dlogits();
    trace::op("mm");
    dense_backward();
    trace::op("lstm_bwd");  // the backward, its weight gradients into PyTorch's layouts (db into both biases)
    lstm_->run(lstm_args_);
    masters_->unpack(masters_args_);
    trace::op("embedding_bwd");
    embedding_backward();
    trace::op("adamw");
    adamw_step();
  }

  Check verify() override {
    copy_into(params_, st_.params), copy_into(m_, st_.m), copy_into(v_, st_.v);
    step_ = 0;
    logits_.poison();
    if (s_.train()) {
      const std::int64_t G = 4 * c_.H;
      const std::pair<std::size_t, std::int64_t> tensors[] = {
          {l_.embed, c_.V * c_.E}, {l_.w_ih, 2 * G * c_.E}, {l_.w_hh, 2 * G * c_.H}, {l_.b_ih, 2 * G},
          {l_.b_hh, 2 * G},        {l_.dense_w, 2 * c_.H * c_.C}, {l_.dense_b, c_.C}};
      for (const auto& [at, n] : tensors) std::fill_n(grads_.as<float>() + at, n, std::nanf(""));
    }
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
    std::string l = std::string(s_.bf16() ? "bf16 autocast (f32 master weights; the weight reorders cast to bf16 each "
                                            "step, f32 bias b_ih+b_hh); " : "") +
                    "oneDNN " + (s_.bf16() ? "bf16 " : "") + "lstm bidirectional_concat " +
                    (s_.train() ? "forward_training + backward" : "forward_inference") +
                    " (kernels/lstm's plan), weights reordered from the flat PyTorch layout every step, bias b_ih+b_hh";
    if (s_.bf16() && s_.train()) l += " (gradients f32)";
    l += s_.bf16() ? "; OpenMP embedding gather to bf16, dense head (bf16 operands, f32 sums, bf16 logits)"
                   : "; OpenMP embedding gather, dense head";
    if (s_.train()) l += ", softmax-CE, dense bwd, deterministic embedding scatter-add, AdamW 1 flat pass";
    return l + ", " + std::to_string(threads_ > 0 ? threads_ : cpu::threads()) + " threads";
  }

  double last_loss() override { return loss_; }

 private:
  int team(std::int64_t work) const { return work >= (1 << 15) ? cpu::threads() : 1; }

  void gather() {
    const std::int64_t T = c_.T, B = s_.batch, E = c_.E;
    const float* embed = params_.as<float>() + l_.embed;
    const bool b16 = s_.bf16();
    const std::int32_t* tok = st_.tokens.data();
#pragma omp parallel for num_threads(team(T * B * E)) schedule(static)
    for (std::int64_t n = 0; n < T * B; ++n) {
      const std::int64_t t = n / B, b = n % B;
      const float* row = embed + static_cast<std::int64_t>(tok[b * T + t]) * E;
      if (!b16) {
        std::copy_n(row, E, x_.as<float>() + n * E);
      } else {
        std::uint16_t* x = x_.as<std::uint16_t>() + n * E;
        for (std::int64_t e = 0; e < E; ++e) x[e] = float_to_bf16(row[e]);
      }
    }
  }

  // feature(b, k) = hT[k / H, b, k % H]: the final hidden states of both directions, concatenated.
  float feature(std::int64_t b, std::int64_t k) const {
    const std::int64_t i = ((k / c_.H) * s_.batch + b) * c_.H + k % c_.H;
    return s_.bf16() ? bf16_to_float(hT_.as<std::uint16_t>()[i]) : hT_.as<float>()[i];
  }
  // A parameter as the step multiplies it: the f32 master, or its bf16 cast.
  float operand(float v) const { return s_.bf16() ? round_bf16(v) : v; }

  void dense_forward() {
    const std::int64_t B = s_.batch, C = c_.C, K = 2 * c_.H;
    const float* W = params_.as<float>() + l_.dense_w;
    const float* bias = params_.as<float>() + l_.dense_b;
    float* z = logits_.as<float>();
    for (std::int64_t b = 0; b < B; ++b) {
      float* zb = z + b * C;
      for (std::int64_t o = 0; o < C; ++o) zb[o] = operand(bias[o]);
      for (std::int64_t k = 0; k < K; ++k) {
        const float f = feature(b, k);
        for (std::int64_t o = 0; o < C; ++o) zb[o] += f * operand(W[k * C + o]);
      }
      for (std::int64_t o = 0; o < C; ++o) zb[o] = operand(zb[o]);  // bf16: the logits are stored bf16
    }
  }

  // Mean softmax cross-entropy; dlogits = (softmax - onehot) / B.
  double loss_and_dlogits() {
    const std::int64_t B = s_.batch, C = c_.C;
    const float* z = logits_.as<float>();
    float* dz = dlogits_.as<float>();
    const float inv_b = 1.f / static_cast<float>(B);
    double total = 0;
    for (std::int64_t r = 0; r < B; ++r) {
      const float* zr = z + r * C;
      float* dr = dz + r * C;
      const std::int32_t y = st_.labels[static_cast<std::size_t>(r)];
      const float mx = *std::max_element(zr, zr + C);
      float sum = 0.f;
      for (std::int64_t o = 0; o < C; ++o) sum += (dr[o] = std::exp(zr[o] - mx));
      const float inv = 1.f / sum;
      for (std::int64_t o = 0; o < C; ++o) dr[o] = operand(dr[o] * inv * inv_b - (o == y ? inv_b : 0.f));
      total += static_cast<double>(std::log(sum) - (zr[y] - mx));
    }
    return total / static_cast<double>(B);
  }

  // dW = feat^T . dz, db = colsum(dz), dhT = dz . W^T.
  void dense_backward() {
    const std::int64_t B = s_.batch, C = c_.C, K = 2 * c_.H, H = c_.H;
    const float* W = params_.as<float>() + l_.dense_w;
    const float* dz = dlogits_.as<float>();
    float* dW = grads_.as<float>() + l_.dense_w;
    float* db = grads_.as<float>() + l_.dense_b;
    float* dh = dhT_.as<float>();
    std::fill_n(dW, K * C, 0.f);
    std::fill_n(db, C, 0.f);
    for (std::int64_t b = 0; b < B; ++b) {
      const float* dzb = dz + b * C;
      for (std::int64_t o = 0; o < C; ++o) db[o] += dzb[o];
      for (std::int64_t k = 0; k < K; ++k) {
        const float f = feature(b, k);
        float s = 0.f;
        for (std::int64_t o = 0; o < C; ++o) {
          dW[k * C + o] += f * dzb[o];
          s += dzb[o] * operand(W[k * C + o]);
        }
        dh[((k / H) * B + b) * H + k % H] = s;
      }
    }
  }

  // dE = 0; dE[tokens[n]] += dx[n] for n in (t, b) order. Thread k owns the rows v with v % team == k
  // and walks every position: each row's sum is taken in the same order whatever the thread count.
  void embedding_backward() {
    const std::int64_t T = c_.T, B = s_.batch, E = c_.E, V = c_.V;
    float* dE = grads_.as<float>() + l_.embed;
    const float* dx = dx_.as<float>();
    const std::int32_t* tok = st_.tokens.data();
    const int n_threads = team(V * E);
#pragma omp parallel num_threads(n_threads)
    {
      const int k = omp_get_thread_num(), n = omp_get_num_threads();
      for (std::int64_t v = k; v < V; v += n) std::fill_n(dE + v * E, E, 0.f);
      for (std::int64_t i = 0; i < T * B; ++i) {
        const std::int64_t t = i / B, b = i % B, v = tok[b * T + t];
        if (v % n != k) continue;
        float* row = dE + v * E;
        const float* g = dx + i * E;
#pragma omp simd
        for (std::int64_t e = 0; e < E; ++e) row[e] += g[e];
      }
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
  lstm::Args lstm_args_;
  lstm::MasterArgs masters_args_;
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
      return std::string("oneDNN has no ") + dtype_name(s.dtype) + " bidirectional lstm " +
             (s.train() ? "forward_training + backward" : "forward_inference") +
             (s.bf16() ? (s.train() ? " (bf16 data, f32 bias and gradients)" : " (bf16 data, f32 bias)") : "") + " for this CPU (ISA " + cpu::isa_name() + ")";
    throw;
  }
  return "";
}

std::unique_ptr<ModelCase> make_cpu(const Problem& p) { return std::make_unique<CpuBilstm>(p); }

}  // namespace hotops::model_bilstm
