// model_bilstm on CUDA: the op families' plans (embedding with its device sort, kernels/lstm's layer:
// hotops' recurrence kernels in bf16, cuDNN's RNN API in f32; matmul's small dense head, the loss
// family's cross_entropy_dbias or cross_entropy with matmul's bias_grad, copy's bf16 widening,
// AdamW); the step op by op, and its bf16 form:
// docs/models.md, "How each model step runs".
#include <algorithm>
#include <cstring>
#include <memory>
#include <type_traits>
#include <string>
#include <vector>

#include "hotops/cuda_util.h"
#include "hotops/trace.h"
#include "kernels/copy/copy.h"
#include "kernels/lstm/lstm.h"
#include "kernels/model_bilstm/model_bilstm.h"
#include "kernels/models/cuda_step.cuh"
#include "kernels/models/data_parallel.h"

namespace hotops::model_bilstm {
namespace {

using models::cast_params;
using models::kMaxClasses;
using models::StepState;

std::size_t aligned(std::size_t n) { return (n + kAlignFloats - 1) / kAlignFloats * kAlignFloats; }

unsigned blocks_for(std::int64_t work, unsigned threads, std::int64_t cap = 4096) {
  return static_cast<unsigned>(std::max<std::int64_t>(1, std::min<std::int64_t>((work + threads - 1) / threads, cap)));
}

class CudaBilstm final : public ModelCase {
 public:
  explicit CudaBilstm(const Problem& p)
      : s_(shape_of(p)), c_(s_.cfg), l_(layout_of(c_)), st_(make_state(s_, l_, models::step_seed(p))), es_(s_.bf16() ? 2 : 4) {
    HOTOPS_CHECK(!c_.fused_loss() || c_.C <= kMaxClasses, "model_bilstm: the CUDA loss kernel takes at most 16 classes");
    const std::int64_t Tn = c_.T, B = s_.batch, E = c_.E, H = c_.H, C = c_.C, D = c_.D, N = Tn * B;
    HOTOPS_CHECK(N * std::max(E, D * H) < (std::int64_t{1} << 31), "model_bilstm: batch too large");
    // The LSTM as kernels/lstm's problem (bf16: bf16 data on tensor ops with f32 sums, the lstm
    // entries' math): its plan, and where its weight space keeps PyTorch's tensors (the f32 masters
    // mirror the space element for element).
    lstm::Shape ls;
    ls.dir = s_.train() ? Direction::bwd : Direction::fwd;
    ls.dtype = s_.dtype;
    ls.T = Tn, ls.B = B, ls.I = E, ls.H = H;
    ls.bidirectional = D == 2;
    rnn_ = lstm::make_cuda_plan(ls);
    cudnn_bf16_ = s_.bf16() && !lstm::cuda_takes_hotops(ls);
    {
      const std::unique_ptr<lstm::Layout> layout = lstm::make_cuda_layout(ls);
      w_bytes_ = layout->weight_bytes();
      positions_ = layout->positions();
    }
    // The device layout: embed (not one_hot) | the LSTM's weight space (its elements, as f32 masters
    // for bf16) | dense W | dense b.
    w_elems_ = w_bytes_ / es_;
    embed_ = 0;
    lstm_ = aligned(static_cast<std::size_t>(c_.embed_count()));
    dense_w_ = lstm_ + aligned(w_elems_);
    dense_b_ = dense_w_ + aligned(static_cast<std::size_t>(D * H * C));
    total_ = dense_b_ + aligned(static_cast<std::size_t>(C));
    params_ = gpu::DeviceBuffer(total_ * sizeof(float));
    HOTOPS_CHECK_CUDA(cudaMemsetAsync(params_.get(), 0, params_.bytes(), gpu::stream()));
    if (s_.bf16()) {  // the bf16 copy of the device layout (the GEMMs and the LSTM read [lstm_, total_))
      low_ = gpu::DeviceBuffer(total_ * sizeof(__nv_bfloat16));
    }
    load_params();  // bf16: casts the whole device layout, the padding included

    // The batch: the tokens, or (one_hot) x itself; the labels as the loss plan takes them.
    if (!c_.one_hot) tokens_ = gpu::DeviceBuffer(st_.tokens.size() * sizeof(std::int64_t));
    labels_ = gpu::DeviceBuffer(c_.fused_loss() ? st_.labels.size() * sizeof(std::int32_t) : st_.targets.size() * sizeof(std::int64_t));
    x_ = gpu::DeviceBuffer(static_cast<std::size_t>(N * E) * es_);
    upload_batch();
    y_ = gpu::DeviceBuffer(static_cast<std::size_t>(N * D * H) * es_);
    hT_ = gpu::DeviceBuffer(static_cast<std::size_t>(D * B * H) * es_);
    logits_ = gpu::DeviceBuffer(static_cast<std::size_t>(B * C) * es_);
    // The lookup (x in the LSTM's dtype from the f32 table) and the dense head over hT [D, B, H], on
    // the f32 masters or their bf16 copy.
    if (!c_.one_hot) {
      lookup_ = embedding::make_cuda_plan(embedding_shape(s_, Direction::fwd, s_.dtype));
      lookup_args_.idx = tokens_.as<const std::int64_t>(), lookup_args_.W = param(embed_), lookup_args_.out = x_.get();
    }
    head_ = matmul::make_cuda_plan(head_shape(s_, Direction::fwd));
    const void* W = s_.bf16() ? static_cast<const void*>(low(dense_w_)) : param(dense_w_);
    head_args_.a = hT_.get(), head_args_.b = W;
    head_args_.bias = s_.bf16() ? static_cast<const void*>(low(dense_b_)) : param(dense_b_);
    head_args_.out = logits_.get();
    if (s_.train()) {
      const std::size_t pbytes = total_ * sizeof(float);
      grads_ = gpu::DeviceBuffer(pbytes);
      m_ = gpu::DeviceBuffer(pbytes);
      v_ = gpu::DeviceBuffer(pbytes);
      HOTOPS_CHECK_CUDA(cudaMemsetAsync(grads_.get(), 0, pbytes, gpu::stream()));  // the padding stays zero
      loss_ = gpu::DeviceBuffer(sizeof(float));
      state_ = gpu::DeviceBuffer(sizeof(StepState));
      dlogits_ = gpu::DeviceBuffer(logits_.bytes());
      dhT_ = gpu::DeviceBuffer(hT_.bytes());
      dy_ = gpu::DeviceBuffer(y_.bytes());
      HOTOPS_CHECK_CUDA(cudaMemsetAsync(dy_.get(), 0, dy_.bytes(), gpu::stream()));  // only hT feeds the head
      dx_ = gpu::DeviceBuffer(x_.bytes());
      if (s_.bf16()) dw_low_ = gpu::DeviceBuffer(w_bytes_);
      lstm_args_.dy = dy_.get(), lstm_args_.dhT = dhT_.get(), lstm_args_.dx = dx_.get();
      lstm_args_.dweights = s_.bf16() ? dw_low_.get() : static_cast<void*>(grads_.as<float>() + lstm_);
      // The head's gradients (dW f32 into the gradients, dhT in the LSTM's dtype), the bf16 weight
      // gradients widened into the f32 ones, the embedding's gradient from dx in the LSTM's dtype.
      head_wgrad_ = matmul::make_cuda_plan(head_shape(s_, Direction::bwd_weight));
      head_wgrad_args_.a = hT_.get(), head_wgrad_args_.dout = dlogits_.get();
      head_wgrad_args_.out = grads_.as<float>() + dense_w_;
      head_dgrad_ = matmul::make_cuda_plan(head_shape(s_, Direction::bwd_data, s_.dtype));
      head_dgrad_args_.dout = dlogits_.get(), head_dgrad_args_.b = W, head_dgrad_args_.out = dhT_.get();
      if (s_.bf16()) {
        copy::Shape cs;
        cs.kind = copy::Kind::bf16_to_f32, cs.src = DType::bf16, cs.dst = DType::f32, cs.count = w_elems_;
        widen_ = copy::make_cuda_plan(cs);
        widen_args_ = {dw_low_.get(), grads_.as<float>() + lstm_};
      }
      if (!c_.one_hot) {
        lookup_bwd_ = embedding::make_cuda_plan(embedding_shape(s_, Direction::bwd, s_.dtype));
        lookup_bwd_args_.idx = tokens_.as<const std::int64_t>(), lookup_bwd_args_.dout = dx_.get();
        lookup_bwd_args_.dW = grads_.as<float>() + embed_;
      }
      // The loss: one cross_entropy_dbias launch that also advances AdamW's step count, or
      // cross_entropy fwd (loss, lse) and bwd (dlogits), bias_grad, and AdamW advancing it itself.
      xent_args_.logits = logits_.get(), xent_args_.loss = loss_.get();
      if (c_.fused_loss()) {
        xent_ = loss::make_cuda_plan(loss::dbias_shape(s_.dtype, B, C));
        xent_args_.labels = labels_.as<const std::int32_t>(), xent_args_.dlogits = dlogits_.get();
        xent_args_.db = grads_.as<float>() + dense_b_;
        xent_args_.advance = state_.as<StepState>(), xent_args_.hyper = &hyper_;
      } else {
        xent_ = loss::make_cuda_plan(loss_shape(s_, Direction::fwd));
        xent_bwd_ = loss::make_cuda_plan(loss_shape(s_, Direction::bwd));
        bias_ = matmul::bias_grad::make_cuda_plan(bias_grad_shape(s_));
        lse_ = gpu::DeviceBuffer(static_cast<std::size_t>(B) * sizeof(float));
        one_ = gpu::DeviceBuffer(sizeof(float));
        HOTOPS_CHECK_CUDA(cudaMemcpyAsync(one_.get(), &kOne, sizeof(float), cudaMemcpyHostToDevice, gpu::stream()));
        xent_args_.target = labels_.as<const std::int64_t>(), xent_args_.lse = lse_.get();
        xent_bwd_args_.logits = logits_.get(), xent_bwd_args_.target = labels_.as<const std::int64_t>();
        xent_bwd_args_.saved_lse = lse_.get(), xent_bwd_args_.dloss = one_.get(), xent_bwd_args_.dlogits = dlogits_.get();
        bias_args_.dy = dlogits_.get(), bias_args_.db = grads_.as<float>() + dense_b_;
      }
      restart_optimizer();
    }
    if (s_.gpus) {  // data parallel: this rank's shard of the global batch, and the all-reduce of the flat gradients
      replicas_.start(p, s_, static_cast<std::size_t>(c_.T), [&](const Shape& g) { return make_state(g, l_, models::step_seed(p)); },
                      st_, grads_.as<float>(), total_);
      upload_batch();
    }
    // Zero initial states (h0, c0 null), cT not kept; dy zero, dcT null (zero), dh0 and dc0 not asked for.
    lstm_args_.x = x_.get(), lstm_args_.weights = weights(), lstm_args_.y = y_.get(), lstm_args_.hT = hT_.get();
    if (s_.variant == Variant::e2e && !s_.train()) logits_host_ = HostBuffer(s_.dtype, static_cast<std::size_t>(B * C));
    // One step outside any capture first, so that whatever the libraries set up lazily on a first call
    // exists before a capture; then back to the seeded start.
    device_step();
    HOTOPS_CHECK_CUDA(cudaStreamSynchronize(gpu::stream()));
    load_params();
    if (s_.train()) restart_optimizer();
    HOTOPS_CHECK_CUDA(cudaStreamSynchronize(gpu::stream()));
    if (s_.variant == Variant::graph) {
      std::string why;
      if (!graph_.capture([this] { device_step(); }, &why))
        throw Error("model_bilstm: the step could not be captured into a CUDA graph: " + why,
                    ErrorKind::unsupported);
    } else if (s_.variant == Variant::plain) {
      // Whether the harness may put the plain step into its graphs (cuDNN does not document capture
      // of its RNN calls): tried once, the trial graph dropped. A bf16 step on cuDNN's LSTM keeps it
      // and replays it (see replays()): cuDNN's bf16 RNN calls are host-bound.
      std::string why;
      capturable_ = graph_.capture([this] { device_step(); }, &why);
      if (!replays()) graph_.reset();
    }
    HOTOPS_CHECK_CUDA(cudaStreamSynchronize(gpu::stream()));
  }

