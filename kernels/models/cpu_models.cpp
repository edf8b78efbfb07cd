// models on the CPU: each dense layer's GEMMs are the matmul family's plans (oneDNN: the forward
// addmm with the bias and a ReLU post-op, the weight and data gradients on transposed views through
// strides; for a GEMM below matmul::kCpuLoopMacs multiply-adds the plan's hand-written single-thread
// loops, where a primitive's fixed cost per call is most of the time). The loss with its gradient and the
// last bias's is the loss family's cross_entropy_dbias plan, ReLU backward with the bias gradient the
// pointwise family's relu_dbias plan; the AdamW step is an OpenMP loop (one thread below a grain of
// work, where forking costs more than it saves).
// bf16 (models.h): the same code on bf16 storage (the class and loops are templates on the storage
// type), the matmuls reading a bf16 copy of the f32 parameters, cast once at the start (train: then
// written by the AdamW step; infer: held, as autocast's weight cache holds it), oneDNN bf16 matmuls or
// the plans' loops (f32 accumulation; the weight gradients written f32).
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <type_traits>

#include "hotops/check.h"
#include "hotops/cpu.h"
#include "hotops/cpu_vector.h"
#include "hotops/trace.h"
#include "kernels/matmul/matmul.h"
#include "kernels/models/models.h"

namespace hotops::models {
namespace {

using bf16 = std::uint16_t;  // bf16 storage

using vec::store;  // f32 -> storage: f32 as is; bf16 rounded to nearest even

// Below this many elements a pointwise loop runs on one thread.
constexpr std::int64_t kParallelGrain = 1 << 15;

void copy_into(HostBuffer& dst, const HostBuffer& src) { std::copy_n(src.as<float>(), src.count(), dst.as<float>()); }

// A model on storage T (float, or bf16 with f32 master weights: models.h).
template <class T>
class CpuModel final : public ModelCase {
  static constexpr bool kBf16 = !std::is_same_v<T, float>;

 public:
  explicit CpuModel(const Problem& p)
      : s_(shape_of(p)), l_(param_layout(s_.widths)), st_(make_state(s_, l_, step_seed(p))),
        threads_(s_.variant == Variant::threads ? s_.threads : 0) {
    cpu::ThreadScope scope(threads_);  // primitives are created for the thread count they run with
    const std::size_t L = s_.layers();
    const std::int64_t B = s_.batch;
    params_ = st_.params, m_ = st_.m, v_ = st_.v;
    if constexpr (kBf16) low_ = HostBuffer(DType::bf16, l_.total);
    if constexpr (kBf16) cast_params();  // the copy at the start; train: AdamW keeps it from then on
    grads_ = HostBuffer(DType::f32, l_.total);
    zero_bytes(grads_.data(), grads_.bytes());  // the padding is never written: zero, as AdamW needs
    act_.resize(L + 1);
    dact_.resize(L + 1);
    for (std::size_t k = 0; k < L; ++k) {
      act_[k + 1] = HostBuffer(s_.dtype, static_cast<std::size_t>(B * s_.out(k)));
      if (s_.train()) dact_[k + 1] = HostBuffer(s_.dtype, static_cast<std::size_t>(B * s_.out(k)));
    }
    fwd_.resize(L), wgrad_.resize(L), dgrad_.resize(L);
    for (std::size_t k = 0; k < L; ++k) {
      fwd_[k] = matmul::make_cpu_plan(forward_gemm(s_, k));
      if (!s_.train()) continue;
      wgrad_[k] = matmul::make_cpu_plan(weight_grad_gemm(s_, k));
      if (k > 0) dgrad_[k] = matmul::make_cpu_plan(data_grad_gemm(s_, k));
    }
    if (s_.train()) {
      xent_ = loss::make_cpu_plan(loss::dbias_shape(s_.dtype, B, s_.classes()));
      for (std::size_t k = 0; k + 1 < L; ++k) relu_dbias_.push_back(pointwise::make_cpu_plan(relu_dbias_shape(s_, k)));
    }
  }

