// model_bert on CUDA: the matmul family's plans for the dense GEMMs (cublasLt), the attention
// family's plans for the attention (hotops' fused kernels, or cuBLAS batched GEMMs on strided heads and
// the softmax kernels where those do not take the layer's shape), the layernorm and gelu families'
// plans (the GELU backward with its bias gradient: gelu_dbias; the LayerNorm backward with its
// residual and bias gradients: layernorm_dbias; the MSE loss and its gradient: the loss family's mse),
// the other bias gradients through the matmul family's bias_grad plan; how each is set up and fused:
// docs/models.md, "How each model step runs".
#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <type_traits>

#include "hotops/cublaslt_gemm.h"
#include "hotops/cuda_elem.cuh"
#include "hotops/cuda_util.h"
#include "hotops/trace.h"
#include "kernels/model_bert/model_bert.h"
#include "kernels/models/cuda_step.cuh"
#include "kernels/models/data_parallel.h"

namespace hotops::model_bert {
namespace {

constexpr unsigned kThreads = 256;

using StepState = adamw::DeviceStep;

using bf16 = __nv_bfloat16;

unsigned grid_for(std::int64_t n, unsigned threads = kThreads, std::int64_t cap = 4096) {
  return static_cast<unsigned>(std::max<std::int64_t>(1, std::min<std::int64_t>((n + threads - 1) / threads, cap)));
}

// T: the activations' storage, float (f32) or bf16 (bf16's mixed precision, model_bert.h).
template <class T>
class CudaLayer final : public LayerCase {
  static constexpr bool kBf16 = std::is_same_v<T, bf16>;