  void run() override {
    // An instrumented pass runs the step eagerly, to see its ops.
    const bool eager = trace::active() != nullptr;
    if (s_.variant == Variant::plain) return replays() && !eager ? graph_.launch() : device_step();
    trace::op("copy_h2d");
    upload_batch();
    if (s_.variant == Variant::graph && !eager) graph_.launch();
    else device_step();
    trace::op("copy_d2h");
    if (s_.train())
      HOTOPS_CHECK_CUDA(cudaMemcpyAsync(&loss_host_, loss_.get(), sizeof(float), cudaMemcpyDeviceToHost, gpu::stream()));
    else
      HOTOPS_CHECK_CUDA(cudaMemcpyAsync(logits_host_.data(), logits_.get(), logits_host_.bytes(), cudaMemcpyDeviceToHost,
                                        gpu::stream()));
    HOTOPS_CHECK_CUDA(cudaStreamSynchronize(gpu::stream()));
  }

  Check verify() override {
    load_params();
    logits_.poison();
    if (s_.train()) {
      restart_optimizer();
      // Poison the tensors, keep the padding zero.
      poison(grads_.as<float>() + embed_, c_.embed_count());
      poison(grads_.as<float>() + lstm_, static_cast<std::int64_t>(w_elems_));
      poison(grads_.as<float>() + dense_w_, c_.D * c_.H * c_.C);
      poison(grads_.as<float>() + dense_b_, c_.C);
    }
    run();
    HOTOPS_CHECK_CUDA(cudaStreamSynchronize(gpu::stream()));
    Outcome o;
    if (!s_.train() || s_.bf16()) {  // bf16 train checks the step's logits too (model_bilstm.cpp)
      o.logits = replicas_.samples(logits_.get(), s_.dtype, static_cast<std::size_t>(c_.C), s_.batch);
      if (!s_.train()) return verify_outcome(s_, l_, st_, o);
    }
    o.loss = static_cast<float>(last_loss());
    HostBuffer g(DType::f32, total_), p(DType::f32, total_);
    grads_.download(g);
    params_.download(p);
    o.grads = to_canonical(g);
    o.params = to_canonical(p);
    // The verified start is the seeded one (a data-parallel step's: the global batch's, of which this rank ran its shard).
    Check c = replicas_.check(s_, st_, replicas_.global_seeded, o,
                              [&](const Shape& sh, const State& st, const Outcome& out) { return verify_outcome(sh, l_, st, out); });
    c.merge(adamw::check_device_step(state_.as<const StepState>(), 1), "step");
    return c;
  }

