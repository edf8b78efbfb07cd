// model_cnn on CUDA: cuDNN convolutions (conv2d plans), cublasLt dense GEMMs (matmul plans) and the
// batchnorm family's fused batch norm + ReLU (+ max-pool) + dropout plans; the passes, layouts and
// bf16 form: docs/models.md, "How each model step runs".
#include <cudnn.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <type_traits>

#include "hotops/cublaslt_gemm.h"
#include "hotops/cudnn_util.h"
#include "hotops/cuda_util.h"
#include "hotops/trace.h"
#include "kernels/batchnorm/cuda_fused.cuh"
#include "kernels/batchnorm/relu_maxpool.h"
#include "kernels/conv2d/conv2d.h"
#include "kernels/loss/loss.h"
#include "kernels/matmul/matmul.h"
#include "kernels/model_cnn/model_cnn.h"
#include "kernels/models/cuda_step.cuh"
#include "kernels/models/data_parallel.h"

namespace hotops::model_cnn {
namespace {

using gpu::cudnn;
using models::StepState;
using pointwise::DropoutKey;

// ---- kernels ------------------------------------------------------------------------------------

// The batchnorm family's kernel helpers and launchers (kernels/batchnorm/cuda_fused.cuh): grid_for,
// kThreads, and the activations the verification recomputes (launch_act, launch_act_nchw).
using namespace batchnorm::cuda_fused;  // NOLINT(build/namespaces): the kernels' helpers
using models::cast_params;
using models::narrow;
using models::widen;
using bf16 = __nv_bfloat16;
namespace relu_maxpool = batchnorm::relu_maxpool;

// The data gradient of a 3x3 stride-1 conv as a forward conv: dx = conv(dz, Wf, pad 2 - pad) with
// Wf[c][r][s][k] = W[k][2-r][2-s][c] (K and C swapped; KRSC, or KCRS as Wf[c][k][r][s] for NCHW).
// cuDNN's NHWC f32 backward-data kernels are several times slower than its forward ones at these
// shapes; this is the same arithmetic through them.
// bf16: the f32 weights cast to bf16 on the way (autocast's cast of the conv weight).
template <class Out>
__global__ void flip_filter(const float* __restrict__ w, Out* __restrict__ wf, int K, int C, bool kcrs) {
  const int n = K * 9 * C;
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    const int k = kcrs ? (i / 9) % K : i % K, rs = kcrs ? i % 9 : (i / K) % 9, c = i / (9 * K);
    wf[i] = narrow<Out>(w[(k * 9 + 8 - rs) * C + c]);
  }
}

// The model's parameters keep KRSC; the NCHW convolutions take KCRS: w (KRSC) -> out (KCRS), or back
// (the weight gradient) with to_krsc; with !kcrs the layout stays (KRSC both sides). In -> Out casts:
// bf16's per-step copy of the f32 weights, and its bf16 weight gradient into the f32 gradients.
template <class In, class Out>
__global__ void filter_layout(const In* __restrict__ in, Out* __restrict__ out, int K, int C, bool kcrs, bool to_krsc) {
  const int n = K * 9 * C;
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    const int rs = i % 9, c = (i / 9) % C, k = i / (9 * C);
    const int krsc = kcrs ? (k * 9 + rs) * C + c : i;
    if (to_krsc) out[krsc] = narrow<Out>(widen(in[i]));
    else out[i] = narrow<Out>(widen(in[krsc]));
  }
}

// A data-parallel replica's shard of the start (models::BatchReplica): its images (`per_image`
// elements each) and their labels.
struct ImagesLabelsShard {
  void operator()(State& out, const State& global, std::size_t per_image, const models::Replica& r, std::int64_t batch) const {
    out.x = models::shard(global.x, per_image, r, batch);
    out.labels = models::shard(global.labels, 1, r, batch);
  }
};

// The layout of a case's activations (CudaLayout). `measured`, on the H100 (docs/models.md has the
// figures): bf16 NHWC, where cuDNN's bf16 tensor-core kernels are (faster in 7 of the 9 verified
// comparisons, all of infer); f32 the architecture's cuda_nchw, NCHW for both convnets: it ran faster
// for both, train and infer, every batch (vgg_cifar train b512 3023 us against 3931 NHWC; keras_cnn
// b64 13.4 ms against 16.5). The test architectures follow their full-size ones.
bool use_nchw(const Arch& a, bool bf16) {
  switch (cuda_layout()) {
    case CudaLayout::nhwc: return false;
    case CudaLayout::nchw: return true;
    case CudaLayout::measured: break;
  }
  return !bf16 && a.cuda_nchw;  // measured
}

// ---- cuDNN and cublasLt setup --------------------------------------------------------------------

int dim(std::int64_t v) {
  HOTOPS_CHECK(v <= 0x7fffffff, "model_cnn: a dimension does not fit an int");
  return static_cast<int>(v);
}

// One conv layer's conv2d plans (each with its algorithm and workspace, chosen when it is built).
struct ConvPlans {
  std::unique_ptr<conv2d::Plan> fwd, filter;  // forward; weight gradient (train)
  std::unique_ptr<conv2d::Plan> data;         // train, layers after the first: the input gradient
  // The input gradient as a forward conv of dz with the flipped filter (`data` is then that conv).
  bool flip = false;
  gpu::DeviceBuffer wf_buf;  // [C][3][3][K] (or [C][K][3][3]), the activations' type
};

