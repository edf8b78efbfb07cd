// The model_bilstm family (the BiLSTM and the character LSTM): names, work, the learnable tasks and
// verification.
//
// Names, as the models family's: model.<config>/<cpu|cuda>/<f32|bf16>/<infer|train>/batch:B, then at most
// one variant arg: threads:T (CPU, T OpenMP threads), e2e:1 (CUDA, host time of the step with the
// tokens and labels copied from pageable host memory and the loss or logits copied back), graph:1
// (CUDA train, as e2e with the device part replayed as one CUDA graph captured at setup). Without a
// variant arg a CUDA step is device time, the batch already on the device. gpus:G (CUDA train): the
// data-parallel step over G GPUs, batch per GPU (kernels/models/data_parallel.h). bf16 is mixed
// precision (model_bilstm.h); every problem exists in both dtypes.
#include "kernels/model_bilstm/model_bilstm.h"


#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>

#include "hotops/check.h"

namespace hotops::model_bilstm {
namespace {

constexpr double kAdamwFlopsPerParam = 14;  // adamw.cpp's count

class BilstmFamily final : public models::DataParallelModelFamily<> {
 public:
  BilstmFamily() : DataParallelModelFamily("model_bilstm", cpu_unsupported_reason, make_cpu, HOTOPS_CUDA_FACTORY(make_cuda)) {}

  std::vector<Problem> benchmark_problems(const std::vector<std::int64_t>& batches) const override {
    return models::steps_and_data_parallel_problems(configs(), batches);
  }

  std::vector<Problem> test_problems() const override {
    // The tiny configuration (T 5, vocabulary 50, E 5 != H 16: a width that hotops' CUDA LSTM kernels
    // take), both backends, both directions, both dtypes, every variant.
    std::vector<Problem> out;
    models::expand_step_problems("bilstm_test", 3, {1}, true, out, /*with_bf16=*/true);
    models::expand_step_problems("bilstm_test", 8, {}, true, out, /*with_bf16=*/true);
    // The character LSTM's (one direction, one-hot input, 19 classes: past cross_entropy_dbias's 16).
    models::expand_step_problems("textgen_test", 3, {1}, true, out, /*with_bf16=*/true);
    // The data-parallel step on a communicator of one process: its whole path on one GPU.
    models::add_data_parallel_test_problems("bilstm_test", 3, out);
    models::add_data_parallel_test_problems("textgen_test", 3, out);
    return out;
  }

