// model_bilstm on the CPU: oneDNN's LSTM forward and backward, OpenMP loops for the rest; the step op
// by op, and its bf16 form:
// docs/models.md, "How each model step runs".
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <unordered_map>

#include "hotops/check.h"
#include "hotops/cpu.h"
#include "hotops/trace.h"
#include "kernels/model_bilstm/model_bilstm.h"

namespace hotops::model_bilstm {
namespace {

using dnnl::memory;
using dt = memory::data_type;
using tag = memory::format_tag;

// PyTorch's W [D, 4H, K] seen as oneDNN's [1, D, K, 4, H] logical weights (strides, no copy).
memory::desc torch_weights(std::int64_t D, std::int64_t H, std::int64_t K) {
  return memory::desc({1, D, K, 4, H}, dt::f32, memory::dims{D * 4 * H * K, 4 * H * K, 1, H * K, K});
}

struct Plan {
  memory::desc src_layer, src_iter, w_layer, w_iter, bias, dst_layer, dst_iter;
  memory::desc d_src_layer, d_src_iter, d_w_layer, d_w_iter, d_bias, d_dst_layer, d_dst_iter;
  dnnl::lstm_forward::primitive_desc fwd;
  dnnl::lstm_backward::primitive_desc bwd;
};

// The primitive descriptors (creating them is the support probe: oneDNN answers `unimplemented` for
// what this CPU cannot do). Data in the problem's dtype; the bias and every gradient f32.
Plan plan(const Shape& s) {
  const Config& c = s.cfg;
  const memory::dim T = c.T, B = s.batch, I = c.E, H = c.H, D = 2;
  const dt t = s.bf16() ? dt::bf16 : dt::f32;
  Plan p;
  p.src_layer = memory::desc({T, B, I}, t, tag::tnc);
  p.src_iter = memory::desc({1, D, B, H}, t, tag::ldnc);
  p.w_layer = memory::desc({1, D, I, 4, H}, t, tag::any);
  p.w_iter = memory::desc({1, D, H, 4, H}, t, tag::any);
  p.bias = memory::desc({1, D, 4, H}, dt::f32, tag::ldgo);
  p.dst_layer = memory::desc({T, B, D * H}, t, tag::tnc);
  p.dst_iter = p.src_iter;
  p.d_src_layer = memory::desc({T, B, I}, dt::f32, tag::tnc);
  p.d_src_iter = memory::desc({1, D, B, H}, dt::f32, tag::ldnc);
  p.d_w_layer = memory::desc({1, D, I, 4, H}, dt::f32, tag::ldigo);
  p.d_w_iter = memory::desc({1, D, H, 4, H}, dt::f32, tag::ldigo);
  p.d_bias = p.bias;
  p.d_dst_layer = memory::desc({T, B, D * H}, dt::f32, tag::tnc);
  p.d_dst_iter = p.d_src_iter;
  dnnl::engine& eng = cpu::engine();
  const auto dir = dnnl::rnn_direction::bidirectional_concat;
  const auto fd = HOTOPS_CHECK_DNNL(dnnl::lstm_forward::desc(
      s.train() ? dnnl::prop_kind::forward_training : dnnl::prop_kind::forward_inference, dir, p.src_layer, p.src_iter,
      p.src_iter, p.w_layer, p.w_iter, p.bias, p.dst_layer, p.dst_iter, p.dst_iter));
  p.fwd = HOTOPS_CHECK_DNNL(dnnl::lstm_forward::primitive_desc(fd, eng));
  if (!s.train()) return p;
  const auto bd = HOTOPS_CHECK_DNNL(dnnl::lstm_backward::desc(
      dnnl::prop_kind::backward, dir, p.src_layer, p.src_iter, p.src_iter, p.w_layer, p.w_iter, p.bias, p.dst_layer,
      p.dst_iter, p.dst_iter, p.d_src_layer, p.d_src_iter, p.d_src_iter, p.d_w_layer, p.d_w_iter, p.d_bias,
      p.d_dst_layer, p.d_dst_iter, p.d_dst_iter));
  p.bwd = HOTOPS_CHECK_DNNL(dnnl::lstm_backward::primitive_desc(bd, eng, p.fwd));
  return p;
}

// A reorder primitive between two memories, made once.
struct Reorder {
  dnnl::reorder prim;
  memory from, to;
  void execute() { prim.execute(cpu::stream(), from, to); }
};
Reorder make_reorder(const memory& from, const memory& to) {
  return Reorder{HOTOPS_CHECK_DNNL(dnnl::reorder(from, to)), from, to};
}

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
      : s_(shape_of(p)), c_(s_.cfg), l_(layout_of(c_)), st_(make_state(s_, l_, p.seed())),
        threads_(s_.variant == Variant::threads ? s_.threads : 0) {
    cpu::ThreadScope scope(threads_);
    plan_ = plan(s_);
    const std::int64_t T = c_.T, B = s_.batch, E = c_.E, H = c_.H, G = 4 * H;
    dnnl::engine& eng = cpu::engine();
    auto mem = [&](const memory::desc& d, void* at) { return memory(d, eng, at); };
    params_ = st_.params, m_ = st_.m, v_ = st_.v;
    grads_ = zeros(l_.total);  // the padding is never written: zero, as AdamW needs
    const DType t = s_.dtype;  // the LSTM's data
    x_ = zeros(static_cast<std::size_t>(T * B * E), t);
    h0_ = zeros(static_cast<std::size_t>(2 * B * H), t);
    c0_ = h0_, hT_ = h0_, cT_ = h0_;
    bias_ = zeros(static_cast<std::size_t>(2 * G));
    y_ = zeros(static_cast<std::size_t>(T * B * 2 * H), t);
    logits_ = zeros(static_cast<std::size_t>(B * c_.C));
    float* P = params_.as<float>();
    const memory wl_torch = mem(torch_weights(2, H, E), P + l_.w_ih), wi_torch = mem(torch_weights(2, H, H), P + l_.w_hh);
    const auto weights_for = [&](const memory::desc& want, const memory& torch, std::vector<Reorder>& into) {
      memory out(want, eng);
      into.push_back(make_reorder(torch, out));
      return out;
    };
    fwd_ = dnnl::lstm_forward(plan_.fwd);
    fwd_args_ = {{DNNL_ARG_SRC_LAYER, mem(plan_.src_layer, x_.data())},
                 {DNNL_ARG_SRC_ITER, mem(plan_.src_iter, h0_.data())},
                 {DNNL_ARG_SRC_ITER_C, mem(plan_.src_iter, c0_.data())},
                 {DNNL_ARG_WEIGHTS_LAYER, weights_for(plan_.fwd.weights_layer_desc(), wl_torch, to_prim_)},
                 {DNNL_ARG_WEIGHTS_ITER, weights_for(plan_.fwd.weights_iter_desc(), wi_torch, to_prim_)},
                 {DNNL_ARG_BIAS, mem(plan_.bias, bias_.data())},
                 {DNNL_ARG_DST_LAYER, mem(plan_.dst_layer, y_.data())},
                 {DNNL_ARG_DST_ITER, mem(plan_.dst_iter, hT_.data())},
                 {DNNL_ARG_DST_ITER_C, mem(plan_.dst_iter, cT_.data())}};
    if (!s_.train()) return;
    workspace_ = memory(plan_.fwd.workspace_desc(), eng);
    fwd_args_[DNNL_ARG_WORKSPACE] = workspace_;
    dlogits_ = zeros(logits_.count());
    dhT_ = zeros(hT_.count());  // the gradients: f32
    dcT_ = zeros(hT_.count());
    dy_ = zeros(y_.count());
    dx_ = zeros(x_.count());
    dh0_ = zeros(hT_.count());
    dc0_ = zeros(hT_.count());
    dw_layer_ = zeros(static_cast<std::size_t>(2 * G * E));
    dw_iter_ = zeros(static_cast<std::size_t>(2 * G * H));
    db_ = zeros(static_cast<std::size_t>(2 * G));
    bwd_ = dnnl::lstm_backward(plan_.bwd);
    const memory dwl = mem(plan_.d_w_layer, dw_layer_.data()), dwi = mem(plan_.d_w_iter, dw_iter_.data());
    bwd_args_ = {{DNNL_ARG_SRC_LAYER, fwd_args_[DNNL_ARG_SRC_LAYER]},
                 {DNNL_ARG_SRC_ITER, fwd_args_[DNNL_ARG_SRC_ITER]},
                 {DNNL_ARG_SRC_ITER_C, fwd_args_[DNNL_ARG_SRC_ITER_C]},
                 {DNNL_ARG_WEIGHTS_LAYER, weights_for(plan_.bwd.weights_layer_desc(), wl_torch, to_prim_)},
                 {DNNL_ARG_WEIGHTS_ITER, weights_for(plan_.bwd.weights_iter_desc(), wi_torch, to_prim_)},
                 {DNNL_ARG_BIAS, fwd_args_[DNNL_ARG_BIAS]},
                 {DNNL_ARG_DST_LAYER, fwd_args_[DNNL_ARG_DST_LAYER]},
                 {DNNL_ARG_DST_ITER, fwd_args_[DNNL_ARG_DST_ITER]},
                 {DNNL_ARG_DST_ITER_C, fwd_args_[DNNL_ARG_DST_ITER_C]},
                 {DNNL_ARG_WORKSPACE, workspace_},
                 {DNNL_ARG_DIFF_DST_LAYER, mem(plan_.d_dst_layer, dy_.data())},
                 {DNNL_ARG_DIFF_DST_ITER, mem(plan_.d_dst_iter, dhT_.data())},
                 {DNNL_ARG_DIFF_DST_ITER_C, mem(plan_.d_dst_iter, dcT_.data())},
                 {DNNL_ARG_DIFF_SRC_LAYER, mem(plan_.d_src_layer, dx_.data())},
                 {DNNL_ARG_DIFF_SRC_ITER, mem(plan_.d_src_iter, dh0_.data())},
                 {DNNL_ARG_DIFF_SRC_ITER_C, mem(plan_.d_src_iter, dc0_.data())},
                 {DNNL_ARG_DIFF_WEIGHTS_LAYER, dwl},
                 {DNNL_ARG_DIFF_WEIGHTS_ITER, dwi},
                 {DNNL_ARG_DIFF_BIAS, mem(plan_.d_bias, db_.data())}};
    float* Gr = grads_.as<float>();
    to_torch_.push_back(make_reorder(dwl, mem(torch_weights(2, H, E), Gr + l_.w_ih)));
    to_torch_.push_back(make_reorder(dwi, mem(torch_weights(2, H, H), Gr + l_.w_hh)));
  }

