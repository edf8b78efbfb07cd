// model_fasttext on CUDA: every op a plan of its family (embedding and global_avgpool: hotops' kernels;
// matmul: cublasLt, CUBLAS_COMPUTE_32F; bce_logits: hotops' kernels) and adamw::cuda_step, all on
// gpu::stream() with no host synchronisation (capturable). The step op by op, its bf16 form and its
// data-parallel form (gpus:G): docs/models.md, "kernels/model_fasttext/cuda_model_fasttext.cu".
#include <cuda_bf16.h>

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "hotops/cublaslt_gemm.h"
#include "hotops/cuda_util.h"
#include "hotops/trace.h"
#include "kernels/model_fasttext/model_fasttext.h"
#include "kernels/models/cuda_dense.h"
#include "kernels/models/cuda_step.cuh"
#include "kernels/models/data_parallel.h"

namespace hotops::model_fasttext {
namespace {

// The dense layer's bias pass where cublasLt has no bias epilogue for [B, 1] (relu_bias, no ReLU).
pointwise::Shape dense_bias_shape(const Shape& s) {
  pointwise::Shape p;
  p.op = pointwise::Op::relu_bias, p.dir = Direction::fwd, p.dtype = s.dtype;
  p.cols = 1, p.elements = s.batch, p.relu = false;
  return p;
}

class CudaFasttext final : public ModelCase {
 public:
  explicit CudaFasttext(const Problem& p)
      : s_(shape_of(p)), l_(layout_of(s_.cfg)), st_(make_state(s_, l_, models::step_seed(p))),
        dense_(dense_shape(s_), dense_bias_shape(s_)) {
    const std::int64_t B = s_.batch, N = s_.tokens(), E = s_.cfg.E;
    const std::size_t e = dtype_size(s_.dtype);  // bytes of a stored activation
    params_ = gpu::DeviceBuffer(st_.params);
    if (s_.bf16()) {
      low_ = gpu::DeviceBuffer(l_.total * e);
      cast_all_params();
    }
    tokens_ = gpu::DeviceBuffer(st_.tokens.size() * sizeof(std::int64_t));
    labels_ = gpu::DeviceBuffer(st_.labels);
    emb_ = gpu::DeviceBuffer(static_cast<std::size_t>(N * E) * e);
    pooled_ = gpu::DeviceBuffer(static_cast<std::size_t>(B * E) * e);
    logits_ = gpu::DeviceBuffer(static_cast<std::size_t>(B) * e);
    gather_ = embedding::make_cuda_plan(embedding_shape(s_, Direction::fwd));
    pool_ = avgpool::make_cuda_plan(pool_shape(s_, Direction::fwd));
    if (s_.train()) {
      const std::size_t pbytes = l_.total * sizeof(float);
      grads_ = gpu::DeviceBuffer(pbytes);
      m_ = gpu::DeviceBuffer(pbytes);
      v_ = gpu::DeviceBuffer(pbytes);
      HOTOPS_CHECK_CUDA(cudaMemsetAsync(grads_.get(), 0, pbytes, gpu::stream()));  // the padding stays zero
      loss_ = gpu::DeviceBuffer(sizeof(float));
      state_ = gpu::DeviceBuffer(sizeof(adamw::DeviceStep));
      dlogits_ = gpu::DeviceBuffer(logits_.bytes());
      dpooled_ = gpu::DeviceBuffer(pooled_.bytes());
      demb_ = gpu::DeviceBuffer(emb_.bytes());
      HostBuffer ones(s_.dtype, static_cast<std::size_t>(B));
      for (std::size_t i = 0; i < ones.count(); ++i) ones.set(i, 1.0);
      ones_ = gpu::DeviceBuffer(ones);
      if (s_.gpus)  // data parallel: this rank's shard of the global batch, and the all-reduce of the flat gradients
        replicas_.start(p, s_, static_cast<std::size_t>(s_.cfg.T),
                        [&](const Shape& g) { return make_state(g, l_, models::step_seed(p)); }, st_, grads_.as<float>(), l_.total);
      embedding::group_by_row(st_.tokens, s_.cfg.V, csr_);  // this rank's tokens
      offset_ = gpu::DeviceBuffer(csr_.offset.size() * sizeof(std::int32_t));
      pos_ = gpu::DeviceBuffer(csr_.pos.size() * sizeof(std::int32_t));
      bce_ = loss::bce::make_cuda_plan(bce_shape(s_, Direction::fwd));
      bce_bwd_ = loss::bce::make_cuda_plan(bce_shape(s_, Direction::bwd));
      wgrad_ = matmul::make_cuda_plan(dense_wgrad_shape(s_));
      bgrad_ = matmul::make_cuda_plan(dense_bgrad_shape(s_));
      dgrad_ = matmul::make_cuda_plan(dense_dgrad_shape(s_));
      pool_bwd_ = avgpool::make_cuda_plan(pool_shape(s_, Direction::bwd));
      scatter_ = embedding::make_cuda_plan(embedding_shape(s_, Direction::bwd));
      restart_optimizer();
    }
    upload_batch();
    if (s_.variant == Variant::e2e && !s_.train()) logits_host_ = HostBuffer(s_.dtype, static_cast<std::size_t>(B));
    gpu::cublaslt();
    gpu::cublas_workspace();
    // One step outside any capture first, so that whatever the libraries set up lazily on a first call
    // exists before a capture; then back to the seeded start.
    device_step();
    HOTOPS_CHECK_CUDA(cudaStreamSynchronize(gpu::stream()));
    load_params(st_.params);
    if (s_.train()) restart_optimizer();
    if (s_.variant == Variant::graph) {
      HOTOPS_CHECK_CUDA(cudaStreamSynchronize(gpu::stream()));
      std::string why;
      if (!graph_.capture([this] { device_step(); }, &why))
        throw Error("model_fasttext: the step could not be captured into a CUDA graph: " + why);
    }
    HOTOPS_CHECK_CUDA(cudaStreamSynchronize(gpu::stream()));
  }