  // FLOPs: the LSTM's GEMMs, D directions x T x 2 x B x 4H x (E + H), and the dense layer's
  // 2 x B x DH x C; the cell's pointwise math, the gather and the loss are not counted (nor the
  // one-hot input's zeros: the LSTM multiplies them as a dense tensor). train: 3x that (forward,
  // data and weight gradients) plus AdamW's 14 per parameter.
  // Bytes, the fewest a step must move: infer reads the tokens and the B x T embedding rows they pick
  // (one_hot: the one-hot batch in the dtype), the LSTM and dense parameters, and writes the logits;
  // train reads that batch and the labels (int32; int64 targets for cross_entropy), reads and writes
  // every parameter and AdamW's m and v (6 x 4 bytes per parameter, as the dense models).
  // bf16 keeps the f32 parameters (its per-step bf16 copy is not counted, as the dense models'); its
  // logits are 2 bytes.
  Work one_gpu_work(const Problem& p) const override {
    const Shape s = shape_of(p);
    const Config& c = s.cfg;
    const Layout l = layout_of(c);
    const double B = static_cast<double>(s.batch), T = static_cast<double>(c.T), E = static_cast<double>(c.E),
                 H = static_cast<double>(c.H), C = static_cast<double>(c.C), P = static_cast<double>(l.parameters);
    const double D = static_cast<double>(c.D), es = s.bf16() ? 2 : 4;
    const double fwd = 2 * T * D * B * 4 * H * (E + H) + 2 * B * D * H * C;
    const double batch = c.one_hot ? es * T * B * E : 8 * B * T;  // the one-hot tensor, or int64 tokens
    const double labels = (c.fused_loss() ? 4 : 8) * B;
    if (!s.train()) {
      const double rows = c.one_hot ? 0 : std::min(B * T, static_cast<double>(c.V)) * E;
      return {fwd, 4 * (P - static_cast<double>(c.embed_count()) + rows) + batch + es * B * C, B};
    }
    return {3 * fwd + kAdamwFlopsPerParam * P, 6 * 4 * P + batch + labels, B};
  }

};

// max|out - ref| / scale against tol.
using models::rms;
using models::within;
using models::as_doubles;
using models::slice;

}  // namespace

const std::vector<Config>& configs() {
  // Keras' imdb_bidirectional_lstm.py (max_features 20000, maxlen 200 in Max Woolf's run,
  // embedding 128), batch 64 in the script, swept 32 and 256; LSTM width as kernels/lstm's imdb.bilstm.
  // Keras' lstm_text_generation.py: 40 one-hot characters of a 57-symbol alphabet, LSTM(128), Dense(57)
  // softmax, batch 128 in the script, swept 32 and 512; the LSTM as kernels/lstm's textgen.
  static const std::vector<Config> all = {
      {"bilstm_imdb", 20000, 128, 128, 200, 2, {32, 64, 256}},
      {"bilstm_test", 50, 5, 16, 5, 2, {}},
      {"lstm_textgen", 57, 57, 128, 40, 57, {32, 128, 512}, 1, true},
      {"textgen_test", 19, 19, 7, 5, 19, {}, 1, true},
  };
  return all;
}

bool Config::fused_loss() const { return C <= loss::kDbiasMaxClasses; }

const Config& config_named(const std::string& name) { return models::entry_named(configs(), name, "model_bilstm: unknown model "); }

Shape shape_of(const Problem& p) {
  const models::StepArgs a = models::step_args(p, "model_bilstm", true, /*allow_bf16=*/true);
  Shape s;
  s.cfg = config_named(a.model);
  models::copy_step_args(a, s);
  return s;
}

embedding::Shape embedding_shape(const Shape& s, Direction d, DType dx) {
  embedding::Shape e;
  e.dir = d;
  e.dtype = d == Direction::fwd ? s.dtype : dx;
  e.batch = s.batch, e.T = s.cfg.T, e.vocab = s.cfg.V, e.dim = s.cfg.E;
  e.time_major = true;                                   // x [T, B, E], as the LSTM reads it
  e.f32_table = d == Direction::fwd && s.bf16();         // the f32 table's rows stored bf16
  return e;
}

matmul::Shape head_shape(const Shape& s, Direction d, DType dh) {
  matmul::Shape m;
  m.op = d == Direction::fwd ? matmul::Op::addmm : matmul::Op::mm;
  m.dir = d;
  m.dtype = s.dtype;
  m.M = s.batch, m.N = s.cfg.C, m.K = s.cfg.D * s.cfg.H;
  m.a_blocks = s.cfg.D;  // hT [D, B, H]: the directions' final states, concatenated where they lie
  // bf16: the weight gradient f32 (master weights); dhT f32 where the LSTM's backward takes it so.
  m.f32_out = s.bf16() && (d == Direction::bwd_weight || (d == Direction::bwd_data && dh == DType::f32));
  return m;
}

loss::Shape loss_shape(const Shape& s, Direction d) {
  loss::Shape x;
  x.kind = loss::Kind::cross_entropy, x.dir = d, x.dtype = s.dtype, x.rows = s.batch, x.classes = s.cfg.C;
  return x;
}

matmul::bias_grad::Shape bias_grad_shape(const Shape& s) { return {s.dtype, s.batch, s.cfg.C}; }

Layout layout_of(const Config& c) {
  Layout l;
  auto place = [&](std::int64_t n) { return models::place_aligned(l.total, l.parameters, n); };
  const std::int64_t G = c.D * 4 * c.H;
  l.embed = place(c.embed_count());
  l.w_ih = place(G * c.E);
  l.w_hh = place(G * c.H);
  l.b_ih = place(G);
  l.b_hh = place(G);
  l.dense_w = place(c.D * c.H * c.C);
  l.dense_b = place(c.C);
  return l;
}

std::vector<Tensor> gradient_tensors(const Config& c, const Layout& l) {
  const std::int64_t G = c.D * 4 * c.H;
  std::vector<Tensor> all;
  if (!c.one_hot) all.push_back({"dEmbedding", l.embed, c.embed_count()});
  for (const Tensor& t : {Tensor{"dW_ih", l.w_ih, G * c.E}, Tensor{"dW_hh", l.w_hh, G * c.H}, Tensor{"db_ih", l.b_ih, G},
                          Tensor{"db_hh", l.b_hh, G}, Tensor{"dW_dense", l.dense_w, c.D * c.H * c.C},
                          Tensor{"db_dense", l.dense_b, c.C}})
    all.push_back(t);
  return all;
}

State make_state(const Shape& s, const Layout& l, std::uint64_t seed) {
  const Config& c = s.cfg;
  State st;
  const std::size_t N = static_cast<std::size_t>(s.batch * c.T);
  HostBuffer u(DType::f32, N);
  u.fill_uniform(seed, 1, 0.f, 1.f);
  st.tokens.resize(N);
  for (std::size_t i = 0; i < N; ++i)
    st.tokens[i] = std::min<std::int64_t>(c.V - 1, static_cast<std::int64_t>(u.get(i) * static_cast<double>(c.V)));
  // Fixed, so that every batch and seed poses the same task: two classes, the "positive" tenth of
  // the vocabulary; more, the next character as a function of the last.
  HostBuffer pick(DType::f32, static_cast<std::size_t>(c.V));
  pick.fill_uniform(0xb1157ull, 2, 0.f, 1.f);
  const auto token = [&](std::int64_t b, std::int64_t t) { return st.tokens[static_cast<std::size_t>(b * c.T + t)]; };
  const std::int64_t threshold = c.T / 10;
  st.labels.resize(static_cast<std::size_t>(s.batch));
  for (std::int64_t b = 0; b < s.batch; ++b) {
    std::int32_t label = 0;
    if (c.C == 2) {
      std::int64_t hits = 0;
      for (std::int64_t t = 0; t < c.T; ++t) hits += pick.get(static_cast<std::size_t>(token(b, t))) < 0.1;
      label = hits > threshold ? 1 : 0;
    } else {
      const double next = pick.get(static_cast<std::size_t>(token(b, c.T - 1)));
      label = static_cast<std::int32_t>(std::min<std::int64_t>(c.C - 1, static_cast<std::int64_t>(next * static_cast<double>(c.C))));
    }
    st.labels[static_cast<std::size_t>(b)] = label;
  }
  st.targets.assign(st.labels.begin(), st.labels.end());
  if (c.one_hot) {
    st.x = HostBuffer(s.dtype, static_cast<std::size_t>(c.T * s.batch * c.E));
    std::memset(st.x.data(), 0, st.x.bytes());
    for (std::int64_t t = 0; t < c.T; ++t)
      for (std::int64_t b = 0; b < s.batch; ++b) st.x.set(static_cast<std::size_t>((t * s.batch + b) * c.E + token(b, t)), 1.0);
  }
  st.params = HostBuffer(DType::f32, l.total);
  std::fill_n(st.params.as<float>(), l.total, 0.f);
  const std::int64_t G = c.D * 4 * c.H;
  const float k_lstm = static_cast<float>(1 / std::sqrt(static_cast<double>(c.H)));
  const float k_dense = static_cast<float>(1 / std::sqrt(static_cast<double>(c.D * c.H)));
  struct Part {
    std::size_t at;
    std::int64_t n;
    float bound;
  };
  const Part parts[] = {{l.embed, c.embed_count(), 1.f},  {l.w_ih, G * c.E, k_lstm},     {l.w_hh, G * c.H, k_lstm},
                        {l.b_ih, G, k_lstm},               {l.b_hh, G, k_lstm},           {l.dense_w, c.D * c.H * c.C, k_dense},
                        {l.dense_b, c.C, k_dense}};
  std::uint64_t stream = 100;
  for (const Part& part : parts) models::fill_uniform_at(st.params, part.at, part.n, seed, stream++, -part.bound, part.bound);
  models::zero_moments(st.m, st.v, l.total);
  return st;
}

void SampleShard::operator()(State& out, const State& global, std::size_t T, const models::Replica& r, std::int64_t batch) const {
  out.tokens = models::shard(global.tokens, T, r, batch);
  out.labels = models::shard(global.labels, 1, r, batch);
  out.targets = models::shard(global.targets, 1, r, batch);
  if (global.x.count() == 0) return;
  // x [T, G B, E]: at each time step, the shard's B rows of E from row r B on.
  const std::size_t B = static_cast<std::size_t>(batch), rows = global.labels.size();
  const std::size_t row_bytes = global.x.bytes() / (T * rows);
  out.x = HostBuffer(global.x.dtype(), global.x.count() / rows * B);
  const auto* from = static_cast<const std::byte*>(global.x.data());
  auto* to = static_cast<std::byte*>(out.x.data());
  for (std::size_t t = 0; t < T; ++t)
    std::memcpy(to + t * B * row_bytes, from + (t * rows + static_cast<std::size_t>(r.rank) * B) * row_bytes, B * row_bytes);
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
// bf16 (model_bilstm.h), against the same exact reference; u = 2^-9, the relative rounding of one bf16
// value. The LSTM part is kernels/lstm's bf16 case (lstm.cpp, tolerance_of): each step's gates sum
// E + H products of bf16 operands (x, W, h_{t-1}, each rounded by up to u; the independent errors add
// in quadrature, ~u of the gates' rms), carried through c as a random walk over the steps: max|hT -
// ref| / rms <= tolerance(bf16) = 4e-2 up to T = 25, times sqrt(T / 25) beyond (0.113 at T 200), the
// bound cuDNN's bf16 imdb.bilstm passes in that family. The dense head passes hT's relative error to
// the logits unchanged (a sum over D H of independent errors scales as the sum), plus u for its bf16 W
// and u for the logits' own rounding: small beside it. So:
// - logits: max|out - ref| / rms(ref) <= tolerance(bf16) x growth, and rms(out - ref) / rms(ref) <=
//   1e-2 x growth (a few roundings of ~u in quadrature, ~5e-3 x growth; rounding averages out in the
//   rms where a systematic slip does not, so it catches what hides under the max bound). A bf16 train
//   step's logits are checked so too: a forward slip such as a missing dense bias moves the gradients
//   only through dlogits, by less than it moves the logits.
// - loss: the mean cross-entropy moves by at most 2 max|dz| for logits moved by dz (its gradient per
//   sample sums to 2 (1 - p_y) in absolute value), so |loss - ref| <= 2 x the logits' max bound x
//   rms(ref logits).
// - gradients, per tensor: kernels/lstm's bf16 backward bound, twice the forward one (the saved
//   activations and the gate gradients are both bf16 GEMM operands; cuDNN stores dW bf16), max <=
//   2 tolerance(bf16) x growth, rms <= 2e-2 x growth; the max against the tensor's largest magnitude
//   rather than its rms. A bf16 gradient's error is relative to each entry (its own rounding, and
//   sums of products of bf16 operands), and these gradients are heavy-tailed: the embedding's is
//   sparse (the batch's tokens' rows only) and decays along the sequence away from the ends hT reads;
//   W_hh's at the tiny test shape has entries 10x its rms, whose ~1% error measured 0.0996 of the rms
//   on the H100 (cuDNN bf16 dW, batch 3), over 2 tolerance(bf16) = 0.08. Against max|ref| the check
//   is the large entries' relative error; the rms check bounds the rest, and a slip (a row scattered to
//   the wrong token, a transposed block) moves the rms by O(1).
// - the step: unchanged (f32 arithmetic on the f32 masters from the implementation's gradients).
// ModelBilstmVerify.Bf16BoundsCatchSlips models a correct bf16 step (reference(..., bf16_rounding))
// inside these bounds and shows planted slips failing them.
namespace {

// within() against `scale`, and rms_within() too for bf16.
Check close(bool bf16, const std::string& what, const std::vector<double>& out, const std::vector<double>& ref,
            double scale, double tol, double rms_tol) {
  Check c = within(what, out, ref, std::max(scale, 1e-30), tol);
  if (bf16) c.merge(models::rms_within(what, out, ref, std::max(rms(ref), 1e-30), rms_tol), "rms");
  return c;
}

double peak(const std::vector<double>& v) {
  double m = 0;
  for (double x : v) m = std::max(m, std::fabs(x));
  return m;
}

}  // namespace

Check verify_outcome(const Shape& s, const Layout& l, const State& start, const Outcome& out) {
  const Config& c = s.cfg;
  // Computed once for every way of running the step (shared_reference).
  const auto shared = models::shared_reference<Reference>(
      models::reference_key(c.name, s.dtype, s.dir, s.batch,
                            {start.params.data(), start.tokens.data(), start.labels.data()},
                            {start.params.bytes(), start.tokens.size() * sizeof(start.tokens[0]),
                             start.labels.size() * sizeof(start.labels[0])}),
      [&] { return reference(c, l, as_doubles(start.params), start.tokens, start.labels, s.batch, s.train()); });
  const Reference& ref = *shared;
  const double growth = std::max(1.0, std::sqrt(static_cast<double>(c.T) / 25.0));
  const bool b16 = s.bf16();
  const double tol = tolerance(b16 ? DType::bf16 : DType::f32) * growth;
  const double tol_rms = 1e-2 * growth;  // bf16 only
  if (!s.train()) return close(b16, "logits", as_doubles(out.logits), ref.logits, rms(ref.logits), tol, tol_rms);
  Check all = b16 ? within("loss", {static_cast<double>(out.loss)}, {ref.loss}, std::max(rms(ref.logits), 1e-30), 2 * tol)
                  : within("loss", {static_cast<double>(out.loss)}, {ref.loss}, std::max(std::fabs(ref.loss), 1e-30), tol);
  if (b16) all.merge(close(true, "logits", as_doubles(out.logits), ref.logits, rms(ref.logits), tol, tol_rms), "logits");
  const std::vector<double> g = as_doubles(out.grads);
  for (const Tensor& t : gradient_tensors(c, l)) {
    const std::size_t n = static_cast<std::size_t>(t.count);
    const std::vector<double> r = slice(ref.grad, t.at, n);
    if (b16) {
      all.merge(close(true, t.name, slice(g, t.at, n), r, peak(r), 2 * tol, 2 * tol_rms), t.name);
    } else {
      all.merge(within(t.name, slice(g, t.at, n), r, std::max(rms(r), 1e-30), 1e-3 * growth), t.name);
    }
  }
  all.merge(models::adamw_first_step(start.params, out.grads, start.m, start.v, out.params, l.total), "step");
  return all;
}

HOTOPS_DEFINE_FAMILY(BilstmFamily);

}  // namespace hotops::model_bilstm