  std::string label() const override {
    std::string l = s_.bf16() ? std::string(s_.train() ? "bf16 autocast (f32 master weights, the AdamW launch writes their bf16 copy); "
                                                       : "bf16 autocast (f32 master weights, hotops cast_params of the LSTM and dense "
                                                         "weights once); ")
                              : std::string();
    l += std::string("LSTM") + (c_.D == 2 ? " bidirectional" : "") + (s_.train() ? " training forward + backward" : " inference") +
         " (kernels/lstm's plan: " + rnn_->label() + "); " + input_label() + "; dense head plans (" + head_->label() + ")";
    if (s_.train())
      l += "; " + loss_label(s_.bf16() ? " (f32 math, bf16 dlogits)" : "") + (s_.bf16() ? ", bf16 dweights widened (copy plan)" : "") +
           backward_label();
    if (s_.variant == Variant::plain && !capturable_) l += "; not graph-capturable (capture failed at setup): launched one by one";
    if (replays())
      l += "; replayed as the CUDA graph captured at setup (cuDNN's bf16 RNN calls cost 5-14 ms of host time a step: "
           "e2e:1 shows it)";
    if (s_.variant == Variant::e2e) l += "; e2e: pageable H2D of the tokens (and labels), launches, D2H, sync";
    if (s_.variant == Variant::graph) l += "; graph: pageable H2D of tokens and labels, 1 CUDA graph, D2H loss, sync";
    if (replicas_.sync) l += replicas_.sync->label();
    return l;
  }

