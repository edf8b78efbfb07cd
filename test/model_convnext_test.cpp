// The model_convnext family: the reference's gradients against finite differences on a tiny block,
// verification failing on planted errors (f32 and bf16), names and work, the shared reference, and the
// block learning its target on the CPU and on CUDA, in f32 and bf16.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>

#include "hotops/check.h"
#include "hotops/gpu.h"
#include "kernels/model_convnext/model_convnext.h"
#include "kernels/models/data_parallel.h"
#include "test/model_test_util.h"

namespace hotops::model_convnext {
namespace {

Problem problem(const std::string& shape, Backend be, Direction d, std::int64_t batch, DType t = DType::f32) {
  return Problem{"model.convnext_block", be, t, d, {{"shape", shape}, {"batch", std::to_string(batch)}}};
}

TEST(ModelConvnextLayout, ParameterCount) {
  // PyTorch's ConvNeXt Block(dim): dwconv C*49 + C, norm 2C, pwconv1 C*4C + 4C, pwconv2 4C*C + C, gamma C.
  EXPECT_EQ(param_layout(arch_named("convnext.s1")).parameters, 79296);
  EXPECT_EQ(param_layout(arch_named("convnext.s3")).parameters, 1201920);
}

TEST(ModelConvnextNames, NamesAndWork) {
  std::vector<std::string> names;
  for (const Problem& p : family().benchmark_problems({})) names.push_back(p.name());
  for (const char* n : {"model.convnext_block/cpu/f32/train/shape:convnext.s1/batch:8",
                        "model.convnext_block/cuda/bf16/infer/shape:convnext.s3/batch:32/e2e:1",
                        "model.convnext_block/cpu/bf16/train/shape:convnext.s3/batch:8/threads:8",
                        "model.convnext_block/cuda/f32/train/shape:convnext.s1/batch:32"})
    EXPECT_NE(std::find(names.begin(), names.end(), n), names.end()) << n;
  // 2 stages x 2 batches x 2 directions x (cpu, threads:1, threads:8, cuda, e2e:1) x 2 dtypes, and
  // the data-parallel train steps: 2 stages x 2 per-GPU batches x gpus:2, 4, 8 x 2 dtypes; the tests'
  // tiny block is not benchmarked.
  EXPECT_EQ(names.size(), 2u * 2 * 2 * 5 * 2 + 2 * 2 * 3 * 2);
  EXPECT_NE(std::find(names.begin(), names.end(), "model.convnext_block/cuda/bf16/train/shape:convnext.s3/batch:32/gpus:8"),
            names.end());
  for (const std::string& n : names) EXPECT_EQ(n.find("convnext.test"), std::string::npos) << n;
  const Work w = family().work(problem("convnext.s1", Backend::cuda, Direction::train, 32));
  const double R = 32.0 * 56 * 56, C = 96;
  const double fwd = 2 * R * (2 * C * 4 * C) + 2 * R * C * 49;
  EXPECT_DOUBLE_EQ(w.flops, 3 * fwd + 14.0 * 79296);
  const Work wb = family().work(problem("convnext.s1", Backend::cuda, Direction::train, 32, DType::bf16));
  EXPECT_DOUBLE_EQ(wb.flops, w.flops);
  EXPECT_DOUBLE_EQ(w.bytes - wb.bytes, 2 * 2 * R * C);  // x and the target in 2 bytes fewer each
  EXPECT_THROW(shape_of(problem("convnext.s1", Backend::cuda, Direction::train, 32, DType::f16)), Error);
  EXPECT_THROW(shape_of(problem("convnext.s2", Backend::cpu, Direction::train, 8)), Error);
  EXPECT_THROW(shape_of(Problem{"model.bert_layer", Backend::cpu, DType::f32, Direction::infer,
                                {{"shape", "convnext.s1"}, {"batch", "1"}}}),
               Error);
}

// The op families' shapes of a stage-1 step: the depthwise convolution as conv2d's named
// convnext.s1_dwconv (groups = channels, NHWC), the LayerNorm as layernorm's convnext.s1 (eps 1e-6).
TEST(ModelConvnextNames, PartsAreTheOpFamiliesShapes) {
  const Shape s = shape_of(problem("convnext.s1", Backend::cpu, Direction::train, 8));
  const conv2d::Shape c = dwconv(s, Direction::fwd);
  EXPECT_EQ(c.groups, 96);
  EXPECT_EQ(c.layout, conv2d::Layout::nhwc);
  EXPECT_EQ(c.P(), 56);
  EXPECT_TRUE(c.bias);
  EXPECT_FALSE(dwconv(s, Direction::bwd_weight).bias);  // its gradient comes from the LayerNorm backward
  EXPECT_EQ(channel_layernorm(s).rows(), 8 * 56 * 56);
  EXPECT_EQ(channel_layernorm(s).eps, 1e-6);
  EXPECT_EQ(linear(s, 96, 384).M, 8 * 56 * 56);
  EXPECT_EQ(layer_scale(s, Direction::bwd).cols, 96);
}

// Central differences of the reference's own loss on the tiny block with every parameter random.
TEST(ModelConvnextReference, GradientsMatchFiniteDifferences) {
  const Arch a = arch_named("convnext.test");
  const ParamLayout l = param_layout(a);
  const std::int64_t B = 2;
  std::mt19937_64 rng(5);
  std::uniform_real_distribution<double> u(-1, 1);
  std::vector<double> params(l.total, 0.0), x(static_cast<std::size_t>(B * a.positions() * a.C)), t(x.size());
  for (const auto& [at, n] : l.tensors)
    for (std::size_t i = 0; i < n; ++i) params[at + i] = u(rng);
  for (double& v : x) v = u(rng);
  for (double& v : t) v = u(rng);
  const Reference ref = reference(a, l, params, x, t, B, true);
  const double h = 1e-6;
  for (std::size_t k = 0; k < l.tensors.size(); ++k) {
    const auto [at, n] = l.tensors[k];
    const auto [worst, biggest, checked] = model_test::finite_differences(
        params, ref.grad, [&](const std::vector<double>& p) { return reference(a, l, p, x, t, B, true).loss; }, h, at, at + n,
        std::max<std::size_t>(1, n / 97));
    EXPECT_LT(worst, 1e-7 + 1e-6 * biggest) << l.names[k] << ", largest |fd| " << biggest;
    EXPECT_GT(biggest, 1e-4) << l.names[k];
  }
}

// One step's outcome as the double reference computes it from `params` (the start's, possibly with a
// planted slip) with `rounding`: Rounding::bf16 models a correct bf16 implementation's rounding.
Outcome outcome_of(const Shape& s, const ParamLayout& l, const State& st, const std::vector<double>& params, Rounding rounding) {
  const std::vector<double> x = models::as_doubles(st.x), t = models::as_doubles(st.target);
  const Reference ref = reference(s.arch, l, params, x, t, s.batch, s.train(), rounding);
  return model_test::regression_outcome(ref, s.train(), s.dtype, st.params, l.total);
}

// The reference's own outcome passes verification; each planted error in it fails.
TEST(ModelConvnextVerify, PlantedErrorsFail) {
  for (const char* shape : {"convnext.test"}) {
    const Shape s = shape_of(problem(shape, Backend::cpu, Direction::train, 3));
    const ParamLayout l = param_layout(s.arch);
    const State st = verification_state(s, make_state(s, l, 42));
    const std::vector<double> p0 = models::as_doubles(st.params);
    const Outcome good = outcome_of(s, l, st, p0, Rounding::none);
    const Check ok = verify_outcome(s, l, st, good);
    EXPECT_TRUE(ok.ok) << shape << ": " << ok.message;
    Outcome wrong_loss = good;
    wrong_loss.loss *= 1.001f;
    EXPECT_FALSE(verify_outcome(s, l, st, wrong_loss).ok) << shape;
    for (std::size_t at : {l.dw_w + 7, l.dw_b + 1, l.ls + 2, l.w2 + 5}) {
      Outcome wrong_grad = good;
      wrong_grad.grads.set(at, wrong_grad.grads.get(at) * 1.5 + 1e-3);
      EXPECT_FALSE(verify_outcome(s, l, st, wrong_grad).ok) << shape << " gradient at " << at;
    }
    Outcome second_step = good;
    model_test::correct_step(models::as_doubles(good.grads), [&](std::size_t i) { return p0[i]; }, l.total, 2,
                             second_step.grads, second_step.params);
    EXPECT_FALSE(verify_outcome(s, l, st, second_step).ok) << shape << " step 2";
    const Shape si = shape_of(problem(shape, Backend::cpu, Direction::infer, 3));
    Outcome y = outcome_of(si, l, st, p0, Rounding::none);
    EXPECT_TRUE(verify_outcome(si, l, st, y).ok) << shape;
    y.y.set(77, y.y.get(77) + 0.01);
    EXPECT_FALSE(verify_outcome(si, l, st, y).ok) << shape;
  }
}

// The bf16 bounds pass a correct bf16 step (the reference with bf16 rounding), which the f32 bounds
// reject, and fail steps with a slip that a bf16 implementation could make: the convolution's bias left
// out, its filter's taps transposed. Both stages, both directions, batch 1.
void check_bf16_bounds(const std::string& shape, Direction d) {
  const Shape s = shape_of(problem(shape, Backend::cuda, d, 1, DType::bf16));
  const ParamLayout l = param_layout(s.arch);
  const State st = verification_state(s, make_state(s, l, 42));
  const std::vector<double> p0 = models::as_doubles(st.params);
  const Outcome correct = outcome_of(s, l, st, p0, Rounding::bf16);
  const Check good = verify_outcome(s, l, st, correct);
  EXPECT_TRUE(good.ok) << shape << ": " << good.message;
  std::printf("%s %s bf16-rounded reference: worst error %.3g of its bound %.3g\n", shape.c_str(),
              d == Direction::train ? "train" : "infer", good.max_err, good.tol);
  Shape f32 = s;
  f32.dtype = DType::f32;
  EXPECT_FALSE(verify_outcome(f32, l, st, correct).ok) << shape << ": the f32 bounds pass bf16";
  std::vector<double> no_bias = p0, transposed = p0;
  const std::size_t C = static_cast<std::size_t>(s.arch.C), K = kKernel;
  for (std::size_t c = 0; c < C; ++c) {
    no_bias[l.dw_b + c] = 0;
    for (std::size_t r = 0; r < K; ++r)
      for (std::size_t t = 0; t < K; ++t) transposed[l.dw_w + (c * K + r) * K + t] = p0[l.dw_w + (c * K + t) * K + r];
  }
  const Check slip1 = verify_outcome(s, l, st, outcome_of(s, l, st, no_bias, Rounding::bf16));
  EXPECT_FALSE(slip1.ok) << shape << ": a missing convolution bias passes";
  std::printf("  missing dwconv.bias: %.3g (%s)\n", slip1.max_err, slip1.message.c_str());
  const Check slip2 = verify_outcome(s, l, st, outcome_of(s, l, st, transposed, Rounding::bf16));
  EXPECT_FALSE(slip2.ok) << shape << ": a transposed filter passes";
  std::printf("  transposed dwconv.weight: %.3g (%s)\n", slip2.max_err, slip2.message.c_str());
}

TEST(ModelConvnextVerify, Bf16BoundsS1Train) { check_bf16_bounds("convnext.s1", Direction::train); }
TEST(ModelConvnextVerify, Bf16BoundsS1Infer) { check_bf16_bounds("convnext.s1", Direction::infer); }
TEST(ModelConvnextVerify, Bf16BoundsS3Train) { check_bf16_bounds("convnext.s3", Direction::train); }
TEST(ModelConvnextVerify, Bf16BoundsS3Infer) { check_bf16_bounds("convnext.s3", Direction::infer); }

// Every way of running one step starts from the same numbers and shares one reference.
TEST(ModelConvnextVerify, VariantsOfAStepShareOneReference) {
  const Problem plain = problem("convnext.test", Backend::cpu, Direction::train, 3);
  Problem one_thread = plain;
  one_thread.args.push_back({"threads", "1"});
  EXPECT_EQ(models::step_seed(plain), models::step_seed(one_thread));
  const std::size_t before = models::shared_reference_computations();
  const Check first = family().make(plain)->verify();
  EXPECT_TRUE(first.ok) << first.message;
  EXPECT_EQ(models::shared_reference_computations(), before + 1);
  EXPECT_TRUE(family().make(one_thread)->verify().ok);
  EXPECT_EQ(models::shared_reference_computations(), before + 1) << "the threads:1 step computed the reference again";
}

void expect_learns(Backend be, const std::string& shape, int steps, DType t = DType::f32) {
  const Problem p = problem(shape, be, Direction::train, 2, t);
  model_test::expect_loss_falls<BlockCase>(*family().make(p), steps, 0.8, p.name());
}

// Stage 3 (the tiny block, with few parameters, learns a random target too slowly at AdamW's lr 1e-3).
TEST(ModelConvnextTraining, LossFallsCpu) { expect_learns(Backend::cpu, "convnext.s3", 12); }

TEST(ModelConvnextTraining, LossFallsCpuBf16) {
  const std::string why = cpu_bf16_reason();
  if (!why.empty()) GTEST_SKIP() << why;
  expect_learns(Backend::cpu, "convnext.s3", 12, DType::bf16);
}

TEST(ModelConvnextTraining, LossFallsCuda) {
  HOTOPS_SKIP_WITHOUT_GPU();
  expect_learns(Backend::cuda, "convnext.s3", 12);
}

TEST(ModelConvnextTraining, LossFallsCudaBf16) {
  HOTOPS_SKIP_WITHOUT_GPU();
  expect_learns(Backend::cuda, "convnext.s3", 12, DType::bf16);
}

// gpus:1 (a communicator of this process alone): the data-parallel step verified against the
// reference at its global batch; stage 3's gradients in two buckets (the Linear layers and the layer
// scale, then the LayerNorm and the depthwise convolution), the tests' tiny block's in one.
TEST(ModelConvnextDataParallel, OneGpuBucketsAndVerifiesCuda) {
  model_test::expect_one_gpu_data_parallel(family(), problem("convnext.s3", Backend::cuda, Direction::train, 1), "in 2 buckets");
  model_test::expect_one_gpu_data_parallel(family(), problem("convnext.test", Backend::cuda, Direction::train, 3, DType::bf16),
                                           "in 1 bucket ");
}

}  // namespace
// The bf16 train steps' copy of the master weights is written by AdamW, never cast in a step.
TEST(ModelConvnextBf16Copy, KeptByAdamwCpu) {
  model_test::expect_bf16_copy_kept(family(), problem("convnext.s1", Backend::cpu, Direction::train, 2, DType::bf16), 3);
}
TEST(ModelConvnextBf16Copy, CastOnceForInfer) {
  model_test::expect_bf16_copy_kept(family(), problem("convnext.s1", Backend::cpu, Direction::infer, 2, DType::bf16), 3);
  if (gpu::available()) model_test::expect_bf16_copy_kept(family(), problem("convnext.s1", Backend::cuda, Direction::infer, 2, DType::bf16), 3);
}
TEST(ModelConvnextBf16Copy, KeptByAdamwCuda) {
  HOTOPS_SKIP_WITHOUT_GPU();
  const Problem p = problem("convnext.s1", Backend::cuda, Direction::train, 2, DType::bf16);
  model_test::expect_bf16_copy_kept(family(), p, 3);
  Problem one_gpu = p;  // the data-parallel step's per-bucket AdamW launches
  one_gpu.args.push_back({"gpus", "1"});
  if (family().unsupported_reason(one_gpu).empty()) model_test::expect_bf16_copy_kept(family(), one_gpu, 3);
}

}  // namespace hotops::model_convnext
