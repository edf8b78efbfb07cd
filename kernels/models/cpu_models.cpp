// models on the CPU: each dense layer is a oneDNN matmul primitive (forward with the bias and a ReLU
// post-op; the weight and data gradients on transposed views through strides), or, for a layer
// below kSmallLayerMacs multiply-adds, hand-written single-thread loops: there a primitive's fixed
// cost per call is most of the time. The loss, ReLU backward with the bias gradient and the AdamW
// step are OpenMP loops (one thread below a grain of work, where forking costs more than it saves).
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <unordered_map>

#include "hotops/check.h"
#include "hotops/cpu.h"
#include "kernels/models/models.h"

namespace hotops::models {
namespace {

using dnnl::memory;
using dt = memory::data_type;

// Below this many elements a pointwise loop runs on one thread.
constexpr std::int64_t kParallelGrain = 1 << 15;

// The thread count of a threads:T case for the duration of a scope (set_threads is OpenMP's, which
// oneDNN follows); a no-op for the all-threads case.
class ThreadScope {
 public:
  explicit ThreadScope(int threads) : previous_(cpu::threads()), set_(threads > 0) {
    if (set_) cpu::set_threads(threads);
  }
  ~ThreadScope() {
    if (set_) cpu::set_threads(previous_);
  }
  ThreadScope(const ThreadScope&) = delete;
  ThreadScope& operator=(const ThreadScope&) = delete;

 private:
  int previous_;
  bool set_;
};

// A row-major [rows, cols] f32 operand, or the transpose of one stored [cols, rows].
memory::desc md(std::int64_t rows, std::int64_t cols, bool transposed = false) {
  return transposed ? memory::desc({rows, cols}, dt::f32, memory::dims{1, rows})
                    : memory::desc({rows, cols}, dt::f32, memory::dims{cols, 1});
}

struct Matmul {
  dnnl::matmul prim;
  memory src, wei, bias, dst;

