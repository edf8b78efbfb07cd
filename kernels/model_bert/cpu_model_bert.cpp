// model_bert on the CPU: every dense GEMM a oneDNN matmul primitive created at setup, the matmul
// family's plans (forward with their bias and the residual as a binary add post-op, the data
// gradients, and the weight gradients f32 out); the attention family's plans, forward and backward
// (the matmul family's 4-D [batch, heads, rows, cols] matmuls on strided views of the QKV, context and
// gradient buffers, so no head split or merge copies, and oneDNN softmax forward and backward in
// place, the probabilities in the step's `saved` buffer); the layernorm and gelu families' plans
// (oneDNN layer_normalization forward; the GELU forward, and its backward with the FFN's first bias
// gradient: gelu_dbias; the LayerNorm backward with its residual and bias gradients: layernorm_dbias;
// the MSE loss and its gradient: the loss family's mse), the other bias gradients through the matmul
// family's bias_grad plan (column sums), the rest OpenMP loops: the bf16 cast, one AdamW pass.
// The loops are templates over the activations' storage (float, or bf16 as its uint16 bits) and
// compute in f32; bf16's matmuls take bf16 operands (a bf16 copy of the f32 master parameters: train
// casts it once at the start and the AdamW pass writes it; infer holds the copy cast at the start) and
// write bf16 activations or f32 weight gradients.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>

#include "hotops/check.h"
#include "hotops/cpu.h"
#include "hotops/cpu_vector.h"
#include "hotops/trace.h"
#include "kernels/model_bert/model_bert.h"

namespace hotops::model_bert {
namespace {

using bf16 = std::uint16_t;  // bf16's bits

// Storage <-> f32: f32 as is; bf16 rounded to nearest even (cpu_vector.h).
inline float ld(float v) { return v; }
inline float ld(bf16 v) { return vec::bf16_to_f32(v); }
template <class T> T st(float v);
template <> inline float st<float>(float v) { return v; }
template <> inline bf16 st<bf16>(float v) { return vec::f32_to_bf16(v); }

// T: the activations' storage, float (f32) or bf16 (bf16's mixed precision, model_bert.h).
template <class T>
class CpuLayer final : public LayerCase {
  static constexpr bool kBf16 = std::is_same_v<T, bf16>;