gpu::DeviceBuffer floats(std::int64_t n) { return gpu::DeviceBuffer(static_cast<std::size_t>(std::max<std::int64_t>(n, 1)) * sizeof(float)); }

// One conv layer's (or the hidden layer's) device buffers.
struct LayerBufs {
  gpu::DeviceBuffer z, out, arg;  // z: conv output; out: p (pooled) or a; arg: the pool's argmax bytes
  gpu::DeviceBuffer affine;       // scale [C], shift [C], mean [C], rstd [C]
  float* scale() const { return affine.as<float>(); }
  float* shift(std::int64_t C) const { return affine.as<float>() + C; }
  float* mean(std::int64_t C) const { return affine.as<float>() + 2 * C; }
  float* rstd(std::int64_t C) const { return affine.as<float>() + 3 * C; }
};

// Act: the activations' storage, float, or bf16 (mixed precision: model_cnn.h).
template <class Act>
class CudaCnn final : public ModelCase {
  static constexpr bool kBf16 = std::is_same_v<Act, bf16>;
  static gpu::DeviceBuffer acts(std::int64_t n) { return gpu::DeviceBuffer(static_cast<std::size_t>(std::max<std::int64_t>(n, 1)) * sizeof(Act)); }

 public:
  explicit CudaCnn(const Problem& p)
      : s_(shape_of(p)), l_(param_layout(s_.arch)), seeded_(seeded_state(s_, l_, models::step_seed(p))), keys_(dropout_keys(s_.arch, models::step_seed(p))) {
    const Arch& a = s_.arch;
    const std::int64_t B = s_.batch, F = flat_width(a), Hd = a.hidden, C = a.classes;
    HOTOPS_CHECK(C <= models::kMaxClasses, "model_cnn: the CUDA loss takes at most 16 classes");
    auto ok_channels = [](std::int64_t c) { return c % 4 == 0 && c <= kMaxChannels && (kThreads % (c / 4)) == 0; };
    for (const ConvLayer& c : s_.convs) HOTOPS_CHECK(ok_channels(c.K) && c.pool <= 15, "model_cnn: CUDA conv widths must be 4 x a power of two <= 1024");
    HOTOPS_CHECK(ok_channels(Hd), "model_cnn: the CUDA hidden width must be 4 x a power of two <= 1024");
    nchw_ = use_nchw(a, kBf16);
    wcopy_ = nchw_ || (kBf16 && !s_.train());
    dwcopy_ = nchw_ || kBf16;
    HOTOPS_CHECK(s_.convs.back().pool > 0, "model_cnn: the last conv layer must be pooled (the flatten reads the pooled output)");
    gpu::cublaslt();
    gpu::cublas_workspace();
    cudnn();
    host_x_ = device_order(seeded_->x);
    host_labels_ = seeded_->labels;
    x_ = gpu::DeviceBuffer(host_x_);
    labels_ = gpu::DeviceBuffer(host_labels_.size() * sizeof(std::int32_t));
    gpu::copy(labels_.get(), host_labels_.data(), labels_.bytes(), cudaMemcpyHostToDevice);
    params_ = gpu::DeviceBuffer(seeded_->params);
    stats_ = gpu::DeviceBuffer(seeded_->stats);
    period_ = gpu::DeviceBuffer(sizeof(int));
    set_period(B);
    std::int64_t max_out = 0, max_in = 1, max_filter = 1;
    for (std::size_t i = 0; i < s_.convs.size(); ++i) {
      const ConvLayer& c = s_.convs[i];
      LayerBufs& lb = layers_.emplace_back();
      lb.z = acts(B * c.out_count());
      lb.out = acts(B * (c.pool ? c.pooled_count() : c.out_count()));
      if (c.pool) lb.arg = gpu::DeviceBuffer(static_cast<std::size_t>(B * c.pooled_count()));
      lb.affine = floats(4 * c.K);
      if (wcopy_) wk_.push_back(acts(c.K * 9 * c.C));
      max_filter = std::max(max_filter, c.K * 9 * c.C);
      max_out = std::max(max_out, c.out_count());
      if (i > 0) max_in = std::max(max_in, c.in_count());
    }
    LayerBufs& hb = hidden_;
    hb.z = acts(B * Hd);
    hb.out = acts(B * Hd);
    hb.affine = floats(4 * Hd);
    logits_ = acts(B * C);
    if (kBf16) {
      low_ = acts(static_cast<std::int64_t>(l_.total));
      cast_all_params();  // the copy for the first step below; restore makes it again from the start
    }
    loss_ = floats(1);
    if (s_.train()) {
      grads_ = gpu::DeviceBuffer(l_.total * sizeof(float));
      HOTOPS_CHECK_CUDA(cudaMemset(grads_.get(), 0, grads_.bytes()));
      m_ = gpu::DeviceBuffer(seeded_->m);
      v_ = gpu::DeviceBuffer(seeded_->v);
      state_ = gpu::DeviceBuffer(sizeof(StepState));
      HOTOPS_CHECK_CUDA(cudaMemset(state_.get(), 0, sizeof(StepState)));
      dz_ = acts(B * max_out);
      if (dwcopy_) dwk_ = acts(max_filter);
      dbuf_[0] = acts(B * max_in);
      dbuf_[1] = acts(B * max_in);
      dflat_ = acts(B * F);
      dlogits_ = acts(B * C);
      xent_ = loss::make_cuda_plan(loss::dbias_shape(s_.dtype, B, C));
      dhd_ = acts(B * Hd);
      dh_ = acts(B * Hd);
    } else {
      logits_host_ = HostBuffer(s_.dtype, static_cast<std::size_t>(B * C));
    }
    if (s_.train()) hint_ = floats(B * std::max(max_out, Hd));
    if (s_.gpus) {  // data parallel: this rank's shard of the global batch, and the all-reduce
      const std::string why = data_parallel_arch_reason(a);
      HOTOPS_CHECK(why.empty(), why);
      State mine = *seeded_;  // this rank's shard of the global batch's start, its own
      replicas_.start(p, s_, static_cast<std::size_t>(a.H * a.W * a.C),
                      [&](const Shape& g) { return make_state(g, l_, models::step_seed(p)); }, mine, grads_.as<float>(), l_.total);
      seeded_ = std::make_shared<const State>(std::move(mine));
    }
    plan_convs();
    plan_gemms();
    plan_layers();
    // One step outside any capture first (lazy library state), then back to the seeded start.
    device_step();
    HOTOPS_CHECK_CUDA(cudaStreamSynchronize(gpu::stream()));
    restore(*seeded_, mask_period(false));
    if (s_.variant == Variant::graph) {
      std::string why;
      if (!graph_.capture([this] { device_step(); }, &why)) throw Error("model_cnn: the step could not be captured into a CUDA graph: " + why, ErrorKind::unsupported);
    } else if (s_.variant == Variant::plain) {
      // Whether the harness may put the plain step into its graphs: tried once (the trial graph dropped).
      std::string why;
      capturable_ = graph_.capture([this] { device_step(); }, &why);
      graph_.reset();
    }
    HOTOPS_CHECK_CUDA(cudaStreamSynchronize(gpu::stream()));
  }

