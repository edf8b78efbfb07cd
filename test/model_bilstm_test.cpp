// The model_bilstm family (the BiLSTM and the character LSTM): the reference's gradients against
// finite differences, verification failing on planted errors, the names and work, the models
// learning their tasks, and the data-parallel steps.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>

#include "hotops/check.h"
#include "hotops/gpu.h"
#include "test/model_test_util.h"
#include "kernels/model_bilstm/model_bilstm.h"
#include "kernels/models/models.h"

namespace hotops::model_bilstm {
namespace {

using model_test::model_problem;

std::vector<double> as_doubles(const HostBuffer& b) {
  std::vector<double> d(b.count());
  for (std::size_t i = 0; i < d.size(); ++i) d[i] = b.get(i);
  return d;
}

// A planted slip: the gradients with W_hh's block of gate i, direction 0 (H x H), transposed.
std::vector<double> w_hh_transposed(const std::vector<double>& grad, const Layout& l, std::int64_t H) {
  std::vector<double> out = grad;
  for (std::int64_t r = 0; r < H; ++r)
    for (std::int64_t k = 0; k < H; ++k) out[l.w_hh + static_cast<std::size_t>(r * H + k)] = grad[l.w_hh + static_cast<std::size_t>(k * H + r)];
  return out;
}

TEST(ModelBilstmLayout, ParameterCountsAndAlignment) {
  const Layout l = layout_of(config_named("bilstm_imdb"));
  // Embedding 20000 x 128; per direction W_ih 512 x 128, W_hh 512 x 128, b_ih, b_hh 512; dense 256 x 2 + 2.
  EXPECT_EQ(l.parameters, 20000 * 128 + 2 * (512 * 128 + 512 * 128 + 2 * 512) + 256 * 2 + 2);
  for (std::size_t at : {l.embed, l.w_ih, l.w_hh, l.b_ih, l.b_hh, l.dense_w, l.dense_b, l.total})
    EXPECT_EQ(at % kAlignFloats, 0u);
}

TEST(ModelBilstmNames, VariantsAndJoinAcrossBackends) {
  std::vector<std::string> names;
  for (const Problem& p : family().benchmark_problems({})) names.push_back(p.name());
  for (const char* n : {"model.bilstm_imdb/cpu/f32/train/batch:64", "model.bilstm_imdb/cuda/f32/train/batch:64",
                        "model.bilstm_imdb/cuda/f32/infer/batch:32/e2e:1", "model.bilstm_imdb/cuda/f32/train/batch:256/graph:1",
                        "model.bilstm_imdb/cpu/f32/infer/batch:64/threads:4", "model.bilstm_imdb/cuda/bf16/train/batch:64",
                        "model.bilstm_imdb/cuda/bf16/infer/batch:32/e2e:1", "model.bilstm_imdb/cuda/bf16/train/batch:256/graph:1",
                        "model.bilstm_imdb/cpu/bf16/infer/batch:64", "model.bilstm_imdb/cpu/bf16/train/batch:64/threads:8"})
    EXPECT_NE(std::find(names.begin(), names.end(), n), names.end()) << n;
  EXPECT_EQ(std::find(names.begin(), names.end(), "model.bilstm_imdb/cuda/f32/infer/batch:64/graph:1"), names.end());
  for (const Problem& p : family().benchmark_problems({7})) EXPECT_EQ(p.get_int("batch"), 7);
  EXPECT_THROW(shape_of(model_problem("bilstm_imdb", Backend::cpu, Direction::train, 4, "e2e", 1)), Error);
  EXPECT_THROW(shape_of(model_problem("bilstm_big", Backend::cpu, Direction::train, 4)), Error);
}

// The step's ops are the op families' benchmarked problems: the names the model's shapes give are
// entries of the embedding and matmul families.
TEST(ModelBilstmOps, TheStepsOpsAreBenchmarkedEntries) {
  std::vector<std::string> listed;
  for (const Family* f : families())
    for (const Problem& p : f->benchmark_problems({})) listed.push_back(p.name());
  const auto has = [&](const std::string& name) { return std::find(listed.begin(), listed.end(), name) != listed.end(); };
  const std::string embed = "shape:imdb_bilstm.embed/batch:64/T:200/vocab:20000/dim:128/layout:tnc";
  const std::string head = "shape:imdb_bilstm.dense/batch:64/M:64/N:2/K:256/a_blocks:2";
  for (const char* be : {"cpu", "cuda"}) {
    const std::string b = be;
    EXPECT_TRUE(has("embedding/" + b + "/f32/fwd/" + embed));
    EXPECT_TRUE(has("embedding/" + b + "/bf16/fwd/" + embed + "/table:f32"));
    EXPECT_TRUE(has("embedding/" + b + "/f32/bwd/" + embed));
    EXPECT_TRUE(has("embedding/" + b + "/bf16/bwd/" + embed));
    for (const char* t : {"f32", "bf16"}) EXPECT_TRUE(has("addmm/" + b + "/" + t + "/fwd/" + head)) << t;
    EXPECT_TRUE(has("mm/" + b + "/f32/bwd_data/" + head));
    EXPECT_TRUE(has("mm/" + b + "/bf16/bwd_data/" + head));
    EXPECT_TRUE(has("mm/" + b + "/bf16/bwd_data/" + head + "/out:f32"));
    EXPECT_TRUE(has("mm/" + b + "/f32/bwd_weight/" + head));
    EXPECT_TRUE(has("mm/" + b + "/bf16/bwd_weight/" + head + "/out:f32"));
  }
  // And the shapes the step builds are those the names parse into.
  Shape s = shape_of(model_problem("bilstm_imdb", Backend::cuda, Direction::train, 64));
  s.dtype = DType::bf16;
  const embedding::Shape e = embedding_shape(s, Direction::fwd, DType::bf16);
  EXPECT_TRUE(e.time_major && e.f32_table && e.batch == 64 && e.T == 200 && e.vocab == 20000 && e.dim == 128);
  const matmul::Shape h = head_shape(s, Direction::bwd_data, DType::bf16);
  EXPECT_TRUE(h.a_blocks == 2 && h.M == 64 && h.N == 2 && h.K == 256 && !h.f32_out);
  EXPECT_TRUE(head_shape(s, Direction::bwd_data, DType::f32).f32_out);
  EXPECT_TRUE(head_shape(s, Direction::bwd_weight).f32_out);
}

TEST(ModelBilstmWork, FlopsBytesItems) {
  const Work infer = family().work(model_problem("bilstm_imdb", Backend::cpu, Direction::infer, 64));
  const double lstm = 2.0 * 200 * 2 * 64 * 512 * (128 + 128), dense = 2.0 * 64 * 256 * 2;
  EXPECT_DOUBLE_EQ(infer.flops, lstm + dense);
  EXPECT_DOUBLE_EQ(infer.items, 64);
  const Work train = family().work(model_problem("bilstm_imdb", Backend::cuda, Direction::train, 64));
  const double P = static_cast<double>(layout_of(config_named("bilstm_imdb")).parameters);
  EXPECT_DOUBLE_EQ(train.flops, 3 * (lstm + dense) + 14 * P);
  EXPECT_DOUBLE_EQ(train.bytes, 24 * P + 8.0 * 64 * 200 + 4.0 * 64);  // int64 tokens, int32 labels
}

// Central differences of the reference's own loss on a tiny configuration, every parameter.
void expect_gradients_match_finite_differences(const std::string& config) {
  SCOPED_TRACE(config);
  const Shape s = shape_of(model_problem(config, Backend::cpu, Direction::train, 3));
  const Layout l = layout_of(s.cfg);
  const State st = make_state(s, l, 11);
  const std::vector<double> p0 = as_doubles(st.params);
  const Reference ref = reference(s.cfg, l, p0, st.tokens, st.labels, s.batch, true);
  const double h = 1e-6;
  double worst = 0, biggest = 0;
  std::size_t embed_nonzero = 0;
  for (std::size_t i = 0; i < l.total; ++i) {
    std::vector<double> p = p0;
    p[i] = p0[i] + h;
    const double lp = reference(s.cfg, l, p, st.tokens, st.labels, s.batch, true).loss;
    p[i] = p0[i] - h;
    const double lm = reference(s.cfg, l, p, st.tokens, st.labels, s.batch, true).loss;
    const double fd = (lp - lm) / (2 * h);
    worst = std::max(worst, std::fabs(fd - ref.grad[i]));
    biggest = std::max(biggest, std::fabs(fd));
    if (i < l.w_ih && ref.grad[i] != 0) ++embed_nonzero;
  }
  EXPECT_GT(biggest, 1e-2);
  EXPECT_LT(worst, 1e-7) << "largest |fd| " << biggest;
  if (s.cfg.one_hot) return;
  // 15 tokens of a vocabulary of 50: some rows have a gradient, most do not.
  EXPECT_GT(embed_nonzero, 0u);
  EXPECT_LT(embed_nonzero, static_cast<std::size_t>(15 * s.cfg.E) + 1);
}

TEST(ModelBilstmReference, GradientsMatchFiniteDifferences) { expect_gradients_match_finite_differences("bilstm_test"); }

TEST(ModelBilstmTask, LabelsAreNotConstant) {
  const Shape s = shape_of(model_problem("bilstm_imdb", Backend::cpu, Direction::train, 256));
  const State st = make_state(s, layout_of(s.cfg), 3);
  const long ones = std::count(st.labels.begin(), st.labels.end(), 1);
  EXPECT_GT(ones, 256 / 5);
  EXPECT_LT(ones, 256 - 256 / 5);
  for (std::int64_t t : st.tokens) ASSERT_TRUE(t >= 0 && t < 20000);
}

// An outcome made from the reference itself passes; the loss off by 0.1%, the step count off by one,
// an infer output off by 0.01 and each of the outcomes `wrong_gradients(s, l, st, correct)` returns
// (the correct train outcome, each with one gradient error planted) fail.
template <class WrongGradients>
void expect_planted_errors_fail(const std::string& config, WrongGradients wrong_gradients) {
  SCOPED_TRACE(config);
  const Shape s = shape_of(model_problem(config, Backend::cpu, Direction::train, 4));
  const Layout l = layout_of(s.cfg);
  const State st = make_state(s, l, 42);
  const std::vector<double> p0 = as_doubles(st.params);
  const Reference ref = reference(s.cfg, l, p0, st.tokens, st.labels, s.batch, true);
  auto outcome = [&](std::int64_t step) {
    Outcome o;
    o.loss = static_cast<float>(ref.loss);
    model_test::correct_step(ref.grad, [&](std::size_t i) { return p0[i]; }, l.total, step, o.grads, o.params);
    return o;
  };
  EXPECT_TRUE(verify_outcome(s, l, st, outcome(1)).ok) << verify_outcome(s, l, st, outcome(1)).message;

  Outcome wrong_loss = outcome(1);
  wrong_loss.loss *= 1.001f;
  EXPECT_FALSE(verify_outcome(s, l, st, wrong_loss).ok);
  const std::vector<Outcome> wrong = wrong_gradients(s, l, st, outcome(1));
  for (std::size_t k = 0; k < wrong.size(); ++k) EXPECT_FALSE(verify_outcome(s, l, st, wrong[k]).ok) << "planted error " << k;
  EXPECT_FALSE(verify_outcome(s, l, st, outcome(2)).ok);  // the step count off by one

  const Shape si = shape_of(model_problem(config, Backend::cpu, Direction::infer, 4));
  model_test::expect_output_checked(ref.logits, &Outcome::logits, 3,
                                    [&](const Outcome& o) { return verify_outcome(si, l, st, o); });
}

TEST(ModelBilstmVerify, PlantedErrorsFail) {
  expect_planted_errors_fail("bilstm_test", [](const Shape& s, const Layout& l, const State& st, const Outcome& correct) {
    // An embedding row's gradient scattered to the wrong token.
    const std::size_t row = l.embed + static_cast<std::size_t>(st.tokens[0] * s.cfg.E);
    Outcome wrong_row = correct;
    for (std::int64_t e = 0; e < s.cfg.E; ++e) {
      const std::size_t other = l.embed + static_cast<std::size_t>(((st.tokens[0] + 1) % s.cfg.V) * s.cfg.E + e);
      wrong_row.grads.set(other, wrong_row.grads.get(other) + wrong_row.grads.get(row + static_cast<std::size_t>(e)));
      wrong_row.grads.set(row + static_cast<std::size_t>(e), 0);
    }
    Outcome wrong_whh = correct;
    wrong_whh.grads.set(l.w_hh + 3, wrong_whh.grads.get(l.w_hh + 3) * 1.5 + 1e-3);
    Outcome wrong_bias = correct;  // b_hh's gradient must equal b_ih's
    wrong_bias.grads.set(l.b_hh + 1, 0);
    return std::vector<Outcome>{wrong_row, wrong_whh, wrong_bias};
  });
}

// A bf16 train step's outcome with loss `loss`, `logits` (stored bf16) and the gradients `grad`, and
// AdamW's first step from p0 on them.
Outcome bf16_outcome(double loss, const std::vector<double>& logits, const std::vector<double>& grad,
                     const std::vector<double>& p0) {
  Outcome o;
  o.loss = static_cast<float>(loss);
  o.logits = HostBuffer(DType::bf16, logits.size());
  for (std::size_t i = 0; i < logits.size(); ++i) o.logits.set(i, logits[i]);
  model_test::correct_step(grad, [&](std::size_t i) { return p0[i]; }, p0.size(), 1, o.grads, o.params);
  return o;
}

// bf16: a correct bf16 step, modelled by the reference rounding what the step stores bf16, passes the
// bf16 bounds (and fails f32's); each planted slip fails them.
void expect_bf16_bounds_catch_slips(const std::string& config, std::int64_t batch) {
  SCOPED_TRACE(config);
  const Shape s = shape_of(model_problem(config, Backend::cuda, Direction::train, batch, nullptr, 0, DType::bf16));
  const Shape si = shape_of(model_problem(config, Backend::cuda, Direction::infer, batch, nullptr, 0, DType::bf16));
  const Shape s32 = shape_of(model_problem(config, Backend::cuda, Direction::train, batch));
  const Layout l = layout_of(s.cfg);
  const State st = make_state(s, l, 42);
  const std::vector<double> p0 = as_doubles(st.params);
  const Reference bf = reference(s.cfg, l, p0, st.tokens, st.labels, s.batch, true, /*bf16_rounding=*/true);
  const std::int64_t B = s.batch, C = s.cfg.C, H = s.cfg.H, E = s.cfg.E;
  // The modelled step's outcome, its logits moved by `dz(b, c)` (a forward slip moves them).
  auto outcome = [&](const std::vector<double>& logits, const std::vector<double>& grad) {
    return bf16_outcome(bf.loss, logits, grad, p0);
  };
  const Check good = verify_outcome(s, l, st, outcome(bf.logits, bf.grad));
  EXPECT_TRUE(good.ok) << good.message;
  Outcome infer;
  infer.logits = outcome(bf.logits, bf.grad).logits;
  EXPECT_TRUE(verify_outcome(si, l, st, infer).ok) << verify_outcome(si, l, st, infer).message;
  EXPECT_FALSE(verify_outcome(s32, l, st, outcome(bf.logits, bf.grad)).ok) << "bf16's rounding passes f32's bounds";

  // The dense bias left out of the logits (infer and train).
  std::vector<double> no_bias = bf.logits;
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t c = 0; c < C; ++c) no_bias[static_cast<std::size_t>(b * C + c)] -= p0[l.dense_b + static_cast<std::size_t>(c)];
  Outcome nb_infer;
  nb_infer.logits = outcome(no_bias, bf.grad).logits;
  EXPECT_FALSE(verify_outcome(si, l, st, nb_infer).ok);
  EXPECT_FALSE(verify_outcome(s, l, st, outcome(no_bias, bf.grad)).ok);

