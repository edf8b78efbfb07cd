// The model_bilstm family: names, work, the learnable task and verification.
//
// Names, as the models family's: model.<config>/<cpu|cuda>/f32/<infer|train>/batch:B, then at most
// one variant arg: threads:T (CPU, T OpenMP threads), e2e:1 (CUDA, host time of the step with the
// tokens and labels copied from pageable host memory and the loss or logits copied back), graph:1
// (CUDA train, as e2e with the device part replayed as one CUDA graph captured at setup). Without a
// variant arg a CUDA step is device time, the batch already on the device.
#include "kernels/model_bilstm/model_bilstm.h"


#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>

#include "hotops/check.h"

namespace hotops::model_bilstm {
namespace {

constexpr double kAdamwFlopsPerParam = 14;  // adamw.cpp's count

class BilstmFamily final : public Family {
 public:
  std::string name() const override { return "model_bilstm"; }

  std::vector<Problem> benchmark_problems(const std::vector<std::int64_t>& batches) const override {
    std::vector<Problem> out;
    const std::vector<int> sweep(std::begin(models::kThreadSweep), std::end(models::kThreadSweep));
    for (const Config& c : configs())
      for (std::int64_t b : batches.empty() ? c.batches : batches) models::expand_step_problems(c.name, b, sweep, true, out);
    return out;
  }

  std::vector<Problem> test_problems() const override {
    // The tiny configuration (T 5, vocabulary 50, E 5 != H 7), both backends, both directions, every variant.
    std::vector<Problem> out;
    models::expand_step_problems("bilstm_test", 3, {1}, true, out);
    models::expand_step_problems("bilstm_test", 8, {}, true, out);
    return out;
  }

  // FLOPs: the LSTM's GEMMs, 2 directions x T x 2 x B x 4H x (E + H), and the dense layer's
  // 2 x B x 2H x C; the cell's pointwise math, the gather and the loss are not counted. train: 3x
  // that (forward, data and weight gradients) plus AdamW's 14 per parameter.
  // Bytes, the fewest a step must move: infer reads the tokens, the B x T embedding rows they pick,
  // the LSTM and dense parameters, and writes the logits; train reads the tokens and labels, reads
  // and writes every parameter and AdamW's m and v (6 x 4 bytes per parameter, as the dense models).
  Work work(const Problem& p) const override {
    const Shape s = shape_of(p);
    const Config& c = s.cfg;
    const Layout l = layout_of(c);
    const double B = static_cast<double>(s.batch), T = static_cast<double>(c.T), E = static_cast<double>(c.E),
                 H = static_cast<double>(c.H), C = static_cast<double>(c.C), P = static_cast<double>(l.parameters);
    const double fwd = 2 * T * 2 * B * 4 * H * (E + H) + 2 * B * 2 * H * C;
    const double tokens = 4 * B * T;
    if (!s.train()) {
      const double rows = std::min(B * T, static_cast<double>(c.V)) * E;
      return {fwd, 4 * (P - static_cast<double>(c.V) * E + rows) + tokens + 4 * B * C, B};
    }
    return {3 * fwd + kAdamwFlopsPerParam * P, 6 * 4 * P + tokens + 4 * B, B};
  }

  std::string unsupported_reason(const Problem& p) const override {
    return backend_unsupported_reason(p, cpu_unsupported_reason);
  }

