// model_convnext on the CPU: the op families' plans in order over the step's NHWC buffers: conv2d's
// oneDNN depthwise convolution (forward with its bias; the weight gradient), oneDNN layer_normalization
// forward and the layernorm_dbias loop (its backward with the convolution's bias gradient), the matmul
// family's oneDNN matmuls for the two Linear layers (forward with the bias; data gradients; weight
// gradients f32 out), the gelu family's GELU and gelu_dbias, pointwise scale_residual (forward; backward
// in place with the second Linear's bias gradient), the loss family's mse and one AdamW pass.
// bf16: bf16 activations; the matmuls take a bf16 copy of the f32 master parameters (train: cast once
// at the start, then written by the AdamW pass; infer: held from the start), the
// convolution casts its f32 weights itself (conv2d's f32_params), the LayerNorm and the layer scale
// read their f32 parameters.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>

#include "hotops/check.h"
#include "hotops/cpu.h"
#include "hotops/cpu_vector.h"
#include "hotops/trace.h"
#include "kernels/model_convnext/model_convnext.h"

namespace hotops::model_convnext {
namespace {

using bf16 = std::uint16_t;  // bf16's bits

// T: the activations' storage, float (f32) or bf16.
template <class T>
class CpuBlock final : public BlockCase {
  static constexpr bool kBf16 = std::is_same_v<T, bf16>;

 public:
  explicit CpuBlock(const Problem& p)
      : s_(shape_of(p)), l_(param_layout(s_.arch)), seeded_(make_state(s_, l_, models::step_seed(p))),
        threads_(s_.variant == Variant::threads ? s_.threads : 0) {
    cpu::ThreadScope scope(threads_);
    const std::int64_t R = s_.rows(), C = s_.arch.C, F = s_.arch.hidden();
    x_ = seeded_.x, target_ = seeded_.target, params_ = seeded_.params, m_ = seeded_.m, v_ = seeded_.v;
    grads_ = HostBuffer(DType::f32, l_.total);
    std::fill_n(grads_.as<float>(), l_.total, 0.f);
    if (kBf16) weights_ = HostBuffer(DType::bf16, l_.total);
    if (kBf16) cast_weights();  // the copy at the start; train: AdamW keeps it from then on
    auto act = [this](std::int64_t n) { return HostBuffer(s_.dtype, static_cast<std::size_t>(n)); };
    auto f32 = [](std::int64_t n) { return HostBuffer(DType::f32, static_cast<std::size_t>(n)); };
    u_ = act(R * C), h_ = act(R * C), z_ = act(R * F), f_ = act(R * F), o_ = act(R * C), y_ = act(R * C);
    mean_ = f32(R), rstd_ = f32(R);
    conv_ = conv2d::make_cpu_plan(dwconv(s_, Direction::fwd));
    norm_ = layernorm::make_cpu_plan(channel_layernorm(s_));
    fc1_ = matmul::make_cpu_plan(linear(s_, C, F));
    gelu_ = gelu::make_cpu_plan(mlp_gelu(s_));
    fc2_ = matmul::make_cpu_plan(linear(s_, F, C));
    scale_ = pointwise::scale_residual::make_cpu_plan(layer_scale(s_, Direction::fwd));
    if (!s_.train()) return;
    dy_ = act(R * C), df_ = act(R * F), dh_ = act(R * C), du_ = act(R * C);
    mse_ = loss::mse::make_cpu_plan(output_mse(s_));
    scale_bwd_ = pointwise::scale_residual::make_cpu_plan(layer_scale(s_, Direction::bwd));
    fc2_w_ = matmul::make_cpu_plan(linear_grad(s_, Direction::bwd_weight, F, C));
    fc2_d_ = matmul::make_cpu_plan(linear_grad(s_, Direction::bwd_data, F, C));
    gelu_bwd_ = gelu::dbias::make_cpu_plan(mlp_gelu_bwd(s_));
    fc1_w_ = matmul::make_cpu_plan(linear_grad(s_, Direction::bwd_weight, C, F));
    fc1_d_ = matmul::make_cpu_plan(linear_grad(s_, Direction::bwd_data, C, F));
    norm_bwd_ = layernorm::dbias::make_cpu_plan(channel_layernorm_bwd(s_));
    conv_w_ = conv2d::make_cpu_plan(dwconv(s_, Direction::bwd_weight));
  }

