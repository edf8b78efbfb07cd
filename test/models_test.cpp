// The models family: the reference's gradients against finite differences, verification failing on
// planted errors, the names, the thread scope of threads:T, and every model learning its task.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "hotops/check.h"
#include "hotops/cpu.h"
#include "hotops/gpu.h"
#include "kernels/models/models.h"

namespace hotops::models {
namespace {

Problem problem(const std::string& model, Backend be, Direction d, std::int64_t batch, const char* key = nullptr,
                int value = 0) {
  Problem p{"model." + model, be, DType::f32, d, {{"batch", std::to_string(batch)}}};
  if (key) p.args.push_back({key, std::to_string(value)});
  return p;
}

TEST(ModelsLayout, ParameterCountsAndAlignment) {
  const ParamLayout tiny = param_layout(model_named("mlp_tiny").widths);
  EXPECT_EQ(tiny.parameters, 13 * 32 + 32 + 32 * 16 + 16 + 16 * 2 + 2);  // 1010, as seed 004's model
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
  // --hotops_batch replaces every model's batches.
  for (const Problem& p : family().benchmark_problems({7})) EXPECT_EQ(p.get_int("batch"), 7);
  EXPECT_THROW(shape_of(problem("mlp_tiny", Backend::cpu, Direction::train, 4, "e2e", 1)), Error);
  EXPECT_THROW(shape_of(problem("resnet", Backend::cpu, Direction::train, 4)), Error);
}

TEST(ModelsWork, FlopsBytesItems) {
  const Work infer = family().work(problem("mlp_tiny", Backend::cpu, Direction::infer, 10));
  EXPECT_DOUBLE_EQ(infer.flops, 2.0 * 10 * (13 * 32 + 32 * 16 + 16 * 2));
  EXPECT_DOUBLE_EQ(infer.bytes, 4.0 * (1010 + 10 * 13 + 10 * 2));
  EXPECT_DOUBLE_EQ(infer.items, 10);
  const Work train = family().work(problem("mlp_tiny", Backend::cuda, Direction::train, 10));
  EXPECT_DOUBLE_EQ(train.flops, 3 * infer.flops + 14.0 * 1010);
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
  const Shape s = shape_of(problem("mlp_tiny", Backend::cpu, Direction::train, 6));
  const ParamLayout l = param_layout(s.widths);
  const State st = make_state(s, l, 42);
  std::vector<double> p0(l.total), x(st.x.count());
  for (std::size_t i = 0; i < p0.size(); ++i) p0[i] = st.params.get(i);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = st.x.get(i);
  const Reference ref = reference(s.widths, l, p0, x, st.labels, s.batch, true);

  auto outcome = [&](std::int64_t step) {
    Outcome o;
    o.loss = static_cast<float>(ref.loss);
    o.grads = HostBuffer(DType::f32, l.total);
    o.params = HostBuffer(DType::f32, l.total);
    for (std::size_t i = 0; i < l.total; ++i) {
      o.grads.set(i, ref.grad[i]);
      adamw::Element e{p0[i], 0, 0};
      adamw::reference_step(hyper(), step, o.grads.get(i), e);
      o.params.set(i, e.p);
    }
    return o;
  };
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

  const Shape si = shape_of(problem("mlp_tiny", Backend::cpu, Direction::infer, 6));
  Outcome logits;
  logits.logits = HostBuffer(DType::f32, ref.logits.size());
  for (std::size_t i = 0; i < ref.logits.size(); ++i) logits.logits.set(i, ref.logits[i]);
  EXPECT_TRUE(verify_outcome(si, l, st, logits).ok);
  logits.logits.set(3, logits.logits.get(3) + 0.01);
  EXPECT_FALSE(verify_outcome(si, l, st, logits).ok);
}

TEST(ModelsCpu, ThreadsVariantRestoresTheThreadCount) {
  const int before = cpu::threads();
  auto c = make_cpu(problem("mlp_tiny", Backend::cpu, Direction::train, 5, "threads", 1));
  EXPECT_EQ(cpu::threads(), before);
  c->run();
  EXPECT_EQ(cpu::threads(), before);
  EXPECT_NE(c->label().find("1 threads"), std::string::npos) << c->label();
}

// Training on the learnable task from the seeded start: the loss must fall.
void expect_learns(Backend be, const std::string& model, int steps) {
  auto c = family().make(problem(model, be, Direction::train, 32));
  auto* m = dynamic_cast<ModelCase*>(c.get());
  ASSERT_NE(m, nullptr);
  ASSERT_TRUE(c->verify().ok);  // one step from the start
  const double first = m->last_loss();
  for (int i = 1; i < steps; ++i) c->run();
  const double last = m->last_loss();
  EXPECT_TRUE(std::isfinite(last));
  EXPECT_LT(last, 0.7 * first) << model << " on " << backend_name(be) << ": " << first << " -> " << last;
}

TEST(ModelsTraining, LossFallsCpu) {
  expect_learns(Backend::cpu, "mlp_tiny", 150);
  expect_learns(Backend::cpu, "mlp_mnist", 30);
  expect_learns(Backend::cpu, "classifierdl", 30);
}

TEST(ModelsTraining, LossFallsCuda) {
  std::string why;
  if (!gpu::available(&why)) GTEST_SKIP() << why;
  expect_learns(Backend::cuda, "mlp_tiny", 150);
  expect_learns(Backend::cuda, "mlp_mnist", 30);
  expect_learns(Backend::cuda, "classifierdl", 30);
}

}  // namespace
}  // namespace hotops::models