  void execute() {
    std::unordered_map<int, memory> args{{DNNL_ARG_SRC, src}, {DNNL_ARG_WEIGHTS, wei}, {DNNL_ARG_DST, dst}};
    if (bias) args.insert({DNNL_ARG_BIAS, bias});
    prim.execute(cpu::stream(), args);
  }
};

// dst = src . wei (+ bias, ReLU), the memories wrapping hotops' own buffers.
Matmul make_matmul(const memory::desc& src, float* src_p, const memory::desc& wei, float* wei_p, float* bias_p,
                   const memory::desc& dst, float* dst_p, bool relu) {
  dnnl::engine& eng = cpu::engine();
  dnnl::primitive_attr attr;
  if (relu) {
    dnnl::post_ops po;
    po.append_eltwise(1.f, dnnl::algorithm::eltwise_relu, 0.f, 0.f);
    attr.set_post_ops(po);
  }
  const memory::desc bias_md = bias_p ? memory::desc({1, dst.dims()[1]}, dt::f32, memory::dims{dst.dims()[1], 1}) : memory::desc();
  const auto d = HOTOPS_CHECK_DNNL(dnnl::matmul::desc(src, wei, bias_md, dst));
  const auto pd = HOTOPS_CHECK_DNNL(dnnl::matmul::primitive_desc(d, attr, eng));
  Matmul m;
  m.prim = HOTOPS_CHECK_DNNL(dnnl::matmul(pd));
  m.src = memory(src, eng, src_p);
  m.wei = memory(wei, eng, wei_p);
  if (bias_p) m.bias = memory(bias_md, eng, bias_p);
  m.dst = memory(dst, eng, dst_p);
  return m;
}

// The hand-written loops of a small layer (rows of the batch outermost; the inner loops run over
// the contiguous output axis so that they vectorise).
void small_forward(const float* a, const float* W, const float* b, float* y, std::int64_t B, std::int64_t in,
                   std::int64_t out, bool relu) {
  for (std::int64_t r = 0; r < B; ++r) {
    float* yr = y + r * out;
    for (std::int64_t o = 0; o < out; ++o) yr[o] = b[o];
    for (std::int64_t i = 0; i < in; ++i) {
      const float ai = a[r * in + i];
      const float* Wi = W + i * out;
      for (std::int64_t o = 0; o < out; ++o) yr[o] += ai * Wi[o];
    }
    if (relu)
      for (std::int64_t o = 0; o < out; ++o) yr[o] = std::max(yr[o], 0.f);
  }
}

// dW = a^T . dz
void small_weight_grad(const float* a, const float* dz, float* dW, std::int64_t B, std::int64_t in, std::int64_t out) {
  std::fill_n(dW, in * out, 0.f);
  for (std::int64_t r = 0; r < B; ++r)
    for (std::int64_t i = 0; i < in; ++i) {
      const float ai = a[r * in + i];
      float* dWi = dW + i * out;
      const float* dzr = dz + r * out;
      for (std::int64_t o = 0; o < out; ++o) dWi[o] += ai * dzr[o];
    }
}

// da = dz . W^T
void small_data_grad(const float* dz, const float* W, float* da, std::int64_t B, std::int64_t in, std::int64_t out) {
  for (std::int64_t r = 0; r < B; ++r)
    for (std::int64_t i = 0; i < in; ++i) {
      const float* Wi = W + i * out;
      const float* dzr = dz + r * out;
      float s = 0.f;
      for (std::int64_t o = 0; o < out; ++o) s += dzr[o] * Wi[o];
      da[r * in + i] = s;
    }
}

void copy_into(HostBuffer& dst, const HostBuffer& src) { std::copy_n(src.as<float>(), src.count(), dst.as<float>()); }

class CpuModel final : public ModelCase {
 public:
  explicit CpuModel(const Problem& p)
      : s_(shape_of(p)), l_(param_layout(s_.widths)), st_(make_state(s_, l_, p.seed())),
        threads_(s_.variant == Variant::threads ? s_.threads : 0) {
    ThreadScope scope(threads_);  // primitives are created for the thread count they run with
    const std::size_t L = s_.layers();
    const std::int64_t B = s_.batch;
    params_ = st_.params, m_ = st_.m, v_ = st_.v;
    grads_ = HostBuffer(DType::f32, l_.total);
    std::fill_n(grads_.as<float>(), l_.total, 0.f);  // the padding is never written: zero, as AdamW needs
    act_.resize(L + 1);
    dact_.resize(L + 1);
    for (std::size_t k = 0; k < L; ++k) {
      act_[k + 1] = HostBuffer(DType::f32, static_cast<std::size_t>(B * s_.out(k)));
      if (s_.train()) dact_[k + 1] = HostBuffer(DType::f32, static_cast<std::size_t>(B * s_.out(k)));
    }
    fwd_.resize(L), wgrad_.resize(L), dgrad_.resize(L);
    for (std::size_t k = 0; k < L; ++k) {
      const std::int64_t in = s_.in(k), out = s_.out(k);
      const bool relu = k + 1 < L;
      small_.push_back(B * in * out < kSmallLayerMacs);
      if (small_.back()) continue;
      float* W = params_.as<float>() + l_.w[k];
      fwd_[k] = make_matmul(md(B, in), input(k), md(in, out), W, params_.as<float>() + l_.b[k], md(B, out),
                            act_[k + 1].as<float>(), relu);
      if (!s_.train()) continue;
      // dW [in, out] = a^T [in, B] . dz [B, out]; da [B, in] = dz [B, out] . W^T [out, in].
      wgrad_[k] = make_matmul(md(in, B, true), input(k), md(B, out), dact_[k + 1].as<float>(), nullptr, md(in, out),
                              grads_.as<float>() + l_.w[k], false);
      if (k > 0)
        dgrad_[k] = make_matmul(md(B, out), dact_[k + 1].as<float>(), md(out, in, true), W, nullptr, md(B, in),
                                dact_[k].as<float>(), false);
    }
  }