  void run() override {
    cpu::ThreadScope scope(threads_);
    forward();
    if (!s_.train()) return;
    trace::op("mse_loss");
    mse_->run({y_.data(), target_.data(), &loss_, dy_.data()});
    backward();
    trace::op("adamw");
    adamw::cpu_step(params_.as<float>(), grads_.as<const float>(), m_.as<float>(), v_.as<float>(), kBf16 ? weights_.as<bf16>() : nullptr,
                    static_cast<std::int64_t>(l_.total), adamw::scalars_for(hyper(), ++step_), cpu::threads());
  }

  Check verify() override {
    const State start = verification_state(s_, seeded_);
    copy_into(x_, start.x), copy_into(target_, start.target);
    copy_into(params_, start.params), copy_into(m_, start.m), copy_into(v_, start.v);
    if (kBf16) cast_weights();
    step_ = 0;
    y_.poison();
    for (const auto& [at, n] : l_.tensors) std::fill_n(grads_.as<float>() + at, n, std::nanf(""));
    run();
    Outcome o;
    if (!s_.train()) o.y = y_;
    else o.loss = loss_, o.grads = grads_, o.params = params_;
    Check c = verify_outcome(s_, l_, start, o);
    copy_into(x_, seeded_.x), copy_into(target_, seeded_.target);  // the timed runs take the seeded batch
    return c;
  }

  std::string label() const override {
    std::string l = "ConvNeXt block (NHWC): " + conv_->label() + "; oneDNN " + std::string(kBf16 ? "bf16 " : "") +
                    "matmul (Linear with bias), LayerNorm, " + gelu_->label() + ", " + scale_->label();
    if (kBf16)
      l += s_.train() ? ", bf16 activations, the AdamW pass writes the bf16 copy of the f32 master weights"
                      : ", bf16 activations, f32 master weights cast to bf16 once";
    if (s_.train())
      l += "; train: " + conv_w_->label() + ", " + norm_bwd_->label() + ", " + gelu_bwd_->label() + ", " +
           scale_bwd_->label() + ", " + mse_->label() + ", AdamW 1 flat pass";
    return l + ", " + std::to_string(threads_ > 0 ? threads_ : cpu::threads()) + " threads";
  }

  double last_loss() override { return loss_; }
  Check bf16_copy_check() override {
    if (!kBf16) return {};
    return models::bf16_copy_of(params_.as<float>(), weights_.as<bf16>(), l_.total);
  }

 private:
  static void copy_into(HostBuffer& dst, const HostBuffer& src) { std::memcpy(dst.data(), src.data(), src.bytes()); }
  // What the matmuls read their weights and biases from: the f32 parameters, or for bf16 their copy.
  const T* gemm_weights() const {
    if constexpr (kBf16) return weights_.as<bf16>();
    else return params_.as<float>();
  }
  const float* P(std::size_t at) const { return params_.as<float>() + at; }
  float* G(std::size_t at) { return grads_.as<float>() + at; }

  void cast_weights() {
    const float* p = params_.as<float>();
    bf16* w = weights_.as<bf16>();
    const auto n = static_cast<std::int64_t>(l_.total);
#pragma omp parallel for simd num_threads(cpu::threads()) schedule(static)
    for (std::int64_t i = 0; i < n; ++i) w[i] = vec::f32_to_bf16(p[i]);
  }

  // A Linear layer's tensors: x . W + b into y, W and b at their offsets in the matmuls' weights.
  matmul::Args dense(const HostBuffer& x, std::size_t w, std::size_t b, HostBuffer& y) const {
    matmul::Args m;
    m.a = x.data(), m.b = gemm_weights() + w, m.bias = gemm_weights() + b, m.out = y.data();
    return m;
  }
  // Its weight gradient x^T . dz into the f32 gradients at `w`, and its data gradient dz . W^T into dx.
  matmul::Args weight_grad(const HostBuffer& x, const HostBuffer& dz, std::size_t w) {
    matmul::Args m;
    m.a = x.data(), m.dout = dz.data(), m.out = G(w);
    return m;
  }
  matmul::Args data_grad(const HostBuffer& dz, std::size_t w, HostBuffer& dx) const {
    matmul::Args m;
    m.b = gemm_weights() + w, m.dout = dz.data(), m.out = dx.data();
    return m;
  }

