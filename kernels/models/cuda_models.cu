// models on CUDA: the matmul family's plans (cublasLt GEMMs with bias/ReLU epilogues), the loss
// family's cross_entropy_dbias plan (the head's loss, dlogits and bias gradient), the pointwise
// family's relu_dbias plan (ReLU backward with the bias gradient) and relu_bias plan (where cublasLt
// has no bias epilogue; the loss plan also advances the optimizer's step count), and AdamW. The step op
// by op, with its launch count: docs/models.md, "How each model step runs".
#include <cuda_bf16.h>

#include <algorithm>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "hotops/cublaslt_gemm.h"
#include "hotops/cuda_util.h"
#include "hotops/trace.h"
#include "kernels/matmul/matmul.h"
#include "kernels/models/cuda_dense.h"
#include "kernels/models/cuda_step.cuh"
#include "kernels/models/data_parallel.h"
#include "kernels/models/models.h"

namespace hotops::models {
namespace {

class CudaModel final : public ModelCase {
 public:
  explicit CudaModel(const Problem& p) : s_(shape_of(p)), l_(param_layout(s_.widths)), st_(make_state(s_, l_, step_seed(p))) {
    const std::size_t L = s_.layers();
    const std::int64_t B = s_.batch;
    HOTOPS_CHECK(s_.classes() <= kMaxClasses, "models: the CUDA loss plan takes at most 16 classes");
    HOTOPS_CHECK(B < (std::int64_t{1} << 31) / kMaxClasses, "models: batch too large");
    const std::size_t pbytes = l_.total * sizeof(float);
    const std::size_t e = dtype_size(s_.dtype);  // bytes of a stored activation
    params_ = gpu::DeviceBuffer(st_.params);
    if (s_.bf16()) {
      low_ = gpu::DeviceBuffer(l_.total * e);
      cast_all_params();
    }
    x_ = gpu::DeviceBuffer(st_.x);
    labels_ = gpu::DeviceBuffer(st_.labels.size() * sizeof(std::int32_t));
    HOTOPS_CHECK_CUDA(cudaMemcpyAsync(labels_.get(), st_.labels.data(), labels_.bytes(), cudaMemcpyHostToDevice, gpu::stream()));
    act_.resize(L + 1);
    dact_.resize(L + 1);
    for (std::size_t k = 0; k < L; ++k) {
      act_[k + 1] = gpu::DeviceBuffer(static_cast<std::size_t>(B * s_.out(k)) * e);
      if (s_.train()) dact_[k + 1] = gpu::DeviceBuffer(static_cast<std::size_t>(B * s_.out(k)) * e);
    }
    if (s_.train()) {
      grads_ = gpu::DeviceBuffer(pbytes);
      m_ = gpu::DeviceBuffer(pbytes);
      v_ = gpu::DeviceBuffer(pbytes);
      HOTOPS_CHECK_CUDA(cudaMemsetAsync(grads_.get(), 0, pbytes, gpu::stream()));  // the padding stays zero
      loss_ = gpu::DeviceBuffer(sizeof(float));
      state_ = gpu::DeviceBuffer(sizeof(StepState));
      restart_optimizer();
    }
    if (s_.variant == Variant::e2e && !s_.train()) logits_host_ = HostBuffer(s_.dtype, static_cast<std::size_t>(B * s_.classes()));

    for (std::size_t k = 0; k < L; ++k) {
      fwd_.emplace_back(forward_gemm(s_, k), relu_bias_shape(s_, k));
      if (!s_.train()) continue;
      wgrad_.push_back(matmul::make_cuda_plan(weight_grad_gemm(s_, k)));
      dgrad_.push_back(k == 0 ? nullptr : matmul::make_cuda_plan(data_grad_gemm(s_, k)));
      if (k + 1 < L) relu_dbias_.push_back(pointwise::make_cuda_plan(relu_dbias_shape(s_, k)));
    }
    if (s_.train()) xent_ = loss::make_cuda_plan(loss::dbias_shape(s_.dtype, B, s_.classes()));
    if (s_.gpus) start_replica(p);
    if (s_.variant == Variant::graph) {
      // Everything the step touches that is created lazily (the cublasLt handle, its workspace)
      // must exist before the capture: allocation is not allowed while the stream is capturing.
      gpu::cublaslt();
      gpu::cublas_workspace();
      HOTOPS_CHECK_CUDA(cudaStreamSynchronize(gpu::stream()));
      std::string why;
      if (!graph_.capture([this] { device_step(); }, &why))
        throw Error("models: the step could not be captured into a CUDA graph: " + why);
    }
    HOTOPS_CHECK_CUDA(cudaStreamSynchronize(gpu::stream()));
  }