  void run() override {
    if (s_.variant == Variant::plain) return device_step();
    cudaStream_t st = gpu::stream();
    trace::op("copy_h2d");
    HOTOPS_CHECK_CUDA(cudaMemcpyAsync(x_.get(), host_x_.data(), x_.bytes(), cudaMemcpyHostToDevice, st));
    if (s_.train())
      HOTOPS_CHECK_CUDA(cudaMemcpyAsync(labels_.get(), host_labels_.data(), labels_.bytes(), cudaMemcpyHostToDevice, st));
    // An instrumented pass runs the graph's step eagerly, to see its ops.
    if (s_.variant == Variant::graph && !trace::active()) graph_.launch();
    else device_step();
    trace::op("copy_d2h");
    if (s_.train())
      HOTOPS_CHECK_CUDA(cudaMemcpyAsync(&loss_host_, loss_.get(), sizeof(float), cudaMemcpyDeviceToHost, st));
    else
      HOTOPS_CHECK_CUDA(cudaMemcpyAsync(logits_host_.data(), logits_.get(), logits_host_.bytes(), cudaMemcpyDeviceToHost, st));
    HOTOPS_CHECK_CUDA(cudaStreamSynchronize(st));
  }

  Check verify() override {
    State global_start;  // data parallel: the global batch's, of which this rank runs its shard
    const State start = replicas_.verification_start(s_, *seeded_, verification_state, &global_start);
    restore(start, mask_period(true));
    logits_.poison();
    if (s_.train())
      for (const auto& [at, n] : l_.tensors) HOTOPS_CHECK_CUDA(cudaMemset(grads_.as<float>() + at, 0xff, n * sizeof(float)));
    run();
    HOTOPS_CHECK_CUDA(cudaStreamSynchronize(gpu::stream()));
    Outcome o;
    const std::int64_t B = s_.batch;
    if (!s_.train()) {
      o.logits = HostBuffer(s_.dtype, static_cast<std::size_t>(B * s_.arch.classes));
      logits_.download(o.logits);
    } else {
      o.loss = static_cast<float>(last_loss());
      o.grads = HostBuffer(DType::f32, l_.total);
      o.params = HostBuffer(DType::f32, l_.total);
      o.stats = HostBuffer(DType::f32, seeded_->stats.count());
      grads_.download(o.grads);
      params_.download(o.params);
      stats_.download(o.stats);
      // The post-ReLU activations the forward decided on, recomputed in f32 from z as the forward's
      // kernels compute them (for the reference's ties; bf16's stored ones would add ties of their own).
      for (std::size_t i = 0; i < s_.convs.size(); ++i) {
        const ConvLayer& c = s_.convs[i];
        launch_conv_act(layers_[i].z.template as<const Act>(), layers_[i], c, hint_.as<float>());
        o.relu.push_back(hint_samples(c.P, c.Q, c.K));
      }
      launch_act(hidden_.z.template as<const Act>(), hidden_, s_.arch.hidden, hint_.as<float>(), B * s_.arch.hidden, Drop{});
      o.hidden = hint_samples(1, 1, s_.arch.hidden);
    }
    Check c = replicas_.check(s_, start, global_start, o, [&](const Shape& sh, const State& st, const Outcome& out) {
      return verify_outcome(sh, l_, keys_, st, out);
    });
    if (s_.train()) {
      c.merge(adamw::check_device_step(state_.as<const StepState>(), 1), "step");
    }
    restore(*seeded_, mask_period(false));
    return c;
  }

