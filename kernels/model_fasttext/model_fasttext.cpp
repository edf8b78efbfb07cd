// The model_fasttext family: names, work, the op shapes of the step, the learnable task and
// verification.
//
// Names, as every model family's: model.fasttext_imdb/<cpu|cuda>/<f32|bf16>/<infer|train>/batch:B, then
// at most one variant arg: threads:T (CPU, T OpenMP threads), e2e:1 (CUDA, host time of the step with
// the batch copied from pageable host memory and the loss or logits copied back), graph:1 (CUDA train,
// as e2e with the device part replayed as one CUDA graph captured at setup). Without a variant arg a
// CUDA step is device time, the batch already on the device. gpus:G (CUDA train): the data-parallel
// step over G GPUs, batch per GPU (kernels/models/data_parallel.h).
#include "kernels/model_fasttext/model_fasttext.h"

#include <algorithm>
#include <cmath>

#include "hotops/check.h"

namespace hotops::model_fasttext {
namespace {

constexpr double kAdamwFlopsPerParam = 14;  // adamw.cpp's count

std::string cpu_reason(const Problem& p) {
  if (std::string why = models::threads_reason(models::step_args(p, "model_fasttext", true, true)); !why.empty())
    return why;
  return cpu_unsupported_reason(p);
}

// The tests' tiny configuration: 6 tokens of 9 draw from 37 words, so rows repeat within a batch.
const Config& test_config() {
  static const Config c{"fasttext_test", 37, 6, 9, {}};
  return c;
}

class FasttextFamily final : public models::DataParallelModelFamily<> {
 public:
  FasttextFamily() : DataParallelModelFamily("model_fasttext", cpu_reason, make_cpu, HOTOPS_CUDA_FACTORY(make_cuda)) {}

  std::vector<Problem> benchmark_problems(const std::vector<std::int64_t>& batches) const override {
    return models::steps_and_data_parallel_problems(configs(), batches);
  }

  std::vector<Problem> test_problems() const override {
    // The tiny configuration at two batches, and the benchmarked shape at a tiny batch: both
    // backends, both directions, both dtypes, every variant.
    std::vector<Problem> out;
    models::expand_step_problems("fasttext_test", 3, {1}, true, out, /*with_bf16=*/true);
    models::expand_step_problems("fasttext_test", 8, {}, true, out, /*with_bf16=*/true);
    models::expand_step_problems("fasttext_imdb", 2, {}, true, out, /*with_bf16=*/true);
    // The data-parallel step on a communicator of one process: its whole path on one GPU.
    models::add_data_parallel_test_problems("fasttext_test", 3, out);
    return out;
  }

