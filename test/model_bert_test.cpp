// The model_bert family: the reference's gradients against finite differences on a tiny layer,
// verification failing on planted errors (f32 and bf16), names and work, and the layer learning its
// target in f32 and bf16.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>

#include "hotops/check.h"
#include "hotops/gpu.h"
#include "test/model_test_util.h"
#include "kernels/model_bert/model_bert.h"
#include "kernels/models/data_parallel.h"

namespace hotops::model_bert {
namespace {

Problem problem(const std::string& op, Backend be, Direction d, std::int64_t batch, DType t = DType::f32) {
  return Problem{"model." + op, be, t, d, {{"batch", std::to_string(batch)}}};
}

TEST(ModelBertLayout, ParameterCount) {
  EXPECT_EQ(param_layout(arch_named("bert_layer")).parameters, 7087872);  // BERT-base's per-layer count
  EXPECT_EQ(param_layout(arch_named("vit_layer")).parameters, 7087872);
}

TEST(ModelBertNames, NamesAndWork) {
  std::vector<std::string> names;
  for (const Problem& p : family().benchmark_problems({})) names.push_back(p.name());
  for (const char* n : {"model.bert_layer/cuda/f32/train/batch:32", "model.vit_layer/cuda/f32/infer/batch:8/e2e:1",
                        "model.bert_layer/cpu/f32/train/batch:8/threads:8", "model.bert_layer/cuda/bf16/train/batch:32",
                        "model.vit_layer/cuda/bf16/infer/batch:8/e2e:1", "model.bert_layer/cpu/bf16/train/batch:8/threads:8"})
    EXPECT_NE(std::find(names.begin(), names.end(), n), names.end()) << n;
  // Every problem in both dtypes: 2 layers x 2 batches x 2 directions x (cpu, threads:1, threads:8,
  // cuda, e2e:1) x 2 dtypes; and the data-parallel train steps: 2 layers x 2 per-GPU batches x
  // gpus:2, 4, 8 x 2 dtypes.
  EXPECT_EQ(names.size(), 2u * 2 * 2 * 5 * 2 + 2 * 2 * 3 * 2);
  for (const char* n : {"model.bert_layer/cuda/f32/train/batch:32/gpus:2", "model.bert_layer/cuda/bf16/train/batch:32/gpus:8",
                        "model.vit_layer/cuda/f32/train/batch:8/gpus:4"})
    EXPECT_NE(std::find(names.begin(), names.end(), n), names.end()) << n;
  const Work w = family().work(problem("bert_layer", Backend::cuda, Direction::train, 32));
  const double T = 32 * 128;
  const double fwd = 2 * T * (4.0 * 768 * 768 + 2.0 * 768 * 3072) + 4.0 * 32 * 12 * 128 * 128 * 64;
  EXPECT_DOUBLE_EQ(w.flops, 3 * fwd + 14.0 * 7087872);
  // bf16: the same FLOPs; x and the target move as bf16, the f32 masters and AdamW's state as before.
  const Work wb = family().work(problem("bert_layer", Backend::cuda, Direction::train, 32, DType::bf16));
  EXPECT_DOUBLE_EQ(wb.flops, w.flops);
  EXPECT_DOUBLE_EQ(w.bytes - wb.bytes, 2 * 2 * T * 768);
  EXPECT_THROW(shape_of(problem("bert_layer", Backend::cuda, Direction::train, 32, DType::f16)), Error);
}

TEST(ModelBertNames, CpuBf16SaysWhyWhereUnsupported) {
  const std::string why = cpu_bf16_reason();
  const Problem p = problem("bert_layer", Backend::cpu, Direction::train, 1, DType::bf16);
  EXPECT_EQ(family().unsupported_reason(p), why);
  if (!why.empty()) {
    EXPECT_NE(why.find("bf16"), std::string::npos) << why;
  }
  EXPECT_EQ(family().unsupported_reason(problem("bert_layer", Backend::cpu, Direction::train, 1)), "");
}

// Central differences of the reference's own loss on a tiny layer with every parameter random.
void check_fd(bool pre_ln) {
  const Arch a{"tiny", 3, 8, 2, 16, pre_ln, 1e-5, {}};
  const ParamLayout l = param_layout(a);
  const std::int64_t B = 2;
  std::mt19937_64 rng(pre_ln ? 11 : 7);
  std::uniform_real_distribution<double> u(-1, 1);
  std::vector<double> params(l.total, 0.0), x(static_cast<std::size_t>(B * a.seq * a.hidden)), t(x.size());
  for (const auto& [at, n] : l.tensors)
    for (std::size_t i = 0; i < n; ++i) params[at + i] = u(rng);
  for (double& v : x) v = u(rng);
  for (double& v : t) v = u(rng);
  const Reference ref = reference(a, l, params, x, t, B, true);
  const double h = 1e-6;
  for (std::size_t k = 0; k < l.tensors.size(); ++k) {
    const auto [at, n] = l.tensors[k];
    const auto [worst, biggest, checked] = model_test::finite_differences(
        params, ref.grad, [&](const std::vector<double>& p) { return reference(a, l, p, x, t, B, true).loss; }, h, at, at + n);
    EXPECT_LT(worst, 1e-7 + 1e-6 * biggest) << l.names[k] << (pre_ln ? " pre-LN" : " post-LN") << ", largest |fd| " << biggest;
    if (l.names[k] != "bqkv") {
      EXPECT_GT(biggest, 1e-4) << l.names[k];
    }
  }
}

TEST(ModelBertReference, GradientsMatchFiniteDifferencesPostLn) { check_fd(false); }
TEST(ModelBertReference, GradientsMatchFiniteDifferencesPreLn) { check_fd(true); }

// The CPU implementation passes verification; each planted error in its outcome fails.
TEST(ModelBertVerify, PlantedErrorsFail) {
  const Arch a = arch_named("bert_layer");
  const Shape s = shape_of(problem("bert_layer", Backend::cpu, Direction::train, 1));
  const ParamLayout l = param_layout(a);
  const State st = verification_state(s, make_state(s, l, 42));
  std::vector<double> p0(l.total), x(st.x.count()), t(st.target.count());
  for (std::size_t i = 0; i < p0.size(); ++i) p0[i] = st.params.get(i);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = st.x.get(i), t[i] = st.target.get(i);
  const Reference ref = reference(a, l, p0, x, t, 1, true);
  auto outcome = [&](std::int64_t step) {
    Outcome o;
    o.loss = static_cast<float>(ref.loss);
    model_test::correct_step(ref.grad, [&](std::size_t i) { return p0[i]; }, l.total, step, o.grads, o.params);
    return o;
  };
  EXPECT_TRUE(verify_outcome(s, l, st, outcome(1)).ok);
  Outcome wrong_loss = outcome(1);
  wrong_loss.loss *= 1.001f;
  EXPECT_FALSE(verify_outcome(s, l, st, wrong_loss).ok);
  Outcome wrong_grad = outcome(1);
  wrong_grad.grads.set(l.ln1g + 5, wrong_grad.grads.get(l.ln1g + 5) * 1.5 + 1e-3);
  EXPECT_FALSE(verify_outcome(s, l, st, wrong_grad).ok);
  EXPECT_FALSE(verify_outcome(s, l, st, outcome(2)).ok);
  const Shape si = shape_of(problem("bert_layer", Backend::cpu, Direction::infer, 1));
  model_test::expect_output_checked(ref.y, &Outcome::y, 77, [&](const Outcome& o) { return verify_outcome(si, l, st, o); });
}

// One step's outcome as the double reference computes it from `params` (the start's, possibly with a
// planted slip) with `rounding`: Rounding::bf16 models a correct bf16 implementation's rounding.
Outcome outcome_of(const Shape& s, const ParamLayout& l, const State& st, std::vector<double> params, Rounding rounding) {
  std::vector<double> x(st.x.count()), t(st.target.count());
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = st.x.get(i), t[i] = st.target.get(i);
  const Reference ref = reference(s.arch, l, params, x, t, s.batch, s.train(), rounding);
  return model_test::regression_outcome(ref, s.train(), s.dtype, st.params, l.total);
}

// The bf16 bounds pass a correct bf16 step (the reference with bf16 rounding), which the f32 bounds
// reject, and fail steps with a slip that a bf16 implementation could make: a missing bias, a
// transposed weight. Both layers, both directions, batch 1.
void check_bf16_bounds(const std::string& op, Direction d) {
  const Shape s = shape_of(problem(op, Backend::cuda, d, 1, DType::bf16));
  const ParamLayout l = param_layout(s.arch);
  const State st = verification_state(s, make_state(s, l, 42));
  std::vector<double> p0(l.total);
  for (std::size_t i = 0; i < l.total; ++i) p0[i] = st.params.get(i);
  // The double reference of a whole layer is most of this test's time: the correct step's is computed once.
  const Outcome correct = outcome_of(s, l, st, p0, Rounding::bf16);
  const Check good = verify_outcome(s, l, st, correct);
  EXPECT_TRUE(good.ok) << op << ": " << good.message;
  std::printf("%s %s bf16-rounded reference: worst error %.3g of its bound %.3g\n", op.c_str(),
              d == Direction::train ? "train" : "infer", good.max_err, good.tol);
  Shape f32 = s;
  f32.dtype = DType::f32;
  EXPECT_FALSE(verify_outcome(f32, l, st, correct).ok) << op << ": the f32 bounds pass bf16";
  const std::int64_t H = s.arch.hidden;
  std::vector<double> no_bias = p0, transposed = p0;
  for (std::int64_t i = 0; i < H; ++i) no_bias[l.bo + static_cast<std::size_t>(i)] = 0;
  for (std::int64_t i = 0; i < H; ++i)
    for (std::int64_t j = 0; j < H; ++j)
      transposed[l.wo + static_cast<std::size_t>(i * H + j)] = p0[l.wo + static_cast<std::size_t>(j * H + i)];
  const Check slip1 = verify_outcome(s, l, st, outcome_of(s, l, st, no_bias, Rounding::bf16));
  EXPECT_FALSE(slip1.ok) << op << ": a missing attention output bias passes";
  std::printf("  missing bo: %.3g (%s)\n", slip1.max_err, slip1.message.c_str());
  const Check slip2 = verify_outcome(s, l, st, outcome_of(s, l, st, transposed, Rounding::bf16));
  EXPECT_FALSE(slip2.ok) << op << ": a transposed Wo passes";
  std::printf("  transposed Wo: %.3g (%s)\n", slip2.max_err, slip2.message.c_str());
}

// Every way of running one step starts from the same numbers (step_seed: the name less its
// variant) and shares one reference: verifying the plain step and its threads:1 twin computes it
// once; another start (another batch) computes its own.
TEST(ModelBertVerify, VariantsOfAStepShareOneReference) {
  const Problem plain = problem("bert_layer", Backend::cpu, Direction::infer, 1);
  Problem one_thread = plain;
  one_thread.args.push_back({"threads", "1"});
  EXPECT_EQ(models::step_seed(plain), models::step_seed(one_thread));
  Problem cuda = plain;
  cuda.backend = Backend::cuda;
  EXPECT_EQ(models::step_seed(plain), models::step_seed(cuda));
  const std::size_t before = models::shared_reference_computations();
  EXPECT_TRUE(family().make(plain)->verify().ok);
  EXPECT_EQ(models::shared_reference_computations(), before + 1);
  EXPECT_TRUE(family().make(one_thread)->verify().ok);
  EXPECT_EQ(models::shared_reference_computations(), before + 1) << "the threads:1 step computed the reference again";
  EXPECT_TRUE(family().make(problem("bert_layer", Backend::cpu, Direction::infer, 2))->verify().ok);
  EXPECT_EQ(models::shared_reference_computations(), before + 2);
}

TEST(ModelBertVerify, Bf16BoundsBertTrain) { check_bf16_bounds("bert_layer", Direction::train); }
TEST(ModelBertVerify, Bf16BoundsBertInfer) { check_bf16_bounds("bert_layer", Direction::infer); }
TEST(ModelBertVerify, Bf16BoundsVitTrain) { check_bf16_bounds("vit_layer", Direction::train); }
TEST(ModelBertVerify, Bf16BoundsVitInfer) { check_bf16_bounds("vit_layer", Direction::infer); }

void expect_learns(Backend be, const std::string& op, int steps, DType t = DType::f32) {
  const Problem p = problem(op, be, Direction::train, 1, t);
  model_test::expect_loss_falls<LayerCase>(*family().make(p), steps, 0.8, p.name());
}

// 12 steps on the CPU: the loss falls to about 0.2 (bert) and 0.04 (vit) of its start, 0.8 the bar.
TEST(ModelBertTraining, LossFallsCpu) {
  expect_learns(Backend::cpu, "bert_layer", 12);
  expect_learns(Backend::cpu, "vit_layer", 12);
}

TEST(ModelBertTraining, LossFallsCuda) {
  HOTOPS_SKIP_WITHOUT_GPU();
  expect_learns(Backend::cuda, "bert_layer", 30);
  expect_learns(Backend::cuda, "vit_layer", 30);
}

TEST(ModelBertTraining, LossFallsCpuBf16) {
  const std::string why = cpu_bf16_reason();
  if (!why.empty()) GTEST_SKIP() << why;
  expect_learns(Backend::cpu, "bert_layer", 12, DType::bf16);
  expect_learns(Backend::cpu, "vit_layer", 12, DType::bf16);
}

TEST(ModelBertTraining, LossFallsCudaBf16) {
  HOTOPS_SKIP_WITHOUT_GPU();
  expect_learns(Backend::cuda, "bert_layer", 30, DType::bf16);
  expect_learns(Backend::cuda, "vit_layer", 30, DType::bf16);
}

// gpus:1 (a communicator of this process alone): the data-parallel step verified against the
// reference at its global batch, its gradients in backward-order buckets: four for the post-LN
// layer (the second FFN layer and LN2, the first FFN layer, the attention output and LN1, the QKV),
// two for the pre-LN layer (the FFN
// and LN2, then the rest: LN1's gradients come last); the work counts the global batch. Every bucket
// but the last is updated during the backward, once the backward no longer reads its parameters.
TEST(ModelBertDataParallel, OneGpuBucketsAndVerifiesCuda) {
  model_test::expect_one_gpu_data_parallel(family(), problem("bert_layer", Backend::cuda, Direction::train, 2, DType::bf16),
                                           "in 4 buckets", "(3 of them during the backward");
  model_test::expect_one_gpu_data_parallel(family(), problem("vit_layer", Backend::cuda, Direction::train, 2), "in 2 buckets",
                                           "(1 of them during the backward");
}

}  // namespace
// The bf16 train steps' copy of the master weights is written by AdamW, never cast in a step.
TEST(ModelBertBf16Copy, KeptByAdamwCpu) {
  for (const char* m : {"bert_layer", "vit_layer"})
    model_test::expect_bf16_copy_kept(family(), problem(m, Backend::cpu, Direction::train, 1, DType::bf16), 2);
}
TEST(ModelBertBf16Copy, CastOnceForInfer) {
  for (const char* m : {"bert_layer", "vit_layer"}) {
    model_test::expect_bf16_copy_kept(family(), problem(m, Backend::cpu, Direction::infer, 1, DType::bf16), 2);
    if (gpu::available()) model_test::expect_bf16_copy_kept(family(), problem(m, Backend::cuda, Direction::infer, 2, DType::bf16), 3);
  }
}
TEST(ModelBertBf16Copy, KeptByAdamwCuda) {
  HOTOPS_SKIP_WITHOUT_GPU();
  for (const char* m : {"bert_layer", "vit_layer"}) {
    const Problem p = problem(m, Backend::cuda, Direction::train, 2, DType::bf16);
    model_test::expect_bf16_copy_kept(family(), p, 3);
    Problem one_gpu = p;  // the data-parallel step's per-bucket AdamW launches
    one_gpu.args.push_back({"gpus", "1"});
    if (family().unsupported_reason(one_gpu).empty()) model_test::expect_bf16_copy_kept(family(), one_gpu, 3);
  }
}

}  // namespace hotops::model_bert