 public:
  explicit CpuLayer(const Problem& p)
      : s_(shape_of(p)), l_(param_layout(s_.arch)), seeded_(make_state(s_, l_, models::step_seed(p))),
        threads_(s_.variant == Variant::threads ? s_.threads : 0) {
    cpu::ThreadScope scope(threads_);
    const Arch& a = s_.arch;
    const std::int64_t T_ = s_.tokens(), H = a.hidden, F = a.ffn;
    HOTOPS_CHECK(a.head_dim() * a.heads == H, "model_bert: hidden must be heads x head_dim");
    x_ = seeded_.x, target_ = seeded_.target, params_ = seeded_.params, m_ = seeded_.m, v_ = seeded_.v;
    grads_ = HostBuffer(DType::f32, l_.total);
    zero_bytes(grads_.data(), grads_.bytes());
    if (kBf16) weights_ = HostBuffer(DType::bf16, l_.total);
    if (kBf16) cast_weights();  // the copy at the start; train: AdamW keeps it from then on
    auto buf = [](std::int64_t n) { return HostBuffer(DType::f32, static_cast<std::size_t>(n)); };
    auto act = [this](std::int64_t n) { return HostBuffer(s_.dtype, static_cast<std::size_t>(n)); };
    u1_ = act(a.pre_ln ? T_ * H : 1), qkv_ = act(T_ * 3 * H), ctx_ = act(T_ * H);
    saved_ = HostBuffer(DType::f32, (attention::saved_bytes(self_attention(s_, Direction::fwd), Backend::cpu) + 3) / 4);
    s1_ = act(T_ * H), h1_ = act(T_ * H), z_ = act(T_ * F), f_ = act(T_ * F), s2_ = act(T_ * H), y_ = act(T_ * H);
    mean1_ = buf(T_), rstd1_ = buf(T_), mean2_ = buf(T_), rstd2_ = buf(T_);
    qkv_gemm_ = matmul::make_cpu_plan(dense_layer(s_, H, 3 * H, false));
    out_gemm_ = matmul::make_cpu_plan(dense_layer(s_, H, H, true));  // s1 = x + attn
    ffn1_ = matmul::make_cpu_plan(dense_layer(s_, H, F, false));
    ffn2_ = matmul::make_cpu_plan(dense_layer(s_, F, H, true));     // s2 = resid + ffn
    attention_ = attention::make_cpu_plan(self_attention(s_, Direction::fwd));
    gelu_ = gelu::make_cpu_plan(ffn_gelu(s_));
    layernorm_ = layernorm::make_cpu_plan(token_layernorm(s_, Direction::fwd));
    if (!s_.train()) return;
    attention_bwd_ = attention::make_cpu_plan(self_attention(s_, Direction::bwd));
    gelu_bwd_ = gelu::dbias::make_cpu_plan(ffn_gelu_bwd(s_));
    layernorm_bwd_ = layernorm::dbias::make_cpu_plan(token_layernorm_bwd(s_));
    mse_ = loss::mse::make_cpu_plan(output_mse(s_));
    // The bias gradients no fused op gives: the QKV's, and vit's FFN's second (its output gradient
    // is the layer's, which no LayerNorm backward precedes).
    qkv_bias_ = matmul::bias_grad::make_cpu_plan(bias_gradient(s_, 3 * H));
    if (a.pre_ln) ffn2_bias_ = matmul::bias_grad::make_cpu_plan(bias_gradient(s_, H));
    dy_ = act(T_ * H), df_ = act(T_ * F), du2_ = act(T_ * H), ds1_ = act(T_ * H), dctx_ = act(T_ * H), dqkv_ = act(T_ * 3 * H);
    du1_ = act(a.pre_ln ? T_ * H : 1);
    if (!a.pre_ln) s2grad();
    // The dense layers' gradients: weight (x^T . dz, f32 out) and data (dz . W^T).
    auto wgrad = [&](std::int64_t in, std::int64_t out) { return matmul::make_cpu_plan(dense_grad(s_, Direction::bwd_weight, in, out, false)); };
    auto dgrad = [&](std::int64_t in, std::int64_t out, bool residual) {
      return matmul::make_cpu_plan(dense_grad(s_, Direction::bwd_data, in, out, residual));
    };
    w2_w_ = wgrad(F, H), w2_d_ = dgrad(F, H, false);
    w1_w_ = wgrad(H, F);
    w1_d_ = dgrad(H, F, !a.pre_ln);  // bert: du2 + ds2 (LN1's output feeds both the FFN and the residual), a binary add post-op
    wo_w_ = wgrad(H, H), wo_d_ = dgrad(H, H, false);
    qkv_w_ = wgrad(H, 3 * H);
    if (a.pre_ln) qkv_d_ = dgrad(H, 3 * H, false);
  }

  void run() override {
    cpu::ThreadScope scope(threads_);
    forward();
    if (!s_.train()) return;
    trace::op("mse_loss");
    mse_->run({out()->data(), target_.data(), &loss_, dy_.data()});
    backward();
    trace::op("adamw");
    adamw_step();
  }

  Check verify() override {
    const State start = verification_state(s_, seeded_);
    copy_into(x_, start.x), copy_into(target_, start.target);
    copy_into(params_, start.params), copy_into(m_, start.m), copy_into(v_, start.v);
    if (kBf16) cast_weights();
    step_ = 0;
    y_.poison();
    s2_.poison();
    for (const auto& [at, n] : l_.tensors) std::fill_n(grads_.as<float>() + at, n, std::nanf(""));
    run();
    Outcome o;
    if (!s_.train()) o.y = *out();
    else o.loss = loss_, o.grads = grads_, o.params = params_;
    Check c = verify_outcome(s_, l_, start, o);
    copy_into(x_, seeded_.x), copy_into(target_, seeded_.target);  // the timed runs take the seeded batch
    return c;
  }

