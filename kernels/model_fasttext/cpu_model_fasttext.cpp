// model_fasttext on the CPU: every op a plan of its family (embedding: OpenMP row copies and per-row
// sums; global_avgpool: oneDNN's average pooling; matmul: oneDNN; bce_logits: an OpenMP loop) and
// adamw::cpu_step. bf16: the flat f32 parameters' bf16 copy, cast once at the start (one OpenMP
// pass), then written by a train step's AdamW pass. A train step:
//   embedding      emb [B·T, E] = embed[tokens]
//   global_avgpool pooled [B, E] = mean over the T positions
//   addmm          logits [B, 1] = pooled . W + b
//   bce_logits     the mean loss; bce_logits_bwd: dlogits = (sigmoid(z) - y) / B
//   mm             dW = pooled^T . dlogits, db = ones^T . dlogits, dpooled = dlogits . W^T
//   global_avgpool_bwd  demb = dpooled / T, at every position
//   group_by_row   the batch's tokens grouped by row (embedding::group_by_row: a counting sort)
//   embedding_bwd  dembed: per row, its positions' demb summed in position order (rows no token hits 0)
//   adamw          one flat pass over p, g, m, v
// bf16 (docs/models.md): the same plans on bf16 storage, their GEMMs writing the weight gradients f32.
#include <omp.h>

#include <algorithm>
#include <cmath>

#include "hotops/check.h"
#include "hotops/cpu.h"
#include "hotops/trace.h"
#include "kernels/model_fasttext/model_fasttext.h"

namespace hotops::model_fasttext {
namespace {

// Below this many elements a flat pass runs on one thread.
constexpr std::int64_t kParallelGrain = 1 << 15;

class CpuFasttext final : public ModelCase {
 public:
  explicit CpuFasttext(const Problem& p)
      : s_(shape_of(p)), l_(layout_of(s_.cfg)), st_(make_state(s_, l_, models::step_seed(p))),
        threads_(s_.variant == Variant::threads ? s_.threads : 0) {
    cpu::ThreadScope scope(threads_);  // primitives are created for the thread count they run with
    const std::int64_t B = s_.batch, N = s_.tokens(), E = s_.cfg.E;
    params_ = st_.params, m_ = st_.m, v_ = st_.v;
    if (s_.bf16()) low_ = HostBuffer(DType::bf16, l_.total);
    if (s_.bf16()) cast_params();  // the copy at the start; train: AdamW keeps it from then on
    emb_ = HostBuffer(s_.dtype, static_cast<std::size_t>(N * E));
    pooled_ = HostBuffer(s_.dtype, static_cast<std::size_t>(B * E));
    logits_ = HostBuffer(s_.dtype, static_cast<std::size_t>(B));
    gather_ = embedding::make_cpu_plan(embedding_shape(s_, Direction::fwd));
    pool_ = avgpool::make_cpu_plan(pool_shape(s_, Direction::fwd));
    dense_ = matmul::make_cpu_plan(dense_shape(s_));
    if (!s_.train()) return;
    grads_ = HostBuffer(DType::f32, l_.total);
    std::fill_n(grads_.as<float>(), l_.total, 0.f);  // the padding is never written: zero, as AdamW needs
    dlogits_ = HostBuffer(s_.dtype, static_cast<std::size_t>(B));
    dpooled_ = HostBuffer(s_.dtype, static_cast<std::size_t>(B * E));
    demb_ = HostBuffer(s_.dtype, static_cast<std::size_t>(N * E));
    ones_ = HostBuffer(s_.dtype, static_cast<std::size_t>(B));
    for (std::size_t i = 0; i < ones_.count(); ++i) ones_.set(i, 1.0);
    bce_ = loss::bce::make_cpu_plan(bce_shape(s_, Direction::fwd));
    bce_bwd_ = loss::bce::make_cpu_plan(bce_shape(s_, Direction::bwd));
    wgrad_ = matmul::make_cpu_plan(dense_wgrad_shape(s_));
    bgrad_ = matmul::make_cpu_plan(dense_bgrad_shape(s_));
    dgrad_ = matmul::make_cpu_plan(dense_dgrad_shape(s_));
    pool_bwd_ = avgpool::make_cpu_plan(pool_shape(s_, Direction::bwd));
    scatter_ = embedding::make_cpu_plan(embedding_shape(s_, Direction::bwd));
  }

  void run() override {
    trace::op("embedding");  // the first op's span includes setting the thread count
    cpu::ThreadScope scope(threads_);
    forward();
    if (!s_.train()) return;
    backward();
    trace::op("adamw");
    const auto n = static_cast<std::int64_t>(l_.total);
    adamw::cpu_step(params_.as<float>(), grads_.as<const float>(), m_.as<float>(), v_.as<float>(),
                    s_.bf16() ? low_.as<std::uint16_t>() : nullptr, n, adamw::scalars_for(models::hyper(), ++step_), team(n));
  }

  Check verify() override {
    copy_into(params_, st_.params), copy_into(m_, st_.m), copy_into(v_, st_.v);
    if (s_.bf16()) cast_params();
    step_ = 0;
    emb_.poison(), pooled_.poison(), logits_.poison();
    if (s_.train()) {  // poison the tensors, keep the padding zero
      std::fill_n(grads_.as<float>() + l_.embed, s_.cfg.V * s_.cfg.E, std::nanf(""));
      std::fill_n(grads_.as<float>() + l_.dense_w, s_.cfg.E, std::nanf(""));
      grads_.as<float>()[l_.dense_b] = std::nanf("");
    }
    run();
    Outcome o;
    o.pooled = pooled_, o.logits = logits_;
    if (s_.train()) o.loss = loss_, o.grads = grads_, o.params = params_;
    return verify_outcome(s_, l_, st_, o);
  }