  void run() override {
    trace::op("addmm");  // the first op's span includes setting the thread count
    cpu::ThreadScope scope(threads_);
    forward();
    if (!s_.train()) return;
    trace::op("cross_entropy");
    loss_ = loss_and_gradients();
    backward();
    trace::op("adamw");
    adamw_step();
  }

  Check verify() override {
    // Into the same storage: the plans run on it.
    copy_into(params_, st_.params), copy_into(m_, st_.m), copy_into(v_, st_.v);
    if constexpr (kBf16) cast_params();
    step_ = 0;
    for (std::size_t k = 1; k < act_.size(); ++k) act_[k].poison();
    grads_poison();
    run();
    Outcome o;
    if (!s_.train()) {
      o.logits = act_.back();
    } else {
      o.loss = static_cast<float>(loss_);
      o.grads = grads_, o.params = params_;
      for (std::size_t k = 1; k + 1 < act_.size(); ++k) o.hidden.push_back(act_[k]);
    }
    return verify_outcome(s_, l_, st_, o);
  }

  std::string label() const override {
    std::string what;
    int small = 0;
    for (std::size_t k = 0; k < s_.layers(); ++k) small += matmul::cpu_runs_loops(forward_gemm(s_, k));
    what = std::to_string(s_.layers()) + " dense layers: matmul plans, ";
    if (small == static_cast<int>(s_.layers())) what += "hand-written single-thread loops (every layer < 64K MACs)";
    else if (small == 0) what += "oneDNN (bias + ReLU post-op fwd, strided transposes bwd)";
    else what += "oneDNN, " + std::to_string(small) + " small layer(s) on hand-written loops";
    if constexpr (kBf16) {
      what = std::string(s_.train() ? "bf16 autocast (the AdamW step writes the bf16 copy of the f32 master weights"
                                    : "bf16 autocast (f32 master weights cast to bf16 once") +
             ", f32 accumulation), " + what;
      for (std::size_t k = 0; k < s_.layers(); ++k)
        if (!matmul::cpu_runs_loops(forward_gemm(s_, k))) {
          what += " [" + fwd_[k]->label() + "]";
          break;
        }
    }
    if (s_.train()) what += "; cross_entropy_dbias and relu_dbias plans, AdamW 1 flat pass";
    return what + ", " + std::to_string(threads_ > 0 ? threads_ : cpu::threads()) + " threads";
  }

  double last_loss() override { return loss_; }
  Check bf16_copy_check() override {
    if (!kBf16) return {};
    return bf16_copy_of(params_.as<float>(), low_.as<std::uint16_t>(), l_.total);
  }

 private:
  T* input(std::size_t k) { return k == 0 ? st_.x.as<T>() : act_[k].as<T>(); }
  // The weights the layers multiply: the f32 parameters, or their bf16 copy.
  T* weights() {
    if constexpr (kBf16) return low_.as<T>();
    else return params_.as<float>();
  }

  int team(std::int64_t work) const { return work >= kParallelGrain ? cpu::threads() : 1; }

  void grads_poison() {
    // Poison the tensors, keep the padding zero.
    for (std::size_t k = 0; k < s_.layers(); ++k) {
      std::fill_n(grads_.as<float>() + l_.w[k], s_.in(k) * s_.out(k), std::nanf(""));
      std::fill_n(grads_.as<float>() + l_.b[k], s_.out(k), std::nanf(""));
    }
  }

  // The bf16 copy of the f32 parameters (autocast's cast of the weights), one flat pass.
  void cast_params() {
    const float* p = params_.as<float>();
    T* low = low_.as<T>();
    const auto n = static_cast<std::int64_t>(l_.total);
#pragma omp parallel for simd num_threads(team(n)) schedule(static)
    for (std::int64_t i = 0; i < n; ++i) low[i] = store<T>(p[i]);
  }

  void forward() {
    for (std::size_t k = 0; k < s_.layers(); ++k) {
      trace::op("addmm");
      fwd_[k]->run({input(k), weights() + l_.w[k], weights() + l_.b[k], nullptr, act_[k + 1].data(), nullptr});
    }
  }