  void run() override {
    if (s_.variant == Variant::plain) return device_step();
    // What a program pays for a step: the batch from pageable host memory, the step, the result back.
    trace::op("copy_h2d");
    HOTOPS_CHECK_CUDA(cudaMemcpyAsync(x_.get(), st_.x.data(), x_.bytes(), cudaMemcpyHostToDevice, gpu::stream()));
    HOTOPS_CHECK_CUDA(cudaMemcpyAsync(labels_.get(), st_.labels.data(), labels_.bytes(), cudaMemcpyHostToDevice, gpu::stream()));
    // An instrumented pass runs the graph's step eagerly, to see its ops.
    if (s_.variant == Variant::graph && !trace::active()) graph_.launch();
    else device_step();
    trace::op("copy_d2h");
    if (s_.train())
      HOTOPS_CHECK_CUDA(cudaMemcpyAsync(&loss_host_, loss_.get(), sizeof(float), cudaMemcpyDeviceToHost, gpu::stream()));
    else
      HOTOPS_CHECK_CUDA(cudaMemcpyAsync(logits_host_.data(), act_.back().get(), logits_host_.bytes(), cudaMemcpyDeviceToHost,
                                        gpu::stream()));
    HOTOPS_CHECK_CUDA(cudaStreamSynchronize(gpu::stream()));
  }

  Check verify() override {
    load_params(st_.params);
    for (std::size_t k = 1; k < act_.size(); ++k) act_[k].poison();
    if (s_.train()) {
      restart_optimizer();
      for (std::size_t k = 0; k < s_.layers(); ++k) {  // poison the gradients, keep the padding zero
        poison(grads_.as<float>() + l_.w[k], s_.in(k) * s_.out(k));
        poison(grads_.as<float>() + l_.b[k], s_.out(k));
      }
    }
    run();
    HOTOPS_CHECK_CUDA(cudaStreamSynchronize(gpu::stream()));
    Outcome o;
    if (!s_.train()) {
      o.logits = HostBuffer(s_.dtype, static_cast<std::size_t>(s_.batch * s_.classes()));
      act_.back().download(o.logits);
      return verify_outcome(s_, l_, st_, o);
    }
    o.loss = static_cast<float>(last_loss());
    o.grads = HostBuffer(DType::f32, l_.total);
    o.params = HostBuffer(DType::f32, l_.total);
    grads_.download(o.grads);
    params_.download(o.params);
    if (s_.gpus) return verify_replicas(o);
    for (std::size_t k = 1; k + 1 < act_.size(); ++k) {
      o.hidden.emplace_back(s_.dtype, static_cast<std::size_t>(s_.batch * s_.out(k - 1)));
      act_[k].download(o.hidden.back());
    }
    Check c = verify_outcome(s_, l_, st_, o);
    c.merge(adamw::check_device_step(state_.as<const StepState>(), 1), "step");
    return c;
  }

  std::string label() const override {
    int launches = 0, unfused = 0;
    std::vector<std::string> gemms;  // each distinct matmul plan label once, in step order
    auto count = [&](const matmul::Plan* g) {
      if (!g) return;
      ++launches;
      if (std::find(gemms.begin(), gemms.end(), g->label()) == gemms.end()) gemms.push_back(g->label());
    };
    for (const DenseForward& f : fwd_) count(f.gemm.get()), launches += f.bias != nullptr, unfused += f.bias != nullptr;
    for (const auto* list : {&wgrad_, &dgrad_})
      for (const auto& g : *list) count(g.get());
    if (s_.train()) launches += 1 + static_cast<int>(s_.layers()) - 1 + 1;  // loss, ReLU backward, AdamW
    std::string list;
    for (const std::string& g : gemms) list += (list.empty() ? "" : "; ") + g;
    const char* bf16 = !s_.bf16()   ? ""
                       : s_.train() ? "bf16 autocast (f32 master weights, the AdamW launch writes their bf16 copy), "
                                    : "bf16 autocast (f32 master weights, their bf16 copy cast once by hotops cast_params), ";
    std::string l = std::string(bf16) +
                    std::to_string(s_.layers()) + " dense layers: matmul plans, " +
                    (s_.bf16() ? "bf16, f32 accumulation" : "f32") + " [" + list + "], " +
                    (unfused ? std::to_string(unfused) + " bias epilogue(s) as relu_bias plans" : "bias/ReLU epilogues");
    if (s_.train()) l += " + cross_entropy_dbias and relu_dbias plans, AdamW 1 launch (the loss plan advances the step)";
    l += ", " + std::to_string(launches) + " launches a step";
    if (s_.variant == Variant::e2e) l += "; e2e: pageable H2D of the batch, launches, D2H, sync";
    if (s_.variant == Variant::graph) l += "; graph: pageable H2D of the batch, 1 CUDA graph, D2H loss, sync";
    if (sync_) l += sync_->label();
    return l;
  }