  std::string label() const override {
    const char* bf16 = !kBf16       ? ""
                       : s_.train() ? (nchw_ ? "bf16 autocast (f32 master weights, the AdamW launch writes their bf16 copy; the conv weights "
                                               "cast into KCRS each step); "
                                             : "bf16 autocast (f32 master weights, the AdamW launch writes their bf16 copy); ")
                                    : "bf16 autocast (f32 master weights, their bf16 copy cast once); ";
    std::string l = std::string(bf16) + "cuDNN " + (nchw_ ? "NCHW" : "NHWC") +
                    (kBf16 ? " bf16 tensor-op convolutions, f32 compute (" : " f32 FMA-math convolutions (") + "conv2d plans: " + algos_ +
                    (algos_.find("hotops direct") != std::string::npos ? ", the first layer's forward hotops' direct kernel, timed faster" : "") +
                    "; ws " + std::to_string(ws_bytes_ >> 20) + " MiB); hotops fused BN/ReLU/max-pool/dropout kernels" +
                    (kBf16 ? " (bf16 storage, f32 math and sums)" : "") + "; matmul plans (cublasLt " + (kBf16 ? "bf16, f32 accumulation" : "f32") + ") dense";
    if (s_.train()) l += "; cross_entropy_dbias plan (it advances the step count), flat AdamW";
    if (s_.variant == Variant::e2e) l += "; e2e: pageable H2D of the images (and labels), launches, D2H, sync";
    if (s_.variant == Variant::graph) l += "; graph: pageable H2D of images and labels, 1 CUDA graph, D2H loss, sync";
    if (s_.variant == Variant::plain && !capturable_) l += "; not graph-capturable (capture failed at setup): launched one by one";
    if (replicas_.sync) l += replicas_.sync->label();
    return l;
  }

  void align() override {
    if (replicas_.sync) replicas_.sync->align();
  }
  bool host_timed() const override { return s_.variant != Variant::plain; }
  bool capturable() const override { return s_.variant == Variant::plain && capturable_; }

  double last_loss() override {
    return gpu::read_float(loss_.get());
  }
  Check bf16_copy_check() override {
    if (!kBf16) return {};
    return models::bf16_copy_of(params_, low_, l_.total);
  }

 private:
  const Act* input_of(std::size_t i) const { return i == 0 ? x_.as<const Act>() : layers_[i - 1].out.template as<const Act>(); }
  // The gradient of conv layer i's input (i >= 1), ping-ponged; the last layer's output gradient is dflat.
  Act* d_input(std::size_t i) const { return dbuf_[i % 2].as<Act>(); }
  Act* d_output(std::size_t i) const { return i + 1 == s_.convs.size() ? dflat_.as<Act>() : d_input(i + 1); }

  // The shape of one conv2d pass of conv layer i: the layer's 3x3 stride-1 convolution over the
  // step's batch, in the step's layout and dtype, no bias (the affine adds it). The algorithm is
  // the conv2d plan's choice: Find's usable results re-timed behind a hold, the fastest kept and a
  // near tie decided by workspace (gpu::pick_retimed; Find's own single timings picked algorithms
  // 10-20% apart in step time from one process to the next); f32 FMA math only (no TF32), bf16
  // tensor-op math only, as the label says.
  conv2d::Shape conv_shape(const ConvLayer& c, Direction dir) const {
    conv2d::Shape cs;
    cs.dir = dir, cs.dtype = s_.dtype, cs.layout = nchw_ ? conv2d::Layout::nchw : conv2d::Layout::nhwc;
    cs.N = s_.batch, cs.C = c.C, cs.H = c.H, cs.W = c.W, cs.K = c.K, cs.R = cs.S = 3, cs.pad_h = cs.pad_w = c.pad;
    cs.tensor_ops_only = kBf16;
    return cs;
  }

  void plan_convs() {
    std::size_t ws = 0;
    for (std::size_t i = 0; i < s_.convs.size(); ++i) {
      const ConvLayer& c = s_.convs[i];
      ConvPlans& cp = *plans_.emplace_back(std::make_unique<ConvPlans>());
      cp.fwd = conv2d::make_cuda_plan(conv_shape(c, Direction::fwd));
      const conv2d::CudaChoice fwd = conv2d::cuda_choice(*cp.fwd);
      ws = std::max(ws, fwd.workspace);
      algos_ += std::string(i ? ", " : "") + "fwd " + (fwd.algo == conv2d::kCudaDirectAlgo ? "hotops direct" : std::to_string(fwd.algo));
      if (s_.train()) {
        cp.filter = conv2d::make_cuda_plan(conv_shape(c, Direction::bwd_weight));
        const conv2d::CudaChoice filter = conv2d::cuda_choice(*cp.filter);
        ws = std::max(ws, filter.workspace);
        algos_ += " filter " + std::to_string(filter.algo);
        if (i > 0) ws = std::max(ws, plan_data_gradient(i, cp));
      }
    }
    // One workspace for all passes (they run one after another on the stream), as large as the
    // hungriest chosen algorithm asks.
    ws_bytes_ = ws;
    workspace_ = gpu::DeviceBuffer(std::max<std::size_t>(ws, 1));
    for (const auto& cp : plans_)
      for (conv2d::Plan* p : {cp->fwd.get(), cp->filter.get(), cp->data.get()})
        if (p) conv2d::use_cuda_workspace(*p, workspace_.get(), ws_bytes_);
  }