 public:
  explicit CudaLayer(const Problem& p) : s_(shape_of(p)), l_(param_layout(s_.arch)), seeded_(make_state(s_, l_, models::step_seed(p))) {
    const Arch& a = s_.arch;
    const std::int64_t T_ = s_.tokens(), H = a.hidden, F = a.ffn;
    HOTOPS_CHECK(a.head_dim() * a.heads == H, "model_bert: hidden must be heads x head_dim");
    HOTOPS_CHECK(H <= layernorm::dbias::kCudaMaxHidden && H % 4 == 0 && F % 4 == 0,
                 "model_bert: the CUDA kernels take hidden <= 1024, a multiple of 4");
    gpu::cublaslt();
    gpu::cublas_workspace();
    auto buf = [](std::int64_t n) { return gpu::DeviceBuffer(static_cast<std::size_t>(n) * sizeof(float)); };  // f32
    auto act = [](std::int64_t n) { return gpu::DeviceBuffer(static_cast<std::size_t>(n) * sizeof(T)); };    // activations
    params_ = gpu::DeviceBuffer(seeded_.params);
    if (kBf16) {
      weights_ = gpu::DeviceBuffer(l_.total * sizeof(bf16));
      cast_weights();
    }
    x_ = gpu::DeviceBuffer(seeded_.x);
    u1_ = act(a.pre_ln ? T_ * H : 1), qkv_ = act(T_ * 3 * H), ctx_ = act(T_ * H);
    saved_ = gpu::DeviceBuffer(attention::saved_bytes(self_attention(s_, Direction::fwd), Backend::cuda));
    s1_ = act(T_ * H), h1_ = act(T_ * H), z_ = act(T_ * F), f_ = act(T_ * F), s2_ = act(T_ * H), y_ = act(a.pre_ln ? 1 : T_ * H);
    mean1_ = buf(T_), rstd1_ = buf(T_), mean2_ = buf(T_), rstd2_ = buf(T_);
    qkv_gemm_ = matmul::make_cuda_plan(dense_layer(s_, H, 3 * H, false));
    attention_ = attention::make_cuda_plan(self_attention(s_, Direction::fwd));
    out_gemm_ = matmul::make_cuda_plan(dense_layer(s_, H, H, true));  // s1 = x + attn
    ffn1_ = matmul::make_cuda_plan(dense_layer(s_, H, F, false));
    ffn2_ = matmul::make_cuda_plan(dense_layer(s_, F, H, true));     // s2 = resid + ffn
    gelu_ = gelu::make_cuda_plan(ffn_gelu(s_));
    layernorm_ = layernorm::make_cuda_plan(token_layernorm(s_, Direction::fwd));
    if (s_.train()) {
      grads_ = buf(static_cast<std::int64_t>(l_.total)), m_ = buf(static_cast<std::int64_t>(l_.total)), v_ = buf(static_cast<std::int64_t>(l_.total));
      HOTOPS_CHECK_CUDA(cudaMemsetAsync(grads_.get(), 0, grads_.bytes(), gpu::stream()));
      target_ = gpu::DeviceBuffer(seeded_.target);
      dy_ = act(T_ * H), ds2_ = act(a.pre_ln ? 1 : T_ * H), df_ = act(T_ * F), du2_ = act(T_ * H), ds1_ = act(T_ * H);
      dctx_ = act(T_ * H), dqkv_ = act(T_ * 3 * H), du1_ = act(a.pre_ln ? T_ * H : 1);
      loss_ = buf(1), state_ = gpu::DeviceBuffer(sizeof(StepState));
      // The bias gradients no fused op gives: the QKV's, and vit's FFN's second (its output gradient
      // is the layer's, which no LayerNorm backward precedes).
      qkv_bias_ = matmul::bias_grad::make_cuda_plan(bias_gradient(s_, 3 * H));
      if (a.pre_ln) ffn2_bias_ = matmul::bias_grad::make_cuda_plan(bias_gradient(s_, H));
      gelu_bwd_ = gelu::dbias::make_cuda_plan(ffn_gelu_bwd(s_));
      layernorm_bwd_ = layernorm::dbias::make_cuda_plan(token_layernorm_bwd(s_));
      mse_ = loss::mse::make_cuda_plan(output_mse(s_));
      // The dense layers' gradients: weight (x^T . dz, f32 out) and data (dz . W^T).
      auto wgrad = [&](std::int64_t in, std::int64_t out) {
        return matmul::make_cuda_plan(dense_grad(s_, Direction::bwd_weight, in, out, false));
      };
      auto dgrad = [&](std::int64_t in, std::int64_t out, bool residual) {
        return matmul::make_cuda_plan(dense_grad(s_, Direction::bwd_data, in, out, residual));
      };
      w2_w_ = wgrad(F, H), w2_d_ = dgrad(F, H, false);
      w1_w_ = wgrad(H, F);
      w1_d_ = dgrad(H, F, !a.pre_ln);  // bert: du2 + ds2 (LN1's output feeds both the FFN and the residual), through C
      wo_w_ = wgrad(H, H), wo_d_ = dgrad(H, H, false);
      attention_bwd_ = attention::make_cuda_plan(self_attention(s_, Direction::bwd));
      qkv_w_ = wgrad(H, 3 * H);
      if (a.pre_ln) qkv_d_ = dgrad(H, 3 * H, false);
      restart_optimizer();
    }
    if (s_.gpus) {  // data parallel: this rank's shard of the global batch, and the all-reduce
      replicas_.start(p, s_, static_cast<std::size_t>(a.seq * a.hidden), [&](const Shape& g) { return make_state(g, l_, models::step_seed(p)); },
                seeded_, grads_.as<float>(), l_.total);
      x_.upload(seeded_.x);
      target_.upload(seeded_.target);
    }
    if (s_.variant == Variant::e2e) host_out_ = HostBuffer(s_.dtype, static_cast<std::size_t>(T_ * H));
    HOTOPS_CHECK_CUDA(cudaStreamSynchronize(gpu::stream()));
  }

