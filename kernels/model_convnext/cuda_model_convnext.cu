// model_convnext on CUDA: the op families' plans in order over the step's NHWC device buffers: conv2d's
// cuDNN depthwise convolution (group count = channels; forward with its bias, the weight gradient), the
// layernorm family's kernels (forward; layernorm_dbias with the convolution's bias gradient), cublasLt
// GEMMs for the two Linear layers (matmul addmm / mm, algorithms timed at setup), the gelu family's
// kernels (GELU; gelu_dbias), pointwise scale_residual (forward; backward in place with the second
// Linear's bias gradient), the loss family's mse and one AdamW launch. bf16: bf16 activations, the
// GEMMs and the convolution read a bf16 copy of the f32 master parameters (train: cast when the
// optimizer restarts, then written by the AdamW launch; infer: cast once at the start), and the
// convolution's bf16 weight gradient is widened into the f32 gradients by the copy family's plan.
#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <type_traits>

#include "hotops/cuda_elem.cuh"
#include "hotops/cuda_util.h"
#include "hotops/trace.h"
#include "kernels/copy/copy.h"
#include "kernels/model_convnext/model_convnext.h"
#include "kernels/models/data_parallel.h"

namespace hotops::model_convnext {
namespace {


using StepState = adamw::DeviceStep;
using bf16 = __nv_bfloat16;


// T: the activations' storage, float (f32) or bf16.
template <class T>
class CudaBlock final : public BlockCase {
  static constexpr bool kBf16 = std::is_same_v<T, bf16>;