  void run() override {
    if (s_.variant == Variant::plain) return device_step();
    // What a program pays for a step: the batch from pageable host memory (train: with its tokens
    // grouped by row, built here on the host), the step, the result back.
    if (s_.train()) {
      trace::op("group_by_row");
      embedding::group_by_row(st_.tokens, s_.cfg.V, csr_);
    }
    trace::op("copy_h2d");
    upload_batch();
    // An instrumented pass runs the graph's step eagerly, to see its ops.
    if (s_.variant == Variant::graph && !trace::active()) graph_.launch();
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
    load_params(st_.params);
    emb_.poison(), pooled_.poison(), logits_.poison();
    if (s_.train()) {
      restart_optimizer();
      // Poison the tensors, keep the padding zero.
      poison(grads_.as<float>() + l_.embed, s_.cfg.V * s_.cfg.E);
      poison(grads_.as<float>() + l_.dense_w, s_.cfg.E);
      poison(grads_.as<float>() + l_.dense_b, 1);
    }
    run();
    HOTOPS_CHECK_CUDA(cudaStreamSynchronize(gpu::stream()));
    Outcome o;
    o.pooled = replicas_.samples(pooled_.get(), s_.dtype, static_cast<std::size_t>(s_.cfg.E), s_.batch);
    o.logits = replicas_.samples(logits_.get(), s_.dtype, 1, s_.batch);
    if (!s_.train()) return verify_outcome(s_, l_, st_, o);
    o.loss = static_cast<float>(last_loss());
    o.grads = HostBuffer(DType::f32, l_.total);
    o.params = HostBuffer(DType::f32, l_.total);
    grads_.download(o.grads);
    params_.download(o.params);
    // The verified start is the seeded one (a data-parallel step's: the global batch's, of which this rank ran its shard).
    Check c = replicas_.check(s_, st_, replicas_.global_seeded, o,
                              [&](const Shape& sh, const State& st, const Outcome& out) { return verify_outcome(sh, l_, st, out); });
    c.merge(adamw::check_device_step(state_.as<const adamw::DeviceStep>(), 1), "step");
    return c;
  }