  std::string label() const override {
    return std::string(s_.arch.pre_ln ? "pre-LN" : "post-LN") + " encoder layer: oneDNN " + (kBf16 ? "bf16 " : "") +
           "matmul (dense with residual post-op), hotops attention plan (strided-head oneDNN matmuls + oneDNN "
           "softmax), oneDNN LayerNorm, " + gelu_->label() +
           (s_.train() ? ", " + gelu_bwd_->label() + ", " + layernorm_bwd_->label() : "") +
           (kBf16 ? s_.train() ? ", bf16 activations, the AdamW pass writes the bf16 copy of the f32 master weights"
                               : ", bf16 activations, f32 master weights cast to bf16 once"
                  : "") +
           (s_.train() ? ", " + mse_->label() + ", bias_grad column sums, AdamW 1 flat pass" : "") + ", " +
           std::to_string(threads_ > 0 ? threads_ : cpu::threads()) + " threads";
  }

  double last_loss() override { return loss_; }
  Check bf16_copy_check() override {
    if (!kBf16) return {};
    return models::bf16_copy_of(params_.as<float>(), weights_.as<bf16>(), l_.total);
  }

 private:
  static void copy_into(HostBuffer& dst, const HostBuffer& src) { std::memcpy(dst.data(), src.data(), src.bytes()); }
  const HostBuffer* out() const { return s_.arch.pre_ln ? &s2_ : &y_; }
  // What the matmuls read their weights and biases from: the f32 parameters, or for bf16 their copy.
  T* gemm_weights() {
    if constexpr (kBf16) return weights_.as<bf16>();
    else return params_.as<float>();
  }
  // bert: the gradient of s2 = h1 + o (LN2's input) lives in ds2_ (allocated on first use).
  T* s2grad() {
    ds2_ = HostBuffer(s_.dtype, static_cast<std::size_t>(s_.tokens() * s_.arch.hidden));
    return ds2_.as<T>();
  }
  int team() const { return cpu::threads(); }

  void cast_weights() {
    const float* p = params_.as<float>();
    bf16* w = weights_.as<bf16>();
    const auto n = static_cast<std::int64_t>(l_.total);
#pragma omp parallel for simd num_threads(team()) schedule(static)
    for (std::int64_t i = 0; i < n; ++i) w[i] = vec::f32_to_bf16(p[i]);
  }

  // LayerNorm's backward (the layernorm_dbias plan) into dx = LN'(dy) (+ dres) when given, its gamma
  // and beta gradients at `g` and `b`, and the column sums of dx into the bias gradient at `bias`
  // (when given: the dense layer that produced x reads dx next). x is LN's input.
  void layernorm_back(const T* dy, const T* x, const HostBuffer& mean, const HostBuffer& rstd, std::size_t g, std::size_t b,
                      T* dx, const T* dres, const std::size_t* bias) {
    float* G = grads_.as<float>();
    layernorm::dbias::Args n;
    n.x = x, n.dy = dy, n.gamma = params_.as<float>() + g, n.saved_mean = mean.as<float>(), n.saved_rstd = rstd.as<float>();
    n.dres = dres, n.dx = dx, n.dgamma = G + g, n.dbeta = G + b, n.dbias = bias ? G + *bias : nullptr;
    layernorm_bwd_->run(n);
  }

  // A bias gradient (the bias_grad plan): the column sums of dz into the f32 gradients at `at`.
  void bias_grad(matmul::bias_grad::Plan& plan, const void* dz, std::size_t at) { plan.run({dz, grads_.as<float>() + at}); }