  // Conv layer i's input gradient: cuDNN's backward data, or the forward conv of dz with the flipped
  // filter (see flip_filter), whichever forward_flip_is_faster says (or the one cuda_data_grad_path() forces).
  // Returns the workspace of the one kept.
  std::size_t plan_data_gradient(std::size_t i, ConvPlans& cp) {
    const ConvLayer& c = s_.convs[i];
    const DataGradPath path = cuda_data_grad_path();
    std::unique_ptr<conv2d::Plan> data, flip;
    if (path != DataGradPath::forward_flip) data = conv2d::make_cuda_plan(conv_shape(c, Direction::bwd_data));
    if (path != DataGradPath::backward_data) {
      // dz (the output's shape) convolved with the flipped filter [C][3][3][K] into dx (the input's
      // shape): K input channels, C output channels, padding 2 - pad.
      conv2d::Shape fs = conv_shape(c, Direction::fwd);
      fs.C = c.K, fs.H = c.P, fs.W = c.Q, fs.K = c.C, fs.pad_h = fs.pad_w = 2 - c.pad;
      HOTOPS_CHECK(fs.P() == c.H && fs.Q() == c.W, "model_cnn: the flipped-filter conv does not give the input's shape");
      flip = conv2d::make_cuda_plan(fs);
    }
    cp.flip = path == DataGradPath::forward_flip ||
              (path == DataGradPath::timed && forward_flip_is_faster(conv2d::cuda_choice(*flip).ms, conv2d::cuda_choice(*data).ms));
    cp.data = std::move(cp.flip ? flip : data);
    const conv2d::CudaChoice kept = conv2d::cuda_choice(*cp.data);
    if (cp.flip) cp.wf_buf = acts(c.C * 9 * c.K);
    algos_ += (cp.flip ? " data fwd-flip " : " data ") + std::to_string(kept.algo);
    return kept.workspace;
  }

  void launch_flip(const float* w, const ConvPlans& cp, const ConvLayer& c) const {
    flip_filter<<<grid_for(c.K * 9 * c.C, 512), kThreads, 0, gpu::stream()>>>(w, cp.wf_buf.as<Act>(), dim(c.K), dim(c.C), nchw_);
    HOTOPS_CHECK_LAUNCH();
  }

  // NCHW or bf16 infer (wcopy_): conv layer i's weights -> wk_ (KCRS for NCHW; cast to bf16; infer's
  // once), or
  // (NCHW or bf16: dwcopy_) its weight gradient dwk_ -> the flat f32 gradients (KRSC).
  void launch_filter_layout(std::size_t i, bool gradient) const {
    const ConvLayer& c = s_.convs[i];
    const unsigned grid = grid_for(c.K * 9 * c.C, 512);
    if (gradient)
      filter_layout<<<grid, kThreads, 0, gpu::stream()>>>(dwk_.as<const Act>(), grads_.as<float>() + l_.conv[i].w, dim(c.K), dim(c.C), nchw_, true);
    else
      filter_layout<<<grid, kThreads, 0, gpu::stream()>>>(params_.as<const float>() + l_.conv[i].w, wk_[i].template as<Act>(), dim(c.K), dim(c.C), nchw_,
                                                          false);
    HOTOPS_CHECK_LAUNCH();
  }
  // The weights conv layer i's cuDNN calls take: the flat parameters (KRSC; bf16: their copy), or
  // the per-step copy (wcopy_).
  const Act* weights(std::size_t i) const { return wcopy_ ? wk_[i].template as<const Act>() : param(l_.conv[i].w); }
  // A parameter at flat offset `at` as the GEMMs and convolutions take it: f32, or the bf16 copy.
  const Act* param(std::size_t at) const {
    if constexpr (kBf16) return low_.as<const Act>() + at;
    else return params_.as<const float>() + at;
  }
  const Act* dense_param(std::size_t at) const { return param(at); }
  // bf16: the copy of the flat parameters, when they are restored.
  void cast_all_params() const {
    const auto n4 = static_cast<std::int64_t>(l_.total / 4);
    cast_params<<<grid_for(n4, 1024), kThreads, 0, gpu::stream()>>>(params_.as<const float4>(), low_.as<__nv_bfloat162>(), n4);
    HOTOPS_CHECK_LAUNCH();
  }

  HostBuffer device_order(const HostBuffer& x) const {
    const Arch& a = s_.arch;
    return nchw_ ? nhwc_to_nchw(x, static_cast<std::int64_t>(x.count()) / (a.H * a.W * a.C), a.H, a.W, a.C) : x;
  }

  // A conv layer's post-ReLU activation of z (no dropout) into out, in the layer's layout.
  template <class O>
  void launch_conv_act(const Act* z, const LayerBufs& lb, const ConvLayer& c, O* out) const {
    const std::int64_t n = s_.batch * c.out_count();
    if (!nchw_) return launch_act(z, lb, c.K, out, n, Drop{});
    launch_act_nchw(z, lb.scale(), lb.shift(c.K), out, n, dim(c.K), dim(c.P * c.Q));
  }