 public:
  explicit CudaBlock(const Problem& p) : s_(shape_of(p)), l_(param_layout(s_.arch)), seeded_(make_state(s_, l_, models::step_seed(p))) {
    const std::int64_t R = s_.rows(), C = s_.arch.C, F = s_.arch.hidden();
    HOTOPS_CHECK(C <= layernorm::dbias::kCudaMaxHidden && C % 4 == 0,
                 "model_convnext: the CUDA kernels take channels <= 1024, a multiple of 4");
    gpu::cublaslt();
    gpu::cublas_workspace();
    auto f32 = [](std::int64_t n) { return gpu::DeviceBuffer(static_cast<std::size_t>(n) * sizeof(float)); };
    auto act = [](std::int64_t n) { return gpu::DeviceBuffer(static_cast<std::size_t>(n) * sizeof(T)); };
    params_ = gpu::DeviceBuffer(seeded_.params);
    if (kBf16) {
      weights_ = gpu::DeviceBuffer(l_.total * sizeof(bf16));
      copy::Shape cs;
      cs.kind = copy::Kind::f32_to_bf16, cs.src = DType::f32, cs.dst = DType::bf16, cs.count = static_cast<std::int64_t>(l_.total);
      cast_ = copy::make_cuda_plan(cs);
      cast_->run({params_.get(), weights_.get()});
    }
    x_ = gpu::DeviceBuffer(seeded_.x);
    u_ = act(R * C), h_ = act(R * C), z_ = act(R * F), f_ = act(R * F), o_ = act(R * C), y_ = act(R * C);
    mean_ = f32(R), rstd_ = f32(R);
    conv_ = conv2d::make_cuda_plan(dwconv(s_, Direction::fwd));
    norm_ = layernorm::make_cuda_plan(channel_layernorm(s_));
    fc1_ = matmul::make_cuda_plan(linear(s_, C, F));
    gelu_ = gelu::make_cuda_plan(mlp_gelu(s_));
    fc2_ = matmul::make_cuda_plan(linear(s_, F, C));
    scale_ = pointwise::scale_residual::make_cuda_plan(layer_scale(s_, Direction::fwd));
    if (s_.train()) {
      const auto total = static_cast<std::int64_t>(l_.total);
      grads_ = f32(total), m_ = f32(total), v_ = f32(total);
      HOTOPS_CHECK_CUDA(cudaMemsetAsync(grads_.get(), 0, grads_.bytes(), gpu::stream()));
      target_ = gpu::DeviceBuffer(seeded_.target);
      dy_ = act(R * C), df_ = act(R * F), dh_ = act(R * C), du_ = act(R * C);
      if (kBf16) {
        dw_low_ = act(C * kKernel * kKernel);
        copy::Shape cs;
        cs.kind = copy::Kind::bf16_to_f32, cs.src = DType::bf16, cs.dst = DType::f32, cs.count = C * kKernel * kKernel;
        widen_ = copy::make_cuda_plan(cs);
      }
      loss_ = f32(1), state_ = gpu::DeviceBuffer(sizeof(StepState));
      mse_ = loss::mse::make_cuda_plan(output_mse(s_));
      scale_bwd_ = pointwise::scale_residual::make_cuda_plan(layer_scale(s_, Direction::bwd));
      fc2_w_ = matmul::make_cuda_plan(linear_grad(s_, Direction::bwd_weight, F, C));
      fc2_d_ = matmul::make_cuda_plan(linear_grad(s_, Direction::bwd_data, F, C));
      gelu_bwd_ = gelu::dbias::make_cuda_plan(mlp_gelu_bwd(s_));
      fc1_w_ = matmul::make_cuda_plan(linear_grad(s_, Direction::bwd_weight, C, F));
      fc1_d_ = matmul::make_cuda_plan(linear_grad(s_, Direction::bwd_data, C, F));
      norm_bwd_ = layernorm::dbias::make_cuda_plan(channel_layernorm_bwd(s_));
      conv_w_ = conv2d::make_cuda_plan(dwconv(s_, Direction::bwd_weight));
      restart_optimizer();
    }
    if (s_.gpus) {  // data parallel: this rank's shard of the global batch, and the all-reduce
      replicas_.start(p, s_, static_cast<std::size_t>(s_.arch.positions() * C),
                      [&](const Shape& g) { return make_state(g, l_, models::step_seed(p)); }, seeded_, grads_.as<float>(), l_.total);
      x_.upload(seeded_.x);
      target_.upload(seeded_.target);
    }
    if (s_.variant == Variant::e2e) {
      host_out_ = HostBuffer(s_.dtype, static_cast<std::size_t>(R * C));
    } else {
      // Whether the harness may put the plain step into its graphs (cuDNN's calls may refuse capture):
      // tried once here, the trial graph dropped. A train trial advances nothing: the graph is not run.
      gpu::StepGraph trial;
      capturable_ = trial.capture([this] { device_step(); }, &not_capturable_);
    }
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
      HOTOPS_CHECK_CUDA(cudaMemcpyAsync(host_out_.data(), y_.get(), host_out_.bytes(), cudaMemcpyDeviceToHost, gpu::stream()));
    HOTOPS_CHECK_CUDA(cudaStreamSynchronize(gpu::stream()));
  }

  Check verify() override {
    State global_start;  // data parallel: the global batch's, of which this rank runs its shard
    const State start = replicas_.verification_start(s_, seeded_, verification_state, &global_start);
    x_.upload(start.x);
    load_params(start.params);
    y_.poison();
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
      o.y = HostBuffer(s_.dtype, static_cast<std::size_t>(s_.rows() * s_.arch.C));
      y_.download(o.y);
    } else {
      o.loss = static_cast<float>(last_loss());
      o.grads = HostBuffer(DType::f32, l_.total);
      o.params = HostBuffer(DType::f32, l_.total);
      grads_.download(o.grads);
      params_.download(o.params);
    }
    Check c = replicas_.check(s_, start, global_start, o,
                              [&](const Shape& sh, const State& st, const Outcome& out) { return verify_outcome(sh, l_, st, out); });
    if (s_.train()) c.merge(adamw::check_device_step(state_.as<const StepState>(), 1), "step");
    // The timed runs take the seeded batch (and train on from the verified step).
    x_.upload(seeded_.x);
    if (s_.train()) target_.upload(seeded_.target);
    return c;
  }

