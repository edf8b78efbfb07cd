// What the model families' tests share: a model problem by name, a training run whose loss must fall,
// and the data-parallel step on one GPU.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "hotops/buffer.h"
#include "hotops/gpu.h"
#include "hotops/op.h"
#include "hotops/trace.h"
#include "kernels/adamw/adamw.h"
#include "kernels/models/models.h"
#include "kernels/models/regression.h"

// Skips the test, with the reason, where no GPU can run it.
#define HOTOPS_SKIP_WITHOUT_GPU()                                                \
  do {                                                                           \
    std::string hotops_why_;                                                     \
    if (!::hotops::gpu::available(&hotops_why_)) GTEST_SKIP() << hotops_why_;    \
  } while (0)

namespace hotops::model_test {

// model.<name>/<backend>/<dtype>/<direction>/batch:B, and /key:value when a key is given.
inline Problem model_problem(const std::string& name, Backend be, Direction d, std::int64_t batch, const char* key = nullptr,
                             int value = 0, DType t = DType::f32) {
  Problem p{"model." + name, be, t, d, {{"batch", std::to_string(batch)}}};
  if (key) p.args.push_back({key, std::to_string(value)});
  return p;
}

// The names of the data-parallel problems (a gpus arg) among `problems`, in their order.
inline std::vector<std::string> data_parallel_names(const std::vector<Problem>& problems) {
  std::vector<std::string> names;
  for (const Problem& p : problems)
    if (p.has("gpus")) names.push_back(p.name());
  return names;
}

// The data-parallel problems among `f`'s benchmark problems are those of `models` (each a model's
// name and the batches of its single-GPU train steps) at each batch (per GPU), G = 2, 4 and 8, in
// f32 and bf16, and no others.
inline void expect_data_parallel_names(const Family& f, const std::vector<std::pair<std::string, std::vector<std::int64_t>>>& models) {
  const std::vector<std::string> names = data_parallel_names(f.benchmark_problems({}));
  std::size_t expected = 0;
  for (const auto& [model, batches] : models)
    for (std::int64_t b : batches)
      for (int g : {2, 4, 8})
        for (const char* t : {"f32", "bf16"}) {
          const std::string n = "model." + model + "/cuda/" + t + "/train/batch:" + std::to_string(b) + "/gpus:" + std::to_string(g);
          EXPECT_NE(std::find(names.begin(), names.end(), n), names.end()) << n;
          ++expected;
        }
  EXPECT_EQ(names.size(), expected);
}

// gpus:G is a CUDA train step of its own: `model`'s CUDA train step at `batch` over `gpus` GPUs has
// that many replicas and `batch` samples on each (`shape_of`: the family's), and a CPU step or an
// infer step with a gpus arg is an error.
template <class ShapeOf>
void expect_gpus_only_on_cuda_train(ShapeOf shape_of, const std::string& model, std::int64_t batch, int gpus) {
  const auto dp = shape_of(model_problem(model, Backend::cuda, Direction::train, batch, "gpus", gpus));
  EXPECT_EQ(dp.gpus, gpus) << model;
  EXPECT_EQ(dp.batch, batch) << model;
  EXPECT_THROW(shape_of(model_problem(model, Backend::cpu, Direction::train, batch, "gpus", 2)), Error) << model;
  EXPECT_THROW(shape_of(model_problem(model, Backend::cuda, Direction::infer, batch, "gpus", 2)), Error) << model;
}

// The data-parallel step over `gpus` GPUs of the single-GPU train problem `p` (its batch B per GPU)
// does `gpus` times `p`'s work and starts from `p`'s seeded start at batch gpus x B (the global batch
// and the parameters).
inline void expect_data_parallel_work_and_seed(const Family& f, const Problem& p, int gpus) {
  Problem dp = p, global = p;
  dp.args.push_back({"gpus", std::to_string(gpus)});
  for (Arg& a : global.args)
    if (a.key == "batch") a.value = std::to_string(gpus * p.get_int("batch"));
  const Work one = f.work(p), all = f.work(dp);
  EXPECT_DOUBLE_EQ(all.items, gpus * one.items) << dp.name();
  EXPECT_DOUBLE_EQ(all.flops, gpus * one.flops) << dp.name();
  EXPECT_DOUBLE_EQ(all.bytes, gpus * one.bytes) << dp.name();
  EXPECT_EQ(models::step_seed(dp), models::step_seed(global)) << dp.name();
}

// The data-parallel step of `p` (a train problem) on a communicator of this process alone (gpus:1):
// its work counts `p`'s batch, it passes verification (the reference at its global batch) and its
// label names its gradient buckets (`buckets`, e.g. "in 4 buckets") and the per-bucket AdamW, and its
// per-op breakdown has the all-reduce's wait and the AdamW parts. Skipped with the reason where this
// machine cannot run it.
inline void expect_one_gpu_data_parallel(const Family& f, Problem p, const std::string& buckets, const std::string& early = "") {
  p.args.push_back({"gpus", "1"});
  EXPECT_DOUBLE_EQ(f.work(p).items, static_cast<double>(p.get_int("batch"))) << p.name();
  const std::string why = f.unsupported_reason(p);
  if (!why.empty()) GTEST_SKIP() << why;
  const auto c = f.make(p);
  const Check chk = c->verify();
  EXPECT_TRUE(chk.ok) << p.name() << ": " << chk.message;
  EXPECT_NE(c->label().find(buckets), std::string::npos) << c->label();
  EXPECT_NE(c->label().find("AdamW a launch per bucket after its all-reduce"), std::string::npos) << c->label();
  if (!early.empty()) {
    EXPECT_NE(c->label().find(early), std::string::npos) << c->label();
  }
  const char* wire = p.dtype == DType::bf16 ? "all-reduce (avg) of the gradients in bf16" : "all-reduce (avg) of the f32 gradients";
  EXPECT_NE(c->label().find(wire), std::string::npos) << c->label();
  const trace::Breakdown b = gpu::measure_breakdown(*c, 0, 2);
  for (const char* op : {"allreduce", "adamw"})
    EXPECT_TRUE(std::any_of(b.parts.begin(), b.parts.end(), [&](const trace::Part& part) { return part.op == op; }))
        << p.name() << ": no " << op << " part in the breakdown";
}

// A bf16 step `p` keeps the bf16 copy of its f32 master that its GEMMs read with no cast of its
// own: from the seeded start, after the verified step and `steps` more, the copy is the master
// rounded to bf16 element for element (train: the AdamW step writes it; infer: cast once at the
// start, as autocast's weight cache holds it), and no "cast" op is in the step's per-op breakdown.
// Skipped with the reason where this machine cannot run the problem.
inline void expect_bf16_copy_kept(const Family& f, const Problem& p, int steps) {
  if (const std::string why = f.unsupported_reason(p); !why.empty()) GTEST_SKIP() << why;
  const auto c = f.make(p);
  auto* m = dynamic_cast<models::ModelCase*>(c.get());
  ASSERT_NE(m, nullptr) << p.name();
  const Check first = c->verify();
  ASSERT_TRUE(first.ok) << p.name() << ": " << first.message;
  const Check after_first = m->bf16_copy_check();
  EXPECT_TRUE(after_first.ok) << p.name() << " after the verified step: " << after_first.message;
  EXPECT_GT(after_first.checked, 0u) << p.name() << ": no bf16 copy checked";
  for (int i = 0; i < steps; ++i) c->run();
  const Check after = m->bf16_copy_check();
  EXPECT_TRUE(after.ok) << p.name() << " after " << steps + 1 << " steps: " << after.message;
  const trace::Breakdown b = p.backend == Backend::cuda ? gpu::measure_breakdown(*c, 0, 2) : trace::measure_on_cpu([&] { c->run(); }, 0, 2);
  for (const trace::Part& part : b.parts) EXPECT_NE(part.op, "cast") << p.name() << ": the step casts its weights";
  EXPECT_TRUE(m->bf16_copy_check().ok) << p.name() << " after the breakdown's steps";
}

// Runs `steps` train steps of `c` and expects the last one's loss below `bar` times the first one's.
// The first step is `verify` (checked against the reference) when `verify_first`, else `run`.
// C: the family's case type, the one with last_loss().
template <class C>
void expect_loss_falls(Case& c, int steps, double bar, const std::string& what, bool verify_first = false) {
  auto* m = dynamic_cast<C*>(&c);
  ASSERT_NE(m, nullptr) << what;
  if (verify_first) {
    const Check first_step = c.verify();
    ASSERT_TRUE(first_step.ok) << what << ": " << first_step.message;
  } else {
    c.run();
  }
  const double first = m->last_loss();
  for (int i = 1; i < steps; ++i) c.run();
  const double last = m->last_loss();
  EXPECT_TRUE(std::isfinite(last)) << what;
  EXPECT_LT(last, bar * first) << what << ": " << first << " -> " << last << " over " << steps << " steps";
}

// Training model.<name> of model family `f` at `batch` from its seeded start, the first step verified:
// the loss must fall below 0.7 of its start in `steps` steps (skipped with the reason where the
// problem cannot run here).
inline void expect_learns(const Family& f, Backend be, const std::string& name, std::int64_t batch, int steps,
                          DType t = DType::f32) {
  const Problem p = model_problem(name, be, Direction::train, batch, nullptr, 0, t);
  if (const std::string why = f.unsupported_reason(p); !why.empty()) GTEST_SKIP() << why;
  expect_loss_falls<models::ModelCase>(*f.make(p), steps, 0.7, p.name(), true);
}

// What a correct train step `step` from m = v = 0 leaves: the gradients `grad` as stored (f32), and
// the parameters after AdamW's step (PyTorch's defaults, every model's) from p0(i) on them.
template <class P0>
void correct_step(const std::vector<double>& grad, P0 p0, std::size_t n, std::int64_t step, HostBuffer& grads,
                  HostBuffer& params) {
  grads = HostBuffer(DType::f32, n);
  params = HostBuffer(DType::f32, n);
  for (std::size_t i = 0; i < n; ++i) {
    grads.set(i, grad[i]);
    adamw::Element e{p0(i), 0, 0};
    adamw::reference_step(adamw::Hyper{}, step, grads.get(i), e);
    params.set(i, e.p);
  }
}

// A step's outcome (kernels/models/regression.h) as its double reference `ref` gives it: infer, y in
// dtype `t`; train, the loss, the gradients and AdamW's first step from `params0` (`total` f32).
inline models::regression::Outcome regression_outcome(const models::regression::Reference& ref, bool train, DType t,
                                                      const HostBuffer& params0, std::size_t total) {
  models::regression::Outcome o;
  if (!train) {
    o.y = HostBuffer(t, ref.y.size());
    for (std::size_t i = 0; i < ref.y.size(); ++i) o.y.set(i, ref.y[i]);
    return o;
  }
  o.loss = static_cast<float>(ref.loss);
  correct_step(ref.grad, [&](std::size_t i) { return params0.get(i); }, total, 1, o.grads, o.params);
  return o;
}

// An infer step's check against its reference output `ref`: the output as the reference gives it
// (f32, in the Outcome's member `output`) passes `verify(outcome)`; with element `at` off by 0.01 it fails.
template <class Outcome, class Verify>
void expect_output_checked(const std::vector<double>& ref, HostBuffer Outcome::*output, std::size_t at, Verify verify) {
  Outcome o;
  HostBuffer& y = o.*output;
  y = HostBuffer(DType::f32, ref.size());
  for (std::size_t i = 0; i < ref.size(); ++i) y.set(i, ref[i]);
  EXPECT_TRUE(verify(o).ok);
  y.set(at, y.get(at) + 0.01);
  EXPECT_FALSE(verify(o).ok);
}

// Central differences of `loss(params)` at p0 (step h) against `grad`: the largest
// |difference - grad[i]| and the largest |difference|, over the parameters i = begin, begin + stride,
// ... below end (every parameter by default).
struct FiniteDifferences {
  double worst = 0, biggest = 0;
  int checked = 0;
};
template <class Loss>
FiniteDifferences finite_differences(const std::vector<double>& p0, const std::vector<double>& grad, Loss loss,
                                     double h = 1e-6, std::size_t begin = 0, std::size_t end = SIZE_MAX,
                                     std::size_t stride = 1) {
  FiniteDifferences fd;
  std::vector<double> p = p0;
  for (std::size_t i = begin; i < std::min(end, p0.size()); i += stride) {
    p[i] = p0[i] + h;
    const double up = loss(p);
    p[i] = p0[i] - h;
    const double down = loss(p);
    p[i] = p0[i];
    const double d = (up - down) / (2 * h);
    fd.worst = std::max(fd.worst, std::fabs(d - grad[i]));
    fd.biggest = std::max(fd.biggest, std::fabs(d));
    ++fd.checked;
  }
  return fd;
}

}  // namespace hotops::model_test