  std::string label() const override {
    std::string l = !s_.bf16()   ? ""
                    : s_.train() ? "bf16 autocast (f32 master parameters, the AdamW launch writes their bf16 copy), "
                                 : "bf16 autocast (f32 master parameters, their bf16 copy cast once by models::cast_params), ";
    l += "embedding, global_avgpool, addmm [" + dense_.gemm->label() + "]";
    if (dense_.bias) l += " + relu_bias plan for the bias";
    if (s_.train())
      l += ", bce_logits fwd and bwd, mm for dW, db (ones^T . dlogits) and dpooled, global_avgpool bwd, embedding bwd "
           "from the tokens grouped by row on the host";
    if (s_.train() && !replicas_.sync) l += "; AdamW 1 launch";  // data parallel: a launch per bucket (the all-reduce's label)
    if (s_.variant == Variant::plain && s_.train()) l += "; the grouped tokens on the device with the batch";
    if (s_.variant == Variant::e2e) l += "; e2e: the batch (and its grouping) from pageable memory, launches, D2H, sync";
    if (s_.variant == Variant::graph) l += "; graph: the batch and its grouping from pageable memory, 1 CUDA graph, D2H loss, sync";
    if (replicas_.sync) l += replicas_.sync->label();
    return l;
  }

  bool capturable() const override { return s_.variant == Variant::plain; }
  bool host_timed() const override { return s_.variant != Variant::plain; }
  void align() override {
    if (replicas_.sync) replicas_.sync->align();
  }

  double last_loss() override {
    HOTOPS_CHECK(s_.train(), "model_fasttext: an infer case has no loss");
    return gpu::read_float(loss_.get());
  }
  Check bf16_copy_check() override {
    if (!s_.bf16()) return {};
    return models::bf16_copy_of(params_, low_, l_.total);
  }

 private:
  // The parameters the ops read at `offset` (floats of the layout): the f32 ones, or their bf16 copy.
  const void* weight(std::size_t offset) const {
    if (s_.bf16()) return low_.as<__nv_bfloat16>() + offset;
    return params_.as<float>() + offset;
  }

  static void poison(float* at, std::int64_t n) {
    HOTOPS_CHECK_CUDA(cudaMemsetAsync(at, 0xFF, static_cast<std::size_t>(n) * sizeof(float), gpu::stream()));
  }

  // The batch from host memory: the tokens, the labels and (train) the tokens grouped by row.
  void upload_batch() {
    const auto h2d = [](const gpu::DeviceBuffer& d, const void* h, std::size_t bytes) {
      HOTOPS_CHECK_CUDA(cudaMemcpyAsync(d.get(), h, bytes, cudaMemcpyHostToDevice, gpu::stream()));
    };
    h2d(tokens_, st_.tokens.data(), tokens_.bytes());
    h2d(labels_, st_.labels.data(), st_.labels.bytes());
    if (!s_.train()) return;
    h2d(offset_, csr_.offset.data(), offset_.bytes());
    h2d(pos_, csr_.pos.data(), pos_.bytes());
  }

  // m = v = 0 and the step count at its start, on the stream: a fresh optimizer (the AdamW launch
  // advances the count itself).
  void restart_optimizer() {
    HOTOPS_CHECK_CUDA(cudaMemsetAsync(m_.get(), 0, m_.bytes(), gpu::stream()));
    HOTOPS_CHECK_CUDA(cudaMemsetAsync(v_.get(), 0, v_.bytes(), gpu::stream()));
    start_ = adamw::first_step(hyper_);
    HOTOPS_CHECK_CUDA(cudaMemcpyAsync(state_.get(), &start_, sizeof start_, cudaMemcpyHostToDevice, gpu::stream()));
  }

  // The parameters from the host and, bf16, their bf16 copy: cast wherever they are loaded, and
  // written from then on by a train step's AdamW launch (infer's stays as cast, as autocast's weight
  // cache holds it).
  void load_params(const HostBuffer& from) {
    params_.upload(from);
    if (s_.bf16()) cast_all_params();
  }

