// The model_fasttext family: names, work, the op shapes against the op entries, the reference's
// gradients against finite differences, verification failing on planted errors (f32 and bf16's
// bounds), the steps against the reference on both backends, the model learning its task, and the
// data-parallel steps.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <tuple>

#include "hotops/check.h"
#include "hotops/gpu.h"
#include "kernels/model_fasttext/model_fasttext.h"
#include "test/model_test_util.h"

namespace hotops::model_fasttext {
namespace {

using model_test::model_problem;
using models::as_doubles;

TEST(ModelFasttextLayout, ParameterCountsAndAlignment) {
  const Layout l = layout_of(config_named("fasttext_imdb"));
  EXPECT_EQ(l.parameters, 20000 * 50 + 50 + 1);  // Keras' summary of imdb_fasttext.py: 1,000,051
  for (std::size_t at : {l.embed, l.dense_w, l.dense_b, l.total}) EXPECT_EQ(at % models::kAlignFloats, 0u);
  EXPECT_LT(l.embed, l.dense_w);
  EXPECT_LT(l.dense_w, l.dense_b);
}

TEST(ModelFasttextNames, VariantsAndJoinAcrossBackends) {
  std::vector<std::string> names;
  for (const Problem& p : family().benchmark_problems({})) names.push_back(p.name());
  for (const char* n :
       {"model.fasttext_imdb/cpu/f32/train/batch:32", "model.fasttext_imdb/cuda/f32/train/batch:32",
        "model.fasttext_imdb/cpu/f32/infer/batch:256/threads:4", "model.fasttext_imdb/cuda/f32/infer/batch:1024/e2e:1",
        "model.fasttext_imdb/cuda/f32/train/batch:32/graph:1", "model.fasttext_imdb/cuda/bf16/train/batch:1024/graph:1",
        "model.fasttext_imdb/cpu/bf16/train/batch:32/threads:8", "model.fasttext_imdb/cuda/bf16/infer/batch:32/e2e:1"})
    EXPECT_NE(std::find(names.begin(), names.end(), n), names.end()) << n;
  EXPECT_EQ(std::find(names.begin(), names.end(), "model.fasttext_imdb/cuda/f32/infer/batch:32/graph:1"), names.end());
  // 3 batches x 2 dtypes: infer 1 + 3 CPU and 2 CUDA problems, train one CUDA more (graph:1) and the
  // data-parallel steps over 2, 4 and 8 GPUs.
  EXPECT_EQ(names.size(), 3u * 2 * (6 + 7 + 3));
  for (const std::string& n : names) EXPECT_EQ(n.find("fasttext_test"), std::string::npos) << n;
  for (const Problem& p : family().benchmark_problems({7})) EXPECT_EQ(p.get_int("batch"), 7);
  EXPECT_THROW(shape_of(model_problem("fasttext_imdb", Backend::cpu, Direction::train, 4, "e2e", 1)), Error);
  EXPECT_THROW(shape_of(model_problem("fasttext_imdb", Backend::cuda, Direction::infer, 4, "graph", 1)), Error);
  EXPECT_THROW(shape_of(model_problem("fasttext_big", Backend::cpu, Direction::train, 4)), Error);
}

TEST(ModelFasttextWork, FlopsBytesItems) {
  const double B = 32, T = 400, E = 50, P = 1000051;
  const Work infer = family().work(model_problem("fasttext_imdb", Backend::cpu, Direction::infer, 32));
  EXPECT_DOUBLE_EQ(infer.flops, B * T * E + 2 * B * E);
  EXPECT_DOUBLE_EQ(infer.bytes, 4 * (12800 * E + E + 1) + 8 * B * T + 4 * B);
  EXPECT_DOUBLE_EQ(infer.items, B);
  const Work train = family().work(model_problem("fasttext_imdb", Backend::cuda, Direction::train, 32));
  EXPECT_DOUBLE_EQ(train.flops, 3 * B * T * E + 6 * B * E + 2 * B + 14 * P);
  EXPECT_DOUBLE_EQ(train.bytes, 24 * P + 8 * B * T + 4 * B);
  // The rows read are at most the table.
  const Work big = family().work(model_problem("fasttext_imdb", Backend::cpu, Direction::infer, 1024, nullptr, 0, DType::bf16));
  EXPECT_DOUBLE_EQ(big.bytes, 4 * (20000 * E + E + 1) + 8 * 1024 * T + 2 * 1024);
}

// The step's ops at batch 32 are the op entries of the same name: what those time is what the step runs.
TEST(ModelFasttextShapes, TheStepsOpsAreTheOpEntries) {
  const Shape s = shape_of(model_problem("fasttext_imdb", Backend::cuda, Direction::train, 32));
  for (Direction d : {Direction::fwd, Direction::bwd}) {
    const embedding::Shape want = embedding::shape_of(
        {"embedding", Backend::cuda, DType::f32, d,
         {{"shape", "fasttext_imdb.embed"}, {"batch", "32"}, {"T", "400"}, {"vocab", "20000"}, {"dim", "50"}}});
    const embedding::Shape got = embedding_shape(s, d);
    EXPECT_EQ(std::tie(got.dir, got.dtype, got.batch, got.T, got.vocab, got.dim),
              std::tie(want.dir, want.dtype, want.batch, want.T, want.vocab, want.dim));
    const avgpool::Shape pool = avgpool::shape_of(
        {"global_avgpool", Backend::cuda, DType::f32, d,
         {{"shape", "fasttext_imdb"}, {"batch", "32"}, {"L", "400"}, {"C", "50"}, {"layout", "nlc"}}});
    const avgpool::Shape mine = pool_shape(s, d);
    EXPECT_EQ(std::tie(mine.dir, mine.dtype, mine.layout, mine.N, mine.L, mine.C),
              std::tie(pool.dir, pool.dtype, pool.layout, pool.N, pool.L, pool.C));
    const loss::bce::Shape bce = loss::bce::shape_of(
        {"bce_logits", Backend::cuda, DType::f32, d, {{"shape", "fasttext_imdb"}, {"batch", "32"}, {"outputs", "1"}}});
    const loss::bce::Shape head = bce_shape(s, d);
    EXPECT_EQ(std::tie(head.dir, head.dtype, head.batch, head.outputs), std::tie(bce.dir, bce.dtype, bce.batch, bce.outputs));
  }
  std::vector<std::string> embeds;
  for (const Problem& p : embedding::family().benchmark_problems({})) embeds.push_back(p.name());
  EXPECT_NE(std::find(embeds.begin(), embeds.end(),
                      "embedding/cpu/f32/bwd/shape:fasttext_imdb.embed/batch:32/T:400/vocab:20000/dim:50"),
            embeds.end());
  // The dense layer: logits [B, 1] = pooled [B, E] . W [E, 1] + b; its gradients written f32 in bf16.
  const Shape b16 = shape_of(model_problem("fasttext_imdb", Backend::cuda, Direction::train, 32, nullptr, 0, DType::bf16));
  const matmul::Shape fwd = dense_shape(b16), dw = dense_wgrad_shape(b16), db = dense_bgrad_shape(b16), dx = dense_dgrad_shape(b16);
  EXPECT_EQ(std::tie(fwd.op, fwd.dir, fwd.M, fwd.K, fwd.N), std::make_tuple(matmul::Op::addmm, Direction::fwd, 32, 50, 1));
  EXPECT_EQ(std::tie(dw.op, dw.dir, dw.M, dw.K, dw.N), std::make_tuple(matmul::Op::mm, Direction::bwd_weight, 32, 50, 1));
  EXPECT_EQ(std::tie(db.op, db.dir, db.M, db.K, db.N), std::make_tuple(matmul::Op::mm, Direction::bwd_weight, 32, 1, 1));
  EXPECT_EQ(std::tie(dx.op, dx.dir, dx.M, dx.K, dx.N), std::make_tuple(matmul::Op::mm, Direction::bwd_data, 32, 50, 1));
  EXPECT_TRUE(dw.f32_out && db.f32_out && !dx.f32_out && !fwd.f32_out);
  EXPECT_FALSE(dense_wgrad_shape(s).f32_out);  // f32: the dtype's own output
}

// Central differences of the reference's own loss on the tiny configuration, every parameter.
TEST(ModelFasttextReference, GradientsMatchFiniteDifferences) {
  const Shape s = shape_of(model_problem("fasttext_test", Backend::cpu, Direction::train, 3));
  const Layout l = layout_of(s.cfg);
  const State st = make_state(s, l, 11);
  const std::vector<double> p0 = as_doubles(st.params);
  const Reference ref = reference(s.cfg, l, p0, st.tokens, st.labels, s.batch, true);
  const model_test::FiniteDifferences fd = model_test::finite_differences(
      p0, ref.grad, [&](const std::vector<double>& p) { return reference(s.cfg, l, p, st.tokens, st.labels, s.batch, true).loss; });
  EXPECT_GT(fd.biggest, 1e-3);
  EXPECT_LT(fd.worst, 1e-8) << "largest |fd| " << fd.biggest;
  std::size_t embed_nonzero = 0;
  for (std::size_t i = l.embed; i < l.dense_w; ++i) embed_nonzero += ref.grad[i] != 0;
  // 27 tokens of a vocabulary of 37: some rows have a gradient, not all.
  EXPECT_GT(embed_nonzero, 0u);
  EXPECT_LT(embed_nonzero, static_cast<std::size_t>(27 * s.cfg.E) + 1);
  EXPECT_LT(embed_nonzero, static_cast<std::size_t>(s.cfg.V * s.cfg.E));
}

TEST(ModelFasttextTask, LabelsAreNotConstant) {
  const Shape s = shape_of(model_problem("fasttext_imdb", Backend::cpu, Direction::train, 256));
  const State st = make_state(s, layout_of(s.cfg), 3);
  double ones = 0;
  for (std::size_t b = 0; b < st.labels.count(); ++b) ones += st.labels.get(b);
  EXPECT_GT(ones, 256 / 5);
  EXPECT_LT(ones, 256 - 256 / 5);
  for (std::int64_t t : st.tokens) ASSERT_TRUE(t >= 0 && t < 20000);
}

// An outcome made from the reference (as a correct step stores it) at the benchmarked shape.
struct Made {
  Shape s, si;
  Layout l;
  State st;
  std::vector<double> p0;
  Reference ref;
  Made(std::int64_t batch, DType t, bool bf16_rounding)
      : s(shape_of(model_problem("fasttext_imdb", Backend::cuda, Direction::train, batch, nullptr, 0, t))),
        si(shape_of(model_problem("fasttext_imdb", Backend::cuda, Direction::infer, batch, nullptr, 0, t))),
        l(layout_of(s.cfg)), st(make_state(s, l, 42)), p0(as_doubles(st.params)),
        ref(reference(s.cfg, l, p0, st.tokens, st.labels, s.batch, true, bf16_rounding)) {}