  bool capturable() const override { return s_.variant == Variant::plain; }
  void align() override {
    if (sync_) sync_->align();
  }
  bool host_timed() const override { return s_.variant != Variant::plain; }

  double last_loss() override {
    HOTOPS_CHECK(s_.train(), "models: an infer case has no loss");
    return gpu::read_float(loss_.get());
  }
  Check bf16_copy_check() override {
    if (!s_.bf16()) return {};
    return bf16_copy_of(params_, low_, l_.total);
  }

 private:
  // The weights the GEMMs multiply at `offset` (floats of the layout): the f32 parameters, or their
  // bf16 copy.
  const void* weight(std::size_t offset) const {
    if (s_.bf16()) return low_.as<__nv_bfloat16>() + offset;
    return params_.as<float>() + offset;
  }
  const void* input(std::size_t k) const { return k == 0 ? x_.get() : act_[k].get(); }

  static void poison(float* at, std::int64_t n) {
    HOTOPS_CHECK_CUDA(cudaMemsetAsync(at, 0xFF, static_cast<std::size_t>(n) * sizeof(float), gpu::stream()));
  }

  // A data-parallel step: the global batch of the G replicas (samples and parameters seeded as the
  // single-GPU step at batch G x B seeds them), this rank's shard of it, and the gradients' all-reduce.
  void start_replica(const Problem& p) {
    const Replica r = replica_of(p);
    global_ = s_;
    global_.batch = s_.batch * r.gpus, global_.gpus = 0;
    global_start_ = make_state(global_, l_, step_seed(p));
    st_.x = shard(global_start_.x, static_cast<std::size_t>(s_.widths[0]), r, s_.batch);
    st_.labels = shard(global_start_.labels, 1, r, s_.batch);
    x_.upload(st_.x);
    HOTOPS_CHECK_CUDA(cudaMemcpyAsync(labels_.get(), st_.labels.data(), labels_.bytes(), cudaMemcpyHostToDevice, gpu::stream()));
    replica_ = r;
    sync_ = std::make_unique<GradSync>(r, p.dtype, grads_.as<float>(), l_.total);
  }

  // The check of a data-parallel step (after its run from the seeded start): every replica's
  // parameters and gradients are rank 0's bitwise, and rank 0's are one step over the global batch
  // against the reference at G x B (the loss: the replicas' mean; the ReLU ties: every replica's
  // hidden activations, gathered in rank order, which is the global batch's order).
  Check verify_replicas(Outcome& o) {
    for (std::size_t k = 1; k + 1 < act_.size(); ++k) {
      o.hidden.emplace_back(s_.dtype, static_cast<std::size_t>(global_.batch * s_.out(k - 1)));
      gpu::DeviceBuffer all(o.hidden.back().bytes());
      sync_->all_gather(act_[k].get(), all.get(), act_[k].bytes());
      all.download(o.hidden.back());
    }
    Check c = models::verify_replicas(*sync_, replica_, o, [&](const Outcome& out) { return verify_outcome(global_, l_, global_start_, out); });
    c.merge(adamw::check_device_step(state_.as<const StepState>(), 1), "step");
    return c;
  }

  // m = v = 0 and step 0, on the stream: a fresh optimizer.
  void restart_optimizer() {
    HOTOPS_CHECK_CUDA(cudaMemsetAsync(m_.get(), 0, m_.bytes(), gpu::stream()));
    HOTOPS_CHECK_CUDA(cudaMemsetAsync(v_.get(), 0, v_.bytes(), gpu::stream()));
    HOTOPS_CHECK_CUDA(cudaMemsetAsync(state_.get(), 0, sizeof(StepState), gpu::stream()));  // no step taken: the loss plan advances it
  }