  // The two directions' halves of the dense weight swapped: logits from the other direction's W.
  std::vector<double> swapped = reference(s.cfg, l, [&] {
    std::vector<double> p = p0;
    for (std::int64_t i = 0; i < H * C; ++i) std::swap(p[l.dense_w + static_cast<std::size_t>(i)], p[l.dense_w + static_cast<std::size_t>(H * C + i)]);
    return p;
  }(), st.tokens, st.labels, s.batch, false, true).logits;
  Outcome sw_infer;
  sw_infer.logits = outcome(swapped, bf.grad).logits;
  EXPECT_FALSE(verify_outcome(si, l, st, sw_infer).ok);

  EXPECT_FALSE(verify_outcome(s, l, st, outcome(bf.logits, w_hh_transposed(bf.grad, l, H))).ok);

  // An embedding row's gradient scattered to the wrong token.
  std::vector<double> wrong_row = bf.grad;
  const std::size_t row = l.embed + static_cast<std::size_t>(st.tokens[0] * E);
  const std::size_t other = l.embed + static_cast<std::size_t>(((st.tokens[0] + 1) % s.cfg.V) * E);
  for (std::int64_t e = 0; e < E; ++e) {
    wrong_row[other + static_cast<std::size_t>(e)] += wrong_row[row + static_cast<std::size_t>(e)];
    wrong_row[row + static_cast<std::size_t>(e)] = 0;
  }
  EXPECT_FALSE(verify_outcome(s, l, st, outcome(bf.logits, wrong_row)).ok);

