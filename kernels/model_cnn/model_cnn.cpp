// The model_cnn family: the architectures, names, work, the learnable task, the seeded start and
// verification.
//
// Names, as the other model families': model.<arch>/<cpu|cuda>/<f32|bf16>/<infer|train>/batch:B, then at most
// one variant arg: threads:T (CPU, T OpenMP threads), e2e:1 (CUDA, host time of the step with the
// images and labels copied from pageable host memory and the loss or logits copied back), graph:1
// (CUDA train, as e2e with the device part replayed as one CUDA graph captured at setup). Without a
// variant arg a CUDA step is device time, the batch already on the device. gpus:G (CUDA train,
// vgg_cifar and cnn_mnist): the data-parallel step over G GPUs, batch per GPU
// (kernels/models/data_parallel.h). bf16 is mixed precision as torch.autocast runs it (model_cnn.h);
// every problem exists in both dtypes.
#include "kernels/model_cnn/model_cnn.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>

#include "hotops/check.h"
#include "kernels/models/data_parallel.h"

namespace hotops::model_cnn {
namespace {

constexpr double kAdamwFlopsPerParam = 14;  // adamw.cpp's count

std::string cpu_reason(const Problem& p) {
  const std::string why = models::threads_reason(models::step_args(p, "model_cnn", true, /*allow_bf16=*/true));
  return why.empty() ? cpu_unsupported_reason(p) : why;
}

class CnnFamily final : public models::ModelFamily {
 public:
  CnnFamily() : models::ModelFamily("model_cnn", cpu_reason, make_cpu, HOTOPS_CUDA_FACTORY(make_cuda)) {}

  // The archs without batches are the tests' only, even at --hotops_batch's. The single-GPU and CPU
  // steps, then the data-parallel train steps at the same per-GPU batches (the convnets without batch
  // normalization: data_parallel_arch_reason).
  std::vector<Problem> benchmark_problems(const std::vector<std::int64_t>& batches) const override {
    std::vector<Arch> benchmarked, data_parallel;
    for (const Arch& a : archs())
      if (!a.batches.empty()) {
        benchmarked.push_back(a);
        if (data_parallel_arch_reason(a).empty()) data_parallel.push_back(a);
      }
    std::vector<Problem> out = models::step_problems(benchmarked, batches, models::thread_sweep(), true);
    for (const Problem& p : models::data_parallel_problems(data_parallel, batches)) out.push_back(p);
    return out;
  }

  std::string unsupported_reason(const Problem& p) const override {
    if (!p.has("gpus")) return models::ModelFamily::unsupported_reason(p);
    const std::string why = data_parallel_arch_reason(shape_of(p).arch);
    return why.empty() ? models::data_parallel_reason(p) : why;
  }

  std::vector<Problem> test_problems() const override {
    // The tiny architectures, both backends, both directions, every variant; batch 6 runs the periodic
    // verification batch with a partial last period.
    std::vector<Problem> out;
    models::expand_step_problems("keras_test", 3, {1}, true, out, /*with_bf16=*/true);
    models::expand_step_problems("keras_test", 6, {}, true, out, /*with_bf16=*/true);
    models::expand_step_problems("vgg_test", 5, {2}, true, out, /*with_bf16=*/true);
    models::expand_step_problems("mnist_test", 4, {}, true, out, /*with_bf16=*/true);
    // The data-parallel step on a communicator of one process: its whole path on one GPU.
    models::add_data_parallel_test_problems("vgg_test", 5, out);
    models::add_data_parallel_test_problems("mnist_test", 4, out);
    return out;
  }

  // FLOPs, the standard count: 2 x batch x (every conv's P Q K x 9 C + the dense layers' in x out);
  // batch norm, ReLU, pooling, dropout and the loss are not counted. train: 3x the forward (forward,
  // data and weight gradients; the first conv's data gradient, which nothing needs, is not computed
  // but counted, as is standard) plus AdamW's 14 per parameter.
  // Bytes, the fewest a step must move: infer reads the parameters and the images and writes the
  // logits; train reads the images and labels, reads and writes every parameter, m and v (6 x 4 bytes
  // per parameter).
  // A data-parallel step (gpus:G) does G replicas' work: G times one GPU's (items: the global batch).
  Work work(const Problem& p) const override { return models::over_replicas(p, one_gpu_work(p)); }