  // A dense layer's GEMM as a matmul plan over the batch's rows, in the step's dtype (cublasLt, the
  // heuristic's first algorithm, f32 accumulation: no TF32 for f32, tensor cores for bf16). bf16:
  // outputs of the step's type have their split-K partials reduced in f32, and weight gradients are
  // written f32 (the flat master gradients) from the f32 accumulators.
  std::unique_ptr<matmul::Plan> dense_plan(matmul::Op op, Direction dir, std::int64_t in, std::int64_t out) const {
    matmul::Shape ms;
    ms.op = op, ms.dir = dir, ms.dtype = s_.dtype, ms.M = s_.batch, ms.K = in, ms.N = out;
    ms.f32_out = kBf16 && dir == Direction::bwd_weight;
    ms.reduce_in_compute = kBf16 && !ms.f32_out;
    return matmul::make_cuda_plan(ms);
  }

  void plan_gemms() {
    const Arch& a = s_.arch;
    const std::int64_t F = flat_width(a), Hd = a.hidden, C = a.classes;
    // h = flat . W1; logits = hd . W2 + b2 (the bias epilogue)
    dense1_fwd_ = dense_plan(matmul::Op::mm, Direction::fwd, F, Hd);
    dense2_fwd_ = dense_plan(matmul::Op::addmm, Direction::fwd, Hd, C);
    if (!s_.train()) return;
    // dW2 = hd^T dlogits, dhd = dlogits W2^T; dW1 = flat^T dh, dflat = dh W1^T (db2 comes from
    // the loss plan, db1 from the hidden layer's batch norm or bias backward)
    dense2_dw_ = dense_plan(matmul::Op::mm, Direction::bwd_weight, Hd, C);
    dense2_dx_ = dense_plan(matmul::Op::mm, Direction::bwd_data, Hd, C);
    dense1_dw_ = dense_plan(matmul::Op::mm, Direction::bwd_weight, F, Hd);
    dense1_dx_ = dense_plan(matmul::Op::mm, Direction::bwd_data, F, Hd);
  }

  // The dropout masks' sample period: the batch (a data-parallel step's global batch, of which this
  // rank's samples are those from first_sample on), or verification's periodic batch's.
  std::int64_t mask_period(bool verifying) const {
    const Shape& whole = replicas_.sync ? replicas_.global : s_;
    return verifying ? verify_period(whole) : whole.batch;
  }

  // Verification's post-ReLU activations of a layer (P x Q x K a sample, its layout) from hint_, NHWC on
  // the host: the step's batch; for a data-parallel step the global batch's first verify_period
  // samples, all the reference reads, gathered from the ranks.
  HostBuffer hint_samples(std::int64_t P, std::int64_t Q, std::int64_t K) const {
    const auto per = static_cast<std::size_t>(P * Q * K);
    std::int64_t n = verify_period(s_);  // the distinct samples the reference computes
    HostBuffer h;
    if (replicas_.sync) {
      n = verify_period(replicas_.global);
      h = models::leading_samples(*replicas_.sync, replicas_.replica, hint_.get(), DType::f32, per, s_.batch, n);
    } else {
      h = HostBuffer(DType::f32, per * static_cast<std::size_t>(n));
      gpu::copy(h.data(), hint_.get(), h.bytes(), cudaMemcpyDeviceToHost);
    }
    return nchw_ ? nhwc_to_nchw(h, n, P, Q, K, true) : h;
  }

  void set_period(std::int64_t p) {
    const int v = static_cast<int>(p);
    gpu::copy(period_.get(), &v, sizeof v, cudaMemcpyHostToDevice);
  }

  // relu(z * scale + shift) over [rows, C] (the verification's recomputed activations).
  template <class O>
  void launch_act(const Act* z, const LayerBufs& lb, std::int64_t C, O* out, std::int64_t n, Drop d) const {
    batchnorm::cuda_fused::launch_act(z, lb.scale(), lb.shift(C), out, n / 4, static_cast<int>(C / 4), d, C / 4);
  }

  // Each conv layer's batch norm (or bias) and ReLU runs a batchnorm family plan in the step's layout:
  // batchnorm_relu_maxpool (with max-pool and dropout) where a pool follows the conv, else
  // batchnorm_relu; the hidden layer's, batchnorm_relu over [batch, hidden] with its dropout. Built
  // here once: fwd (infer) and, to train, bwd. NCHW pools the last conv into NHWC, the order the
  // flatten reads.
  void plan_layers() {
    std::size_t stage = 0;
    const batchnorm::Layout layout = nchw_ ? batchnorm::Layout::nchw : batchnorm::Layout::nhwc;
    for (std::size_t i = 0; i <= s_.convs.size(); ++i) {
      relu_maxpool::Shape ps;
      ps.dir = s_.train() ? Direction::fwd : Direction::infer;
      ps.dtype = s_.dtype, ps.N = s_.batch, ps.bn = s_.arch.bn, ps.eps = kBnEps, ps.momentum = kBnMomentum;
      if (i == s_.convs.size()) {  // the hidden layer
        ps.pool = false, ps.k = 1, ps.layout = ps.pooled_layout = batchnorm::Layout::nc, ps.C = s_.arch.hidden;
        ps.dropout = s_.arch.hidden_dropout, ps.key = keys_.back();
      } else {
        const ConvLayer& c = s_.convs[i];
        ps.pool = c.pool > 0, ps.k = c.pool ? c.pool : 1, ps.C = c.K, ps.H = c.P, ps.W = c.Q, ps.layout = layout;
        ps.pooled_layout = c.pool && i + 1 == s_.convs.size() ? batchnorm::Layout::nhwc : layout;
        if (c.pool) ps.dropout = c.dropout, ps.key = keys_[stage++];
      }
      fused_fwd_.push_back(relu_maxpool::make_cuda_plan(ps));
      if (s_.train()) ps.dir = Direction::bwd, fused_bwd_.push_back(relu_maxpool::make_cuda_plan(ps));
    }
  }