  void forward() {
    const Arch& a = s_.arch;
    const T* W = gemm_weights();
    const void* u1 = a.pre_ln ? u1_.data() : x_.data();
    const void* resid = a.pre_ln ? s1_.data() : h1_.data();  // the FFN block's skip connection
    if (a.pre_ln) trace::op("layernorm"), layernorm_->run(ln(x_, l_.ln1g, l_.ln1b, u1_, mean1_, rstd1_));
    trace::op("addmm");
    qkv_gemm_->run(dense(u1, W, l_.wqkv, l_.bqkv, qkv_, nullptr));
    trace::op("attention");
    attention_->run({qkv_.data(), ctx_.data(), saved_.data(), nullptr, nullptr});
    trace::op("addmm");
    out_gemm_->run(dense(ctx_.data(), W, l_.wo, l_.bo, s1_, x_.data()));  // s1 = x + attn
    trace::op("layernorm");
    if (a.pre_ln) layernorm_->run(ln(s1_, l_.ln2g, l_.ln2b, h1_, mean2_, rstd2_));  // h1: the FFN's input
    else layernorm_->run(ln(s1_, l_.ln1g, l_.ln1b, h1_, mean1_, rstd1_));
    trace::op("addmm");
    ffn1_->run(dense(h1_.data(), W, l_.w1, l_.b1, z_, nullptr));
    trace::op("gelu");
    gelu_->run({z_.data(), nullptr, f_.data()});
    trace::op("addmm");
    ffn2_->run(dense(f_.data(), W, l_.w2, l_.b2, s2_, resid));  // s2 = resid + ffn
    if (!a.pre_ln) trace::op("layernorm"), layernorm_->run(ln(s2_, l_.ln2g, l_.ln2b, y_, mean2_, rstd2_));
  }

  // A dense layer's tensors: x . W + b (+ c) into y, W and b at their offsets in the GEMMs' weights.
  static matmul::Args dense(const void* x, const T* W, std::size_t w, std::size_t b, HostBuffer& y, const void* c) {
    matmul::Args m;
    m.a = x, m.b = W + w, m.bias = W + b, m.out = y.data(), m.c = c;
    return m;
  }
  // A dense layer's weight gradient x^T . dz into the f32 gradients at `w`.
  matmul::Args weight_grad(const void* x, const void* dz, std::size_t w) {
    matmul::Args m;
    m.a = x, m.dout = dz, m.out = grads_.as<float>() + w;
    return m;
  }
  // A dense layer's data gradient dz . W^T (+ c) into dx, W at `w` in the GEMMs' weights.
  matmul::Args data_grad(const void* dz, std::size_t w, HostBuffer& dx, const void* c = nullptr) {
    matmul::Args m;
    m.b = gemm_weights() + w, m.dout = dz, m.out = dx.data(), m.c = c;
    return m;
  }
  // A LayerNorm's tensors: LN(x) with gamma and beta at their offsets in the f32 parameters.
  layernorm::Args ln(const HostBuffer& x, std::size_t g, std::size_t b, HostBuffer& y, HostBuffer& mean, HostBuffer& rstd) {
    const float* P = params_.as<float>();
    layernorm::Args n;
    n.x = x.data(), n.gamma = P + g, n.beta = P + b, n.y = y.data(), n.mean = mean.data(), n.rstd = rstd.data();
    return n;
  }