  std::string label() const override {
    std::string l = !s_.bf16()   ? ""
                    : s_.train() ? "bf16 autocast (the AdamW pass writes the bf16 copy of the f32 master parameters), "
                                 : "bf16 autocast (f32 master parameters cast to bf16 once), ";
    l += "embedding, global_avgpool (oneDNN), addmm [" + dense_->label() + "]";
    if (s_.train())
      l += ", bce_logits fwd and bwd, mm for dW, db (ones^T . dlogits) and dpooled, global_avgpool bwd, the tokens "
           "grouped by row each step (counting sort), embedding bwd; AdamW 1 flat pass";
    return l + ", " + std::to_string(threads_ > 0 ? threads_ : cpu::threads()) + " threads";
  }

  double last_loss() override { return loss_; }
  Check bf16_copy_check() override {
    if (!s_.bf16()) return {};
    return models::bf16_copy_of(params_.as<float>(), low_.as<std::uint16_t>(), l_.total);
  }

 private:
  static void copy_into(HostBuffer& dst, const HostBuffer& src) { std::copy_n(src.as<float>(), src.count(), dst.as<float>()); }
  int team(std::int64_t work) const { return work >= kParallelGrain ? cpu::threads() : 1; }

  // The parameters the ops read: the f32 ones, or their bf16 copy, at `offset` floats of the layout.
  const void* weight(std::size_t offset) const {
    if (s_.bf16()) return low_.as<std::uint16_t>() + offset;
    return params_.as<float>() + offset;
  }

  // The bf16 copy of the f32 parameters (autocast's cast), one flat pass.
  void cast_params() {
    const float* p = params_.as<float>();
    std::uint16_t* low = low_.as<std::uint16_t>();
    const auto n = static_cast<std::int64_t>(l_.total);
#pragma omp parallel for simd num_threads(team(n)) schedule(static)
    for (std::int64_t i = 0; i < n; ++i) low[i] = float_to_bf16(p[i]);
  }

  void forward() {
    trace::op("embedding");
    embedding::Args g;
    g.idx = st_.tokens.data(), g.W = weight(l_.embed), g.out = emb_.data();
    gather_->run(g);
    trace::op("global_avgpool");
    pool_->run({emb_.data(), nullptr, pooled_.data()});
    trace::op("addmm");
    dense_->run({pooled_.data(), weight(l_.dense_w), weight(l_.dense_b), nullptr, logits_.data(), nullptr});
  }

  void backward() {
    float* g = grads_.as<float>();
    trace::op("bce_logits");
    loss::bce::Args b;
    b.logits = logits_.data(), b.target = st_.labels.as<const float>(), b.loss = &loss_;
    bce_->run(b);
    trace::op("bce_logits_bwd");
    b.loss = nullptr, b.dlogits = dlogits_.data();
    bce_bwd_->run(b);
    trace::op("mm");
    wgrad_->run({pooled_.data(), nullptr, nullptr, dlogits_.data(), g + l_.dense_w, nullptr});
    bgrad_->run({ones_.data(), nullptr, nullptr, dlogits_.data(), g + l_.dense_b, nullptr});
    dgrad_->run({nullptr, weight(l_.dense_w), nullptr, dlogits_.data(), dpooled_.data(), nullptr});
    trace::op("global_avgpool_bwd");
    pool_bwd_->run({nullptr, dpooled_.data(), demb_.data()});
    // The grouping depends on the batch only, and a training loop meets each batch once: part of the
    // step, as PyTorch's embedding backward sorts its indices in every call.
    trace::op("group_by_row");
    embedding::group_by_row(st_.tokens, s_.cfg.V, csr_);
    trace::op("embedding_bwd");
    embedding::Args e;
    e.offset = csr_.offset.data(), e.pos = csr_.pos.data(), e.dout = demb_.data(), e.dW = g + l_.embed;
    scatter_->run(e);
  }

  Shape s_;
  Layout l_;
  State st_;  // the seeded start: verify() restores from it
  int threads_;
  HostBuffer params_, grads_, m_, v_;
  HostBuffer low_;  // bf16: the step's bf16 copy of params_ (same layout)
  HostBuffer emb_, pooled_, logits_, dlogits_, dpooled_, demb_;
  HostBuffer ones_;      // [B] ones: db = ones^T . dlogits
  embedding::Csr csr_;   // the batch's tokens grouped by row, rebuilt each train step
  std::unique_ptr<embedding::Plan> gather_, scatter_;
  std::unique_ptr<avgpool::Plan> pool_, pool_bwd_;
  std::unique_ptr<matmul::Plan> dense_, wgrad_, bgrad_, dgrad_;
  std::unique_ptr<loss::bce::Plan> bce_, bce_bwd_;
  float loss_ = 0;
  std::int64_t step_ = 0;
};

}  // namespace

std::unique_ptr<ModelCase> make_cpu(const Problem& p) { return std::make_unique<CpuFasttext>(p); }

}  // namespace hotops::model_fasttext