  // Layer i's plan tensors (a conv layer, or the hidden one at i = convs.size()): the forward's (dout
  // null), or the backward's from dout, the gradient of its output, into dz.
  relu_maxpool::Args layer_args(std::size_t i, const Act* dout, Act* dz) const {
    const bool hidden = i == s_.convs.size();
    const LayerBufs& lb = hidden ? hidden_ : layers_[i];
    const Layer& ly = hidden ? l_.dense1 : l_.conv[i];
    const std::int64_t K = hidden ? s_.arch.hidden : s_.convs[i].K;
    float* P = params_.as<float>();
    relu_maxpool::Args a;
    a.z = lb.z.get();
    a.period = period_.as<const int>();
    a.first_sample = replicas_.first_sample(s_.batch);
    if (!hidden && s_.convs[i].pool) a.arg = lb.arg.as<std::uint8_t>();
    a.scale = lb.scale(), a.shift = lb.shift(K), a.mean = lb.mean(K), a.rstd = lb.rstd(K);
    if (s_.arch.bn) a.gamma = P + ly.gamma;
    if (dout) {
      float* G = grads_.as<float>();
      a.dout = dout, a.dz = dz, a.dbias = G + ly.b;
      if (s_.arch.bn) a.dgamma = G + ly.gamma, a.dbeta = G + ly.beta;
      return a;
    }
    float* S = stats_.as<float>();
    a.bias = P + ly.b, a.out = lb.out.get();
    if (s_.arch.bn) a.beta = P + ly.beta, a.running_mean = S + ly.mean, a.running_var = S + ly.var;
    return a;
  }

  void device_step() {
    cudaStream_t st = gpu::stream();
    float* P = params_.as<float>();
    // train, NCHW: the conv weights reordered into KCRS each step, as the AdamW launch changed them
    // (bf16 train's flat copy is written by the AdamW launch; infer's weights are prepared once, in restore).
    const bool reorder = wcopy_ && s_.train();
    if (reorder) trace::op(kBf16 ? "cast" : "reorder");  // the conv weights into the step's dtype and layout
    for (std::size_t i = 0; reorder && i < s_.convs.size(); ++i) launch_filter_layout(i, false);
    for (std::size_t i = 0; i < s_.convs.size(); ++i) {
      const ConvLayer& c = s_.convs[i];
      const LayerBufs& lb = layers_[i];
      const ConvPlans& cp = *plans_[i];
      trace::op("conv2d");
      cp.fwd->run({input_of(i), weights(i), nullptr, nullptr, lb.z.get(), nullptr});
      trace::op(c.pool ? "bn_relu_maxpool_dropout" : "bn_relu");
      fused_fwd_[i]->run(layer_args(i, nullptr, nullptr));
    }
    trace::op("mm");
    const Act* flat = layers_.back().out.template as<const Act>();
    dense1_fwd_->run({flat, dense_param(l_.dense1.w), nullptr, nullptr, hidden_.z.get(), nullptr});
    trace::op("bn_relu_dropout");
    fused_fwd_.back()->run(layer_args(s_.convs.size(), nullptr, nullptr));
    trace::op("addmm");
    dense2_fwd_->run({hidden_.out.get(), dense_param(l_.dense2.w), dense_param(l_.dense2.b), nullptr, logits_.get(), nullptr});
    if (!s_.train()) return;

    float* G = grads_.as<float>();
    trace::op("cross_entropy");
    loss::Args xa;
    xa.logits = logits_.get(), xa.labels = labels_.as<const std::int32_t>(), xa.dlogits = dlogits_.get();
    xa.loss = loss_.get(), xa.db = G + l_.dense2.b;
    xa.advance = state_.as<StepState>(), xa.hyper = &hyper_;
    xent_->run(xa);
    trace::op("mm");
    dense2_dw_->run({hidden_.out.get(), nullptr, nullptr, dlogits_.get(), G + l_.dense2.w, nullptr});
    dense2_dx_->run({nullptr, dense_param(l_.dense2.w), nullptr, dlogits_.get(), dhd_.get(), nullptr});
    trace::op("bn_relu_dropout_bwd");  // hidden: dropout, ReLU, batch norm (or bias) backward -> dh
    fused_bwd_.back()->run(layer_args(s_.convs.size(), dhd_.as<const Act>(), dh_.as<Act>()));
    trace::op("mm");
    dense1_dw_->run({flat, nullptr, nullptr, dh_.get(), G + l_.dense1.w, nullptr});
    models::grads_ready(replicas_.sync, l_.dense1.w);  // the dense layers' are final
    dense1_dx_->run({nullptr, dense_param(l_.dense1.w), nullptr, dh_.get(), dflat_.get(), nullptr});
    for (std::size_t i = s_.convs.size(); i-- > 0;) {
      const ConvLayer& c = s_.convs[i];
      const ConvPlans& cp = *plans_[i];
      trace::op(c.pool ? "bn_relu_maxpool_dropout_bwd" : "bn_relu_bwd");
      fused_bwd_[i]->run(layer_args(i, d_output(i), dz_.as<Act>()));
      trace::op("conv2d_bwd_weight");
      cp.filter->run({input_of(i), nullptr, nullptr, dz_.get(), dwcopy_ ? dwk_.get() : static_cast<void*>(G + l_.conv[i].w), nullptr});
      if (dwcopy_) launch_filter_layout(i, true);
      models::grads_ready(replicas_.sync, l_.conv[i].w);  // this layer's and every later layer's are final
      if (i > 0) trace::op("conv2d_bwd_data");
      if (i > 0 && cp.flip) {  // dz convolved with the flipped filter, into dx
        launch_flip(P + l_.conv[i].w, cp, c);
        cp.data->run({dz_.get(), cp.wf_buf.get(), nullptr, nullptr, d_input(i), nullptr});
      } else if (i > 0) {
        cp.data->run({nullptr, weights(i), nullptr, dz_.get(), d_input(i), nullptr});
      }
    }
    models::adamw_step(replicas_.sync, {params_.as<float>(), grads_.as<const float>(), m_.as<float>(), v_.as<float>(),
                       kBf16 ? low_.as<std::uint16_t>() : nullptr, l_.total, state_.as<StepState>(), nullptr, 4096});
  }