  // The dense weight gradient without one direction's half (dhT of the other read for it).
  std::vector<double> half = bf.grad;
  for (std::int64_t i = 0; i < H * C; ++i) half[l.dense_w + static_cast<std::size_t>(H * C + i)] = half[l.dense_w + static_cast<std::size_t>(i)];
  EXPECT_FALSE(verify_outcome(s, l, st, outcome(bf.logits, half)).ok);
}

TEST(ModelBilstmVerify, Bf16BoundsCatchSlips) {
  expect_bf16_bounds_catch_slips("bilstm_test", 4);
  expect_bf16_bounds_catch_slips("bilstm_test", 8);
  expect_bf16_bounds_catch_slips("bilstm_imdb", 2);
}

// A CPU without oneDNN's bf16 lstm says so, naming the primitive and the ISA.
TEST(ModelBilstmBf16, CpuUnsupportedSaysWhy) {
  for (Direction d : {Direction::infer, Direction::train}) {
    const Problem p = model_problem("bilstm_imdb", Backend::cpu, d, 64, nullptr, 0, DType::bf16);
    const std::string why = family().unsupported_reason(p);
    std::printf("%s: %s\n", p.name().c_str(), why.empty() ? "supported" : why.c_str());
    if (why.empty()) continue;
    EXPECT_NE(why.find("oneDNN has no bf16 bidirectional lstm"), std::string::npos) << why;
    EXPECT_NE(why.find("ISA"), std::string::npos) << why;
  }
}

// On the CPU, the imdb model (every size but the batch its own) learns at batch 8 in 10 steps: the
// loss falls to about 0.3 of its start (0.7 is the bar), and the first step is verified at that size.
// Batch 32 and 30 steps are 12 times the work: up to 40 s on 2 cores shared with other processes.
TEST(ModelBilstmTraining, LossFallsCpu) {
  model_test::expect_learns(family(), Backend::cpu, "bilstm_test", 32, 150);
  model_test::expect_learns(family(), Backend::cpu, "bilstm_imdb", 8, 10);
}

TEST(ModelBilstmTraining, LossFallsCuda) {
  HOTOPS_SKIP_WITHOUT_GPU();
  model_test::expect_learns(family(), Backend::cuda, "bilstm_test", 32, 150);
  model_test::expect_learns(family(), Backend::cuda, "bilstm_imdb", 32, 30);
}

TEST(ModelBilstmTraining, LossFallsCudaBf16) {
  HOTOPS_SKIP_WITHOUT_GPU();
  model_test::expect_learns(family(), Backend::cuda, "bilstm_test", 32, 150, DType::bf16);
  model_test::expect_learns(family(), Backend::cuda, "bilstm_imdb", 32, 30, DType::bf16);
}

// Skips, with oneDNN's reason, on a CPU without its bf16 lstm.
TEST(ModelBilstmTraining, LossFallsCpuBf16) {
  model_test::expect_learns(family(), Backend::cpu, "bilstm_test", 32, 150, DType::bf16);
  model_test::expect_learns(family(), Backend::cpu, "bilstm_imdb", 8, 10, DType::bf16);
}

// The character LSTM (Keras' lstm_text_generation.py): one direction, one-hot input, 57 classes.

TEST(ModelTextgenLayout, ParameterCountsAndAlignment) {
  const Config c = config_named("lstm_textgen");
  EXPECT_TRUE(c.one_hot && c.D == 1 && !c.fused_loss());
  const Layout l = layout_of(c);
  // No embedding; W_ih 512 x 57, W_hh 512 x 128, b_ih, b_hh 512; dense 128 x 57 + 57: 103,097 (Keras'
  // 95,232 + 7,353 with one LSTM bias, and PyTorch's second bias).
  EXPECT_EQ(l.parameters, 512 * 57 + 512 * 128 + 2 * 512 + 128 * 57 + 57);
  EXPECT_EQ(l.parameters, 95232 + 7353 + 512);
  EXPECT_EQ(l.embed, l.w_ih);
  for (std::size_t at : {l.w_ih, l.w_hh, l.b_ih, l.b_hh, l.dense_w, l.dense_b, l.total}) EXPECT_EQ(at % kAlignFloats, 0u);
  std::vector<std::string> names;
  for (const Tensor& t : gradient_tensors(c, l)) names.push_back(t.name);
  EXPECT_EQ(names, (std::vector<std::string>{"dW_ih", "dW_hh", "db_ih", "db_hh", "dW_dense", "db_dense"}));
}

TEST(ModelTextgenNames, VariantsAndJoinAcrossBackends) {
  std::vector<std::string> names;
  for (const Problem& p : family().benchmark_problems({})) names.push_back(p.name());
  const auto has = [&](const std::string& n) { return std::find(names.begin(), names.end(), n) != names.end(); };
  for (const char* be : {"cpu", "cuda"})
    for (const char* t : {"f32", "bf16"})
      for (const char* d : {"infer", "train"})
        for (int b : {32, 128, 512}) {
          const std::string n = std::string("model.lstm_textgen/") + be + "/" + t + "/" + d + "/batch:" + std::to_string(b);
          EXPECT_TRUE(has(n)) << n;
        }
  for (const char* n : {"model.lstm_textgen/cpu/f32/train/batch:128/threads:4", "model.lstm_textgen/cpu/bf16/infer/batch:32/threads:8",
                        "model.lstm_textgen/cuda/f32/infer/batch:128/e2e:1", "model.lstm_textgen/cuda/bf16/train/batch:512/e2e:1",
                        "model.lstm_textgen/cuda/f32/train/batch:128/graph:1", "model.lstm_textgen/cuda/bf16/train/batch:32/graph:1"})
    EXPECT_TRUE(has(n)) << n;
  EXPECT_FALSE(has("model.lstm_textgen/cuda/f32/infer/batch:128/graph:1"));
  EXPECT_FALSE(has("model.textgen_test/cpu/f32/train/batch:3"));  // the tests' configuration is not benchmarked
  std::vector<std::string> tests;
  for (const Problem& p : family().test_problems()) tests.push_back(p.name());
  EXPECT_NE(std::find(tests.begin(), tests.end(), "model.textgen_test/cpu/f32/train/batch:3"), tests.end());
  EXPECT_NE(std::find(tests.begin(), tests.end(), "model.textgen_test/cuda/bf16/train/batch:3/graph:1"), tests.end());
}

// The step's ops are the op families' benchmarked problems: the lstm family's textgen, the head's
// GEMMs, cross_entropy and bias_grad at 57 classes.
TEST(ModelTextgenOps, TheStepsOpsAreBenchmarkedEntries) {
  std::vector<std::string> listed;
  for (const Family* f : families())
    for (const Problem& p : f->benchmark_problems({})) listed.push_back(p.name());
  const auto has = [&](const std::string& name) { return std::find(listed.begin(), listed.end(), name) != listed.end(); };
  const std::string head = "shape:lstm_textgen.dense/batch:128/M:128/N:57/K:128";
  for (const char* be : {"cpu", "cuda"}) {
    const std::string b = be;
    for (const char* t : {"f32", "bf16"}) EXPECT_TRUE(has("addmm/" + b + "/" + t + "/fwd/" + head)) << t;
    EXPECT_TRUE(has("mm/" + b + "/f32/bwd_data/" + head));
    EXPECT_TRUE(has("mm/" + b + "/bf16/bwd_data/" + head));
    EXPECT_TRUE(has("mm/" + b + "/bf16/bwd_data/" + head + "/out:f32"));
    EXPECT_TRUE(has("mm/" + b + "/f32/bwd_weight/" + head));
    EXPECT_TRUE(has("mm/" + b + "/bf16/bwd_weight/" + head + "/out:f32"));
    for (const char* t : {"f32", "bf16"}) {
      EXPECT_TRUE(has("bias_grad/" + b + "/" + t + "/bwd/shape:lstm_textgen.dense/batch:128/M:128/N:57")) << t;
      for (const char* d : {"fwd", "bwd"})
        EXPECT_TRUE(has("cross_entropy/" + b + "/" + t + "/" + d + "/shape:lstm_textgen/batch:128/rows:128/classes:57")) << t << d;
    }
  }
  // The LSTM as kernels/lstm's textgen (T 40, input 57, hidden 128, one direction).
  bool lstm_listed = false;
  for (const std::string& n : listed) lstm_listed |= n.rfind("lstm/", 0) == 0 && n.find("shape:textgen") != std::string::npos;
  EXPECT_TRUE(lstm_listed);
  // And the shapes the step builds are those the names parse into.
  Shape s = shape_of(model_problem("lstm_textgen", Backend::cuda, Direction::train, 128));
  s.dtype = DType::bf16;
  const matmul::Shape h = head_shape(s, Direction::bwd_weight);
  EXPECT_TRUE(h.a_blocks == 1 && h.M == 128 && h.N == 57 && h.K == 128 && h.f32_out);
  const loss::Shape x = loss_shape(s, Direction::bwd);
  EXPECT_TRUE(x.kind == loss::Kind::cross_entropy && x.rows == 128 && x.classes == 57 && x.dtype == DType::bf16);
  const matmul::bias_grad::Shape bg = bias_grad_shape(s);
  EXPECT_TRUE(bg.rows == 128 && bg.cols == 57 && bg.dtype == DType::bf16);
}

TEST(ModelTextgenWork, FlopsBytesItems) {
  const Work infer = family().work(model_problem("lstm_textgen", Backend::cpu, Direction::infer, 128));
  const double lstm = 2.0 * 40 * 1 * 128 * 512 * (57 + 128), dense = 2.0 * 128 * 128 * 57;
  const double P = static_cast<double>(layout_of(config_named("lstm_textgen")).parameters);
  EXPECT_DOUBLE_EQ(infer.flops, lstm + dense);
  EXPECT_DOUBLE_EQ(infer.items, 128);
  EXPECT_DOUBLE_EQ(infer.bytes, 4 * P + 4.0 * 40 * 128 * 57 + 4.0 * 128 * 57);  // f32 one-hot batch, f32 logits
  const Work train = family().work(model_problem("lstm_textgen", Backend::cuda, Direction::train, 128, nullptr, 0, DType::bf16));
  EXPECT_DOUBLE_EQ(train.flops, 3 * (lstm + dense) + 14 * P);
  EXPECT_DOUBLE_EQ(train.bytes, 24 * P + 2.0 * 40 * 128 * 57 + 8.0 * 128);  // bf16 one-hot batch, int64 targets
}

TEST(ModelTextgenTask, OneHotBatchAndLabels) {
  const Shape s = shape_of(model_problem("lstm_textgen", Backend::cpu, Direction::train, 256));
  const State st = make_state(s, layout_of(s.cfg), 3);
  ASSERT_EQ(st.x.count(), static_cast<std::size_t>(40 * 256 * 57));
  double sum = 0;
  for (std::size_t i = 0; i < st.x.count(); ++i) sum += st.x.get(i);
  EXPECT_DOUBLE_EQ(sum, 40.0 * 256);
  for (std::int64_t t : {0, 17, 39})
    for (std::int64_t b : {0, 100, 255})
      EXPECT_EQ(st.x.get(static_cast<std::size_t>((t * 256 + b) * 57 + st.tokens[static_cast<std::size_t>(b * 40 + t)])), 1.0);
  std::vector<int> seen(57, 0);
  for (std::size_t b = 0; b < st.labels.size(); ++b) {
    ASSERT_TRUE(st.labels[b] >= 0 && st.labels[b] < 57);
    EXPECT_EQ(st.targets[b], st.labels[b]);
    ++seen[static_cast<std::size_t>(st.labels[b])];
  }
  EXPECT_GT(std::count_if(seen.begin(), seen.end(), [](int n) { return n > 0; }), 20);  // many classes
}

TEST(ModelTextgenReference, GradientsMatchFiniteDifferences) { expect_gradients_match_finite_differences("textgen_test"); }

TEST(ModelTextgenVerify, PlantedErrorsFail) {
  expect_planted_errors_fail("textgen_test", [](const Shape& s, const Layout& l, const State& st, const Outcome& correct) {
    // The dense bias gradient of one class taken from its neighbour (a bias_grad column off by one).
    Outcome wrong_db = correct;
    wrong_db.grads.set(l.dense_b + 17, wrong_db.grads.get(l.dense_b + 18));
    Outcome wrong_wih = correct;  // a one-hot column of W_ih's gradient dropped
    for (std::int64_t r = 0; r < 4 * s.cfg.H; ++r) wrong_wih.grads.set(l.w_ih + static_cast<std::size_t>(r * s.cfg.E + st.tokens[0]), 0);
    return std::vector<Outcome>{wrong_db, wrong_wih};
  });
}

// bf16: a correct bf16 step (the reference rounding what the step stores bf16) passes; the dense bias
// left out of the logits and a transposed W_hh gradient block fail.
TEST(ModelTextgenVerify, Bf16BoundsCatchSlips) {
  for (const char* config : {"textgen_test", "lstm_textgen"}) {
    SCOPED_TRACE(config);
    const std::int64_t batch = 4;
    const Shape s = shape_of(model_problem(config, Backend::cuda, Direction::train, batch, nullptr, 0, DType::bf16));
    const Shape si = shape_of(model_problem(config, Backend::cuda, Direction::infer, batch, nullptr, 0, DType::bf16));
    const Layout l = layout_of(s.cfg);
    const State st = make_state(s, l, 42);
    const std::vector<double> p0 = as_doubles(st.params);
    const Reference bf = reference(s.cfg, l, p0, st.tokens, st.labels, s.batch, true, /*bf16_rounding=*/true);
    auto outcome = [&](const std::vector<double>& logits, const std::vector<double>& grad) {
      return bf16_outcome(bf.loss, logits, grad, p0);
    };
    const Check good = verify_outcome(s, l, st, outcome(bf.logits, bf.grad));
    EXPECT_TRUE(good.ok) << good.message;
    std::vector<double> no_bias = bf.logits;
    const std::int64_t C = s.cfg.C, H = s.cfg.H;
    for (std::int64_t b = 0; b < batch; ++b)
      for (std::int64_t c = 0; c < C; ++c) no_bias[static_cast<std::size_t>(b * C + c)] -= p0[l.dense_b + static_cast<std::size_t>(c)];
    Outcome nb;
    nb.logits = outcome(no_bias, bf.grad).logits;
    EXPECT_FALSE(verify_outcome(si, l, st, nb).ok);
    EXPECT_FALSE(verify_outcome(s, l, st, outcome(bf.logits, w_hh_transposed(bf.grad, l, H))).ok);
  }
}

TEST(ModelTextgenTraining, LossFallsCpu) {
  model_test::expect_learns(family(), Backend::cpu, "textgen_test", 8, 150);
  model_test::expect_learns(family(), Backend::cpu, "lstm_textgen", 8, 30);
}

TEST(ModelTextgenTraining, LossFallsCpuBf16) {
  model_test::expect_learns(family(), Backend::cpu, "textgen_test", 8, 150, DType::bf16);
  model_test::expect_learns(family(), Backend::cpu, "lstm_textgen", 8, 30, DType::bf16);
}

TEST(ModelTextgenTraining, LossFallsCuda) {
  HOTOPS_SKIP_WITHOUT_GPU();
  model_test::expect_learns(family(), Backend::cuda, "textgen_test", 8, 150);
  model_test::expect_learns(family(), Backend::cuda, "lstm_textgen", 8, 30);
}

TEST(ModelTextgenTraining, LossFallsCudaBf16) {
  HOTOPS_SKIP_WITHOUT_GPU();
  model_test::expect_learns(family(), Backend::cuda, "textgen_test", 8, 150, DType::bf16);
  model_test::expect_learns(family(), Backend::cuda, "lstm_textgen", 8, 30, DType::bf16);
}

// ---- data-parallel train steps (gpus:G; kernels/models/data_parallel.h) ----

// bilstm_imdb and lstm_textgen have data-parallel steps at their train batches (per GPU), G = 2, 4,
// 8, in both dtypes, doing G times one GPU's work from the single-GPU step's start at G x B; the
// tests' configurations have gpus:1 steps only.
TEST(ModelBilstmDataParallel, NamesWorkAndSeed) {
  model_test::expect_data_parallel_names(
      family(), {{"bilstm_imdb", config_named("bilstm_imdb").batches}, {"lstm_textgen", config_named("lstm_textgen").batches}});
  for (const Problem& p : family().benchmark_problems({7}))
    if (p.has("gpus")) {
      EXPECT_EQ(p.get_int("batch"), 7) << p.name();  // --hotops_batch sets the per-GPU batch
    }

  model_test::expect_gpus_only_on_cuda_train(shape_of, "bilstm_imdb", 64, 4);
  model_test::expect_gpus_only_on_cuda_train(shape_of, "lstm_textgen", 8, 2);
  // The seed: the tokens, the labels and the parameters.
  model_test::expect_data_parallel_work_and_seed(family(), model_problem("bilstm_imdb", Backend::cuda, Direction::train, 64), 4);
  model_test::expect_data_parallel_work_and_seed(
      family(), model_problem("lstm_textgen", Backend::cuda, Direction::train, 512, nullptr, 0, DType::bf16), 8);

  const std::vector<std::string> tests = model_test::data_parallel_names(family().test_problems());
  EXPECT_EQ(tests, (std::vector<std::string>{"model.bilstm_test/cuda/f32/train/batch:3/gpus:1", "model.bilstm_test/cuda/bf16/train/batch:3/gpus:1",
                                              "model.textgen_test/cuda/f32/train/batch:3/gpus:1",
                                              "model.textgen_test/cuda/bf16/train/batch:3/gpus:1"}));
}

// A replica's shard of the global batch is that batch's samples r B .. (r + 1) B - 1: their tokens,
// labels and targets, and for the one-hot input their rows of every time step of x [T, B, E], which
// the shards, put back side by side at each time step, make up again.
TEST(ModelBilstmDataParallel, ShardsAreTheGlobalBatchsSamples) {
  for (const char* config : {"bilstm_test", "textgen_test"})
    for (DType t : {DType::f32, DType::bf16}) {
      SCOPED_TRACE(std::string(config) + " " + dtype_name(t));
      const std::int64_t B = 3, G = 4;
      const Shape global = shape_of(model_problem(config, Backend::cuda, Direction::train, G * B, nullptr, 0, t));
      const Layout l = layout_of(global.cfg);
      const State all = make_state(global, l, 5);
      const auto T = static_cast<std::size_t>(global.cfg.T), E = static_cast<std::size_t>(global.cfg.E);
      HostBuffer joined(t, all.x.count());
      for (int r = 0; r < G; ++r) {
        State mine;
        SampleShard{}(mine, all, T, models::Replica{static_cast<int>(G), r}, B);
        ASSERT_EQ(mine.tokens.size(), static_cast<std::size_t>(B) * T);
        ASSERT_EQ(mine.labels.size(), static_cast<std::size_t>(B));
        for (std::size_t b = 0; b < static_cast<std::size_t>(B); ++b) {
          const std::size_t g = static_cast<std::size_t>(r * B) + b;
          EXPECT_EQ(mine.labels[b], all.labels[g]);
          EXPECT_EQ(mine.targets[b], all.targets[g]);
          for (std::size_t s = 0; s < T; ++s) EXPECT_EQ(mine.tokens[b * T + s], all.tokens[g * T + s]);
        }
        if (!global.cfg.one_hot) {
          EXPECT_EQ(mine.x.count(), 0u);
          continue;
        }
        ASSERT_EQ(mine.x.count(), T * static_cast<std::size_t>(B) * E);
        EXPECT_EQ(mine.x.dtype(), t);
        for (std::size_t s = 0; s < T; ++s)
          for (std::size_t b = 0; b < static_cast<std::size_t>(B); ++b)
            for (std::size_t e = 0; e < E; ++e) {
              const double v = mine.x.get((s * static_cast<std::size_t>(B) + b) * E + e);
              EXPECT_EQ(v, e == static_cast<std::size_t>(mine.tokens[b * T + s]) ? 1.0 : 0.0);
              joined.set((s * static_cast<std::size_t>(G * B) + static_cast<std::size_t>(r * B) + b) * E + e, v);
            }
      }
      if (global.cfg.one_hot) {
        EXPECT_EQ(std::memcmp(joined.data(), all.x.data(), all.x.bytes()), 0);
      }
    }
}

// gpus:1 (a communicator of this process alone): the data-parallel step verified against the
// reference at its global batch; bilstm_imdb's gradients in two buckets (the LSTM's and the dense
// head's, final after the LSTM's backward; then the embedding's), the character LSTM's and the tiny
// configurations' in one.
TEST(ModelBilstmDataParallel, OneGpuBucketsAndVerifiesCuda) {
  model_test::expect_one_gpu_data_parallel(family(), model_problem("bilstm_imdb", Backend::cuda, Direction::train, 4), "in 2 buckets");
  model_test::expect_one_gpu_data_parallel(family(), model_problem("lstm_textgen", Backend::cuda, Direction::train, 4, nullptr, 0, DType::bf16),
                                           "in 1 bucket ");
  for (DType t : {DType::f32, DType::bf16})
    for (const char* config : {"bilstm_test", "textgen_test"})
      model_test::expect_one_gpu_data_parallel(family(), model_problem(config, Backend::cuda, Direction::train, 3, nullptr, 0, t),
                                               "in 1 bucket ");
}

}  // namespace
// The CUDA bf16 train steps' copy of the master weights is written by AdamW, never cast in a step; a
// data-parallel step's too, by its per-bucket launches.
TEST(ModelBilstmBf16Copy, KeptByAdamwCuda) {
  HOTOPS_SKIP_WITHOUT_GPU();
  model_test::expect_bf16_copy_kept(family(), model_test::model_problem("bilstm_test", Backend::cuda, Direction::train, 32, nullptr, 0, DType::bf16), 3);
  model_test::expect_bf16_copy_kept(family(), model_test::model_problem("textgen_test", Backend::cuda, Direction::train, 8, nullptr, 0, DType::bf16), 3);
  const Problem one_gpu = model_test::model_problem("bilstm_imdb", Backend::cuda, Direction::train, 4, "gpus", 1, DType::bf16);
  if (family().unsupported_reason(one_gpu).empty()) model_test::expect_bf16_copy_kept(family(), one_gpu, 3);
}
TEST(ModelBilstmBf16Copy, CastOnceForInferCuda) {
  HOTOPS_SKIP_WITHOUT_GPU();
  model_test::expect_bf16_copy_kept(family(), model_test::model_problem("bilstm_test", Backend::cuda, Direction::infer, 32, nullptr, 0, DType::bf16), 3);
  model_test::expect_bf16_copy_kept(family(), model_test::model_problem("textgen_test", Backend::cuda, Direction::infer, 8, "e2e", 1, DType::bf16), 3);
}