  void forward() {
    trace::op("conv2d");
    conv2d::Args cv;
    cv.x = x_.data(), cv.w = P(l_.dw_w), cv.b = P(l_.dw_b), cv.out = u_.data();
    conv_->run(cv);
    trace::op("layernorm");
    layernorm::Args n;
    n.x = u_.data(), n.gamma = P(l_.ln_g), n.beta = P(l_.ln_b), n.y = h_.data(), n.mean = mean_.data(), n.rstd = rstd_.data();
    norm_->run(n);
    trace::op("addmm");
    fc1_->run(dense(h_, l_.w1, l_.b1, z_));
    trace::op("gelu");
    gelu_->run({z_.data(), nullptr, f_.data()});
    trace::op("addmm");
    fc2_->run(dense(f_, l_.w2, l_.b2, o_));
    trace::op("scale_residual");
    pointwise::scale_residual::Args sr;
    sr.x = x_.data(), sr.z = o_.data(), sr.gamma = P(l_.ls), sr.out = y_.data();
    scale_->run(sr);
  }

  void backward() {
    trace::op("scale_residual_bwd");  // in place over dy: do = gamma dy, with dgamma and the second Linear's bias gradient
    pointwise::scale_residual::Args sr;
    sr.z = o_.data(), sr.dy = dy_.data(), sr.gamma = P(l_.ls), sr.out = dy_.data(), sr.dgamma = G(l_.ls), sr.dbias = G(l_.b2);
    scale_bwd_->run(sr);
    trace::op("mm");
    fc2_w_->run(weight_grad(f_, dy_, l_.w2));
    fc2_d_->run(data_grad(dy_, l_.w2, df_));
    trace::op("gelu_bwd");  // in place over df, with the first Linear's bias gradient
    gelu_bwd_->run({z_.data(), df_.data(), df_.data(), G(l_.b1)});
    trace::op("mm");
    fc1_w_->run(weight_grad(h_, df_, l_.w1));
    fc1_d_->run(data_grad(df_, l_.w1, dh_));
    trace::op("layernorm_bwd");  // with the convolution's bias gradient, the column sums of du
    layernorm::dbias::Args n;
    n.x = u_.data(), n.dy = dh_.data(), n.gamma = P(l_.ln_g), n.saved_mean = mean_.as<float>(), n.saved_rstd = rstd_.as<float>();
    n.dx = du_.data(), n.dgamma = G(l_.ln_g), n.dbeta = G(l_.ln_b), n.dbias = G(l_.dw_b);
    norm_bwd_->run(n);
    trace::op("conv2d_bwd_weight");
    conv2d::Args cv;
    cv.x = x_.data(), cv.dy = du_.data(), cv.out = G(l_.dw_w);
    conv_w_->run(cv);
  }

  Shape s_;
  ParamLayout l_;
  State seeded_;
  int threads_;
  HostBuffer x_, target_, params_, weights_, grads_, m_, v_;
  HostBuffer u_, h_, z_, f_, o_, y_, mean_, rstd_, dy_, df_, dh_, du_;
  std::unique_ptr<conv2d::Plan> conv_, conv_w_;
  std::unique_ptr<layernorm::Plan> norm_;
  std::unique_ptr<layernorm::dbias::Plan> norm_bwd_;
  std::unique_ptr<matmul::Plan> fc1_, fc2_, fc2_w_, fc2_d_, fc1_w_, fc1_d_;
  std::unique_ptr<gelu::Plan> gelu_;
  std::unique_ptr<gelu::dbias::Plan> gelu_bwd_;
  std::unique_ptr<pointwise::scale_residual::Plan> scale_, scale_bwd_;
  std::unique_ptr<loss::mse::Plan> mse_;
  std::int64_t step_ = 0;
  float loss_ = 0;
};

}  // namespace

std::unique_ptr<BlockCase> make_cpu(const Problem& p) {
  return models::make_step_case<CpuBlock, bf16>(p);
}

}  // namespace hotops::model_convnext