  void cast_all_params() {
    const auto n4 = static_cast<std::int64_t>(l_.total / 4);
    const auto blocks = static_cast<unsigned>(std::min<std::int64_t>((n4 + 255) / 256, 1024));
    models::cast_params<<<blocks, 256, 0, gpu::stream()>>>(params_.as<const float4>(), low_.as<__nv_bfloat162>(), n4);
    HOTOPS_CHECK_LAUNCH();
  }

  void device_step() {
    trace::op("embedding");
    embedding::Args g;
    g.idx = tokens_.as<const std::int64_t>(), g.W = weight(l_.embed), g.out = emb_.get();
    gather_->run(g);
    trace::op("global_avgpool");
    pool_->run({emb_.get(), nullptr, pooled_.get()});
    trace::op("addmm");
    dense_.run(pooled_.get(), weight(l_.dense_w), weight(l_.dense_b), logits_.get());
    if (!s_.train()) return;
    float* grads = grads_.as<float>();
    trace::op("bce_logits");
    loss::bce::Args b;
    b.logits = logits_.get(), b.target = labels_.as<const float>(), b.loss = loss_.as<float>();
    bce_->run(b);
    trace::op("bce_logits_bwd");
    b.loss = nullptr, b.dlogits = dlogits_.get();
    bce_bwd_->run(b);
    trace::op("mm");
    wgrad_->run({pooled_.get(), nullptr, nullptr, dlogits_.get(), grads + l_.dense_w, nullptr});
    bgrad_->run({ones_.get(), nullptr, nullptr, dlogits_.get(), grads + l_.dense_b, nullptr});
    models::grads_ready(replicas_.sync, l_.dense_w);  // the dense layer's are final
    dgrad_->run({nullptr, weight(l_.dense_w), nullptr, dlogits_.get(), dpooled_.get(), nullptr});
    trace::op("global_avgpool_bwd");
    pool_bwd_->run({nullptr, dpooled_.get(), demb_.get()});
    trace::op("embedding_bwd");
    embedding::Args e;
    e.offset = offset_.as<const std::int32_t>(), e.pos = pos_.as<const std::int32_t>(), e.dout = demb_.get();
    e.dW = grads + l_.embed;
    scatter_->run(e);
    models::grads_ready(replicas_.sync, l_.embed);  // the embedding table's (every row written): all of them
    // The (last) AdamW launch advances the step count.
    models::adamw_step(replicas_.sync, {params_.as<float>(), grads_.as<const float>(), m_.as<float>(), v_.as<float>(),
                       s_.bf16() ? low_.as<std::uint16_t>() : nullptr, l_.total, state_.as<adamw::DeviceStep>(), &hyper_});
  }

  Shape s_;
  Layout l_;
  State st_;  // the seeded start, and the batch in pageable host memory for the e2e variants
  gpu::DeviceBuffer params_, grads_, m_, v_, tokens_, labels_, loss_, state_;
  gpu::DeviceBuffer low_;  // bf16: the bf16 copy of params_ (same layout) the ops read
  gpu::DeviceBuffer emb_, pooled_, logits_, dlogits_, dpooled_, demb_, ones_;
  gpu::DeviceBuffer offset_, pos_;  // train: the batch's tokens grouped by row (csr_ on the device)
  embedding::Csr csr_;              // train: the grouping in host memory
  models::DenseForward dense_;
  std::unique_ptr<embedding::Plan> gather_, scatter_;
  std::unique_ptr<avgpool::Plan> pool_, pool_bwd_;
  std::unique_ptr<matmul::Plan> wgrad_, bgrad_, dgrad_;
  std::unique_ptr<loss::bce::Plan> bce_, bce_bwd_;
  adamw::Hyper hyper_ = models::hyper();
  adamw::DeviceStep start_{};  // the step count's start, the source of restart_optimizer's copy
  HostBuffer logits_host_;
  float loss_host_ = 0;
  gpu::StepGraph graph_;  // graph:1
  models::BatchReplica<Shape, State, SampleShard> replicas_;  // gpus:G (data parallel)
};

}  // namespace

std::unique_ptr<ModelCase> make_cuda(const Problem& p) { return std::make_unique<CudaFasttext>(p); }

}  // namespace hotops::model_fasttext