  std::string input_label() const { return lookup_ ? "embedding plan (" + lookup_->label() + ")" : "one-hot input"; }
  std::string loss_label(const std::string& math) const {
    return c_.fused_loss() ? "cross_entropy_dbias plan" + math
                           : "cross_entropy fwd and bwd plans" + math + ", bias_grad plan (" + bias_->label() + ")";
  }
  std::string backward_label() const {
    return (lookup_bwd_ ? ", embedding bwd plan (" + lookup_bwd_->label() + ")" : std::string()) +
           (replicas_.sync ? "" : ", AdamW 1 launch");  // data parallel: a launch per bucket (the all-reduce's label)
  }

  // The harness may capture a plain step into its graphs, but one that replays: it already is one.
  bool capturable() const override { return s_.variant == Variant::plain && capturable_ && !replays(); }
  // Whether a plain step replays the graph captured at setup: a bf16 step on cuDNN's LSTM does (a
  // hidden size hotops' kernels do not take), where the capture worked. cuDNN 9.14's bf16 RNN calls
  // take 5-14 ms of host time per step on the H100 host, whatever the algorithm, math type or states
  // (tools/cudnn_rnn_bf16_probe.cu; f32's take under 0.4 ms), far more than their GPU work: launched
  // one by one, the device time would be the host's enqueueing. The replayed graph is the same device
  // work; e2e:1 still launches one by one and shows the host cost.
  bool replays() const { return cudnn_bf16_ && s_.variant == Variant::plain && capturable_; }
  bool host_timed() const override { return s_.variant != Variant::plain; }
  void align() override {
    if (replicas_.sync) replicas_.sync->align();
  }