  void run() override {
    ThreadScope scope(threads_);
    forward();
    if (!s_.train()) return;
    loss_ = loss_and_dlogits();
    backward();
    adamw_step();
  }

  Check verify() override {
    // Into the same storage: the primitives' memories point at it.
    copy_into(params_, st_.params), copy_into(m_, st_.m), copy_into(v_, st_.v);
    step_ = 0;
    for (std::size_t k = 1; k < act_.size(); ++k) act_[k].poison();
    grads_poison();
    run();
    Outcome o;
    if (!s_.train()) {
      o.logits = act_.back();
    } else {
      o.loss = loss_;
      o.grads = grads_, o.params = params_;
      for (std::size_t k = 1; k + 1 < act_.size(); ++k) o.hidden.push_back(act_[k]);
    }
    return verify_outcome(s_, l_, st_, o);
  }

  std::string label() const override {
    std::string what;
    int small = 0;
    for (bool b : small_) small += b;
    what = std::to_string(s_.layers()) + " dense layers: ";
    if (small == static_cast<int>(small_.size())) what += "hand-written single-thread loops (every layer < 64K MACs)";
    else if (small == 0) what += "oneDNN matmul (bias + ReLU post-op fwd, strided transposes bwd)";
    else what += "oneDNN matmul, " + std::to_string(small) + " small layer(s) hand-written";
    if (s_.train()) what += "; OpenMP softmax-CE, ReLU bwd + bias grad, AdamW 1 flat pass";
    return what + ", " + std::to_string(threads_ > 0 ? threads_ : cpu::threads()) + " threads";
  }

  double last_loss() override { return loss_; }

 private:
  float* input(std::size_t k) { return k == 0 ? st_.x.as<float>() : act_[k].as<float>(); }

  int team(std::int64_t work) const { return work >= kParallelGrain ? cpu::threads() : 1; }

  void grads_poison() {
    // Poison the tensors, keep the padding zero.
    for (std::size_t k = 0; k < s_.layers(); ++k) {
      std::fill_n(grads_.as<float>() + l_.w[k], s_.in(k) * s_.out(k), std::nanf(""));
      std::fill_n(grads_.as<float>() + l_.b[k], s_.out(k), std::nanf(""));
    }
  }

  void forward() {
    const std::int64_t B = s_.batch;
    bool waited = true;
    for (std::size_t k = 0; k < s_.layers(); ++k) {
      if (small_[k]) {
        if (!waited) cpu::stream().wait(), waited = true;
        small_forward(input(k), params_.as<float>() + l_.w[k], params_.as<float>() + l_.b[k], act_[k + 1].as<float>(), B,
                      s_.in(k), s_.out(k), k + 1 < s_.layers());
      } else {
        fwd_[k].execute();
        waited = false;
      }
    }
    if (!waited) cpu::stream().wait();
  }

  // Mean softmax cross-entropy of the logits; dlogits = (softmax - onehot) / batch.
  double loss_and_dlogits() {
    const std::int64_t B = s_.batch, C = s_.classes();
    const float* z = act_.back().as<float>();
    float* dz = dact_.back().as<float>();
    const std::int32_t* y = st_.labels.data();
    const float inv_b = 1.f / static_cast<float>(B);
    double total = 0;
#pragma omp parallel for num_threads(team(B * C * 8)) reduction(+ : total) schedule(static)
    for (std::int64_t r = 0; r < B; ++r) {
      const float* zr = z + r * C;
      float* dr = dz + r * C;
      const float mx = *std::max_element(zr, zr + C);
      float sum = 0.f;
      for (std::int64_t c = 0; c < C; ++c) sum += (dr[c] = std::exp(zr[c] - mx));
      const float inv = 1.f / sum;
      for (std::int64_t c = 0; c < C; ++c) dr[c] = dr[c] * inv * inv_b;
      dr[y[r]] -= inv_b;
      total += static_cast<double>(std::log(sum) - (zr[y[r]] - mx));
    }
    return total / static_cast<double>(B);
  }