  std::string label() const override {
    const std::string gemm = kBf16 ? "bf16 (f32 accumulate, tensor cores)" : "f32";
    std::string l = "ConvNeXt block (NHWC): " + conv_->label() + "; cublasLt " + gemm +
                    " Linear GEMMs (bias epilogue, algorithms timed at setup), hotops LayerNorm, GELU, scale_residual kernels";
    if (kBf16)
      l += s_.train() ? ", bf16 activations, the AdamW step writes the bf16 copy of the f32 master weights"
                      : ", bf16 activations, f32 master weights cast to bf16 once";
    if (s_.train()) l += "; train: " + conv_w_->label() + ", MSE, the kernels' backwards, AdamW 1 launch";
    if (s_.variant == Variant::e2e) l += "; e2e: pageable H2D of the inputs, launches, D2H, sync";
    if (s_.variant == Variant::plain && !capturable_) l += "; not graph-capturable (" + not_capturable_ + "): launched one by one";
    if (replicas_.sync) l += replicas_.sync->label();
    return l;
  }

  bool capturable() const override { return s_.variant == Variant::plain && capturable_; }
  void align() override {
    if (replicas_.sync) replicas_.sync->align();
  }
  bool host_timed() const override { return s_.variant != Variant::plain; }

  double last_loss() override {
    HOTOPS_CHECK(s_.train(), "model_convnext: an infer case has no loss");
    return gpu::read_float(loss_.get());
  }
  Check bf16_copy_check() override {
    if (!kBf16) return {};
    return models::bf16_copy_of(params_, weights_, l_.total);
  }

 private:
  // What the GEMMs and the convolution read their weights and biases from: the f32 parameters, or for
  // bf16 their copy.
  const T* low(std::size_t at) const {
    if constexpr (kBf16) return weights_.as<const bf16>() + at;
    else return params_.as<const float>() + at;
  }
  const float* P(std::size_t at) const { return params_.as<const float>() + at; }
  float* G(std::size_t at) const { return grads_.as<float>() + at; }

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
    if constexpr (kBf16) cast_->run({params_.get(), weights_.get()});
  }

  matmul::Args dense(const gpu::DeviceBuffer& x, std::size_t w, std::size_t b, gpu::DeviceBuffer& y) const {
    matmul::Args m;
    m.a = x.get(), m.b = low(w), m.bias = low(b), m.out = y.get();
    return m;
  }
  matmul::Args weight_grad(const gpu::DeviceBuffer& x, const gpu::DeviceBuffer& dz, std::size_t w) const {
    matmul::Args m;
    m.a = x.get(), m.dout = dz.get(), m.out = G(w);
    return m;
  }
  matmul::Args data_grad(const gpu::DeviceBuffer& dz, std::size_t w, gpu::DeviceBuffer& dx) const {
    matmul::Args m;
    m.b = low(w), m.dout = dz.get(), m.out = dx.get();
    return m;
  }