  // The mean softmax cross-entropy, dlogits = (softmax - onehot) / batch and the last layer's bias
  // gradient, in one plan: the loss family's two cross_entropy plans (fwd, bwd) took mlp_tiny's f32
  // train step at batch 10 from 6.5 to 9-10 us.
  double loss_and_gradients() {
    loss::Args a;
    a.logits = act_.back().data(), a.labels = st_.labels.data(), a.dlogits = dact_.back().data();
    a.loss = &loss_out_, a.db = grads_.as<float>() + l_.b[s_.layers() - 1];
    xent_->run(a);
    return loss_out_;
  }

  // dz = da * (a > 0) in place over hidden layer k's output, and its bias gradient db = colsum(dz).
  void relu_dbias(std::size_t k) {
    pointwise::Args r;
    r.x = act_[k + 1].data(), r.dy = dact_[k + 1].data(), r.out = dact_[k + 1].data();
    r.db = grads_.as<float>() + l_.b[k];
    relu_dbias_[k]->run(r);
  }

  void backward() {
    for (std::size_t k = s_.layers(); k-- > 0;) {
      T* dz = dact_[k + 1].as<T>();
      trace::op("mm");
      wgrad_[k]->run({input(k), nullptr, nullptr, dz, grads_.as<float>() + l_.w[k], nullptr});
      if (k > 0) dgrad_[k]->run({nullptr, weights() + l_.w[k], nullptr, dz, dact_[k].data(), nullptr});
      if (k > 0) trace::op("relu_bwd"), relu_dbias(k - 1);
    }
  }

  void adamw_step() {
    const auto n = static_cast<std::int64_t>(l_.total);
    adamw::cpu_step(params_.as<float>(), grads_.as<const float>(), m_.as<float>(), v_.as<float>(),
                    kBf16 ? low_.as<std::uint16_t>() : nullptr, n, adamw::scalars_for(hyper(), ++step_), team(n));
  }

  Shape s_;
  ParamLayout l_;
  State st_;  // the seeded start: verify() restores from it
  int threads_;
  HostBuffer params_, grads_, m_, v_;
  HostBuffer low_;                // bf16: the bf16 copy of params_ (same layout) the matmuls read
  std::vector<HostBuffer> act_;   // [k]: layer k's output (post-ReLU for hidden layers, logits last); [0] unused
  std::vector<HostBuffer> dact_;  // [k]: gradient of act_[k] (dlogits last; da, then dz in place, for hidden)
  std::vector<std::unique_ptr<matmul::Plan>> fwd_, wgrad_, dgrad_;  // per layer (dgrad_[0] null: no da)
  std::vector<std::unique_ptr<pointwise::Plan>> relu_dbias_;         // per hidden layer
  std::unique_ptr<loss::Plan> xent_;                                 // train: the head's loss and gradients
  float loss_out_ = 0;                                               // where xent_ writes the loss
  std::int64_t step_ = 0;
  double loss_ = 0;
};

}  // namespace

std::unique_ptr<ModelCase> make_cpu(const Problem& p) {
  return make_step_case<CpuModel, bf16>(p);
}

std::string cpu_bf16_reason(const Problem& p) {
  if (p.dtype != DType::bf16) return "";
  const Shape s = shape_of(p);
  // The GEMMs CpuModel<bf16> plans, descriptors only (those on the plans' loops need no oneDNN).
  for (std::size_t k = 0; k < s.layers(); ++k) {
    std::vector<matmul::Shape> gemms{forward_gemm(s, k)};
    if (s.train()) gemms.push_back(weight_grad_gemm(s, k));
    if (s.train() && k > 0) gemms.push_back(data_grad_gemm(s, k));
    for (const matmul::Shape& g : gemms)
      if (const std::string why = matmul::cpu_unsupported_reason(g); !why.empty()) return why;
  }
  return "";
}

}  // namespace hotops::models