  void run() override {
    if (s_.variant == Variant::plain) return device_step();
    trace::op("copy_h2d");
    HOTOPS_CHECK_CUDA(cudaMemcpyAsync(x_.get(), seeded_.x.data(), x_.bytes(), cudaMemcpyHostToDevice, gpu::stream()));
    if (s_.train())
      HOTOPS_CHECK_CUDA(cudaMemcpyAsync(target_.get(), seeded_.target.data(), target_.bytes(), cudaMemcpyHostToDevice, gpu::stream()));
    device_step();
    trace::op("copy_d2h");
    if (s_.train())
      HOTOPS_CHECK_CUDA(cudaMemcpyAsync(&loss_host_, loss_.get(), sizeof(float), cudaMemcpyDeviceToHost, gpu::stream()));
    else
      HOTOPS_CHECK_CUDA(cudaMemcpyAsync(host_out_.data(), out().get(), host_out_.bytes(), cudaMemcpyDeviceToHost, gpu::stream()));
    HOTOPS_CHECK_CUDA(cudaStreamSynchronize(gpu::stream()));
  }

  Check verify() override {
    State global_start;  // data parallel: the global batch's, of which this rank runs its shard
    const State start = replicas_.verification_start(s_, seeded_, verification_state, &global_start);
    x_.upload(start.x);
    load_params(start.params);
    out().poison();
    if (s_.train()) {
      target_.upload(start.target);
      restart_optimizer();
      for (const auto& [at, n] : l_.tensors)
        HOTOPS_CHECK_CUDA(cudaMemsetAsync(grads_.as<float>() + at, 0xFF, n * sizeof(float), gpu::stream()));
    }
    device_step();
    HOTOPS_CHECK_CUDA(cudaStreamSynchronize(gpu::stream()));
    Outcome o;
    if (!s_.train()) {
      o.y = HostBuffer(s_.dtype, static_cast<std::size_t>(s_.tokens() * s_.arch.hidden));
      out().download(o.y);
    } else {
      o.loss = static_cast<float>(last_loss());
      o.grads = HostBuffer(DType::f32, l_.total);
      o.params = HostBuffer(DType::f32, l_.total);
      grads_.download(o.grads);
      params_.download(o.params);
    }
    Check c = replicas_.check(s_, start, global_start, o,
                              [&](const Shape& sh, const State& st, const Outcome& out) { return verify_outcome(sh, l_, st, out); });
    if (s_.train()) {
      c.merge(adamw::check_device_step(state_.as<const StepState>(), 1), "step");
    }
    // The timed runs take the seeded batch (and train on from the verified step).
    x_.upload(seeded_.x);
    if (s_.train()) target_.upload(seeded_.target);
    return c;
  }

  std::string label() const override {
    const std::string gemm = kBf16 ? "bf16 (f32 accumulate, tensor cores)" : "f32";
    std::string l = std::string(s_.arch.pre_ln ? "pre-LN" : "post-LN") + " encoder layer: cublasLt " + gemm +
                    " dense GEMMs (bias epilogue, residual as C, algorithms timed at setup), hotops attention plan [" +
                    attention_->label() + "], hotops LayerNorm, GELU kernels";
    if (kBf16)
      l += s_.train() ? ", bf16 activations, the AdamW step writes the bf16 copy of the f32 master weights"
                      : ", bf16 activations, f32 master weights cast to bf16 once";
    if (s_.train()) l += " + MSE, their backwards, bias_grad column sums, AdamW 1 launch";
    if (s_.variant == Variant::e2e) l += "; e2e: pageable H2D of the inputs, launches, D2H, sync";
    if (replicas_.sync) l += replicas_.sync->label();
    return l;
  }

  bool capturable() const override { return s_.variant == Variant::plain; }
  void align() override {
    if (replicas_.sync) replicas_.sync->align();
  }
  bool host_timed() const override { return s_.variant != Variant::plain; }

  double last_loss() override {
    HOTOPS_CHECK(s_.train(), "model_bert: an infer case has no loss");
    return gpu::read_float(loss_.get());
  }
  Check bf16_copy_check() override {
    if (!kBf16) return {};
    return models::bf16_copy_of(params_, weights_, l_.total);
  }

 private:
  gpu::DeviceBuffer& out() { return s_.arch.pre_ln ? s2_ : y_; }
  // What the GEMMs read their weights and biases from: the f32 parameters, or for bf16 their copy.
  const T* gemm_weights() const {
    if constexpr (kBf16) return weights_.as<const bf16>();
    else return params_.as<const float>();
  }