  static Work one_gpu_work(const Problem& p) {
    const Shape s = shape_of(p);
    const Arch& a = s.arch;
    double macs = 0;
    for (const ConvLayer& c : s.convs) macs += static_cast<double>(c.out_count()) * 9.0 * static_cast<double>(c.C);
    macs += static_cast<double>(flat_width(a) * a.hidden + a.hidden * a.classes);
    const double B = static_cast<double>(s.batch), P = static_cast<double>(param_layout(a).parameters);
    const double fwd = 2 * B * macs;
    // bf16 keeps f32 parameters (the per-step bf16 copy is not counted); the images and logits are bf16.
    const double e = s.bf16() ? 2 : 4;
    const double x_bytes = e * B * static_cast<double>(a.H * a.W * a.C);
    if (!s.train()) return {fwd, 4 * P + x_bytes + e * B * static_cast<double>(a.classes), B};
    return {3 * fwd + kAdamwFlopsPerParam * P, 6 * 4 * P + x_bytes + 4 * B, B};
  }

};

using models::rms;
using models::within;
using models::as_doubles;
using models::slice;

}  // namespace

const std::vector<Arch>& archs() {
  static const std::vector<Arch> all = {
      // The TensorFlow 2 comparison: batch 64 in the study; 16 and 32 for the batch axis.
      {"keras_cnn", 256, 256, 3, true,
       {{{{32, true}}, 3, 0.25}, {{{64, true}, {64, true}}, 2, 0.25}, {{{128, true}, {128, true}}, 2, 0.25}},
       1024, 0.5, 4, {16, 32, 64}, true},
      // Max Woolf's benchmarks: Keras' cifar10_cnn.py, batch 32 in the script, 128 in the study.
      {"vgg_cifar", 32, 32, 3, false,
       {{{{32, true}, {32, false}}, 2, 0.25}, {{{64, true}, {64, false}}, 2, 0.25}},
       512, 0.5, 10, {32, 128, 512}, true},
      // Keras' mnist_cnn.py (Max Woolf's benchmarks): two valid 3x3 convolutions, one pool, batch 128
      // in the script.
      {"cnn_mnist", 28, 28, 1, false, {{{{32, false}, {64, false}}, 2, 0.25}}, 128, 0.5, 10, {32, 128, 512}, true},
      // The tests' tiny versions: odd and unequal H and W, pools that crop a row or a column; one input
      // channel and one stage (mnist_test).
      {"keras_test", 20, 17, 3, true, {{{{4, true}}, 3, 0.25}, {{{8, true}, {8, true}}, 2, 0.25}}, 16, 0.5, 3, {}, true},
      {"mnist_test", 13, 12, 1, false, {{{{4, false}, {8, false}}, 2, 0.25}}, 16, 0.5, 5, {}, true},
      {"vgg_test", 16, 14, 3, false, {{{{4, true}, {4, false}}, 2, 0.25}, {{{8, true}, {8, false}}, 2, 0.25}}, 16, 0.5, 5, {}, true},
  };
  return all;
}

const Arch& arch_named(const std::string& name) { return models::entry_named(archs(), name, "model_cnn: unknown model "); }

std::vector<ConvLayer> conv_layers(const Arch& a) {
  std::vector<ConvLayer> out;
  std::int64_t C = a.C, H = a.H, W = a.W;
  for (const Stage& st : a.stages)
    for (std::size_t i = 0; i < st.convs.size(); ++i) {
      ConvLayer c{};
      c.C = C, c.H = H, c.W = W, c.K = st.convs[i].out, c.pad = st.convs[i].same ? 1 : 0;
      c.P = H + 2 * c.pad - 2, c.Q = W + 2 * c.pad - 2;
      HOTOPS_CHECK(c.P > 0 && c.Q > 0, "model_cnn: a valid conv leaves nothing of " + a.name);
      if (i + 1 == st.convs.size()) {
        c.pool = st.pool, c.PH = c.P / st.pool, c.PW = c.Q / st.pool, c.dropout = st.dropout;
        HOTOPS_CHECK(c.PH > 0 && c.PW > 0, "model_cnn: a pool leaves nothing of " + a.name);
        H = c.PH, W = c.PW;
      } else {
        H = c.P, W = c.Q;
      }
      C = c.K;
      out.push_back(c);
    }
  return out;
}

std::int64_t flat_width(const Arch& a) {
  const ConvLayer last = conv_layers(a).back();
  return last.pooled_count();
}

Shape shape_of(const Problem& p) {
  const models::StepArgs a = models::step_args(p, "model_cnn", true, /*allow_bf16=*/true);
  Shape s;
  s.arch = arch_named(a.model);
  s.convs = conv_layers(s.arch);
  models::copy_step_args(a, s);
  return s;
}

std::string data_parallel_arch_reason(const Arch& a) {
  if (!a.bn) return "";
  return "model_cnn: " + a.name + " has batch normalization: a data-parallel replica would normalise by its own shard's "
         "statistics (no SyncBatchNorm), not one step over the global batch, so hotops has no data-parallel step of it";
}

ParamLayout param_layout(const Arch& a) {
  ParamLayout l;
  auto place = [&](const std::string& name, std::int64_t n, bool zero_grad = false) {
    const std::size_t at = l.total;
    l.total += (static_cast<std::size_t>(n) + kAlignFloats - 1) / kAlignFloats * kAlignFloats;
    l.parameters += n;
    l.tensors.emplace_back(at, static_cast<std::size_t>(n));
    l.names.push_back(name);
    l.zero_grad.push_back(zero_grad);
    return at;
  };
  auto stats = [&](Layer& y, std::int64_t n) {
    y.mean = l.stats;
    y.var = l.stats + static_cast<std::size_t>(n);
    l.stats += 2 * static_cast<std::size_t>(n);
  };
  const std::vector<ConvLayer> convs = conv_layers(a);
  for (std::size_t i = 0; i < convs.size(); ++i) {
    const ConvLayer& c = convs[i];
    const std::string n = "conv" + std::to_string(i + 1);
    Layer y;
    y.w = place(n + ".W", c.K * 9 * c.C);
    y.b = place(n + ".b", c.K, a.bn);
    if (a.bn) y.gamma = place(n + ".gamma", c.K), y.beta = place(n + ".beta", c.K);
    l.conv.push_back(y);
  }
  l.dense1.w = place("dense1.W", flat_width(a) * a.hidden);
  l.dense1.b = place("dense1.b", a.hidden, a.bn);
  if (a.bn) l.dense1.gamma = place("dense1.gamma", a.hidden), l.dense1.beta = place("dense1.beta", a.hidden);
  l.dense2.w = place("dense2.W", a.hidden * a.classes);
  l.dense2.b = place("dense2.b", a.classes);
  if (a.bn) {
    for (std::size_t i = 0; i < convs.size(); ++i) stats(l.conv[i], convs[i].K);
    stats(l.dense1, a.hidden);
  }
  return l;
}

std::vector<pointwise::DropoutKey> dropout_keys(const Arch& a, std::uint64_t seed) {
  std::vector<pointwise::DropoutKey> keys;
  std::uint64_t k = seed ^ 0xd1b54a32d192ed03ull;
  for (const Stage& st : a.stages) keys.push_back(pointwise::dropout_key(k += 0x9e3779b97f4a7c15ull, st.dropout));
  keys.push_back(pointwise::dropout_key(k += 0x9e3779b97f4a7c15ull, a.hidden_dropout));
  return keys;
}

State make_state(const Shape& s, const ParamLayout& l, std::uint64_t seed) {
  const Arch& a = s.arch;
  State st;
  const std::int64_t in = a.H * a.W * a.C;
  st.x = HostBuffer(s.dtype, static_cast<std::size_t>(s.batch * in));
  st.x.fill_uniform(seed, 1);
  // The teacher depends on the architecture only, so that every batch size poses the same task.
  HostBuffer teacher(DType::f32, static_cast<std::size_t>(in * a.classes));
  teacher.fill_uniform(0xc0111e5ull, 2);
  st.labels.resize(static_cast<std::size_t>(s.batch));
  std::vector<float> x(st.x.count());
  const auto xn = static_cast<std::int64_t>(x.size());
#pragma omp parallel for schedule(static) if (xn > (std::int64_t(1) << 16))
  for (std::int64_t i = 0; i < xn; ++i) x[static_cast<std::size_t>(i)] = static_cast<float>(st.x.get(static_cast<std::size_t>(i)));
  const float* t = teacher.as<float>();
#pragma omp parallel for schedule(static)
  for (std::int64_t b = 0; b < s.batch; ++b) {
    std::vector<double> score(static_cast<std::size_t>(a.classes), 0.0);
    for (std::int64_t i = 0; i < in; ++i)
      for (std::int64_t c = 0; c < a.classes; ++c) score[static_cast<std::size_t>(c)] += x[b * in + i] * t[i * a.classes + c];
    st.labels[static_cast<std::size_t>(b)] =
        static_cast<std::int32_t>(std::max_element(score.begin(), score.end()) - score.begin());
  }
  st.params = HostBuffer(DType::f32, l.total);
  zero_bytes(st.params.data(), st.params.bytes());
  const std::vector<ConvLayer>& convs = s.convs;
  auto fill = [&](std::size_t at, std::int64_t n, std::uint64_t stream, float lo, float hi) {
    models::fill_uniform_at(st.params, at, n, seed, stream, lo, hi);
  };
  std::uint64_t stream = 100;
  auto layer = [&](const Layer& y, std::int64_t fan_in, std::int64_t wn, std::int64_t n, bool bn) {
    const float bound = static_cast<float>(1 / std::sqrt(static_cast<double>(fan_in)));
    fill(y.w, wn, stream++, -bound, bound);
    fill(y.b, n, stream++, -bound, bound);
    if (bn) {
      fill(y.gamma, n, stream++, 0.9f, 1.1f);
      fill(y.beta, n, stream++, -0.1f, 0.1f);
    }
  };
  for (std::size_t i = 0; i < convs.size(); ++i) layer(l.conv[i], 9 * convs[i].C, convs[i].K * 9 * convs[i].C, convs[i].K, a.bn);
  layer(l.dense1, flat_width(a), flat_width(a) * a.hidden, a.hidden, a.bn);
  layer(l.dense2, a.hidden, a.hidden * a.classes, a.classes, false);
  st.stats = HostBuffer(DType::f32, std::max<std::size_t>(1, l.stats));
  std::fill_n(st.stats.as<float>(), st.stats.count(), 0.f);
  if (a.bn) {
    auto stat = [&](const Layer& y, std::int64_t n) {
      HostBuffer u(DType::f32, static_cast<std::size_t>(2 * n));
      u.fill_uniform(seed, stream++, -0.1f, 0.1f);
      for (std::int64_t c = 0; c < n; ++c) {
        st.stats.as<float>()[y.mean + static_cast<std::size_t>(c)] = u.as<float>()[c];
        st.stats.as<float>()[y.var + static_cast<std::size_t>(c)] = 1.f + u.as<float>()[n + c];
      }
    };
    for (std::size_t i = 0; i < convs.size(); ++i) stat(l.conv[i], convs[i].K);
    stat(l.dense1, a.hidden);
  }
  models::zero_moments(st.m, st.v, l.total);
  return st;
}

std::size_t& seeded_states_made() {
  static std::size_t n = 0;
  return n;
}

std::shared_ptr<const State> seeded_state(const Shape& s, const ParamLayout& l, std::uint64_t seed) {
  const std::string key = s.arch.name + "/" + dtype_name(s.dtype) + "/batch:" + std::to_string(s.batch) + "/seed:" + std::to_string(seed);
  return shared_value<State>(key, [&] { return make_state(s, l, seed); }, 1, seeded_states_made());
}

std::int64_t verify_period(const Shape& s) { return std::min(s.batch, kVerifyPeriod); }

State verification_state(const Shape& s, const State& seeded) {
  State st = seeded;
  const std::int64_t period = verify_period(s), per = s.arch.H * s.arch.W * s.arch.C;
  for (std::int64_t b = period; b < s.batch; ++b) {
    const std::size_t bytes = st.x.bytes() / st.x.count() * static_cast<std::size_t>(per);
    std::memcpy(static_cast<char*>(st.x.data()) + static_cast<std::size_t>(b) * bytes,
                static_cast<const char*>(seeded.x.data()) + static_cast<std::size_t>(b % period) * bytes, bytes);
    st.labels[static_cast<std::size_t>(b)] = seeded.labels[static_cast<std::size_t>(b % period)];
  }
  return st;
}

// Bounds, from one step at the verification start (optimizer step 1):
// - logits (infer) and loss: max|out - ref| / rms(ref) <= 1e-3: f32 convolutions (cuDNN may pick FFT
//   or Winograd algorithms, whose rounding is larger than a direct sum's) through up to five layers and
//   a 56448-term dense sum; a wrong weight, channel or pixel is O(1e-2) or more.
// - gradients, per tensor, max|out - ref| / rms(ref) <= 5e-3 (sums over the batch and the pixels of
//   products carried back through batch norm, pooling and dropout); a bias whose gradient is zero by
//   construction (before batch norm) is checked against the rms of its layer's weight gradient.
// - near-ties: a ReLU whose input is zero up to rounding, or a max-pool window whose two largest values
//   are equal up to rounding, would route one gradient differently in the reference and in a correct
//   implementation, and change a conv weight's gradient by O(1/sqrt(pixels)): within a band of 1e-4 x
//   the error a channel's values can carry (rms of the layer's values, or more where batch norm
//   magnifies z's rounding: reference.cpp's tie_bands), the reference decides as the implementation
//   decided (its post-ReLU outputs, Outcome::relu and ::hidden).
// - running statistics: max|out - ref| / rms(ref) <= 1e-3.
// - the step, as the other model families: the reference takes AdamW's step in double from the
//   gradients the implementation computed (checked above); p - p0 in units of lr, bound 1e-3.
//
// bf16 (model_cnn.h), against the same double reference; u = 2^-9, the relative rounding of one bf16
// value. Every conv and dense layer rounds its operands (the weights, its input activation) and its
// output z; errors independent in sign from element to element add in quadrature as the terms do, so
// each such step adds ~ u rms(z) to the carried error, and batch normalization, dividing by the batch
// deviation, scales a channel's by |z| / std. The max over up to 10^7 elements is ~ 4-5 x the rms.
// The backward adds, per layer, the rounding of dz, of the weights and of the stored data gradient, and
// a weight gradient sums products that normalization has made nearly cancelling (dz sums to ~0 over a
// channel), so its relative error exceeds the forward's by the ratio sum|terms| / |sum|. Measured on
// the H100 (verification batch, every benchmarked and test batch):
// - logits: <= 0.017 (keras_cnn b16; vgg_cifar <= 0.0071); bound 20u = 0.039. vgg_test's first conv
//   bias left out gives 0.052, its last bias or a transposed last weight far more.
// - loss: <= 0.0094 relative (keras_test b3); bound 16u.
// - gradients, per tensor: vgg_cifar max <= 0.043, rms <= 0.0072; keras_test max <= 0.39 (dW1 at
//   batch 4), rms <= 0.04; keras_cnn (16 distinct samples, CUDA b16-b64 and the CPU's b16) max <= 0.31
//   (dconv5.W, dW1), rms <= 0.037 (dconv2.beta); bounds max 0.5 (256u), rms(out - ref) <= 0.1 rms(ref)
//   (51u). The rms bound is the one a systematic slip (a missing bias, a transposed weight, another
//   mask) breaks, as it shifts every element where rounding is random
//   (ModelCnnVerify.Bf16BoundsCatchSlips).
// - running statistics: <= 4.6e-4; bound 8u (means over B P Q values, each rounded once).
// - ties: a ReLU or a pool window within 16u x the error its channel can carry decided as the
//   implementation did (its z is off by a few u |z|), times the layer's depth (reference.cpp's
//   bn_relu_fwd: the layers below add their errors).
// - f32 sums over the batch: a conv layer's weight, bias and batch-norm gradients each sum n = B P Q
//   terms (4.2M at keras_cnn's first layer, batch 64), and an f32 sum of them carries rounding that
//   grows with n and with sum|terms| in the order a kernel adds them: oneDNN's one-thread weight
//   gradient adds longer runs than its many-thread one (keras_cnn b64 on one thread: dconv1.W off by
//   0.0074 of its rms at one element, 1.2e-3 relative, where the same step on two threads passes).
//   Before the bounds above, each gradient element may differ by u32 sqrt(n) / 8 times its bound of
//   sum|terms| (Reference::summed: Cauchy-Schwarz over the channels' values). Measured on that step:
//   at most 0.42 of the allowance (dconv1.W), whose largest element is 0.019 of the tensor's rms at
//   conv 1 and under 0.004 above it, so a slip of a few percent of a gradient still fails.
struct Bounds {
  double logits, loss, grad, grad_rms, stats, tie, summed;
};
Bounds bounds_for(DType t) {
  constexpr double u = 1.0 / 512;
  if (t == DType::bf16) return {20 * u, 16 * u, 0.5, 0.1, 8 * u, 16 * u, 0};
  return {1e-3, 1e-3, 5e-3, 0, 1e-3, 1e-4, 1.0 / 8 / (1 << 24)};
}

// out[i] with its difference from ref[i] less its allowance `factor` x summed[i] (never past ref[i]),
// for the n elements at each pointer, into o: what the bounds then judge.
void less_allowance(const double* out, const double* ref, const double* summed, double factor, std::size_t n, double* o) {
  const auto count = static_cast<std::int64_t>(n);
#pragma omp parallel for schedule(static) if (count > (std::int64_t(1) << 16))
  for (std::int64_t k = 0; k < count; ++k) {
    const auto i = static_cast<std::size_t>(k);
    const double d = out[i] - ref[i], a = summed[i] * factor;
    o[i] = std::fabs(d) <= a ? ref[i] : out[i] - std::copysign(a, d);
  }
}

Check verify_outcome(const Shape& s, const ParamLayout& l, const std::vector<pointwise::DropoutKey>& keys,
                     const State& start, const Outcome& out) {
  const Arch& a = s.arch;
  const std::int64_t period = verify_period(s);
  std::vector<std::int64_t> count(static_cast<std::size_t>(period), 0);
  for (std::int64_t b = 0; b < s.batch; ++b) ++count[static_cast<std::size_t>(b % period)];
  const std::size_t per = static_cast<std::size_t>(a.H * a.W * a.C);
  const std::vector<std::int32_t> labels(start.labels.begin(), start.labels.begin() + period);
  const Bounds bound = bounds_for(s.dtype);
  Hints hints;
  hints.band = bound.tie;
  if (s.train()) {
    for (const HostBuffer& h : out.relu) hints.conv.push_back(h.as<float>());
    hints.hidden = out.hidden.count() ? out.hidden.as<float>() : nullptr;
  }
  // Computed once for every way of running the step that starts from the same state (shared_reference).
  // A train step's reference decides its ReLU and pool near-ties as the run's activations did, so
  // it is shared only by runs whose activations are the same bits (the key hashes them): the plain,
  // e2e:1 and graph:1 runs of one CUDA step where their kernels agree.
  const auto compute = [&] {  // (keras_cnn's 58M parameters in double: only where it is computed)
    const std::vector<double> x = as_doubles(start.x, 0, per * static_cast<std::size_t>(period));
    return reference(s, l, keys, as_doubles(start.params), as_doubles(start.stats), x, labels, count, s.train(),
                     s.train() ? &hints : nullptr);
  };
  std::vector<std::pair<const void*, std::size_t>> from{{start.params.data(), start.params.bytes()},
                                                        {start.stats.data(), start.stats.bytes()},
                                                        {start.x.data(), start.x.bytes()},
                                                        {keys.data(), keys.size() * sizeof(keys[0])}};
  if (s.train()) {
    for (const HostBuffer& h : out.relu) from.emplace_back(h.data(), h.bytes());
    from.emplace_back(out.hidden.data(), out.hidden.bytes());
  }
  const auto shared = models::shared_reference<Reference>(models::reference_key(a.name, s.dtype, s.dir, s.batch, from), compute);
  const Reference& ref = *shared;
  if (!s.train()) {
    const std::vector<double> logits = as_doubles(out.logits);
    std::vector<double> r(logits.size());
    const std::size_t C = static_cast<std::size_t>(a.classes);
    for (std::size_t i = 0; i < r.size(); ++i) r[i] = ref.logits[((i / C) % static_cast<std::size_t>(period)) * C + i % C];
    return within("logits", logits, r, std::max(rms(r), 1e-30), bound.logits);
  }
  Check c = within("loss", {static_cast<double>(out.loss)}, {ref.loss}, std::max(std::fabs(ref.loss), 1e-30), bound.loss);
  for (std::size_t k = 0; k < l.tensors.size(); ++k) {
    const auto [at, n] = l.tensors[k];
    const double* r = ref.grad.data() + at;  // the tensor in place: keras_cnn's dense W is 58M elements
    // A zero-by-construction bias: the scale of the weight gradient placed just before it.
    const double scale = l.zero_grad[k] ? rms(ref.grad.data() + l.tensors[k - 1].first, l.tensors[k - 1].second) : rms(r, n);
    const std::string what = "d" + l.names[k];
    const models::Checks t = models::within_by_chunks(
        what, n, std::max(scale, 1e-30), bound.grad, bound.grad_rms, [&](std::size_t part, std::size_t len, double* o, double* rk) {
          const std::vector<double> g = as_doubles(out.grads, at + part, len);
          less_allowance(g.data(), r + part, ref.summed.data() + at + part, bound.summed, len, o);
          std::copy_n(r + part, len, rk);
        });
    c.merge(t.max, what);
    if (bound.grad_rms > 0) c.merge(t.rms, what + " (rms)");
  }
  if (l.stats > 0) {
    const std::vector<double> st = as_doubles(out.stats);
    c.merge(within("running stats", slice(st, 0, l.stats), ref.stats, std::max(rms(ref.stats), 1e-30), bound.stats), "stats");
  }
  c.merge(models::adamw_first_step(start.params, out.grads, start.m, start.v, out.params, l.total), "step");
  return c;
}

namespace {
std::atomic<DataGradPath> g_data_grad_path{DataGradPath::timed};
std::atomic<CudaLayout> g_cuda_layout{CudaLayout::measured};
}  // namespace
void set_cuda_data_grad_path(DataGradPath p) { g_data_grad_path = p; }
DataGradPath cuda_data_grad_path() { return g_data_grad_path; }
void set_cuda_layout(CudaLayout l) { g_cuda_layout = l; }
CudaLayout cuda_layout() { return g_cuda_layout; }

HOTOPS_DEFINE_FAMILY(CnnFamily);

HostBuffer nhwc_to_nchw(const HostBuffer& x, std::int64_t N, std::int64_t H, std::int64_t W, std::int64_t C, bool inverse) {
  HostBuffer out(x.dtype(), x.count());
  const std::size_t e = x.bytes() / std::max<std::size_t>(1, x.count());
  const auto move = [&](auto element) {
    using T = decltype(element);
    const T* in = static_cast<const T*>(x.data());
    T* o = static_cast<T*>(out.data());
#pragma omp parallel for collapse(2) schedule(static) if (N * C * H * W > (std::int64_t(1) << 16))
    for (std::int64_t n = 0; n < N; ++n)
      for (std::int64_t c = 0; c < C; ++c)
        for (std::int64_t hw = 0; hw < H * W; ++hw) {
          const std::int64_t nchw = (n * C + c) * H * W + hw, nhwc = (n * H * W + hw) * C + c;
          o[inverse ? nhwc : nchw] = in[inverse ? nchw : nhwc];
        }
  };
  HOTOPS_CHECK(e == 2 || e == 4, "nhwc_to_nchw: 2- or 4-byte elements only");
  if (e == 2) move(std::uint16_t{});
  else move(std::uint32_t{});
  return out;
}

}  // namespace hotops::model_cnn