// The CPU infer step packs the LSTM's weights into oneDNN's layouts (and casts bf16's dense head)
// once, at the start: its breakdown has no reorder or copy part, a train step's has the reorder.
TEST(ModelBilstm, CpuInferPreparesItsWeightsOnce) {
  for (DType t : {DType::f32, DType::bf16})
    for (Direction d : {Direction::infer, Direction::train}) {
      const Problem p = model_test::model_problem("bilstm_test", Backend::cpu, d, 4, nullptr, 0, t);
      if (!family().unsupported_reason(p).empty()) continue;
      const auto c = family().make(p);
      const Check first = c->verify();
      ASSERT_TRUE(first.ok) << p.name() << ": " << first.message;
      const trace::Breakdown b = trace::measure_on_cpu([&] { c->run(); }, 0, 2);
      const auto has = [&](const char* op) {
        return std::any_of(b.parts.begin(), b.parts.end(), [&](const trace::Part& part) { return part.op == op; });
      };
      EXPECT_EQ(has("reorder"), d == Direction::train) << p.name();
      if (d == Direction::infer) {
        EXPECT_FALSE(has("copy")) << p.name();
      }
      const Check again = c->verify();  // the weights prepared again from the restored masters
      EXPECT_TRUE(again.ok) << p.name() << ": " << again.message;
    }
}

}  // namespace hotops::model_bilstm