  // m = v = 0 and the step count at its start (the AdamW launch advances it: adamw.h, DeviceStep).
  void restart_optimizer() {
    HOTOPS_CHECK_CUDA(cudaMemsetAsync(m_.get(), 0, m_.bytes(), gpu::stream()));
    HOTOPS_CHECK_CUDA(cudaMemsetAsync(v_.get(), 0, v_.bytes(), gpu::stream()));
    HOTOPS_CHECK_CUDA(cudaMemcpyAsync(state_.get(), &first_step_, sizeof(StepState), cudaMemcpyHostToDevice, gpu::stream()));
  }

  // The parameters from the host and, bf16, their bf16 copy: cast wherever they are loaded, and
  // written from then on by a train step's AdamW launch (infer's stays as cast, as autocast's weight
  // cache holds it).
  void load_params(const HostBuffer& from) {
    params_.upload(from);
    if constexpr (kBf16) cast_weights();
  }

  // The bf16 copy of the f32 parameters, the flat layout's padding included.
  void cast_weights() {
    const auto n4 = static_cast<std::int64_t>(l_.total / 4);
    models::cast_params<<<grid_for(n4, kThreads, 1024), kThreads, 0, gpu::stream()>>>(params_.as<const float4>(),
                                                                                      weights_.as<__nv_bfloat162>(), n4);
    HOTOPS_CHECK_LAUNCH();
  }

  // A dense layer's tensors: x . W + b (+ c) into y, W and b at their offsets in the GEMMs' weights.
  matmul::Args dense(const void* x, std::size_t w, std::size_t b, gpu::DeviceBuffer& y, const void* c) const {
    const T* W = gemm_weights();
    matmul::Args m;
    m.a = x, m.b = W + w, m.bias = W + b, m.out = y.get(), m.c = c;
    return m;
  }
  // A dense layer's weight gradient x^T . dz into the f32 gradients at `w`.
  matmul::Args weight_grad(const void* x, const void* dz, std::size_t w) const {
    matmul::Args m;
    m.a = x, m.dout = dz, m.out = grads_.as<float>() + w;
    return m;
  }
  // A dense layer's data gradient dz . W^T (+ c) into dx, W at `w` in the GEMMs' weights.
  matmul::Args data_grad(const void* dz, std::size_t w, gpu::DeviceBuffer& dx, const void* c) const {
    matmul::Args m;
    m.b = gemm_weights() + w, m.dout = dz, m.out = dx.get(), m.c = c;
    return m;
  }
  // A LayerNorm's tensors: LN(x) with gamma and beta at their offsets in the f32 parameters.
  layernorm::Args ln(const gpu::DeviceBuffer& x, std::size_t g, std::size_t b, gpu::DeviceBuffer& y, gpu::DeviceBuffer& mean,
                     gpu::DeviceBuffer& rstd) const {
    const float* P = params_.as<const float>();
    layernorm::Args n;
    n.x = x.get(), n.gamma = P + g, n.beta = P + b, n.y = y.get(), n.mean = mean.get(), n.rstd = rstd.get();
    return n;
  }

  // LayerNorm's backward (the layernorm_dbias plan) into dx = LN'(dy) (+ dres) when given, its gamma
  // and beta gradients at `g` and `b`, and the column sums of dx into the bias gradient at `bias`
  // (when given: the dense layer that produced x reads dx next).
  void layernorm_back(const T* dy, const T* x, const float* mean, const float* rstd, std::size_t g, std::size_t b, T* dx,
                      const T* dres, const std::size_t* bias) {
    float* G = grads_.as<float>();
    layernorm::dbias::Args n;
    n.x = x, n.dy = dy, n.gamma = params_.as<float>() + g, n.saved_mean = mean, n.saved_rstd = rstd;
    n.dres = dres, n.dx = dx, n.dgamma = G + g, n.dbeta = G + b, n.dbias = bias ? G + *bias : nullptr;
    layernorm_bwd_->run(n);
  }

  // A bias gradient (the bias_grad plan): the column sums of dz into the f32 gradients at `at`.
  void bias_grad(matmul::bias_grad::Plan& plan, const void* dz, std::size_t at) { plan.run({dz, grads_.as<float>() + at}); }