  double last_loss() override {
    HOTOPS_CHECK(s_.train(), "model_bilstm: an infer case has no loss");
    return gpu::read_float(loss_.get());
  }
  Check bf16_copy_check() override {
    if (!s_.bf16()) return {};
    return models::bf16_copy_of(params_, low_, total_, s_.train() ? 0 : lstm_);  // infer: the embedding table stays f32
  }

 private:
  const float* param(std::size_t offset) const { return params_.as<float>() + offset; }
  // bf16: the step's copy of the master at `offset` (in [lstm_, total_)).
  __nv_bfloat16* low(std::size_t offset) const { return low_.as<__nv_bfloat16>() + offset; }
  // The LSTM's weight space: the f32 masters' LSTM region, or its bf16 copy.
  void* weights() const {
    return s_.bf16() ? static_cast<void*>(low(lstm_)) : static_cast<void*>(params_.as<float>() + lstm_);
  }


  static void poison(float* at, std::int64_t n) {
    HOTOPS_CHECK_CUDA(cudaMemsetAsync(at, 0xFF, static_cast<std::size_t>(n) * sizeof(float), gpu::stream()));
  }

  void upload_batch() {
    if (c_.one_hot)
      HOTOPS_CHECK_CUDA(cudaMemcpyAsync(x_.get(), st_.x.data(), x_.bytes(), cudaMemcpyHostToDevice, gpu::stream()));
    else
      HOTOPS_CHECK_CUDA(cudaMemcpyAsync(tokens_.get(), st_.tokens.data(), tokens_.bytes(), cudaMemcpyHostToDevice, gpu::stream()));
    if (!s_.train()) return;
    const void* labels = c_.fused_loss() ? static_cast<const void*>(st_.labels.data()) : static_cast<const void*>(st_.targets.data());
    HOTOPS_CHECK_CUDA(cudaMemcpyAsync(labels_.get(), labels, labels_.bytes(), cudaMemcpyHostToDevice, gpu::stream()));
  }