  std::unique_ptr<Case> make(const Problem& p) const override {
    return make_on_backend(p, make_cpu, HOTOPS_CUDA_FACTORY(make_cuda));
  }
};

// max|out - ref| / scale against tol.
using models::rms;
using models::within;
using models::as_doubles;
using models::slice;

}  // namespace

const std::vector<Config>& configs() {
  // Seed 002: Keras' imdb_bidirectional_lstm.py (max_features 20000, maxlen 200 in the study's run,
  // embedding 128), batch 64 in the script, swept 32 and 256; LSTM width as kernels/lstm's imdb.bilstm.
  static const std::vector<Config> all = {
      {"bilstm_imdb", 20000, 128, 128, 200, 2, {32, 64, 256}},
      {"bilstm_test", 50, 5, 7, 5, 2, {}},
  };
  return all;
}

const Config& config_named(const std::string& name) {
  for (const Config& c : configs())
    if (c.name == name) return c;
  throw Error("model_bilstm: unknown model " + name);
}

Shape shape_of(const Problem& p) {
  const models::StepArgs a = models::step_args(p, "model_bilstm", true);
  Shape s;
  s.cfg = config_named(a.model);
  s.backend = a.backend;
  s.dir = a.dir;
  s.batch = a.batch;
  s.variant = a.variant;
  s.threads = a.threads;
  return s;
}

Layout layout_of(const Config& c) {
  Layout l;
  auto place = [&](std::int64_t n) {
    const std::size_t at = l.total;
    l.total += (static_cast<std::size_t>(n) + kAlignFloats - 1) / kAlignFloats * kAlignFloats;
    l.parameters += n;
    return at;
  };
  const std::int64_t G = 4 * c.H;
  l.embed = place(c.V * c.E);
  l.w_ih = place(2 * G * c.E);
  l.w_hh = place(2 * G * c.H);
  l.b_ih = place(2 * G);
  l.b_hh = place(2 * G);
  l.dense_w = place(2 * c.H * c.C);
  l.dense_b = place(c.C);
  return l;
}

State make_state(const Shape& s, const Layout& l, std::uint64_t seed) {
  const Config& c = s.cfg;
  State st;
  const std::size_t N = static_cast<std::size_t>(s.batch * c.T);
  HostBuffer u(DType::f32, N);
  u.fill_uniform(seed, 1, 0.f, 1.f);
  st.tokens.resize(N);
  for (std::size_t i = 0; i < N; ++i)
    st.tokens[i] = static_cast<std::int32_t>(std::min<std::int64_t>(c.V - 1, static_cast<std::int64_t>(u.get(i) * static_cast<double>(c.V))));
  // The "positive" tenth of the vocabulary: fixed, so that every batch and seed poses the same task.
  HostBuffer pick(DType::f32, static_cast<std::size_t>(c.V));
  pick.fill_uniform(0xb1157ull, 2, 0.f, 1.f);
  const std::int64_t threshold = c.T / 10;
  st.labels.resize(static_cast<std::size_t>(s.batch));
  for (std::int64_t b = 0; b < s.batch; ++b) {
    std::int64_t hits = 0;
    for (std::int64_t t = 0; t < c.T; ++t) hits += pick.get(static_cast<std::size_t>(st.tokens[static_cast<std::size_t>(b * c.T + t)])) < 0.1;
    st.labels[static_cast<std::size_t>(b)] = hits > threshold ? 1 : 0;
  }
  st.params = HostBuffer(DType::f32, l.total);
  std::fill_n(st.params.as<float>(), l.total, 0.f);
  const std::int64_t G = 4 * c.H;
  const float k_lstm = static_cast<float>(1 / std::sqrt(static_cast<double>(c.H)));
  const float k_dense = static_cast<float>(1 / std::sqrt(static_cast<double>(2 * c.H)));
  struct Part {
    std::size_t at;
    std::int64_t n;
    float bound;
  };
  const Part parts[] = {{l.embed, c.V * c.E, 1.f},      {l.w_ih, 2 * G * c.E, k_lstm},     {l.w_hh, 2 * G * c.H, k_lstm},
                        {l.b_ih, 2 * G, k_lstm},        {l.b_hh, 2 * G, k_lstm},           {l.dense_w, 2 * c.H * c.C, k_dense},
                        {l.dense_b, c.C, k_dense}};
  std::uint64_t stream = 100;
  for (const Part& part : parts) {
    HostBuffer t(DType::f32, static_cast<std::size_t>(part.n));
    t.fill_uniform(seed, stream++, -part.bound, part.bound);
    std::copy_n(t.as<float>(), t.count(), st.params.as<float>() + part.at);
  }
  st.m = HostBuffer(DType::f32, l.total);
  st.v = HostBuffer(DType::f32, l.total);
  std::fill_n(st.m.as<float>(), l.total, 0.f);
  std::fill_n(st.v.as<float>(), l.total, 0.f);
  return st;
}

// Bounds, from one step at the seeded start (optimizer step 1):
// - logits and loss: max|out - ref| / rms(ref) <= kernels/lstm's bound for this T (tolerance(f32) =
//   1e-4 up to T = 25, growing as sqrt(T / 25): each step's rounding is carried through c).
// - gradients, per tensor (embedding, W_ih, W_hh, b_ih, b_hh, dense W, dense b): max|out - ref| /
//   rms(ref) <= 1e-3 x the same sqrt(T / 25) growth: the dense models' gradient bound (sums over the
//   batch of products carried through the chain) with the recurrence's random walk of errors on top.
//   A wrong gate, time step or token row is O(1).
// - the step, as the dense models: the reference takes AdamW's step in double from the gradients the
//   implementation computed (checked above); p - p0 in units of lr, bound 1e-3.
Check verify_outcome(const Shape& s, const Layout& l, const State& start, const Outcome& out) {
  const Config& c = s.cfg;
  const std::vector<double> p0 = as_doubles(start.params);
  const Reference ref = reference(c, l, p0, start.tokens, start.labels, s.batch, s.train());
  const double growth = std::max(1.0, std::sqrt(static_cast<double>(c.T) / 25.0));
  const double tol = tolerance(DType::f32) * growth;
  if (!s.train()) return within("logits", as_doubles(out.logits), ref.logits, std::max(rms(ref.logits), 1e-30), tol);
  Check all = within("loss", {static_cast<double>(out.loss)}, {ref.loss}, std::max(std::fabs(ref.loss), 1e-30), tol);
  const std::vector<double> g = as_doubles(out.grads);
  const std::int64_t G = 4 * c.H;
  const std::pair<const char*, std::pair<std::size_t, std::int64_t>> tensors[] = {
      {"dEmbedding", {l.embed, c.V * c.E}}, {"dW_ih", {l.w_ih, 2 * G * c.E}}, {"dW_hh", {l.w_hh, 2 * G * c.H}},
      {"db_ih", {l.b_ih, 2 * G}},           {"db_hh", {l.b_hh, 2 * G}},       {"dW_dense", {l.dense_w, 2 * c.H * c.C}},
      {"db_dense", {l.dense_b, c.C}}};
  for (const auto& [what, where] : tensors) {
    const std::size_t n = static_cast<std::size_t>(where.second);
    const std::vector<double> r = slice(ref.grad, where.first, n);
    all.merge(within(what, slice(g, where.first, n), r, std::max(rms(r), 1e-30), 1e-3 * growth), what);
  }
  all.merge(models::adamw_first_step(p0, g, start.m, start.v, out.params, l.total), "step");
  return all;
}

const Family& family() {
  static const BilstmFamily f;
  return f;
}

}  // namespace hotops::model_bilstm