  void device_step() {
    const Arch& a = s_.arch;
    // forward
    const void* u1 = a.pre_ln ? u1_.get() : x_.get();
    const void* resid = a.pre_ln ? s1_.get() : h1_.get();  // the FFN block's skip connection
    if (a.pre_ln) trace::op("layernorm"), layernorm_->run(ln(x_, l_.ln1g, l_.ln1b, u1_, mean1_, rstd1_));
    trace::op("addmm");
    qkv_gemm_->run(dense(u1, l_.wqkv, l_.bqkv, qkv_, nullptr));
    trace::op("attention");
    attention_->run({qkv_.get(), ctx_.get(), saved_.get(), nullptr, nullptr});
    trace::op("addmm");
    out_gemm_->run(dense(ctx_.get(), l_.wo, l_.bo, s1_, x_.get()));  // s1 = x + ctx . Wo + bo
    trace::op("layernorm");
    if (a.pre_ln) layernorm_->run(ln(s1_, l_.ln2g, l_.ln2b, h1_, mean2_, rstd2_));  // h1: the FFN's input
    else layernorm_->run(ln(s1_, l_.ln1g, l_.ln1b, h1_, mean1_, rstd1_));
    trace::op("addmm");
    ffn1_->run(dense(h1_.get(), l_.w1, l_.b1, z_, nullptr));
    trace::op("gelu");
    gelu_->run({z_.get(), nullptr, f_.get()});
    trace::op("addmm");
    ffn2_->run(dense(f_.get(), l_.w2, l_.b2, s2_, resid));  // s2 = resid + f . W2 + b2
    if (!a.pre_ln) trace::op("layernorm"), layernorm_->run(ln(s2_, l_.ln2g, l_.ln2b, y_, mean2_, rstd2_));
    if (!s_.train()) return;
    // loss
    trace::op("mse_loss");
    mse_->run({out().get(), target_.get(), loss_.as<float>(), dy_.get()});
    // backward
    const T* ds2 = dy_.as<T>();
    if (!a.pre_ln) {
      trace::op("layernorm_bwd");
      layernorm_back(dy_.as<T>(), s2_.as<T>(), mean2_.as<float>(), rstd2_.as<float>(), l_.ln2g, l_.ln2b, ds2_.as<T>(), nullptr,
                     &l_.b2);
      ds2 = ds2_.as<T>();
    } else {
      trace::op("sum");  // the breakdown's name for the bias_grad plans
      bias_grad(*ffn2_bias_, ds2, l_.b2);
    }
    trace::op("mm");
    w2_w_->run(weight_grad(f_.get(), ds2, l_.w2));
    if (!a.pre_ln) models::grads_ready(replicas_.sync, l_.w2);  // post-LN: the second FFN layer's and LayerNorm's are final
    w2_d_->run(data_grad(ds2, l_.w2, df_, nullptr));
    if (!a.pre_ln) models::params_done(replicas_.sync, l_.w2, adamw_arrays());  // and no longer read
    trace::op("gelu_bwd");
    gelu_bwd_->run({z_.get(), df_.get(), df_.get(), grads_.as<float>() + l_.b1});  // in place over df
    trace::op("mm");
    w1_w_->run(weight_grad(h1_.get(), df_.get(), l_.w1));
    if (!a.pre_ln) models::grads_ready(replicas_.sync, l_.w1);  // post-LN: the first FFN layer's too
    w1_d_->run(data_grad(df_.get(), l_.w1, du2_, a.pre_ln ? nullptr : ds2));  // bert: du2 = df . W1^T + ds2
    if (!a.pre_ln) models::params_done(replicas_.sync, l_.w1, adamw_arrays());
    trace::op("layernorm_bwd");
    if (a.pre_ln) {
      layernorm_back(du2_.as<T>(), s1_.as<T>(), mean2_.as<float>(), rstd2_.as<float>(), l_.ln2g, l_.ln2b, ds1_.as<T>(), ds2, &l_.bo);
      models::grads_ready(replicas_.sync, l_.w1);  // pre-LN: the FFN's and the second LayerNorm's are final
      models::params_done(replicas_.sync, l_.w1, adamw_arrays());  // and no longer read
    } else {
      layernorm_back(du2_.as<T>(), s1_.as<T>(), mean1_.as<float>(), rstd1_.as<float>(), l_.ln1g, l_.ln1b, ds1_.as<T>(), nullptr,
                     &l_.bo);
    }
    trace::op("mm");
    wo_w_->run(weight_grad(ctx_.get(), ds1_.get(), l_.wo));
    if (!a.pre_ln) models::grads_ready(replicas_.sync, l_.wo);  // post-LN: the attention output's and the first LayerNorm's too
    wo_d_->run(data_grad(ds1_.get(), l_.wo, dctx_, nullptr));
    if (!a.pre_ln) models::params_done(replicas_.sync, l_.wo, adamw_arrays());
    trace::op("attention_bwd");
    attention_bwd_->run({qkv_.get(), ctx_.get(), saved_.get(), dctx_.get(), dqkv_.get()});
    trace::op("sum");
    bias_grad(*qkv_bias_, dqkv_.get(), l_.bqkv);
    trace::op("mm");
    qkv_w_->run(weight_grad(u1, dqkv_.get(), l_.wqkv));
    if (a.pre_ln) {
      qkv_d_->run(data_grad(dqkv_.get(), l_.wqkv, du1_, nullptr));
      trace::op("layernorm_bwd");
      layernorm_back(du1_.as<T>(), x_.as<T>(), mean1_.as<float>(), rstd1_.as<float>(), l_.ln1g, l_.ln1b, nullptr, nullptr, nullptr);
    }
    // optimizer
    models::adamw_step(replicas_.sync, adamw_arrays());
  }
  models::AdamwArrays adamw_arrays() {
    return {params_.as<float>(), grads_.as<const float>(), m_.as<float>(), v_.as<float>(),
            kBf16 ? weights_.as<std::uint16_t>() : nullptr, l_.total, state_.as<StepState>(), &hyper_};
  }