  // The outcome with its pooled values, logits and gradients as given.
  Outcome outcome(const std::vector<double>& pooled, const std::vector<double>& logits, const std::vector<double>& grad,
                  std::int64_t step = 1) const {
    Outcome o;
    o.pooled = HostBuffer(s.dtype, pooled.size());
    for (std::size_t i = 0; i < pooled.size(); ++i) o.pooled.set(i, pooled[i]);
    o.logits = HostBuffer(s.dtype, logits.size());
    for (std::size_t i = 0; i < logits.size(); ++i) o.logits.set(i, logits[i]);
    o.loss = static_cast<float>(ref.loss);
    model_test::correct_step(grad, [&](std::size_t i) { return p0[i]; }, l.total, step, o.grads, o.params);
    return o;
  }
  Outcome good() const { return outcome(ref.pooled, ref.logits, ref.grad); }
  bool passes(const Outcome& o, bool train = true) const { return verify_outcome(train ? s : si, l, st, o).ok; }
  std::string why(const Outcome& o, bool train = true) const { return verify_outcome(train ? s : si, l, st, o).message; }
  // The first position's token and its embedding row's first gradient element.
  std::size_t row_of(std::int64_t token) const { return l.embed + static_cast<std::size_t>(token * s.cfg.E); }
};

// Each planted slip fails verification: `f32` the exact reference against f32's bounds, or the
// reference rounded as a bf16 step stores against bf16's.
void expect_slips_fail(const Made& m) {
  const std::int64_t E = m.s.cfg.E, T = m.s.cfg.T, B = m.s.batch;
  const Reference& r = m.ref;
  EXPECT_TRUE(m.passes(m.good())) << m.why(m.good());
  EXPECT_TRUE(m.passes(m.good(), false)) << m.why(m.good(), false);

  // Forward: the bias left out of the logits; one position's row gathered from the next token.
  std::vector<double> no_bias = r.logits;
  for (double& z : no_bias) z -= m.p0[m.l.dense_b];
  EXPECT_FALSE(m.passes(m.outcome(r.pooled, no_bias, r.grad), false));
  EXPECT_FALSE(m.passes(m.outcome(r.pooled, no_bias, r.grad)));
  std::vector<double> wrong_gather = r.pooled;
  const std::size_t row = m.row_of(m.st.tokens[0]), next = m.row_of((m.st.tokens[0] + 1) % m.s.cfg.V);
  for (std::int64_t e = 0; e < E; ++e)
    wrong_gather[static_cast<std::size_t>(e)] += (m.p0[next + static_cast<std::size_t>(e)] - m.p0[row + static_cast<std::size_t>(e)]) / static_cast<double>(T);
  EXPECT_FALSE(m.passes(m.outcome(wrong_gather, r.logits, r.grad), false));
  // The dense weight read one element off (W[e + 1] for W[e]).
  std::vector<double> shifted_w = r.logits;
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t e = 0; e + 1 < E; ++e)
      shifted_w[static_cast<std::size_t>(b)] += r.pooled[static_cast<std::size_t>(b * E + e)] *
                                                (m.p0[m.l.dense_w + static_cast<std::size_t>(e + 1)] - m.p0[m.l.dense_w + static_cast<std::size_t>(e)]);
  EXPECT_FALSE(m.passes(m.outcome(r.pooled, shifted_w, r.grad), false));