  void restore(const State& st, std::int64_t period) {
    host_x_ = device_order(st.x);
    host_labels_ = st.labels;
    x_.upload(host_x_);
    gpu::copy(labels_.get(), st.labels.data(), labels_.bytes(), cudaMemcpyHostToDevice);
    params_.upload(st.params);
    stats_.upload(st.stats);
    if constexpr (kBf16) cast_all_params();  // train: the AdamW launch writes the copy from then on
    if (s_.train()) {
      m_.upload(st.m);
      v_.upload(st.v);
      HOTOPS_CHECK_CUDA(cudaMemset(state_.get(), 0, sizeof(StepState)));
    } else {
      // infer: the conv weights in the step's dtype and layout once, as autocast's weight cache holds them
      for (std::size_t i = 0; wcopy_ && i < s_.convs.size(); ++i) launch_filter_layout(i, false);
    }
    set_period(period);
  }

  Shape s_;
  ParamLayout l_;
  std::shared_ptr<const State> seeded_;
  std::vector<DropoutKey> keys_;
  HostBuffer host_x_;  // the batch in pageable host memory, for the e2e and graph variants
  std::vector<std::int32_t> host_labels_;
  gpu::DeviceBuffer x_, labels_, params_, stats_, grads_, m_, v_, state_, period_, loss_, logits_;
  gpu::DeviceBuffer dz_, dbuf_[2], dflat_, dlogits_, dhd_, dh_, hint_, workspace_;
  std::unique_ptr<loss::Plan> xent_;        // train: the head's loss and gradients, advancing the step count
  const adamw::Hyper hyper_ = models::hyper();  // AdamW's, as the loss plan advances the step count
  std::vector<LayerBufs> layers_;
  LayerBufs hidden_;
  bool nchw_ = false;                 // the activations' layout (CudaLayout)
  bool wcopy_ = false;                // the convs take a per-step copy of their weights (NCHW, or bf16 infer)
  bool dwcopy_ = false;               // the weight gradients land in dwk_ first (NCHW or bf16)
  std::vector<gpu::DeviceBuffer> wk_;  // wcopy_: each conv layer's weights (KCRS for NCHW; Act)
  gpu::DeviceBuffer dwk_;             // dwcopy_: a conv layer's weight gradient (KCRS for NCHW; Act)
  gpu::DeviceBuffer low_;             // bf16: the bf16 copy of the flat parameters (train: written by AdamW)
  std::vector<std::unique_ptr<ConvPlans>> plans_;
  std::unique_ptr<matmul::Plan> dense1_fwd_, dense2_fwd_;                          // the dense layers' forward
  std::unique_ptr<matmul::Plan> dense2_dw_, dense2_dx_, dense1_dw_, dense1_dx_;  // train: their gradients
  // The batchnorm family's plans of each conv layer, then the hidden layer's (plan_layers); bwd: train.
  std::vector<std::unique_ptr<relu_maxpool::Plan>> fused_fwd_, fused_bwd_;
  std::size_t ws_bytes_ = 0;  // the conv2d plans' shared workspace: the largest their algorithms need
  std::string algos_;
  HostBuffer logits_host_;
  float loss_host_ = 0;
  bool capturable_ = false;
  gpu::StepGraph graph_;  // graph:1
  models::BatchReplica<Shape, State, ImagesLabelsShard> replicas_;  // gpus:G (data parallel)
};

}  // namespace

bool forward_flip_is_faster(float flip_ms, float data_ms) { return flip_ms * (1 + gpu::kRetimeTie) < data_ms; }

std::unique_ptr<ModelCase> make_cuda(const Problem& p) {
  if (p.dtype == DType::bf16) return std::make_unique<CudaCnn<bf16>>(p);
  return std::make_unique<CudaCnn<float>>(p);
}

}  // namespace hotops::model_cnn