  // dz = da * (a > 0) in place, and db = colsum(dz); threads over blocks of columns.
  void relu_backward_bias_grad(std::size_t k) {
    const std::int64_t B = s_.batch, n = s_.out(k);
    float* dz = dact_[k + 1].as<float>();
    const float* a = act_[k + 1].as<float>();
    float* db = grads_.as<float>() + l_.b[k];
    constexpr std::int64_t kCols = 16;
#pragma omp parallel for num_threads(team(B * n)) schedule(static)
    for (std::int64_t c0 = 0; c0 < n; c0 += kCols) {
      const std::int64_t c1 = std::min(n, c0 + kCols);
      float acc[kCols] = {};
      for (std::int64_t r = 0; r < B; ++r)
        for (std::int64_t c = c0; c < c1; ++c) {
          float& d = dz[r * n + c];
          d = a[r * n + c] > 0.f ? d : 0.f;
          acc[c - c0] += d;
        }
      for (std::int64_t c = c0; c < c1; ++c) db[c] = acc[c - c0];
    }
  }

  void bias_grad(std::size_t k) {  // the last layer's: no ReLU
    const std::int64_t B = s_.batch, n = s_.out(k);
    const float* dz = dact_[k + 1].as<float>();
    float* db = grads_.as<float>() + l_.b[k];
    std::fill_n(db, n, 0.f);
    for (std::int64_t r = 0; r < B; ++r)
      for (std::int64_t c = 0; c < n; ++c) db[c] += dz[r * n + c];
  }

  void backward() {
    const std::int64_t B = s_.batch;
    bias_grad(s_.layers() - 1);
    for (std::size_t k = s_.layers(); k-- > 0;) {
      const std::int64_t in = s_.in(k), out = s_.out(k);
      float* dz = dact_[k + 1].as<float>();
      float* W = params_.as<float>() + l_.w[k];
      if (small_[k]) {
        small_weight_grad(input(k), dz, grads_.as<float>() + l_.w[k], B, in, out);
        if (k > 0) small_data_grad(dz, W, dact_[k].as<float>(), B, in, out);
      } else {
        wgrad_[k].execute();
        if (k > 0) dgrad_[k].execute();
        cpu::stream().wait();
      }
      if (k > 0) relu_backward_bias_grad(k - 1);
    }
  }

  void adamw_step() {
    const adamw::StepScalars sc = adamw::scalars_for(hyper(), ++step_);
    float* p = params_.as<float>();
    const float* g = grads_.as<float>();
    float* m = m_.as<float>();
    float* v = v_.as<float>();
    const auto n = static_cast<std::int64_t>(l_.total);
#pragma omp parallel for simd num_threads(team(n)) schedule(static)
    for (std::int64_t i = 0; i < n; ++i)
      adamw::step_element(p[i], g[i], m[i], v[i], sc, [](float x) { return std::sqrt(x); });
  }

  Shape s_;
  ParamLayout l_;
  State st_;  // the seeded start: verify() restores from it
  int threads_;
  HostBuffer params_, grads_, m_, v_;
  std::vector<HostBuffer> act_;   // [k]: layer k's output (post-ReLU for hidden layers, logits last); [0] unused
  std::vector<HostBuffer> dact_;  // [k]: gradient of act_[k] (dlogits last; da, then dz in place, for hidden)
  std::vector<bool> small_;
  std::vector<Matmul> fwd_, wgrad_, dgrad_;
  std::int64_t step_ = 0;
  double loss_ = 0;
};

}  // namespace

std::unique_ptr<ModelCase> make_cpu(const Problem& p) { return std::make_unique<CpuModel>(p); }

}  // namespace hotops::models
