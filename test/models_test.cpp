// The models family: the reference's gradients against finite differences, verification failing on
// planted errors (f32 and bf16 bounds), the names, the thread scope of threads:T, and every model
// learning its task in f32 and in bf16.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>

#include "hotops/check.h"
#include "hotops/cpu.h"
#include "hotops/gpu.h"
#include "test/model_test_util.h"
#include "kernels/model_bert/model_bert.h"
#include "kernels/models/data_parallel.h"
#include "kernels/models/models.h"

namespace hotops::models {
namespace {

using model_test::model_problem;
Problem bf16_problem(const std::string& model, Backend be, Direction d, std::int64_t batch) {
  return model_problem(model, be, d, batch, nullptr, 0, DType::bf16);
}

// The train outcome of a model that computed reference r's loss, the gradients `grads`, and took
// AdamW step `step` from p0 with them.
Outcome train_outcome(const Reference& r, const std::vector<double>& grads, const std::vector<double>& p0, std::int64_t step = 1) {
  Outcome o;
  o.loss = static_cast<float>(r.loss);
  model_test::correct_step(grads, [&](std::size_t i) { return p0[i]; }, p0.size(), step, o.grads, o.params);
  return o;
}

TEST(ModelsLayout, ParameterCountsAndAlignment) {
  const ParamLayout tiny = param_layout(model_named("mlp_tiny").widths);
  EXPECT_EQ(tiny.parameters, 13 * 32 + 32 + 32 * 16 + 16 + 16 * 2 + 2);  // 1010, as the notebook's MLP
  // Keras' mnist_mlp summary: 669,706 trainable parameters.
  EXPECT_EQ(param_layout(model_named("mlp_mnist").widths).parameters, 669706);
  EXPECT_EQ(param_layout(model_named("classifierdl").widths).parameters, 768 * 512 + 512 + 512 * 2 + 2);
  for (std::size_t k = 0; k < tiny.w.size(); ++k) {
    EXPECT_EQ(tiny.w[k] % kAlignFloats, 0u);
    EXPECT_EQ(tiny.b[k] % kAlignFloats, 0u);
  }
  EXPECT_EQ(tiny.total % kAlignFloats, 0u);
}

TEST(ModelsNames, VariantsAndJoinAcrossBackends) {
  std::vector<std::string> names;
  for (const Problem& p : family().benchmark_problems({})) names.push_back(p.name());
  for (const char* n : {"model.mlp_tiny/cpu/f32/train/batch:10", "model.mlp_tiny/cuda/f32/train/batch:10",
                        "model.mlp_tiny/cpu/f32/infer/batch:10/threads:1", "model.mlp_tiny/cuda/f32/train/batch:10/e2e:1",
                        "model.mlp_tiny/cuda/f32/train/batch:10/graph:1", "model.mlp_mnist/cuda/f32/infer/batch:128",
                        "model.classifierdl/cpu/f32/train/batch:1024/threads:8"})
    EXPECT_NE(std::find(names.begin(), names.end(), n), names.end()) << n;
  EXPECT_EQ(std::find(names.begin(), names.end(), "model.mlp_tiny/cuda/f32/infer/batch:10/graph:1"), names.end());
  // Every f32 problem has its bf16 twin, named with the dtype segment replaced, and nothing else.
  std::vector<std::string> f32, bf16;
  for (const std::string& n : names) {
    const auto at = n.find("/f32/");
    if (at != std::string::npos) f32.push_back(n.substr(0, at) + "/bf16/" + n.substr(at + 5));
    else bf16.push_back(n);
  }
  EXPECT_EQ(f32, bf16);
  EXPECT_EQ(names.size(), 2 * f32.size());
  EXPECT_NE(std::find(names.begin(), names.end(), "model.mlp_tiny/cuda/bf16/train/batch:10"), names.end());
  // Other model families keep refusing bf16 (step_args' default); this one takes it.
  const Problem b = bf16_problem("mlp_tiny", Backend::cuda, Direction::train, 10);
  EXPECT_THROW(step_args(b, "model_x", true), Error);
  EXPECT_EQ(step_args(b, "models", true, true).dtype, DType::bf16);
  EXPECT_THROW(shape_of(model_problem("mlp_tiny", Backend::cpu, Direction::train, 4, nullptr, 0, DType::f16)), Error);
  std::vector<Problem> plain;
  expand_step_problems("mlp_tiny", 10, {1}, true, plain);
  for (const Problem& p : plain) EXPECT_EQ(p.dtype, DType::f32) << p.name();
  // --hotops_batch replaces every model's batches.
  for (const Problem& p : family().benchmark_problems({7})) EXPECT_EQ(p.get_int("batch"), 7);
  EXPECT_THROW(shape_of(model_problem("mlp_tiny", Backend::cpu, Direction::train, 4, "e2e", 1)), Error);
  EXPECT_THROW(shape_of(model_problem("resnet", Backend::cpu, Direction::train, 4)), Error);
}

TEST(ModelsWork, FlopsBytesItems) {
  const Work infer = family().work(model_problem("mlp_tiny", Backend::cpu, Direction::infer, 10));
  EXPECT_DOUBLE_EQ(infer.flops, 2.0 * 10 * (13 * 32 + 32 * 16 + 16 * 2));
  EXPECT_DOUBLE_EQ(infer.bytes, 4.0 * (1010 + 10 * 13 + 10 * 2));
  EXPECT_DOUBLE_EQ(infer.items, 10);
  const Work train = family().work(model_problem("mlp_tiny", Backend::cuda, Direction::train, 10));
  EXPECT_DOUBLE_EQ(train.flops, 3 * infer.flops + 14.0 * 1010);
  // bf16: the same FLOPs; the parameters stay f32, x and the logits are bf16.
  const Work infer16 = family().work(bf16_problem("mlp_tiny", Backend::cpu, Direction::infer, 10));
  EXPECT_DOUBLE_EQ(infer16.flops, infer.flops);
  EXPECT_DOUBLE_EQ(infer16.bytes, 4.0 * 1010 + 2.0 * (10 * 13 + 10 * 2));
}

// Central differences of the reference's own loss, in double, on a tiny model with every weight random.
TEST(ModelsReference, GradientsMatchFiniteDifferences) {
  const std::vector<std::int64_t> widths = {5, 4, 3, 3};
  const ParamLayout l = param_layout(widths);
  const std::int64_t B = 4;
  std::mt19937_64 rng(7);
  std::uniform_real_distribution<double> u(-1, 1);
  std::vector<double> params(l.total, 0.0), x(static_cast<std::size_t>(B * widths[0]));
  for (std::size_t k = 0; k + 1 < widths.size(); ++k) {
    for (std::int64_t i = 0; i < widths[k] * widths[k + 1]; ++i) params[l.w[k] + static_cast<std::size_t>(i)] = u(rng);
    for (std::int64_t i = 0; i < widths[k + 1]; ++i) params[l.b[k] + static_cast<std::size_t>(i)] = 0.5 * u(rng);
  }
  for (double& v : x) v = u(rng);
  const std::vector<std::int32_t> labels = {0, 2, 1, 2};
  const Reference ref = reference(widths, l, params, x, labels, B, true);
  const double h = 1e-6;
  double worst = 0, biggest = 0;
  int checked = 0;
  for (std::size_t k = 0; k + 1 < widths.size(); ++k)
    for (int wb = 0; wb < 2; ++wb) {
      const std::size_t at = wb == 0 ? l.w[k] : l.b[k];
      const std::int64_t n = wb == 0 ? widths[k] * widths[k + 1] : widths[k + 1];
      for (std::int64_t i = 0; i < n; ++i) {
        std::vector<double> p = params;
        p[at + static_cast<std::size_t>(i)] = params[at + static_cast<std::size_t>(i)] + h;
        const double lp = reference(widths, l, p, x, labels, B, true).loss;
        p[at + static_cast<std::size_t>(i)] = params[at + static_cast<std::size_t>(i)] - h;
        const double lm = reference(widths, l, p, x, labels, B, true).loss;
        const double fd = (lp - lm) / (2 * h);
        worst = std::max(worst, std::fabs(fd - ref.grad[at + static_cast<std::size_t>(i)]));
        biggest = std::max(biggest, std::fabs(fd));
        ++checked;
      }
    }
  EXPECT_EQ(checked, 5 * 4 + 4 + 4 * 3 + 3 + 3 * 3 + 3);
  EXPECT_GT(biggest, 1e-2);
  EXPECT_LT(worst, 1e-7) << "largest |fd| " << biggest;
  // The padding has no gradient.
  for (std::size_t i = l.b[0] + 4; i < l.w[1]; ++i) EXPECT_EQ(ref.grad[i], 0.0);
}

// An outcome made from the reference itself passes; each planted error fails.
TEST(ModelsVerify, PlantedErrorsFail) {
  const Shape s = shape_of(model_problem("mlp_tiny", Backend::cpu, Direction::train, 6));
  const ParamLayout l = param_layout(s.widths);
  const State st = make_state(s, l, 42);
  std::vector<double> p0(l.total), x(st.x.count());
  for (std::size_t i = 0; i < p0.size(); ++i) p0[i] = st.params.get(i);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = st.x.get(i);
  const Reference ref = reference(s.widths, l, p0, x, st.labels, s.batch, true);

  auto outcome = [&](std::int64_t step) { return train_outcome(ref, ref.grad, p0, step); };
  EXPECT_TRUE(verify_outcome(s, l, st, outcome(1)).ok);

  Outcome wrong_loss = outcome(1);
  wrong_loss.loss *= 1.001f;
  EXPECT_FALSE(verify_outcome(s, l, st, wrong_loss).ok);

  Outcome wrong_grad = outcome(1);
  wrong_grad.grads.set(l.w[1] + 5, wrong_grad.grads.get(l.w[1] + 5) * 1.5 + 1e-3);
  EXPECT_FALSE(verify_outcome(s, l, st, wrong_grad).ok);

  EXPECT_FALSE(verify_outcome(s, l, st, outcome(2)).ok);  // the step count off by one

  Outcome nan_param = outcome(1);
  nan_param.params.set(l.b[2], std::nan(""));
  EXPECT_FALSE(verify_outcome(s, l, st, nan_param).ok);

  const Shape si = shape_of(model_problem("mlp_tiny", Backend::cpu, Direction::infer, 6));
  model_test::expect_output_checked(ref.logits, &Outcome::logits, 3,
                                    [&](const Outcome& o) { return verify_outcome(si, l, st, o); });
}

// bf16's bounds pass the reference itself and a real bf16 run, and fail on the slips they must
// catch: one layer's bias left out, one weight matrix read transposed.
// A check in chunks judges as one over the whole array: the worst element by its index among all n
// (not within its chunk), the rms over every element.
TEST(ModelsVerify, ChunkedChecksNameTheWholeIndex) {
  const std::size_t n = 2 * models::kCheckChunk + 123, bad = models::kCheckChunk + 77;
  std::vector<double> out(n, 1.0), ref(n, 1.0);
  out[bad] = 1.5;
  const auto fill = [&](std::size_t at, std::size_t k, double* o, double* r) {
    std::copy_n(out.data() + at, k, o);
    std::copy_n(ref.data() + at, k, r);
  };
  const models::Checks c = models::within_by_chunks("t", n, 1.0, 0.1, 1e-4, fill);
  const Check whole = models::within("t", out, ref, 1.0, 0.1), whole_rms = models::rms_within("t", out, ref, 1.0, 1e-4);
  EXPECT_FALSE(c.max.ok);
  EXPECT_EQ(c.max.message, whole.message);
  EXPECT_NE(c.max.message.find("index " + std::to_string(bad)), std::string::npos) << c.max.message;
  EXPECT_EQ(c.max.checked, n);
  EXPECT_FALSE(c.rms.ok);
  EXPECT_NEAR(c.rms.max_err, whole_rms.max_err, 1e-12);
  out[n - 1] = 1.5;  // as bad an element in a later chunk: the first is named, as within() names it
  EXPECT_NE(models::within_by_chunks("t", n, 1.0, 0.1, 1e-4, fill).max.message.find("index " + std::to_string(bad)),
            std::string::npos);
  out[bad] = out[n - 1] = 1.0;
  EXPECT_TRUE(models::within_by_chunks("t", n, 1.0, 0.1, 1e-4, fill).max.ok);
  EXPECT_TRUE(models::within_by_chunks("t", n, 1.0, 0.1, 1e-4, fill).rms.ok);
}

// A fill that fails in one chunk (its checks run in parallel) is the check's error, not the process's end.
TEST(ModelsVerify, AChunkedCheckPassesOnAFillsError) {
  const auto fill = [](std::size_t at, std::size_t k, double* o, double* r) {
    if (at == models::kCheckChunk) throw Error("the second chunk cannot be read");
    std::fill_n(o, k, 1.0);
    std::fill_n(r, k, 1.0);
  };
  EXPECT_THROW(models::within_by_chunks("t", 3 * models::kCheckChunk, 1.0, 0.1, 0, fill), Error);
}

TEST(ModelsVerify, Bf16BoundsCatchSlips) {
  for (Direction d : {Direction::infer, Direction::train}) {
    const Shape s = shape_of(bf16_problem("mlp_mnist", Backend::cpu, d, 16));
    const ParamLayout l = param_layout(s.widths);
    const State st = make_state(s, l, 42);
    std::vector<double> p0(l.total), x(st.x.count());
    for (std::size_t i = 0; i < p0.size(); ++i) p0[i] = st.params.get(i);
    for (std::size_t i = 0; i < x.size(); ++i) x[i] = st.x.get(i);
    // The outcome of a model that computed `params` exactly (its logits stored bf16), and took the step.
    auto outcome = [&](const std::vector<double>& params) {
      const Reference r = reference(s.widths, l, params, x, st.labels, s.batch, s.train());
      Outcome o = s.train() ? train_outcome(r, r.grad, p0) : Outcome{};
      o.logits = HostBuffer(DType::bf16, r.logits.size());
      for (std::size_t i = 0; i < r.logits.size(); ++i) o.logits.set(i, r.logits[i]);
      return o;
    };
    const Check good = verify_outcome(s, l, st, outcome(p0));
    EXPECT_TRUE(good.ok) << good.message;

    std::vector<double> no_bias = p0;
    std::fill_n(no_bias.begin() + static_cast<std::ptrdiff_t>(l.b[1]), s.out(1), 0.0);
    const Check c1 = verify_outcome(s, l, st, outcome(no_bias));
    EXPECT_FALSE(c1.ok) << direction_name(d) << ": a missing bias passed";
    EXPECT_GT(c1.max_err, 5 * c1.tol) << direction_name(d) << ": a missing bias is near the bound: " << c1.message;

    // W3 [512, 10] read as if stored [10, 512]: element (i, o) from flat index o * 512 + i.
    std::vector<double> transposed = p0;
    for (std::int64_t i = 0; i < s.in(2); ++i)
      for (std::int64_t o = 0; o < s.out(2); ++o)
        transposed[l.w[2] + static_cast<std::size_t>(i * s.out(2) + o)] = p0[l.w[2] + static_cast<std::size_t>(o * s.in(2) + i)];
    const Check c2 = verify_outcome(s, l, st, outcome(transposed));
    EXPECT_FALSE(c2.ok) << direction_name(d) << ": a transposed weight passed";
    EXPECT_GT(c2.max_err, 5 * c2.tol) << direction_name(d) << ": a transposed weight is near the bound: " << c2.message;
  }
}

// Where a gradient's terms cancel, its rounding errors are relative to the terms, not to the sum:
// classifierdl's last bias (2 classes whose counts balance over the batch) is about 1e-3 of the
// terms' root-sum-square, so a run correct to a few bf16 roundings of the terms must pass; an
// error the size of the terms still fails.
TEST(ModelsVerify, CancellingGradientIsJudgedByItsTerms) {
  const Problem p = model_problem("classifierdl", Backend::cpu, Direction::train, 256, "threads", 8, DType::bf16);
  const Shape s = shape_of(p);
  const ParamLayout l = param_layout(s.widths);
  const State st = make_state(s, l, p.seed());
  std::vector<double> p0(l.total), x(st.x.count());
  for (std::size_t i = 0; i < p0.size(); ++i) p0[i] = st.params.get(i);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = st.x.get(i);
  const Reference r = reference(s.widths, l, p0, x, st.labels, s.batch, true);
  const std::size_t last = s.layers() - 1, b = l.b[last];
  const auto n = static_cast<std::size_t>(s.out(last));
  double sum_sq = 0, terms_sq = 0;
  for (std::size_t i = b; i < b + n; ++i) sum_sq += r.grad[i] * r.grad[i], terms_sq += r.grad_terms_sq[i];
  const double rms_ref = std::sqrt(sum_sq / n), rms_terms = std::sqrt(terms_sq / n);
  ASSERT_LT(rms_ref, 0.01 * rms_terms) << "the test needs a last bias whose terms cancel";
  auto outcome = [&](double db_error) {
    std::vector<double> g = r.grad;
    for (std::size_t i = b; i < b + n; ++i) g[i] += db_error;
    return train_outcome(r, g, p0);
  };
  constexpr double u = 1.0 / 512;
  const Check rounded = verify_outcome(s, l, st, outcome(8 * u * rms_terms));
  EXPECT_TRUE(rounded.ok) << rounded.message;
  const Check wrong = verify_outcome(s, l, st, outcome(rms_terms));
  EXPECT_FALSE(wrong.ok) << "an error the size of the terms passed";
  EXPECT_NE(wrong.message.find("db" + std::to_string(last + 1)), std::string::npos) << wrong.message;
}

// A bf16 run really rounds (its error is above f32's bound) yet passes bf16's; f32 keeps its bound.
TEST(ModelsCpu, Bf16RunsInBf16) {
  for (Direction d : {Direction::infer, Direction::train}) {
    auto c32 = make_cpu(model_problem("mlp_tiny", Backend::cpu, d, 10));
    auto c16 = make_cpu(bf16_problem("mlp_tiny", Backend::cpu, d, 10));
    const Check k32 = c32->verify(), k16 = c16->verify();
    EXPECT_TRUE(k32.ok) << k32.message;
    EXPECT_TRUE(k16.ok) << k16.message;
    EXPECT_LT(k32.max_err, tolerance(DType::f32));
    EXPECT_GT(k16.max_err, tolerance(DType::f32)) << "bf16 no less exact than f32: is it rounding?";
    EXPECT_NE(c16->label().find("bf16"), std::string::npos) << c16->label();
  }
}

TEST(ModelsCpu, ThreadsVariantRestoresTheThreadCount) {
  const int before = cpu::threads();
  auto c = make_cpu(model_problem("mlp_tiny", Backend::cpu, Direction::train, 5, "threads", 1));
  EXPECT_EQ(cpu::threads(), before);
  c->run();
  EXPECT_EQ(cpu::threads(), before);
  EXPECT_NE(c->label().find("1 threads"), std::string::npos) << c->label();
}

// Training on the learnable task from the seeded start: the loss must fall. A bf16 case this CPU
// cannot run (oneDNN without bf16 matmul) is left out with a note.
void expect_learns(Backend be, const std::string& model, int steps, DType t = DType::f32) {
  const Problem p = model_problem(model, be, Direction::train, 32, nullptr, 0, t);
  if (const std::string why = family().unsupported_reason(p); !why.empty()) {
    std::printf("[ note ] %s not trained here: %s\n", p.name().c_str(), why.c_str());
    return;
  }
  model_test::expect_loss_falls<ModelCase>(*family().make(p), steps, 0.7, p.name(), true);
}

TEST(ModelsTraining, LossFallsCpu) {
  for (DType t : {DType::f32, DType::bf16}) {
    expect_learns(Backend::cpu, "mlp_tiny", 150, t);
    expect_learns(Backend::cpu, "mlp_mnist", 30, t);
    expect_learns(Backend::cpu, "classifierdl", 30, t);
  }
}

TEST(ModelsTraining, LossFallsCuda) {
  HOTOPS_SKIP_WITHOUT_GPU();
  for (DType t : {DType::f32, DType::bf16}) {
    expect_learns(Backend::cuda, "mlp_tiny", 150, t);
    expect_learns(Backend::cuda, "mlp_mnist", 30, t);
    expect_learns(Backend::cuda, "classifierdl", 30, t);
  }
}

// ---- data-parallel train steps (gpus:G; data_parallel.h) ----

Problem data_parallel(const std::string& model, std::int64_t batch, int gpus, DType t = DType::f32) {
  return model_problem(model, Backend::cuda, Direction::train, batch, "gpus", gpus, t);
}

TEST(ModelsDataParallel, NamesAtTheSingleGpuTrainBatches) {
  std::vector<std::string> names;
  for (const Problem& p : family().benchmark_problems({})) names.push_back(p.name());
  for (const Model& m : models())
    for (std::int64_t b : m.batches)
      for (int g : {2, 4, 8})
        for (const char* t : {"f32", "bf16"}) {
          const std::string n = "model." + m.name + "/cuda/" + t + "/train/batch:" + std::to_string(b) + "/gpus:" + std::to_string(g);
          EXPECT_NE(std::find(names.begin(), names.end(), n), names.end()) << n;
        }
  EXPECT_EQ(std::count_if(names.begin(), names.end(), [](const std::string& n) { return n.find("/gpus:") != std::string::npos; }),
            (5 + 2 + 4) * 3 * 2);
  // --hotops_batch sets the per-GPU batch.
  for (const Problem& p : family().benchmark_problems({7}))
    if (p.has("gpus")) {
      EXPECT_EQ(p.get_int("batch"), 7) << p.name();
    }
  // gpus:G is a CUDA train step of its own: no CPU, no infer, no other variant with it.
  model_test::expect_gpus_only_on_cuda_train(shape_of, "mlp_tiny", 10, 4);
  Problem both = data_parallel("mlp_tiny", 10, 2);
  both.args.push_back({"e2e", "1"});
  EXPECT_THROW(shape_of(both), Error);
}

TEST(ModelsDataParallel, WorkAndSeedFollowTheGlobalBatch) {
  // G replicas do G times one GPU's work; samples/s counts every GPU's samples.
  const Problem dp = data_parallel("mlp_mnist", 128, 4);
  const Work one = family().work(model_problem("mlp_mnist", Backend::cuda, Direction::train, 128));
  const Work all = family().work(dp);
  EXPECT_DOUBLE_EQ(all.items, 4 * 128);
  EXPECT_DOUBLE_EQ(all.flops, 4 * one.flops);
  EXPECT_DOUBLE_EQ(all.bytes, 4 * one.bytes);
  // The global batch and the parameters are those of the single-GPU step at batch G x B.
  EXPECT_EQ(global_problem(dp).name(), "model.mlp_mnist/cuda/f32/train/batch:512");
  EXPECT_EQ(step_seed(dp), step_seed(model_problem("mlp_mnist", Backend::cuda, Direction::train, 512)));
  EXPECT_NE(step_seed(dp), step_seed(data_parallel("mlp_mnist", 128, 2)));
  EXPECT_EQ(step_seed(dp), step_seed(data_parallel("mlp_mnist", 256, 2)));
  // Without a run over as many GPUs (or a GPU, or NCCL), an entry says why.
  EXPECT_FALSE(family().unsupported_reason(data_parallel("mlp_tiny", 10, 8)).empty());
  std::string why;
  if (!gpu::available(&why)) {
    EXPECT_EQ(family().unsupported_reason(data_parallel("mlp_tiny", 10, 1)), why);
  }
  EXPECT_THROW(replica_of(data_parallel("mlp_tiny", 10, 3)), Error);  // 1/3 is not exact
}

TEST(ModelsDataParallel, ShardsAreTheGlobalBatchInRankOrder) {
  const Shape s = shape_of(model_problem("mlp_tiny", Backend::cpu, Direction::train, 12));
  const ParamLayout l = param_layout(s.widths);
  const State global = make_state(s, l, 42);
  const std::size_t in = static_cast<std::size_t>(s.widths[0]);
  std::vector<double> joined;
  std::vector<std::int32_t> labels;
  for (int r = 0; r < 4; ++r) {
    const HostBuffer x = shard(global.x, in, Replica{4, r}, 3);
    ASSERT_EQ(x.count(), 3 * in);
    for (std::size_t i = 0; i < x.count(); ++i) joined.push_back(x.get(i));
    const std::vector<std::int32_t> y = shard(global.labels, 1, Replica{4, r}, 3);
    labels.insert(labels.end(), y.begin(), y.end());
  }
  EXPECT_EQ(joined, as_doubles(global.x));
  EXPECT_EQ(labels, global.labels);
  EXPECT_THROW(shard(global.x, in, Replica{4, 3}, 4), Error);  // beyond the global batch
}

// The buckets of a step cover the flat gradients once, from the end towards the start, each at least
// the cap but the last; a step's ready points never go back.
std::vector<Bucket> buckets_of(BucketPlan& plan, const std::vector<std::size_t>& ready_points) {
  std::vector<Bucket> out;
  for (std::size_t from : ready_points)
    if (const auto b = plan.ready(from)) out.push_back(*b);
  if (const auto b = plan.finish()) out.push_back(*b);
  return out;
}

TEST(ModelsDataParallel, BucketsFollowTheBackward) {
  // mlp_mnist: layer k's tensors are final after its weight gradient, from the last layer down.
  const ParamLayout l = param_layout(model_named("mlp_mnist").widths);
  BucketPlan plan(l.total, kBucketFloats);
  const std::vector<Bucket> b = buckets_of(plan, {l.w[2], l.w[1], l.w[0]});
  ASSERT_EQ(b.size(), 2u);  // the last two layers (267k floats) reach the cap together; the first alone
  EXPECT_EQ(b[0].begin, l.w[1]);
  EXPECT_EQ(b[0].end, l.total);
  EXPECT_EQ(b[1].begin, 0u);
  EXPECT_EQ(b[1].end, l.w[1]);
  // The plan starts again for the next step, and gives the same buckets.
  const std::vector<Bucket> again = buckets_of(plan, {l.w[2], l.w[1], l.w[0]});
  ASSERT_EQ(again.size(), 2u);
  EXPECT_EQ(again[0].begin, l.w[1]);
  // mlp_tiny's 1010 parameters: one bucket. A step whose last ready point is not 0: finish() takes the rest.
  const ParamLayout tiny = param_layout(model_named("mlp_tiny").widths);
  BucketPlan small(tiny.total, kBucketFloats);
  const std::vector<Bucket> one = buckets_of(small, {tiny.w[2], tiny.w[1]});
  ASSERT_EQ(one.size(), 1u);
  EXPECT_EQ(one[0].begin, 0u);
  EXPECT_EQ(one[0].end, tiny.total);
  // Every cap: disjoint, in backward order, covering [0, total).
  for (std::size_t cap : {std::size_t(1), std::size_t(1000), std::size_t(300000), std::size_t(1) << 30}) {
    BucketPlan p(l.total, cap);
    std::size_t end = l.total;
    for (const Bucket& k : buckets_of(p, {l.w[2], l.w[1], l.w[0]})) {
      EXPECT_EQ(k.end, end) << cap;
      EXPECT_LT(k.begin, k.end) << cap;
      end = k.begin;
    }
    EXPECT_EQ(end, 0u) << cap;
  }
  BucketPlan back(l.total, 1);
  ASSERT_TRUE(back.ready(l.w[1]).has_value());
  EXPECT_THROW(back.ready(l.w[2]), Error);
}

// The encoder layers' buckets, at the ready points of their CUDA steps: bert (post-LN) the FFN and the
// second LayerNorm, then the attention output and the first LayerNorm, then the QKV projection; vit
// (pre-LN, its first LayerNorm's gradients last) the FFN and the second LayerNorm, then the rest.
// Each bucket's AdamW launch starts at its first float: every bound on a 16-byte boundary.
TEST(ModelsDataParallel, EncoderBucketsStartOnVectors) {
  const model_bert::ParamLayout bert = model_bert::param_layout(model_bert::arch_named("bert_layer"));
  BucketPlan post(bert.total, kBucketFloats);
  const std::vector<Bucket> b = buckets_of(post, {bert.w1, bert.wo});
  ASSERT_EQ(b.size(), 3u);
  EXPECT_EQ(b[0].begin, bert.w1);
  EXPECT_EQ(b[1].begin, bert.wo);
  EXPECT_EQ(b[2].begin, 0u);
  EXPECT_EQ(b[2].end, bert.wo);
  const model_bert::ParamLayout vit = model_bert::param_layout(model_bert::arch_named("vit_layer"));
  BucketPlan pre(vit.total, kBucketFloats);
  const std::vector<Bucket> v = buckets_of(pre, {vit.w1});
  ASSERT_EQ(v.size(), 2u);
  EXPECT_EQ(v[0].begin, vit.w1);
  EXPECT_EQ(v[0].end, vit.total);
  EXPECT_EQ(v[1].end, vit.w1);
  for (const auto& list : {b, v})
    for (const Bucket& k : list) {
      EXPECT_EQ(k.begin % 4, 0u);
      EXPECT_EQ(k.end % 4, 0u);
    }
}

// gpus:1: the data-parallel step's whole path (its communicator of one process, the bucketed
// all-reduce on the second stream, the replicas' check, the timer's CUDA graph of the step) on one
// GPU; it starts from the numbers of the single-GPU step at its global batch and learns as it does.
TEST(ModelsDataParallel, OneGpuRunsTheWholePathCuda) {
  const Problem p = data_parallel("mlp_mnist", 64, 1);
  const std::string why = family().unsupported_reason(p);
  if (!why.empty()) GTEST_SKIP() << why;
  for (DType t : {DType::f32, DType::bf16}) {
    Problem q = data_parallel("mlp_mnist", 64, 1, t);
    const auto dp = family().make(q);
    const Check c = dp->verify();
    EXPECT_TRUE(c.ok) << q.name() << ": " << c.message;
    EXPECT_NE(dp->label().find("data parallel over 1 GPU"), std::string::npos) << dp->label();
    EXPECT_NE(dp->label().find("in 2 buckets"), std::string::npos) << dp->label();
    EXPECT_TRUE(dp->capturable());
    const auto one = family().make(global_problem(q));
    ASSERT_TRUE(one->verify().ok);
    auto* a = dynamic_cast<ModelCase*>(dp.get());
    auto* b = dynamic_cast<ModelCase*>(one.get());
    ASSERT_TRUE(a && b);
    // The same loss up to the GEMMs' own choices (each plan autotunes: another algorithm sums in
    // another order; bf16 then rounds the logits apart by a unit or so).
    const double rel = t == DType::bf16 ? 1.0 / 128 : 1e-5;
    EXPECT_NEAR(a->last_loss(), b->last_loss(), rel * std::fabs(b->last_loss())) << q.name();
    // The timer captures the step (both streams, the all-reduce inside) in a CUDA graph.
    gpu::Timer timer(*dp, gpu::TimerOptions{});
    EXPECT_GT(timer.sample(), 0) << q.name();
    model_test::expect_loss_falls<ModelCase>(*dp, 30, 0.7, q.name());
  }
}

// Two or more GPUs need as many processes: bench --hotops_gpus=G runs them (BenchSmoke.CudaDataParallel*).
TEST(ModelsDataParallel, TwoGpusNeedARunOverTwoGpusCuda) {
  const std::string why = family().unsupported_reason(data_parallel("mlp_tiny", 10, 2));
  ASSERT_FALSE(why.empty());
  GTEST_SKIP() << why << " (bench --hotops_gpus=2 runs it: BenchSmoke.CudaDataParallelStepsOnTwoGpus)";
}

}  // namespace
// The bf16 train steps' copy of the master weights is written by AdamW, never cast in a step.
TEST(ModelsBf16Copy, KeptByAdamwCpu) {
  for (const char* m : {"mlp_tiny", "mlp_mnist"})
    model_test::expect_bf16_copy_kept(family(), model_test::model_problem(m, Backend::cpu, Direction::train, 10, nullptr, 0, DType::bf16), 4);
}
TEST(ModelsBf16Copy, CastOnceForInferCpu) {
  for (const char* m : {"mlp_tiny", "mlp_mnist", "classifierdl"})
    model_test::expect_bf16_copy_kept(family(), model_test::model_problem(m, Backend::cpu, Direction::infer, 10, nullptr, 0, DType::bf16), 3);
}
TEST(ModelsBf16Copy, CastOnceForInferCuda) {
  HOTOPS_SKIP_WITHOUT_GPU();
  for (const char* m : {"mlp_tiny", "classifierdl"})
    for (const char* variant : {"plain", "e2e"})  // graph:1 is a train variant
      model_test::expect_bf16_copy_kept(
          family(), model_test::model_problem(m, Backend::cuda, Direction::infer, 10, variant[0] == 'p' ? nullptr : variant, 1, DType::bf16), 3);
}
TEST(ModelsBf16Copy, KeptByAdamwCuda) {
  HOTOPS_SKIP_WITHOUT_GPU();
  for (const char* m : {"mlp_tiny", "mlp_mnist"}) {
    const Problem p = model_test::model_problem(m, Backend::cuda, Direction::train, 10, nullptr, 0, DType::bf16);
    model_test::expect_bf16_copy_kept(family(), p, 4);
    Problem graph = p;
    graph.args.push_back({"graph", "1"});
    model_test::expect_bf16_copy_kept(family(), graph, 4);
  }
}

}  // namespace hotops::models