  Shape s_;
  ParamLayout l_;
  State seeded_;
  const adamw::Hyper hyper_ = hyper();
  const StepState first_step_ = adamw::first_step(hyper_);  // restart_optimizer's copy source
  gpu::DeviceBuffer params_, weights_, grads_, m_, v_, x_, target_, loss_, state_;
  gpu::DeviceBuffer u1_, qkv_, saved_, ctx_, s1_, h1_, z_, f_, s2_, y_, mean1_, rstd1_, mean2_, rstd2_;
  gpu::DeviceBuffer dy_, ds2_, df_, du2_, ds1_, dctx_, dqkv_, du1_;
  std::unique_ptr<matmul::Plan> qkv_gemm_, out_gemm_, ffn1_, ffn2_, w2_w_, w2_d_, w1_w_, w1_d_, wo_w_, wo_d_, qkv_w_, qkv_d_;
  std::unique_ptr<attention::Plan> attention_, attention_bwd_;  // on the heads of qkv_; what the backward needs in saved_
  std::unique_ptr<gelu::Plan> gelu_;
  std::unique_ptr<gelu::dbias::Plan> gelu_bwd_;
  std::unique_ptr<layernorm::Plan> layernorm_;
  std::unique_ptr<layernorm::dbias::Plan> layernorm_bwd_;
  std::unique_ptr<loss::mse::Plan> mse_;
  std::unique_ptr<matmul::bias_grad::Plan> qkv_bias_, ffn2_bias_;  // ffn2_bias_: vit only
  HostBuffer host_out_;
  float loss_host_ = 0;
  models::XTargetReplica<Shape, State> replicas_;  // gpus:G (data parallel)
};

}  // namespace

std::unique_ptr<LayerCase> make_cuda(const Problem& p) {
  if (p.dtype == DType::bf16) return std::make_unique<CudaLayer<bf16>>(p);
  return std::make_unique<CudaLayer<float>>(p);
}

}  // namespace hotops::model_bert