  void run() override {
    cpu::ThreadScope scope(threads_);
    trace::op("embedding");
    gather();
    trace::op("reorder");  // the LSTM weights into oneDNN's layouts (the summed biases, a bf16 cast)
    prepare_weights();
    trace::op("lstm");
    HOTOPS_CHECK_DNNL(fwd_.execute(cpu::stream(), fwd_args_));
    HOTOPS_CHECK_DNNL(cpu::stream().wait());
    trace::op("addmm");
    dense_forward();
    if (!s_.train()) return;
    trace::op("cross_entropy");
    loss_ = loss_and_dlogits();
    trace::op("mm");
    dense_backward();
    trace::op("lstm_bwd");
    std::memset(dw_layer_.data(), 0, dw_layer_.bytes());
    std::memset(dw_iter_.data(), 0, dw_iter_.bytes());
    std::memset(db_.data(), 0, db_.bytes());
    HOTOPS_CHECK_DNNL(bwd_.execute(cpu::stream(), bwd_args_));
    for (Reorder& r : to_torch_) r.execute();
    HOTOPS_CHECK_DNNL(cpu::stream().wait());
    std::copy_n(db_.as<float>(), db_.count(), grads_.as<float>() + l_.b_ih);
    std::copy_n(db_.as<float>(), db_.count(), grads_.as<float>() + l_.b_hh);
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
                    (s_.train() ? "forward_training + backward (" + std::string(plan_.bwd.impl_info_str()) + ")"
                                : "forward_inference (" + std::string(plan_.fwd.impl_info_str()) + ")") +
                    ", weights reordered from the flat PyTorch layout every step, bias b_ih+b_hh";
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

  void prepare_weights() {
    const float* P = params_.as<float>();
    float* bias = bias_.as<float>();
    for (std::size_t i = 0; i < bias_.count(); ++i) bias[i] = P[l_.b_ih + i] + P[l_.b_hh + i];
    for (Reorder& r : to_prim_) r.execute();
    HOTOPS_CHECK_DNNL(cpu::stream().wait());
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
  Plan plan_;
  HostBuffer params_, grads_, m_, v_;
  HostBuffer x_, h0_, c0_, hT_, cT_, bias_, y_, logits_;
  HostBuffer dlogits_, dhT_, dcT_, dy_, dx_, dh0_, dc0_, dw_layer_, dw_iter_, db_;
  memory workspace_;
  dnnl::lstm_forward fwd_;
  dnnl::lstm_backward bwd_;
  std::unordered_map<int, memory> fwd_args_, bwd_args_;
  std::vector<Reorder> to_prim_, to_torch_;
  std::int64_t step_ = 0;
  double loss_ = 0;
};

}  // namespace

std::string cpu_unsupported_reason(const Problem& p) {
  const Shape s = shape_of(p);
  if (const std::string why = models::threads_reason(models::step_args(p, "model_bilstm", true, /*allow_bf16=*/true)); !why.empty()) return why;
  try {
    plan(s);
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