  void backward() {
    const Arch& a = s_.arch;
    float* G = grads_.as<float>();
    const T* ds2 = dy_.as<T>();
    if (!a.pre_ln) {
      trace::op("layernorm_bwd");
      layernorm_back(dy_.as<T>(), s2_.as<T>(), mean2_, rstd2_, l_.ln2g, l_.ln2b, ds2_.as<T>(), nullptr, &l_.b2);
      ds2 = ds2_.as<T>();
    } else {
      trace::op("sum");  // the breakdown's name for the bias_grad plans
      bias_grad(*ffn2_bias_, ds2, l_.b2);
    }
    trace::op("mm");
    w2_w_->run(weight_grad(f_.data(), ds2, l_.w2));
    w2_d_->run(data_grad(ds2, l_.w2, df_));
    trace::op("gelu_bwd");
    T* df = df_.as<T>();
    gelu_bwd_->run({z_.data(), df, df, G + l_.b1});  // in place over df, with the FFN's first bias gradient
    trace::op("mm");
    w1_w_->run(weight_grad(h1_.data(), df, l_.w1));
    w1_d_->run(data_grad(df, l_.w1, du2_, a.pre_ln ? nullptr : ds2));  // bert: du2 = df . W1^T + ds2
    trace::op("layernorm_bwd");
    if (a.pre_ln)  // ds1 = LN2'(du2) + dy
      layernorm_back(du2_.as<T>(), s1_.as<T>(), mean2_, rstd2_, l_.ln2g, l_.ln2b, ds1_.as<T>(), ds2, &l_.bo);
    else  // ds1 = LN1'(du2)
      layernorm_back(du2_.as<T>(), s1_.as<T>(), mean1_, rstd1_, l_.ln1g, l_.ln1b, ds1_.as<T>(), nullptr, &l_.bo);
    trace::op("mm");
    wo_w_->run(weight_grad(ctx_.data(), ds1_.data(), l_.wo));
    wo_d_->run(data_grad(ds1_.data(), l_.wo, dctx_));
    trace::op("attention_bwd");
    attention_bwd_->run({qkv_.data(), ctx_.data(), saved_.data(), dctx_.data(), dqkv_.data()});
    trace::op("mm");
    qkv_w_->run(weight_grad(a.pre_ln ? u1_.data() : x_.data(), dqkv_.data(), l_.wqkv));
    if (a.pre_ln) qkv_d_->run(data_grad(dqkv_.data(), l_.wqkv, du1_));
    trace::op("sum");
    bias_grad(*qkv_bias_, dqkv_.data(), l_.bqkv);
    if (a.pre_ln)
      trace::op("layernorm_bwd"), layernorm_back(du1_.as<T>(), x_.as<T>(), mean1_, rstd1_, l_.ln1g, l_.ln1b, nullptr, nullptr, nullptr);
  }

  void adamw_step() {
    const auto n = static_cast<std::int64_t>(l_.total);
    adamw::cpu_step(params_.as<float>(), grads_.as<const float>(), m_.as<float>(), v_.as<float>(),
                    kBf16 ? weights_.as<bf16>() : nullptr, n, adamw::scalars_for(hyper(), ++step_), team());
  }

  Shape s_;
  ParamLayout l_;
  State seeded_;
  int threads_;
  HostBuffer x_, target_, params_, weights_, grads_, m_, v_;
  HostBuffer u1_, qkv_, saved_, ctx_, s1_, h1_, z_, f_, s2_, y_, mean1_, rstd1_, mean2_, rstd2_;
  HostBuffer dy_, ds2_, df_, du2_, ds1_, dctx_, dqkv_, du1_;
  std::unique_ptr<matmul::Plan> qkv_gemm_, out_gemm_, ffn1_, ffn2_;
  std::unique_ptr<matmul::Plan> w2_w_, w2_d_, w1_w_, w1_d_, wo_w_, wo_d_, qkv_w_, qkv_d_;
  std::unique_ptr<attention::Plan> attention_, attention_bwd_;  // on the heads of qkv_; the probabilities in saved_
  std::unique_ptr<gelu::Plan> gelu_;
  std::unique_ptr<gelu::dbias::Plan> gelu_bwd_;
  std::unique_ptr<layernorm::Plan> layernorm_;
  std::unique_ptr<layernorm::dbias::Plan> layernorm_bwd_;
  std::unique_ptr<loss::mse::Plan> mse_;
  std::unique_ptr<matmul::bias_grad::Plan> qkv_bias_, ffn2_bias_;  // ffn2_bias_: vit only
  std::int64_t step_ = 0;
  float loss_ = 0;
};

}  // namespace

std::unique_ptr<LayerCase> make_cpu(const Problem& p) {
  return models::make_step_case<CpuLayer, bf16>(p);
}

}  // namespace hotops::model_bert