  Outcome wrong_loss = m.good();
  wrong_loss.loss *= 1.01f;
  EXPECT_FALSE(m.passes(wrong_loss));

  // Backward: a row's gradient scattered to the next token; a row's gradient missing the last
  // position's term; demb without its 1/T (every embedding gradient T times too large).
  std::vector<double> scattered = r.grad;
  for (std::int64_t e = 0; e < E; ++e) {
    scattered[next + static_cast<std::size_t>(e)] += scattered[row + static_cast<std::size_t>(e)];
    scattered[row + static_cast<std::size_t>(e)] = 0;
  }
  EXPECT_FALSE(m.passes(m.outcome(r.pooled, r.logits, scattered)));
  std::vector<double> dropped = r.grad;
  const std::int64_t last = m.st.tokens.back();
  const double dz = (1 / (1 + std::exp(-r.logits.back())) - m.st.labels.get(static_cast<std::size_t>(B - 1))) / static_cast<double>(B);
  for (std::int64_t e = 0; e < E; ++e)
    dropped[m.row_of(last) + static_cast<std::size_t>(e)] -= dz * m.p0[m.l.dense_w + static_cast<std::size_t>(e)] / static_cast<double>(T);
  EXPECT_FALSE(m.passes(m.outcome(r.pooled, r.logits, dropped)));
  std::vector<double> no_mean = r.grad;
  for (std::size_t i = m.l.embed; i < m.l.embed + static_cast<std::size_t>(m.s.cfg.V * E); ++i) no_mean[i] *= static_cast<double>(T);
  EXPECT_FALSE(m.passes(m.outcome(r.pooled, r.logits, no_mean)));
  // dW from the dlogits of the wrong sample (shifted by one); db summed over half the batch.
  std::vector<double> wrong_dw = r.grad;
  std::fill_n(wrong_dw.begin() + static_cast<std::ptrdiff_t>(m.l.dense_w), E, 0.0);
  for (std::int64_t b = 0; b < B; ++b) {
    const double z = r.logits[static_cast<std::size_t>((b + 1) % B)];
    const double d = (1 / (1 + std::exp(-z)) - m.st.labels.get(static_cast<std::size_t>((b + 1) % B))) / static_cast<double>(B);
    for (std::int64_t e = 0; e < E; ++e) wrong_dw[m.l.dense_w + static_cast<std::size_t>(e)] += r.pooled[static_cast<std::size_t>(b * E + e)] * d;
  }
  EXPECT_FALSE(m.passes(m.outcome(r.pooled, r.logits, wrong_dw)));
  std::vector<double> half_db = r.grad;
  half_db[m.l.dense_b] = 0;
  for (std::int64_t b = 0; b < B / 2; ++b)
    half_db[m.l.dense_b] += (1 / (1 + std::exp(-r.logits[static_cast<std::size_t>(b)])) - m.st.labels.get(static_cast<std::size_t>(b))) / static_cast<double>(B);
  EXPECT_FALSE(m.passes(m.outcome(r.pooled, r.logits, half_db)));