  void restart_optimizer() {
    HOTOPS_CHECK_CUDA(cudaMemsetAsync(m_.get(), 0, m_.bytes(), gpu::stream()));
    HOTOPS_CHECK_CUDA(cudaMemsetAsync(v_.get(), 0, v_.bytes(), gpu::stream()));
    // No step taken: the loss plan advances the count (zeroed), or AdamW's launch does (first_step).
    if (c_.fused_loss())
      HOTOPS_CHECK_CUDA(cudaMemsetAsync(state_.get(), 0, sizeof(StepState), gpu::stream()));
    else
      HOTOPS_CHECK_CUDA(cudaMemcpyAsync(state_.get(), &first_, sizeof(StepState), cudaMemcpyHostToDevice, gpu::stream()));
  }

  // The seeded parameters in the device layout and, bf16, their bf16 copy: cast wherever they are
  // loaded, and written from then on by a train step's AdamW launch (infer's stays as cast, as
  // autocast's weight cache holds it).
  void load_params() {
    params_.upload(to_device(st_.params));
    if (s_.bf16()) cast_weights();
  }

  // Between the canonical flat layout (model_bilstm.h) and the device's, either way.
  void convert(HostBuffer& canonical, HostBuffer& device, bool to_dev) const {
    float* can = canonical.as<float>();
    float* dev = device.as<float>();
    const auto move = [&](std::size_t c_at, std::size_t d_at, std::size_t n) {
      if (to_dev) std::copy_n(can + c_at, n, dev + d_at);
      else std::copy_n(dev + d_at, n, can + c_at);
    };
    move(l_.embed, embed_, static_cast<std::size_t>(c_.embed_count()));
    move(l_.dense_w, dense_w_, static_cast<std::size_t>(c_.D * c_.H * c_.C));
    move(l_.dense_b, dense_b_, static_cast<std::size_t>(c_.C));
    const std::pair<std::size_t, const std::vector<std::size_t>*> tensors[] = {
        {l_.w_ih, &positions_.w_ih}, {l_.w_hh, &positions_.w_hh}, {l_.b_ih, &positions_.b_ih}, {l_.b_hh, &positions_.b_hh}};
    for (const auto& [at, where] : tensors)
      for (std::size_t i = 0; i < where->size(); ++i) move(at + i, lstm_ + (*where)[i], 1);
  }
  HostBuffer to_device(const HostBuffer& canonical) const {
    HostBuffer dev(DType::f32, total_), can = canonical;
    std::fill_n(dev.as<float>(), total_, 0.f);
    convert(can, dev, true);
    return dev;
  }
  HostBuffer to_canonical(HostBuffer& device) const {
    HostBuffer can(DType::f32, l_.total);
    std::fill_n(can.as<float>(), l_.total, 0.f);
    convert(can, device, false);
    return can;
  }

  // The bf16 copy of the device layout, the padding included.
  void cast_weights() const {
    const auto n4 = static_cast<std::int64_t>(total_ / 4);
    cast_params<<<blocks_for(n4, 256, 1024), 256, 0, gpu::stream()>>>(params_.as<const float4>(), low_.as<__nv_bfloat162>(), n4);
    HOTOPS_CHECK_LAUNCH();
  }