  // The parameters from the host and, bf16, their bf16 copy: cast here, wherever they are loaded,
  // and written from then on by a train step's AdamW launch (infer's stays as cast, as autocast's
  // weight cache holds it).
  void load_params(const HostBuffer& from) {
    params_.upload(from);
    if (s_.bf16()) cast_all_params();
  }

  void cast_all_params() {
    const auto n4 = static_cast<std::int64_t>(l_.total / 4);
    const auto blocks = static_cast<unsigned>(std::min<std::int64_t>((n4 + 255) / 256, 1024));
    cast_params<<<blocks, 256, 0, gpu::stream()>>>(params_.as<const float4>(), low_.as<__nv_bfloat162>(), n4);
    HOTOPS_CHECK_LAUNCH();
  }

  // The step: f32, or bf16 on the parameters' bf16 copy (the plans know the storage): train's written
  // by the AdamW launch, infer's cast once at setup (its weights do not change): the layers' forward
  // and, for train, the loss, the backward and the optimizer.
  void device_step() {
    const std::size_t L = s_.layers();
    for (std::size_t k = 0; k < L; ++k) {
      trace::op("addmm");
      fwd_[k].run(input(k), weight(l_.w[k]), weight(l_.b[k]), act_[k + 1].get());
    }
    if (!s_.train()) return;
    trace::op("cross_entropy");
    loss::Args xa;
    xa.logits = act_[L].get(), xa.labels = labels_.as<const std::int32_t>(), xa.dlogits = dact_[L].get();
    xa.loss = loss_.get(), xa.db = grads_.as<float>() + l_.b[L - 1];
    xa.advance = state_.as<StepState>(), xa.hyper = &hyper_;
    xent_->run(xa);
    for (std::size_t k = L; k-- > 0;) {
      trace::op("mm");
      wgrad_[k]->run({input(k), nullptr, nullptr, dact_[k + 1].get(), grads_.as<float>() + l_.w[k], nullptr});
      grads_ready(sync_, l_.w[k]);  // layer k's (its bias's came before) and every later layer's
      if (k == 0) break;
      dgrad_[k]->run({nullptr, weight(l_.w[k]), nullptr, dact_[k + 1].get(), dact_[k].get(), nullptr});
      trace::op("relu_bwd");
      pointwise::Args r;
      r.x = act_[k].get(), r.dy = dact_[k].get(), r.out = dact_[k].get(), r.db = grads_.as<float>() + l_.b[k - 1];
      relu_dbias_[k - 1]->run(r);
    }
    adamw_step(sync_, {params_.as<float>(), grads_.as<const float>(), m_.as<float>(), v_.as<float>(),
               s_.bf16() ? low_.as<std::uint16_t>() : nullptr, l_.total, state_.as<StepState>(), nullptr});
  }

  Shape s_;
  ParamLayout l_;
  State st_;  // the seeded start, and the batch in pageable host memory for the e2e variants
  gpu::DeviceBuffer params_, grads_, m_, v_, x_, labels_, loss_, state_;
  gpu::DeviceBuffer low_;  // bf16: the bf16 copy of params_ (same layout) the GEMMs read
  std::vector<gpu::DeviceBuffer> act_, dact_;
  std::vector<DenseForward> fwd_;                            // per layer
  std::vector<std::unique_ptr<matmul::Plan>> wgrad_, dgrad_;  // per layer (dgrad_: null for the first)
  std::vector<std::unique_ptr<pointwise::Plan>> relu_dbias_;  // per hidden layer
  std::unique_ptr<loss::Plan> xent_;                          // train: the head's loss and gradients
  adamw::Hyper hyper_ = hyper();                              // AdamW's, as the loss plan advances the step count
  HostBuffer logits_host_;
  float loss_host_ = 0;
  gpu::StepGraph graph_;  // graph:1
  // gpus:G (data parallel): the global batch's shape and start, this replica, the all-reduce.
  Shape global_;
  State global_start_;
  Replica replica_;
  std::unique_ptr<GradSync> sync_;
};

}  // namespace

std::unique_ptr<ModelCase> make_cuda(const Problem& p) { return std::make_unique<CudaModel>(p); }

}  // namespace hotops::models