  EXPECT_FALSE(m.passes(m.outcome(r.pooled, r.logits, r.grad, 2)));  // the step count off by one
}

TEST(ModelFasttextVerify, PlantedErrorsFail) {
  for (std::int64_t batch : {2, 32}) {
    SCOPED_TRACE(batch);
    expect_slips_fail(Made(batch, DType::f32, false));
  }
}

// bf16: a correct bf16 step, modelled by the reference rounding what the step stores bf16, passes the
// bf16 bounds (and fails f32's); each planted slip fails them.
TEST(ModelFasttextVerify, Bf16BoundsCatchSlips) {
  for (std::int64_t batch : {2, 32}) {
    SCOPED_TRACE(batch);
    const Made m(batch, DType::bf16, true);
    expect_slips_fail(m);
    const Made f32(batch, DType::f32, false);
    Outcome as_f32 = f32.outcome(m.ref.pooled, m.ref.logits, m.ref.grad);
    as_f32.loss = static_cast<float>(m.ref.loss);
    EXPECT_FALSE(f32.passes(as_f32)) << "bf16's rounding passes f32's bounds";
  }
}

// The steps against the reference, every direction and variant at the tiny configuration (the
// registry's OpTest runs the family's test problems too); CUDA skips without a GPU, bf16 on the CPU
// without oneDNN's bf16 matmul and pooling, each with its reason. The data-parallel steps have tests
// of their own (below).
void expect_matches(Backend be, DType t) {
  for (const Problem& p : family().test_problems()) {
    if (p.backend != be || p.dtype != t || p.has("gpus")) continue;
    const std::string why = family().unsupported_reason(p);
    if (!why.empty()) GTEST_SKIP() << p.name() << ": " << why;
    const auto c = family().make(p);
    const Check chk = c->verify();
    EXPECT_TRUE(chk.ok) << p.name() << ": " << chk.message;
  }
}

TEST(ModelFasttextStep, MatchesReferenceCpu) { expect_matches(Backend::cpu, DType::f32); }
TEST(ModelFasttextStep, MatchesReferenceCpuBf16) { expect_matches(Backend::cpu, DType::bf16); }
TEST(ModelFasttextStep, MatchesReferenceCuda) {
  std::string why;
  if (!gpu::available(&why)) GTEST_SKIP() << why;
  expect_matches(Backend::cuda, DType::f32);
}
TEST(ModelFasttextStep, MatchesReferenceCudaBf16) {
  HOTOPS_SKIP_WITHOUT_GPU();
  expect_matches(Backend::cuda, DType::bf16);
}

// A CPU without oneDNN's bf16 matmul says so.
TEST(ModelFasttextBf16, CpuUnsupportedSaysWhy) {
  for (Direction d : {Direction::infer, Direction::train}) {
    const Problem p = model_problem("fasttext_imdb", Backend::cpu, d, 32, nullptr, 0, DType::bf16);
    const std::string why = family().unsupported_reason(p);
    std::printf("%s: %s\n", p.name().c_str(), why.empty() ? "supported" : why.c_str());
    if (!why.empty()) {
      EXPECT_NE(why.find("bf16"), std::string::npos) << why;
    }
  }
}

TEST(ModelFasttextTraining, LossFallsCpu) {
  model_test::expect_learns(family(), Backend::cpu, "fasttext_test", 32, 1000);
  model_test::expect_learns(family(), Backend::cpu, "fasttext_imdb", 32, 100);
}

TEST(ModelFasttextTraining, LossFallsCpuBf16) {
  model_test::expect_learns(family(), Backend::cpu, "fasttext_imdb", 32, 100, DType::bf16);
}

TEST(ModelFasttextTraining, LossFallsCuda) {
  HOTOPS_SKIP_WITHOUT_GPU();
  model_test::expect_learns(family(), Backend::cuda, "fasttext_test", 32, 1000);
  model_test::expect_learns(family(), Backend::cuda, "fasttext_imdb", 32, 100);
  model_test::expect_learns(family(), Backend::cuda, "fasttext_imdb", 32, 100, DType::bf16);
}

// ---- data-parallel train steps (gpus:G; kernels/models/data_parallel.h) ----

// fasttext_imdb has data-parallel steps at its train batches (per GPU), G = 2, 4, 8, in both dtypes,
// doing G times one GPU's work from the single-GPU step's start at G x B; the tests' configuration
// has gpus:1 steps only.
TEST(ModelFasttextDataParallel, NamesWorkAndSeed) {
  model_test::expect_data_parallel_names(family(), {{"fasttext_imdb", config_named("fasttext_imdb").batches}});
  model_test::expect_gpus_only_on_cuda_train(shape_of, "fasttext_imdb", 256, 4);
  // The seed: the tokens, the labels and the parameters.
  model_test::expect_data_parallel_work_and_seed(family(), model_problem("fasttext_imdb", Backend::cuda, Direction::train, 32), 8);
  model_test::expect_data_parallel_work_and_seed(
      family(), model_problem("fasttext_imdb", Backend::cuda, Direction::train, 1024, nullptr, 0, DType::bf16), 2);

  const std::vector<std::string> tests = model_test::data_parallel_names(family().test_problems());
  EXPECT_EQ(tests, (std::vector<std::string>{"model.fasttext_test/cuda/f32/train/batch:3/gpus:1",
                                              "model.fasttext_test/cuda/bf16/train/batch:3/gpus:1"}));
}

// A global batch of G x B samples of the tests' configuration, seeded with `seed`, and its shards.
struct GlobalBatch {
  std::int64_t B;
  int G;
  std::uint64_t seed;
  Shape s;
  Layout l;
  State all;
  GlobalBatch(std::int64_t per_gpu, int gpus, std::uint64_t seeded)
      : B(per_gpu), G(gpus), seed(seeded), s(shape_of(model_problem("fasttext_test", Backend::cuda, Direction::train, per_gpu * gpus))),
        l(layout_of(s.cfg)), all(make_state(s, l, seeded)) {}
  // Rank r's start as the step makes it: its own seeded start at batch B, then its shard of the global batch.
  State shard(int r) const {
    Shape one = s;
    one.batch = B;
    State mine = make_state(one, l, seed);
    SampleShard{}(mine, all, static_cast<std::size_t>(s.cfg.T), models::Replica{G, r}, B);
    return mine;
  }
};

// A replica's shard of the global batch is that batch's samples r B .. (r + 1) B - 1: their tokens
// and labels, which the shards, put back in rank order, make up again; its parameters (drawn at its
// own batch) are the global batch's.
TEST(ModelFasttextDataParallel, ShardsAreTheGlobalBatchsSamples) {
  const GlobalBatch g(3, 4, 5);
  std::vector<std::int64_t> tokens;
  std::vector<double> labels;
  for (int r = 0; r < g.G; ++r) {
    const State mine = g.shard(r);
    ASSERT_EQ(mine.tokens.size(), static_cast<std::size_t>(g.B * g.s.cfg.T));
    ASSERT_EQ(mine.labels.count(), static_cast<std::size_t>(g.B));
    EXPECT_EQ(as_doubles(mine.params), as_doubles(g.all.params));
    tokens.insert(tokens.end(), mine.tokens.begin(), mine.tokens.end());
    for (double y : as_doubles(mine.labels)) labels.push_back(y);
  }
  EXPECT_EQ(tokens, g.all.tokens);
  EXPECT_EQ(labels, as_doubles(g.all.labels));
}

// What makes the data-parallel step one step over the global batch: the loss is a mean over the
// samples and nothing else couples them, so the reference's loss and gradients at G x B are the mean
// of its G shards' (the all-reduce's average); the embedding's rows that no shard's tokens hit stay 0.
TEST(ModelFasttextDataParallel, GlobalStepIsTheMeanOfTheShards) {
  const GlobalBatch g(4, 2, 7);
  const std::vector<double> p0 = as_doubles(g.all.params);
  const Reference whole = reference(g.s.cfg, g.l, p0, g.all.tokens, g.all.labels, g.s.batch, true);
  std::vector<double> mean(whole.grad.size(), 0.0);
  double loss = 0;
  for (int r = 0; r < g.G; ++r) {
    const State mine = g.shard(r);
    const Reference part = reference(g.s.cfg, g.l, p0, mine.tokens, mine.labels, g.B, true);
    for (std::size_t i = 0; i < mean.size(); ++i) mean[i] += part.grad[i] / g.G;
    loss += part.loss / g.G;
  }
  EXPECT_NEAR(loss, whole.loss, 1e-12 * std::fabs(whole.loss));
  double worst = 0, biggest = 0;
  for (std::size_t i = 0; i < mean.size(); ++i) {
    worst = std::max(worst, std::fabs(mean[i] - whole.grad[i]));
    biggest = std::max(biggest, std::fabs(whole.grad[i]));
    if (whole.grad[i] == 0) {
      EXPECT_EQ(mean[i], 0.0) << i;
    }
  }
  EXPECT_GT(biggest, 1e-3);
  EXPECT_LT(worst, 1e-12 * biggest);
}

// gpus:1 (a communicator of this process alone): the data-parallel step verified against the
// reference at its global batch (pooled and the logits gathered from the ranks); its gradients in one
// bucket (the dense layer's, final first, are under 1 MiB and wait for the embedding table's, which
// the backward finishes last).
TEST(ModelFasttextDataParallel, OneGpuBucketsAndVerifiesCuda) {
  for (DType t : {DType::f32, DType::bf16}) {
    model_test::expect_one_gpu_data_parallel(family(), model_problem("fasttext_imdb", Backend::cuda, Direction::train, 4, nullptr, 0, t),
                                             "in 1 bucket ");
    model_test::expect_one_gpu_data_parallel(family(), model_problem("fasttext_test", Backend::cuda, Direction::train, 3, nullptr, 0, t),
                                             "in 1 bucket ");
  }
}

}  // namespace
// The bf16 train steps' copy of the master weights is written by AdamW, never cast in a step; a
// data-parallel step's too, by its per-bucket launches.
TEST(ModelFasttextBf16Copy, KeptByAdamwCpu) {
  model_test::expect_bf16_copy_kept(family(), model_test::model_problem("fasttext_imdb", Backend::cpu, Direction::train, 32, nullptr, 0, DType::bf16), 3);
}
TEST(ModelFasttextBf16Copy, CastOnceForInfer) {
  model_test::expect_bf16_copy_kept(family(), model_test::model_problem("fasttext_imdb", Backend::cpu, Direction::infer, 32, nullptr, 0, DType::bf16), 3);
  if (!gpu::available()) return;
  model_test::expect_bf16_copy_kept(family(), model_test::model_problem("fasttext_imdb", Backend::cuda, Direction::infer, 32, nullptr, 0, DType::bf16), 3);
  model_test::expect_bf16_copy_kept(family(), model_test::model_problem("fasttext_imdb", Backend::cuda, Direction::infer, 32, "e2e", 1, DType::bf16), 3);
}
TEST(ModelFasttextBf16Copy, KeptByAdamwCuda) {
  HOTOPS_SKIP_WITHOUT_GPU();
  model_test::expect_bf16_copy_kept(family(), model_test::model_problem("fasttext_imdb", Backend::cuda, Direction::train, 32, nullptr, 0, DType::bf16), 3);
  model_test::expect_bf16_copy_kept(family(), model_test::model_problem("fasttext_imdb", Backend::cuda, Direction::train, 32, "graph", 1, DType::bf16), 3);
  const Problem one_gpu = model_test::model_problem("fasttext_imdb", Backend::cuda, Direction::train, 32, "gpus", 1, DType::bf16);
  if (family().unsupported_reason(one_gpu).empty()) model_test::expect_bf16_copy_kept(family(), one_gpu, 3);
}

}  // namespace hotops::model_fasttext