  // The step on the LSTM's dtype (bf16: on the weights' copy, train's written by the AdamW launch,
  // infer's cast once at the start), through the plans.
  void device_step() {
    if (lookup_) {
      trace::op("embedding");
      lookup_->run(lookup_args_);
    }
    trace::op("lstm");
    if (s_.train()) rnn_->forward(lstm_args_);
    else rnn_->run(lstm_args_);
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
    trace::op("mm");
    head_wgrad_->run(head_wgrad_args_);
    models::grads_ready(replicas_.sync, dense_w_);  // the dense head's are final
    head_dgrad_->run(head_dgrad_args_);

    trace::op("lstm_bwd");  // the dweights zeroed, BackwardData, BackwardWeights (ADD)
    rnn_->run(lstm_args_);
    if (widen_) {
      trace::op("copy");  // the LSTM's bf16 weight gradients into the f32 ones
      widen_->run(widen_args_);
    }
    models::grads_ready(replicas_.sync, lstm_);  // the LSTM's (its weight space) and the head's are final

    if (lookup_bwd_) {
      trace::op("embedding_bwd");  // the batch's tokens sorted on the device, then every row of dE
      lookup_bwd_->run(lookup_bwd_args_);
    }

    // The step count advanced by the loss plan (fused_loss) or by the (last) AdamW launch.
    models::adamw_step(replicas_.sync, {params_.as<float>(), grads_.as<const float>(), m_.as<float>(), v_.as<float>(),
                       s_.bf16() ? low_.as<std::uint16_t>() : nullptr, total_, state_.as<StepState>(),
                       c_.fused_loss() ? nullptr : &hyper_});
  }

  Shape s_;
  Config c_;
  Layout l_;  // the canonical layout
  State st_;  // the seeded start, and the batch in pageable host memory for the e2e variants
  std::size_t es_;  // the LSTM's data element size: 4 (f32) or 2 (bf16)
  std::size_t embed_ = 0, lstm_ = 0, dense_w_ = 0, dense_b_ = 0, total_ = 0;  // the device layout, floats
  std::size_t w_elems_ = 0;  // the LSTM's weight space, in elements
  std::unique_ptr<lstm::Plan> rnn_;  // the LSTM on its weight space (the masters' LSTM region)
  bool cudnn_bf16_ = false;          // bf16 on cuDNN's LSTM (host-bound calls: see replays())
  lstm::Args lstm_args_;
  lstm::Layout::Positions positions_;  // PyTorch's LSTM tensors in that space, for the conversions
  std::size_t w_bytes_ = 0;
  gpu::DeviceBuffer params_, grads_, m_, v_, tokens_, labels_, x_, y_, hT_, logits_;  // labels_: int32, or int64 targets
  gpu::DeviceBuffer loss_, state_, dlogits_, dhT_, dy_, dx_;
  gpu::DeviceBuffer low_, dw_low_;  // bf16: the copy of the device layout (train: written by AdamW), the LSTM's bf16 dweights
  std::unique_ptr<embedding::Plan> lookup_, lookup_bwd_;            // the gather; train: its gradient (not one_hot)
  std::unique_ptr<matmul::Plan> head_, head_wgrad_, head_dgrad_;   // the dense head; train: dW, dhT
  std::unique_ptr<copy::Plan> widen_;                              // bf16 train: the LSTM's dweights to f32
  embedding::Args lookup_args_, lookup_bwd_args_;
  matmul::Args head_args_, head_wgrad_args_, head_dgrad_args_;
  copy::Args widen_args_;
  std::unique_ptr<loss::Plan> xent_, xent_bwd_;               // train: the head's loss and gradients (xent_bwd_: not fused_loss)
  std::unique_ptr<matmul::bias_grad::Plan> bias_;             // train, not fused_loss: the dense bias gradient
  loss::Args xent_args_, xent_bwd_args_;
  matmul::bias_grad::Args bias_args_;
  gpu::DeviceBuffer lse_, one_;                               // not fused_loss: the saved lse, dloss = 1
  static constexpr float kOne = 1.f;
  adamw::Hyper hyper_ = models::hyper();                      // AdamW's, as the loss plan or the AdamW launch advances the step count
  StepState first_ = adamw::first_step(models::hyper());      // not fused_loss: the count before the first step
  HostBuffer logits_host_;
  float loss_host_ = 0;
  bool capturable_ = false;
  gpu::StepGraph graph_;  // graph:1
  models::BatchReplica<Shape, State, SampleShard> replicas_;  // gpus:G (data parallel)
};

}  // namespace

std::unique_ptr<ModelCase> make_cuda(const Problem& p) { return std::make_unique<CudaBilstm>(p); }

}  // namespace hotops::model_bilstm