  void device_step() {
    // forward
    trace::op("conv2d");
    conv2d::Args cv;
    cv.x = x_.get(), cv.w = low(l_.dw_w), cv.b = low(l_.dw_b), cv.out = u_.get();
    conv_->run(cv);
    trace::op("layernorm");
    layernorm::Args n;
    n.x = u_.get(), n.gamma = P(l_.ln_g), n.beta = P(l_.ln_b), n.y = h_.get(), n.mean = mean_.get(), n.rstd = rstd_.get();
    norm_->run(n);
    trace::op("addmm");
    fc1_->run(dense(h_, l_.w1, l_.b1, z_));
    trace::op("gelu");
    gelu_->run({z_.get(), nullptr, f_.get()});
    trace::op("addmm");
    fc2_->run(dense(f_, l_.w2, l_.b2, o_));
    trace::op("scale_residual");
    pointwise::scale_residual::Args sr;
    sr.x = x_.get(), sr.z = o_.get(), sr.gamma = P(l_.ls), sr.out = y_.get();
    scale_->run(sr);
    if (!s_.train()) return;
    // loss
    trace::op("mse_loss");
    mse_->run({y_.get(), target_.get(), loss_.as<float>(), dy_.get()});
    // backward
    trace::op("scale_residual_bwd");  // in place over dy, with dgamma and the second Linear's bias gradient
    pointwise::scale_residual::Args sb;
    sb.z = o_.get(), sb.dy = dy_.get(), sb.gamma = P(l_.ls), sb.out = dy_.get(), sb.dgamma = G(l_.ls), sb.dbias = G(l_.b2);
    scale_bwd_->run(sb);
    trace::op("mm");
    fc2_w_->run(weight_grad(f_, dy_, l_.w2));
    fc2_d_->run(data_grad(dy_, l_.w2, df_));
    trace::op("gelu_bwd");  // in place over df, with the first Linear's bias gradient
    gelu_bwd_->run({z_.get(), df_.get(), df_.get(), G(l_.b1)});
    trace::op("mm");
    fc1_w_->run(weight_grad(h_, df_, l_.w1));
    models::grads_ready(replicas_.sync, l_.w1);  // the two Linear layers' and the layer scale's are final
    fc1_d_->run(data_grad(df_, l_.w1, dh_));
    trace::op("layernorm_bwd");  // with the convolution's bias gradient, the column sums of du
    layernorm::dbias::Args nb;
    nb.x = u_.get(), nb.dy = dh_.get(), nb.gamma = P(l_.ln_g), nb.saved_mean = mean_.as<const float>(),
    nb.saved_rstd = rstd_.as<const float>();
    nb.dx = du_.get(), nb.dgamma = G(l_.ln_g), nb.dbeta = G(l_.ln_b), nb.dbias = G(l_.dw_b);
    norm_bwd_->run(nb);
    trace::op("conv2d_bwd_weight");
    conv2d::Args cw;
    cw.x = x_.get(), cw.dy = du_.get(), cw.out = kBf16 ? dw_low_.get() : static_cast<void*>(G(l_.dw_w));
    conv_w_->run(cw);
    if constexpr (kBf16) {
      widen_->run({dw_low_.get(), G(l_.dw_w)});
    }
    // optimizer
    models::adamw_step(replicas_.sync, {params_.as<float>(), grads_.as<const float>(), m_.as<float>(), v_.as<float>(),
                       kBf16 ? weights_.as<std::uint16_t>() : nullptr, l_.total, state_.as<StepState>(), &hyper_});
  }

  Shape s_;
  ParamLayout l_;
  State seeded_;
  const adamw::Hyper hyper_ = hyper();
  const StepState first_step_ = adamw::first_step(hyper_);  // restart_optimizer's copy source
  gpu::DeviceBuffer params_, weights_, grads_, m_, v_, x_, target_, loss_, state_;
  std::unique_ptr<copy::Plan> cast_, widen_;  // bf16: the parameters' copy, the conv's weight gradient widened
  gpu::DeviceBuffer u_, h_, z_, f_, o_, y_, mean_, rstd_, dy_, df_, dh_, du_, dw_low_;
  std::unique_ptr<conv2d::Plan> conv_, conv_w_;
  std::unique_ptr<layernorm::Plan> norm_;
  std::unique_ptr<layernorm::dbias::Plan> norm_bwd_;
  std::unique_ptr<matmul::Plan> fc1_, fc2_, fc2_w_, fc2_d_, fc1_w_, fc1_d_;
  std::unique_ptr<gelu::Plan> gelu_;
  std::unique_ptr<gelu::dbias::Plan> gelu_bwd_;
  std::unique_ptr<pointwise::scale_residual::Plan> scale_, scale_bwd_;
  std::unique_ptr<loss::mse::Plan> mse_;
  HostBuffer host_out_;
  float loss_host_ = 0;
  bool capturable_ = false;
  std::string not_capturable_;  // why, where the trial capture failed
  models::XTargetReplica<Shape, State> replicas_;  // gpus:G (data parallel)
};

}  // namespace

std::unique_ptr<BlockCase> make_cuda(const Problem& p) {
  return models::make_step_case<CudaBlock, bf16>(p);
}

}  // namespace hotops::model_convnext