  // FLOPs, each op as its family counts it: the pooling's adds (one an input element, B·T·E) and the
  // dense layer's 2·B·E forward; train adds the pooling's backward (B·T·E), the embedding gradient's
  // adds (B·T·E), the dense layer's weight and data gradients (2·2·B·E) and its bias gradient (2·B,
  // as the GEMV it is), and AdamW's 14 per parameter. The gather moves bytes only; the loss (a few
  // per sample) is not counted, as for every model.
  // Bytes, the fewest a step must move: infer reads the int64 tokens, the embedding rows they pick
  // (at most the table), W and b, and writes the logits; train reads the tokens and the f32 labels
  // and reads and writes every parameter and AdamW's m and v (6 x 4 bytes per parameter, as every
  // model). bf16 keeps the f32 parameters (its per-step bf16 copy is not counted, as every model's);
  // its logits are 2 bytes.
  Work one_gpu_work(const Problem& p) const override {
    const Shape s = shape_of(p);
    const Config& c = s.cfg;
    const double B = static_cast<double>(s.batch), T = static_cast<double>(c.T), E = static_cast<double>(c.E),
                 P = static_cast<double>(layout_of(c).parameters);
    const double fwd = B * T * E + 2 * B * E;
    const double tokens = 8 * B * T;
    if (!s.train()) {
      const double rows = std::min(B * T, static_cast<double>(c.V)) * E;
      return {fwd, 4 * (rows + E + 1) + tokens + static_cast<double>(dtype_size(s.dtype)) * B, B};
    }
    return {fwd + 2 * B * T * E + 4 * B * E + 2 * B + kAdamwFlopsPerParam * P, 6 * 4 * P + tokens + 4 * B, B};
  }
};

using models::as_doubles;
using models::rms;
using models::slice;
using models::within;

}  // namespace

const std::vector<Config>& configs() {
  // Keras' imdb_fasttext.py: max_features 20000, embedding_dims 50, maxlen 400, batch_size 32; swept
  // to 256 and 1024.
  static const std::vector<Config> all = {{"fasttext_imdb", 20000, 50, 400, {32, 256, 1024}}};
  return all;
}

const Config& config_named(const std::string& name) {
  if (name == test_config().name) return test_config();
  return models::entry_named(configs(), name, "model_fasttext: unknown model ");
}

Shape shape_of(const Problem& p) {
  const models::StepArgs a = models::step_args(p, "model_fasttext", true, /*allow_bf16=*/true);
  Shape s;
  s.cfg = config_named(a.model);
  models::copy_step_args(a, s);
  HOTOPS_CHECK(s.tokens() < (std::int64_t{1} << 31), "model_fasttext: fewer than 2^31 tokens a batch: " + p.name());
  return s;
}

Layout layout_of(const Config& c) {
  Layout l;
  auto place = [&](std::int64_t n) { return models::place_aligned(l.total, l.parameters, n); };
  l.embed = place(c.V * c.E);
  l.dense_w = place(c.E);
  l.dense_b = place(1);
  return l;
}

embedding::Shape embedding_shape(const Shape& s, Direction d) {
  embedding::Shape e;
  e.dir = d, e.dtype = s.dtype;
  e.batch = s.batch, e.T = s.cfg.T, e.vocab = s.cfg.V, e.dim = s.cfg.E;
  return e;
}

avgpool::Shape pool_shape(const Shape& s, Direction d) {
  avgpool::Shape a;
  a.dir = d, a.dtype = s.dtype, a.layout = avgpool::Layout::nlc;
  a.N = s.batch, a.L = s.cfg.T, a.C = s.cfg.E;
  return a;
}

namespace {
matmul::Shape dense_gemm(const Shape& s, matmul::Op op, Direction d, std::int64_t K) {
  matmul::Shape g;
  g.op = op, g.dir = d, g.dtype = s.dtype;
  g.M = s.batch, g.K = K, g.N = 1;
  g.f32_out = d == Direction::bwd_weight && s.bf16();  // the f32 master weights' gradients
  return g;
}
}  // namespace

matmul::Shape dense_shape(const Shape& s) { return dense_gemm(s, matmul::Op::addmm, Direction::fwd, s.cfg.E); }
matmul::Shape dense_wgrad_shape(const Shape& s) { return dense_gemm(s, matmul::Op::mm, Direction::bwd_weight, s.cfg.E); }
matmul::Shape dense_bgrad_shape(const Shape& s) { return dense_gemm(s, matmul::Op::mm, Direction::bwd_weight, 1); }
matmul::Shape dense_dgrad_shape(const Shape& s) { return dense_gemm(s, matmul::Op::mm, Direction::bwd_data, s.cfg.E); }

loss::bce::Shape bce_shape(const Shape& s, Direction d) {
  loss::bce::Shape b;
  b.dir = d, b.dtype = s.dtype, b.batch = s.batch, b.outputs = 1;
  return b;
}

State make_state(const Shape& s, const Layout& l, std::uint64_t seed) {
  const Config& c = s.cfg;
  State st;
  const auto n = static_cast<std::size_t>(s.tokens());
  HostBuffer u(DType::f32, n);
  u.fill_uniform(seed, 1, 0.f, 1.f);
  st.tokens.resize(n);
  for (std::size_t i = 0; i < n; ++i)
    st.tokens[i] = std::min<std::int64_t>(c.V - 1, static_cast<std::int64_t>(u.get(i) * static_cast<double>(c.V)));
  // Each word's score: fixed, so that every batch and seed poses the same task.
  HostBuffer score(DType::f32, static_cast<std::size_t>(c.V));
  score.fill_uniform(0xfa57ull, 2);
  st.labels = HostBuffer(DType::f32, static_cast<std::size_t>(s.batch));
  for (std::int64_t b = 0; b < s.batch; ++b) {
    double sum = 0;
    for (std::int64_t t = 0; t < c.T; ++t) sum += score.get(static_cast<std::size_t>(st.tokens[static_cast<std::size_t>(b * c.T + t)]));
    st.labels.set(static_cast<std::size_t>(b), sum > 0 ? 1 : 0);
  }
  st.params = HostBuffer(DType::f32, l.total);
  zero_bytes(st.params.data(), st.params.bytes());
  const float k_dense = static_cast<float>(1 / std::sqrt(static_cast<double>(c.E)));
  struct Part {
    std::size_t at;
    std::int64_t n;
    float bound;
  };
  const Part parts[] = {{l.embed, c.V * c.E, 1.f}, {l.dense_w, c.E, k_dense}, {l.dense_b, 1, k_dense}};
  std::uint64_t stream = 100;
  for (const Part& part : parts) models::fill_uniform_at(st.params, part.at, part.n, seed, stream++, -part.bound, part.bound);
  models::zero_moments(st.m, st.v, l.total);
  return st;
}

void SampleShard::operator()(State& out, const State& global, std::size_t T, const models::Replica& r, std::int64_t batch) const {
  out.tokens = models::shard(global.tokens, T, r, batch);
  out.labels = models::shard(global.labels, 1, r, batch);
}

// Bounds, from one step at the seeded start (optimizer step 1, m = v = 0), each error max|out - ref| /
// scale:
// - pooled: the mean of T f32 terms; its rounding errors grow with the terms' root-sum-square, so the
//   scale is the larger of rms(ref) and the rms of sqrt(sum x^2) / T (about rms(ref) for random
//   embeddings). f32: 1e-4 (a sum of 400 terms in any order: 3.1e-6 seen, oneDNN's pooling on the
//   CPU); a token's row gathered wrong or a position dropped moves an element by |x| / T, about
//   1/sqrt(T) of the scale (0.05 at 400 tokens).
// - logits: rms(ref) as scale, tolerance(f32) = 1e-4 (50 terms after the pooled ones: 5.7e-7 seen);
//   the loss relative to itself, 1e-4.
// - gradients, per tensor, 1e-3 (the dense models' bound: sums of products carried through the chain);
//   the scale is the larger of rms(ref) and the rms of the terms' root-sum-square, as the dense models'
//   (db sums dlogits over a batch whose labels balance: it cancels); 1.9e-6 seen. The embedding's
//   gradient over the rows the batch's tokens hit; every other row must be exactly 0 (nothing is
//   added to it).
// - the step, as every model: the reference takes AdamW's first step in double from the gradients the
//   implementation computed (checked above); p - p0 in units of lr, bound 1e-3.
// bf16 (docs/models.md), with the dense models' bounds in u = 2^-9: pooled and logits 32u, the loss
// 4u, the gradients 64u. The step rounds the table's rows and W (u each, random in sign: they add in
// quadrature), pooled, the logits, dlogits, dpooled and demb once each (u of each). An element of the
// embedding's gradient sums the products dlogits·W / T of the n positions that hold its token (n ~ B·T
// / V: 0.6 at batch 32, 20 at 1024), each rounded three times (3u of the product), so up to 3u sqrt(n)
// of its terms' root-sum-square, and its products are up to ~2.5 times the tensor's rms (|W| up to
// 1.7 times its rms): ~30u at batch 1024. Measured on the CPU (oneDNN bf16 on AVX512_BF16, batches 2,
// 32 and 1024): pooled <= 0.012 (6u), logits <= 0.0086, the loss <= 1.4e-4 (relative), dEmbedding <=
// 0.035 at batches 2 and 32 and 0.055 (28u) at 1024, dW <= 0.0079, db <= 0.0075. A missing bias moves
// the logits by |b| (about 0.5-1 of their rms at this init), a dropped 1/T scales demb by T, a row
// scattered to the wrong token breaks the zero rows: each far beyond the bounds
// (ModelFasttextVerify.Bf16BoundsCatchSlips).
namespace {

struct Bounds {
  double pooled, logits, loss, grad;
};
Bounds bounds_for(DType t) {
  constexpr double u = 1.0 / 512;  // bf16's unit roundoff as the dense models take it, 2^-9
  if (t == DType::bf16) return {32 * u, 32 * u, 4 * u, 64 * u};
  return {1e-4, tolerance(DType::f32), tolerance(DType::f32), 1e-3};
}

// A gradient tensor's check over the elements `at` of the flat gradients, against the larger of
// rms(ref) and the rms of the terms' root-sum-square.
Check gradient_within(const std::string& what, const std::vector<double>& g, const Reference& ref,
                      const std::vector<std::size_t>& at, double tol) {
  std::vector<double> out(at.size()), want(at.size()), terms(at.size());
  for (std::size_t k = 0; k < at.size(); ++k) out[k] = g[at[k]], want[k] = ref.grad[at[k]], terms[k] = ref.grad_terms_sq[at[k]];
  double terms_mean = 0;
  for (double t : terms) terms_mean += t;
  terms_mean /= static_cast<double>(std::max<std::size_t>(1, at.size()));
  return within(what, out, want, std::max({rms(want), std::sqrt(terms_mean), 1e-30}), tol);
}

std::vector<std::size_t> range(std::size_t from, std::size_t n) {
  std::vector<std::size_t> r(n);
  for (std::size_t k = 0; k < n; ++k) r[k] = from + k;
  return r;
}

}  // namespace

Check verify_outcome(const Shape& s, const Layout& l, const State& start, const Outcome& out) {
  const Config& c = s.cfg;
  const Bounds bound = bounds_for(s.dtype);
  // Computed once for every way of running the step (shared_reference).
  const auto shared = models::shared_reference<Reference>(
      models::reference_key(c.name, s.dtype, s.dir, s.batch, {start.params.data(), start.tokens.data(), start.labels.data()},
                            {start.params.bytes(), start.tokens.size() * sizeof(start.tokens[0]), start.labels.bytes()}),
      [&] { return reference(c, l, as_doubles(start.params), start.tokens, start.labels, s.batch, s.train()); });
  const Reference& ref = *shared;
  const double pooled_scale = std::max({rms(ref.pooled), rms(ref.pooled_rss), 1e-30});
  Check all = within("pooled", as_doubles(out.pooled), ref.pooled, pooled_scale, bound.pooled);
  all.merge(within("logits", as_doubles(out.logits), ref.logits, std::max(rms(ref.logits), 1e-30), bound.logits), "logits");
  if (!s.train()) return all;
  all.merge(within("loss", {static_cast<double>(out.loss)}, {ref.loss}, std::max(std::fabs(ref.loss), 1e-30), bound.loss),
            "loss");
  const std::vector<double> g = as_doubles(out.grads);
  // The embedding's gradient: the rows the tokens hit against the reference, the others exactly 0.
  std::vector<char> hit(static_cast<std::size_t>(c.V), 0);
  for (std::int64_t t : start.tokens) hit[static_cast<std::size_t>(t)] = 1;
  std::vector<std::size_t> hit_at, zero_at;
  for (std::size_t r = 0; r < hit.size(); ++r)
    for (std::size_t e = 0; e < static_cast<std::size_t>(c.E); ++e)
      (hit[r] ? hit_at : zero_at).push_back(l.embed + r * static_cast<std::size_t>(c.E) + e);
  all.merge(gradient_within("dEmbedding", g, ref, hit_at, bound.grad), "dEmbedding");
  std::vector<double> zero_rows(zero_at.size());
  for (std::size_t k = 0; k < zero_at.size(); ++k) zero_rows[k] = g[zero_at[k]];
  all.merge(within("dEmbedding (rows no token hits)", zero_rows, std::vector<double>(zero_at.size(), 0.0), 1, 0),
            "dEmbedding zero rows");
  all.merge(gradient_within("dW", g, ref, range(l.dense_w, static_cast<std::size_t>(c.E)), bound.grad), "dW");
  all.merge(gradient_within("db", g, ref, range(l.dense_b, 1), bound.grad), "db");
  all.merge(models::adamw_first_step(start.params, out.grads, start.m, start.v, out.params, l.total), "step");
  return all;
}

std::string cpu_unsupported_reason(const Problem& p) {
  if (p.dtype != DType::bf16) return "";
  const Shape s = shape_of(p);
  // The bf16 primitives the step's oneDNN plans make, from their descriptors.
  std::vector<matmul::Shape> gemms{dense_shape(s)};
  if (s.train()) gemms.insert(gemms.end(), {dense_wgrad_shape(s), dense_bgrad_shape(s), dense_dgrad_shape(s)});
  for (const matmul::Shape& g : gemms)
    if (std::string why = matmul::cpu_unsupported_reason(g); !why.empty()) return why;
  std::vector<Direction> pools{Direction::fwd};
  if (s.train()) pools.push_back(Direction::bwd);
  for (Direction d : pools) {
    const avgpool::Shape a = pool_shape(s, d);
    const Problem pool{"global_avgpool", Backend::cpu, DType::bf16, d,
                       {{"shape", "fasttext"}, {"N", std::to_string(a.N)}, {"L", std::to_string(a.L)},
                        {"C", std::to_string(a.C)}, {"layout", "nlc"}}};
    if (std::string why = avgpool::onednn_unsupported_reason(pool); !why.empty()) return why;
  }
  return "";
}

HOTOPS_DEFINE_FAMILY(FasttextFamily);

}  // namespace hotops::model_fasttext
