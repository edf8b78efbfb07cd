// The cross_entropy reference on hand-computed values, and verification that fails where it must:
// a wrong target index, a gradient without the / rows, a wrong loss, a written guard element; the
// same for cross_entropy_dbias and its bias gradient, and its plans run on given tensors; the mse
// reference, its plans and the failures its verification must catch.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "hotops/gpu.h"
#include "kernels/adamw/adamw.h"
#include "kernels/loss/bce.h"
#include "kernels/loss/loss.h"
#include "kernels/loss/mse.h"
#include "test/plan_test_util.h"

namespace hotops::loss {
namespace {

Problem test_problem(DType t, Direction d, std::int64_t rows, std::int64_t classes) {
  return Problem{"cross_entropy", Backend::cpu, t, d,
                 {{"shape", "test"}, {"rows", std::to_string(rows)}, {"classes", std::to_string(classes)}}};
}

// Every output from the reference (rounded to its dtype); the guards left poisoned.
Outputs reference_outputs(const Shape& s, const Inputs& in, std::int64_t target_shift = 0, bool divide = true) {
  Outputs out = make_outputs(s);
  poison(out);
  const auto rows = static_cast<std::size_t>(s.rows), classes = static_cast<std::size_t>(s.classes);
  if (s.dir == Direction::fwd) {
    std::vector<double> lse(rows);
    out.loss.set(0, reference_fwd(s, in, lse.data()));
    for (std::size_t r = 0; r < rows; ++r) out.lse.set(r, lse[r]);
    return out;
  }
  std::vector<double> x(classes), d(classes);
  const double scale = in.dloss / (divide ? static_cast<double>(rows) : 1.0);
  for (std::size_t r = 0; r < rows; ++r) {
    for (std::size_t j = 0; j < classes; ++j) x[j] = in.logits.get(r * classes + j);
    const std::int64_t t = (in.target[r] + target_shift) % s.classes;
    reference_bwd(x.data(), classes, t, in.lse.get(r), scale, d.data());
    for (std::size_t j = 0; j < classes; ++j) out.dlogits.set(r * classes + j, d[j]);
  }
  return out;
}

TEST(CrossEntropyReference, KnownValues) {
  // Row 0: logits (0, ln 2, ln 3): lse = ln 6, target 2: loss ln 6 - ln 3 = ln 2.
  // Row 1: logits (1, 1, 1): lse = 1 + ln 3, target 0: loss ln 3. Mean (ln 2 + ln 3) / 2 = ln 6 / 2.
  const Shape s = shape_of(test_problem(DType::f32, Direction::fwd, 2, 3));
  Inputs in;
  in.logits = HostBuffer(DType::f32, 6 + kGuard);
  const double v[6] = {0, std::log(2.0), std::log(3.0), 1, 1, 1};
  for (std::size_t i = 0; i < 6; ++i) in.logits.set(i, v[i]);
  in.target = {2, 0};
  double lse[2];
  EXPECT_NEAR(reference_fwd(s, in, lse), std::log(6.0) / 2, 1e-7);  // the logits are f32-rounded
  EXPECT_NEAR(lse[0], std::log(6.0), 1e-7);
  EXPECT_NEAR(lse[1], 1 + std::log(3.0), 1e-7);
  // Gradient of row 0 with dloss 1 over 2 rows: (softmax - onehot) / 2 = (1/6, 2/6, 3/6 - 1) / 2.
  double dx[3];
  reference_bwd(v, 3, 2, std::log(6.0), 0.5, dx);
  EXPECT_NEAR(dx[0], 1.0 / 12, 1e-15);
  EXPECT_NEAR(dx[1], 2.0 / 12, 1e-15);
  EXPECT_NEAR(dx[2], -0.25, 1e-15);
  EXPECT_NEAR(dx[0] + dx[1] + dx[2], 0, 1e-15);  // a row's gradient sums to 0
}

TEST(CrossEntropyInputs, TargetsInRangeAndNotConstant) {
  const Shape s = shape_of(test_problem(DType::f32, Direction::bwd, 64, 5));
  const Inputs in = make_inputs(s, 7);
  bool differ = false;
  for (std::int64_t t : in.target) {
    EXPECT_GE(t, 0);
    EXPECT_LT(t, 5);
    differ |= t != in.target[0];
  }
  EXPECT_TRUE(differ);
  for (std::size_t r = 0; r < 64; ++r) EXPECT_GE(in.lse.get(r), in.logits.get(r * 5));  // lse >= every logit
}

class CrossEntropyVerify : public testing::TestWithParam<std::tuple<DType, std::int64_t>> {};

TEST_P(CrossEntropyVerify, FwdPassesTheReferenceAndFailsPlantedErrors) {
  const auto [t, classes] = GetParam();
  const Shape s = shape_of(test_problem(t, Direction::fwd, 6, classes));
  const Inputs in = make_inputs(s, 11);
  const Outputs out = reference_outputs(s, in);
  const Check ok = verify(s, in, out);
  EXPECT_TRUE(ok.ok) << ok.message;

  Outputs bad = out;  // the loss of a wrong target index in row 0 (x[t] - x[t+1] is O(1))
  const std::size_t c = static_cast<std::size_t>(classes);
  bad.loss.set(0, out.loss.get(0) + (in.logits.get(static_cast<std::size_t>(in.target[0])) -
                                     in.logits.get((static_cast<std::size_t>(in.target[0]) + 1) % c)) / 6);
  Outputs sum = out;  // the sum instead of the mean
  sum.loss.set(0, out.loss.get(0) * 6);
  if (classes > 1) {  // at classes 1 every loss is 0
    EXPECT_FALSE(verify(s, in, bad).ok) << "a wrong target passed";
    EXPECT_FALSE(verify(s, in, sum).ok) << "a missing / rows passed";
  }
  Outputs lse = out;
  lse.lse.set(3, out.lse.get(3) + 1e-3);
  EXPECT_FALSE(verify(s, in, lse).ok) << "a wrong lse passed";
  Outputs guard = out;
  guard.lse.set(6, 0);
  EXPECT_FALSE(verify(s, in, guard).ok) << "a written guard element passed";
}

TEST_P(CrossEntropyVerify, BwdPassesTheReferenceAndFailsPlantedErrors) {
  const auto [t, classes] = GetParam();
  const Shape s = shape_of(test_problem(t, Direction::bwd, 6, classes));
  const Inputs in = make_inputs(s, 13);
  const Check ok = verify(s, in, reference_outputs(s, in));
  EXPECT_TRUE(ok.ok) << ok.message;
  if (classes > 1) {
    EXPECT_FALSE(verify(s, in, reference_outputs(s, in, 1)).ok) << "a wrong target index passed";
    EXPECT_FALSE(verify(s, in, reference_outputs(s, in, 0, false)).ok) << "a missing / rows passed";
  }
  Inputs twice = in;  // the gradient of dloss 1 checked against dloss 2
  twice.dloss = 2;
  if (classes > 1) {  // at classes 1 every gradient is 0
    EXPECT_FALSE(verify(s, twice, reference_outputs(s, in)).ok) << "an ignored dloss passed";
  }
  Outputs guard = reference_outputs(s, in);
  guard.dlogits.set(s.elements(), 0);
  EXPECT_FALSE(verify(s, in, guard).ok) << "a written guard element passed";
  if (classes > 1) {  // every non-target gradient 0: at BERT's 30,522 classes each is ~1/C of the largest
    Outputs zero = reference_outputs(s, in);
    for (std::int64_t r = 0; r < s.rows; ++r)
      for (std::int64_t j = 0; j < classes; ++j)
        if (j != in.target[static_cast<std::size_t>(r)]) zero.dlogits.set(static_cast<std::size_t>(r * classes + j), 0);
    EXPECT_FALSE(verify(s, in, zero).ok) << "zero non-target gradients passed";
  }
}

INSTANTIATE_TEST_SUITE_P(CrossEntropy, CrossEntropyVerify,
                         testing::Combine(testing::Values(DType::f32, DType::bf16),
                                          testing::Values<std::int64_t>(1, 2, 5, 33, 1000, 30522)));

TEST(CrossEntropyFamily, NamesAndWork) {
  const Family& f = family();
  std::vector<Problem> problems, dbias, mse, bce;
  for (const Problem& q : f.benchmark_problems({8}))
    (q.op == "cross_entropy" ? problems : q.op == "cross_entropy_dbias" ? dbias : q.op == "bce_logits" ? bce : mse).push_back(q);
  ASSERT_EQ(problems.size(), 7u * 8);  // seven heads, both backends, dtypes and directions
  ASSERT_EQ(dbias.size(), 4u * 4);  // four heads, both backends and dtypes, bwd only
  ASSERT_EQ(mse.size(), 2u * 4);    // two encoder outputs, both backends and dtypes, bwd only
  ASSERT_EQ(bce.size(), 1u * 8);    // one binary head, both backends, dtypes and directions
  for (const Problem& q : mse) EXPECT_EQ(q.op, "mse");
  const Problem& p = problems.back();
  EXPECT_EQ(p.name(), "cross_entropy/cuda/bf16/bwd/shape:bert.mlm/batch:8/rows:1024/classes:30522");
  const Work w = f.work(p);
  const double n = 1024.0 * 30522;
  EXPECT_DOUBLE_EQ(w.bytes, n * 2 * 2 + 1024.0 * (8 + 4) + 4);
  EXPECT_DOUBLE_EQ(w.flops, n * 4);
  EXPECT_DOUBLE_EQ(w.items, 8);
  // mlp_tiny at two batches in each cross-entropy op, lstm_textgen at three in cross_entropy; mse: two
  // outputs at batches 8 and 32; bce_logits: fasttext_imdb at batches 32 and 4096
  EXPECT_EQ(f.benchmark_problems({}).size(), 10u * 8 + 5u * 4 + 2u * 2 * 4 + 2u * 8);
  const Problem& d = dbias.back();
  EXPECT_EQ(d.name(), "cross_entropy_dbias/cuda/bf16/bwd/shape:bilstm_imdb/batch:8/rows:8/classes:2");
  EXPECT_DOUBLE_EQ(f.work(d).bytes, 16 * 2 * 2 + 8 * 4 + 4 + 2 * 4);
  EXPECT_DOUBLE_EQ(f.work(d).flops, 16 * 9);
  EXPECT_THROW(shape_of(Problem{"cross_entropy_dbias", Backend::cpu, DType::f32, Direction::fwd, d.args}), Error);
}

// ---- cross_entropy_dbias ----

Problem dbias_problem(DType t, std::int64_t rows, std::int64_t classes) {
  Problem p = test_problem(t, Direction::bwd, rows, classes);
  p.op = "cross_entropy_dbias";
  return p;
}

// The outputs from the reference: the loss, dlogits (rounded to the dtype) and db, the column sums of
// those rounded dlogits; the guards poisoned.
Outputs dbias_reference(const Shape& s, const Inputs& in) {
  Outputs out = make_outputs(s);
  poison(out);
  const auto rows = static_cast<std::size_t>(s.rows), classes = static_cast<std::size_t>(s.classes);
  std::vector<double> lse(rows), x(classes), d(classes), db(classes, 0.0);
  out.loss.set(0, reference_fwd(s, in, lse.data()));
  for (std::size_t r = 0; r < rows; ++r) {
    for (std::size_t j = 0; j < classes; ++j) x[j] = in.logits.get(r * classes + j);
    reference_bwd(x.data(), classes, in.target[r], lse[r], 1.0 / static_cast<double>(rows), d.data());
    for (std::size_t j = 0; j < classes; ++j) out.dlogits.set(r * classes + j, d[j]);
    for (std::size_t j = 0; j < classes; ++j) db[j] += out.dlogits.get(r * classes + j);
  }
  for (std::size_t j = 0; j < classes; ++j) out.db.set(j, db[j]);
  return out;
}

TEST(CrossEntropyDbias, VerifyAcceptsTheReferenceAndFailsPlantedErrors) {
  for (DType t : {DType::f32, DType::bf16}) {
    const Shape s = shape_of(dbias_problem(t, 1100, 3));
    const Inputs in = make_inputs(s, 5);
    const Outputs ref = dbias_reference(s, in);
    const Check ok = verify(s, in, ref);
    ASSERT_TRUE(ok.ok) << dtype_name(t) << ": " << ok.message;
    // db without the last row's term.
    Outputs bad = ref;
    bad.db.set(1, ref.db.get(1) - ref.dlogits.get(1099 * 3 + 1));
    EXPECT_FALSE(verify(s, in, bad).ok) << dtype_name(t) << " dropped row";
    // dlogits of one row with the one-hot on the wrong class.
    bad = ref;
    const auto y = static_cast<std::size_t>(in.target[7]), w = (y + 1) % 3;
    bad.dlogits.set(7 * 3 + y, ref.dlogits.get(7 * 3 + y) + 1.0 / 1100);
    bad.dlogits.set(7 * 3 + w, ref.dlogits.get(7 * 3 + w) - 1.0 / 1100);
    EXPECT_FALSE(verify(s, in, bad).ok) << dtype_name(t) << " target";
    // The loss summed without its last row.
    bad = ref;
    bad.loss.set(0, ref.loss.get(0) * 1100 / 1099);
    EXPECT_FALSE(verify(s, in, bad).ok) << dtype_name(t) << " loss";
    // A guard element of db written.
    bad = ref;
    bad.db.set(3, 0.0);
    EXPECT_FALSE(verify(s, in, bad).ok) << dtype_name(t) << " db guard";
  }
}

// One plan on `backend` run on two sets of caller-owned tensors in turn: each loss, dlogits and db is
// that of its own inputs. Rows past the CUDA block's 512 threads.
void expect_dbias_plan_runs_on_given_tensors(Backend backend) {
  for (DType t : {DType::f32, DType::bf16}) {
    const Shape s = shape_of(dbias_problem(t, 1100, 10));
    auto plan = make_plan(s, backend);
    Inputs in[2] = {make_inputs(s, 1), make_inputs(s, 2)};
    Outputs out[2] = {make_outputs(s), make_outputs(s)};
    HostBuffer labels[2];  // int32, held in a buffer's bytes
    for (int k = 0; k < 2; ++k) {
      labels[k] = HostBuffer(DType::f32, in[k].target.size());
      for (std::size_t r = 0; r < in[k].target.size(); ++r) labels[k].as<std::int32_t>()[r] = static_cast<std::int32_t>(in[k].target[r]);
    }
    struct Device {
      gpu::DeviceBuffer logits, labels, loss, dlogits, db;
    } dev[2];
    const auto args_of = [&](int k) {
      poison(out[k]);
      Args a;
      if (backend == Backend::cpu) {
        a.logits = in[k].logits.data(), a.labels = labels[k].as<std::int32_t>();
        a.loss = out[k].loss.data(), a.dlogits = out[k].dlogits.data(), a.db = out[k].db.as<float>();
        return a;
      }
      Device& d = dev[k];
      d.logits = gpu::DeviceBuffer(in[k].logits);
      d.labels = gpu::DeviceBuffer(labels[k]);
      d.loss = gpu::DeviceBuffer(out[k].loss), d.dlogits = gpu::DeviceBuffer(out[k].dlogits), d.db = gpu::DeviceBuffer(out[k].db);
      a.logits = d.logits.get(), a.labels = d.labels.as<const std::int32_t>();
      a.loss = d.loss.get(), a.dlogits = d.dlogits.get(), a.db = d.db.as<float>();
      return a;
    };
    const auto check = [&](int i, int o) {
      if (backend == Backend::cuda) dev[o].loss.download(out[o].loss), dev[o].dlogits.download(out[o].dlogits), dev[o].db.download(out[o].db);
      return verify(s, in[i], out[o]);
    };
    plan_test::expect_each_run_on_its_own_tensors(*plan, args_of, check, dtype_name(t));
  }
}

HOTOPS_PLAN_TESTS(CrossEntropyDbias, PlanRunsOnTheTensorsItIsGiven, expect_dbias_plan_runs_on_given_tensors)

#ifdef HOTOPS_HAVE_CUDA
// Given a step state, the CUDA plan advances it once a run, to that step's AdamW scalars, as a model's
// train step asks before its AdamW launch; without one it leaves it alone; and its outputs are the same.
TEST(CrossEntropyDbiasCuda, AdvancesTheStepCountItIsGiven) {
  std::string why;
  if (!gpu::available(&why)) GTEST_SKIP() << why;
  const Shape s = shape_of(dbias_problem(DType::f32, 40, 3));
  auto plan = make_plan(s, Backend::cuda);
  const Inputs in = make_inputs(s, 5);
  HostBuffer labels(DType::f32, in.target.size());  // int32, held in a buffer's bytes
  for (std::size_t r = 0; r < in.target.size(); ++r) labels.as<std::int32_t>()[r] = static_cast<std::int32_t>(in.target[r]);
  Outputs out = make_outputs(s);
  poison(out);
  gpu::DeviceBuffer logits(in.logits), dlabels(labels), loss(out.loss), dlogits(out.dlogits), db(out.db);
  const adamw::Hyper h;
  const adamw::DeviceStep start = adamw::first_step(h);
  gpu::DeviceBuffer state(sizeof start);
  HOTOPS_CHECK_CUDA(cudaMemcpy(state.get(), &start, sizeof start, cudaMemcpyHostToDevice));
  Args a;
  a.logits = logits.get(), a.labels = dlabels.as<const std::int32_t>(), a.loss = loss.get(), a.dlogits = dlogits.get();
  a.db = db.as<float>();
  a.advance = state.as<adamw::DeviceStep>(), a.hyper = &h;
  plan->run(a);
  plan->run(a);
  EXPECT_TRUE(adamw::check_device_step(state.as<const adamw::DeviceStep>(), 2).ok);
  adamw::DeviceStep after{};
  HOTOPS_CHECK_CUDA(cudaMemcpy(&after, state.get(), sizeof after, cudaMemcpyDeviceToHost));
  const adamw::StepScalars want = adamw::scalars_for(h, 2);
  EXPECT_EQ(after.s.step_size, want.step_size);
  EXPECT_EQ(after.s.inv_sqrt_bc2, want.inv_sqrt_bc2);
  loss.download(out.loss), dlogits.download(out.dlogits), db.download(out.db);
  const Check c = verify(s, in, out);
  EXPECT_TRUE(c.ok) << c.message;
  a.advance = nullptr, a.hyper = nullptr;
  plan->run(a);
  EXPECT_TRUE(adamw::check_device_step(state.as<const adamw::DeviceStep>(), 2).ok);
}
#endif

// One CPU plan per direction, run on two sets of caller-owned tensors in turn: each result is that of
// its own inputs (a plan that kept the first pointers would write the second result into the first).
TEST(CrossEntropy, PlanRunsOnTheTensorsItIsGivenEachRun) {
  for (Direction d : {Direction::fwd, Direction::bwd}) {
    const Shape s = shape_of(test_problem(DType::f32, d, 6, 33));
    auto plan = make_plan(s, Backend::cpu);
    Inputs in[2] = {make_inputs(s, 1), make_inputs(s, 2)};
    Outputs out[2] = {make_outputs(s), make_outputs(s)};
    const auto args_of = [&](int k) {
      poison(out[k]);
      Args a;
      a.logits = in[k].logits.data();
      a.target = in[k].target.data();
      if (d == Direction::fwd) {
        a.loss = out[k].loss.data();
        a.lse = out[k].lse.data();
      } else {
        a.saved_lse = in[k].lse.data();
        a.dloss = &in[k].dloss;
        a.dlogits = out[k].dlogits.data();
      }
      return a;
    };
    const auto check = [&](int i, int o) { return verify(s, in[i], out[o]); };
    plan_test::expect_each_run_on_its_own_tensors(*plan, args_of, check, direction_name(d));
  }
}

}  // namespace
}  // namespace hotops::loss

namespace hotops::loss::mse {
namespace {

Shape mse_shape(DType t, std::int64_t batch, std::int64_t tokens, std::int64_t hidden) {
  Shape s;
  s.dtype = t, s.batch = batch, s.tokens = tokens, s.hidden = hidden;
  return s;
}

Args args_of(const Inputs& in, Outputs& out) { return {in.y.data(), in.target.data(), out.loss.as<float>(), out.dy.data()}; }

// The name a benchmark gives, and the shape and work it reads back.
TEST(Mse, NameShapeAndWork) {
  const Problem p{"mse", Backend::cuda, DType::bf16, Direction::bwd,
                  {{"shape", "bert.layer"}, {"batch", "32"}, {"tokens", "128"}, {"hidden", "768"}}};
  EXPECT_EQ(p.name(), "mse/cuda/bf16/bwd/shape:bert.layer/batch:32/tokens:128/hidden:768");
  const Shape s = shape_of(p);
  EXPECT_EQ(s.count(), 32 * 128 * 768);
  EXPECT_EQ(family().work(p).bytes, 3.0 * 2 * 32 * 128 * 768 + 4);
}

// y = {1, 0.5, -1}, t = {0, 0.5, 1}: errors {1, 0, -2}, loss 5/3, dy = 2 e / 3.
TEST(Mse, ReferenceMatchesHandComputedValues) {
  const Shape s = mse_shape(DType::f32, 1, 1, 3);
  Inputs in = make_inputs(s, 1);
  const double y[] = {1, 0.5, -1}, t[] = {0, 0.5, 1};
  for (std::size_t i = 0; i < 3; ++i) in.y.set(i, y[i]), in.target.set(i, t[i]);
  EXPECT_DOUBLE_EQ(reference_loss(in), 5.0 / 3);
  EXPECT_DOUBLE_EQ(reference_dy(in, 0), 2.0 / 3);
  EXPECT_DOUBLE_EQ(reference_dy(in, 1), 0.0);
  EXPECT_DOUBLE_EQ(reference_dy(in, 2), -4.0 / 3);
}

// The CPU plan, built once, run on two sets of caller-owned tensors in turn.
TEST(Mse, PlanRunsOnTheTensorsItIsGivenEachRun) {
  for (DType t : {DType::f32, DType::bf16}) {
    const Shape s = mse_shape(t, 2, 7, 33);
    const auto plan = make_plan(s, Backend::cpu);
    Inputs in[2] = {make_inputs(s, 1), make_inputs(s, 2)};
    Outputs out[2] = {make_outputs(s), make_outputs(s)};
    const auto set = [&](int k) {
      out[k].loss.poison(), out[k].dy.poison();
      return args_of(in[k], out[k]);
    };
    const auto check = [&](int i, int o) { return verify(s, in[i], out[o]); };
    plan_test::expect_each_run_on_its_own_tensors(*plan, set, check, dtype_name(t));
  }
}

// A correct result passes; a loss without 1/256 of its terms (a few CUDA blocks' share), a dy
// without the / n (the sum's gradient), a dy of the wrong sign and one wrong dy element each fail.
TEST(Mse, VerifyCatchesAMissingBlockAMissingMeanAWrongSignAndAWrongElement) {
  for (DType t : {DType::f32, DType::bf16}) {
    const Shape s = mse_shape(t, 3, 97, 256);
    const Inputs in = make_inputs(s, 5);
    Outputs out = make_outputs(s);
    make_plan(s, Backend::cpu)->run(args_of(in, out));
    ASSERT_TRUE(verify(s, in, out).ok) << verify(s, in, out).message;
    const auto n = static_cast<std::size_t>(s.count());
    Outputs missing = out;
    double part = 0;
    for (std::size_t i = 0; i < n; i += 256) part += std::pow(in.y.get(i) - in.target.get(i), 2);
    missing.loss.set(0, out.loss.get(0) - part / static_cast<double>(n));
    EXPECT_FALSE(verify(s, in, missing).ok) << dtype_name(t);
    Outputs sum = out, sign = out;
    for (std::size_t i = 0; i < n; ++i) sum.dy.set(i, out.dy.get(i) * static_cast<double>(n)), sign.dy.set(i, -out.dy.get(i));
    Outputs wrong = out;
    wrong.dy.set(7, out.dy.get(7) * 1.05 + 1e-6);
    EXPECT_FALSE(verify(s, in, wrong).ok) << dtype_name(t);
    EXPECT_FALSE(verify(s, in, sum).ok) << dtype_name(t) << ": dy without / n";
    EXPECT_FALSE(verify(s, in, sign).ok) << dtype_name(t) << ": dy of the wrong sign";
  }
}

#ifdef HOTOPS_HAVE_CUDA
// The CUDA plan over: 74,496 elements (a block per 2048 elements, one vector a thread); 15 (no whole
// bf16 vector: the first thread takes all); 100,003 (a tail of 3 past the vectors); BERT's 3.1M
// (the full 1024-block grid, threads taking two vectors); and 74,496 with y one element off 16-byte
// alignment (one element per access). Each passes, and a second run gives the same bits.
TEST(MseCuda, MatchesTheReference) {
  std::string why;
  if (!gpu::available(&why)) GTEST_SKIP() << why;
  struct Case {
    std::int64_t batch, tokens, hidden;
    std::size_t shift;
  };
  for (DType t : {DType::f32, DType::bf16})
    for (const Case& k : {Case{3, 97, 256, 0}, Case{1, 3, 5, 0}, Case{1, 1, 100003, 0}, Case{32, 128, 768, 0}, Case{3, 97, 256, 1}}) {
      const Shape s = mse_shape(t, k.batch, k.tokens, k.hidden);
      const std::string what = std::string(dtype_name(t)) + " " + std::to_string(s.count()) + " elements" +
                               (k.shift ? ", y misaligned" : "");
      const auto plan = make_plan(s, Backend::cuda);
      const Inputs in = make_inputs(s, 3);
      const plan_test::ShiftedOnDevice y(in.y, k.shift);
      gpu::DeviceBuffer target(in.target), loss(sizeof(float)), dy(in.y.bytes());
      Outputs out[2] = {make_outputs(s), make_outputs(s)};
      for (Outputs& o : out) {
        loss.poison(), dy.poison();
        plan->run({y.data(), target.get(), loss.as<float>(), dy.get()});
        loss.download(o.loss), dy.download(o.dy);
      }
      const Check c = verify(s, in, out[0]);
      EXPECT_TRUE(c.ok) << what << ": " << c.message;
      EXPECT_EQ(0, std::memcmp(out[0].loss.data(), out[1].loss.data(), out[0].loss.bytes())) << what;
      EXPECT_EQ(0, std::memcmp(out[0].dy.data(), out[1].dy.data(), out[0].dy.bytes())) << what;
    }
}
#endif

}  // namespace
}  // namespace hotops::loss::mse

namespace hotops::loss::bce {
namespace {

Shape bce_shape(Direction d, DType t, std::int64_t batch, std::int64_t outputs) {
  Shape s;
  s.dir = d, s.dtype = t, s.batch = batch, s.outputs = outputs;
  return s;
}

TEST(BceLogits, NameShapeAndWork) {
  const Problem p{"bce_logits", Backend::cuda, DType::bf16, Direction::bwd,
                  {{"shape", "fasttext_imdb"}, {"batch", "32"}, {"outputs", "1"}}};
  EXPECT_EQ(p.name(), "bce_logits/cuda/bf16/bwd/shape:fasttext_imdb/batch:32/outputs:1");
  const Shape s = shape_of(p);
  EXPECT_EQ(s.count(), 32);
  const Work w = family().work(p);
  EXPECT_DOUBLE_EQ(w.bytes, 32.0 * (2 + 4 + 2));
  EXPECT_DOUBLE_EQ(w.flops, 32.0 * 5);
  EXPECT_DOUBLE_EQ(w.items, 32);
  Problem fwd = p;
  fwd.dir = Direction::fwd, fwd.dtype = DType::f32;
  EXPECT_DOUBLE_EQ(family().work(fwd).bytes, 32.0 * (4 + 4) + 4);
  Problem bad = p;
  bad.dir = Direction::bwd_data;
  EXPECT_THROW(shape_of(bad), Error);
}

// The stable form equals the textbook −[y log σ(z) + (1 − y) log(1 − σ(z))] where that is accurate,
// stays finite where it is not (|z| = 100), and its gradient is (σ(z) − y) / n.
TEST(BceLogits, ReferenceMatchesHandComputedValues) {
  EXPECT_DOUBLE_EQ(reference_term(0, 0.5), std::log(2.0));
  for (double z : {-3.0, -0.25, 0.5, 2.0})
    for (double y : {0.0, 0.3, 1.0}) {
      const double sig = 1 / (1 + std::exp(-z));
      EXPECT_NEAR(reference_term(z, y), -(y * std::log(sig) + (1 - y) * std::log(1 - sig)), 1e-12) << z << " " << y;
    }
  EXPECT_DOUBLE_EQ(reference_term(100, 0), 100);
  EXPECT_DOUBLE_EQ(reference_term(-100, 1), 100);
  EXPECT_NEAR(reference_term(100, 1), 0, 1e-40);
  const Shape s = bce_shape(Direction::bwd, DType::f32, 2, 1);
  Inputs in = make_inputs(s, 1);
  in.logits.set(0, 0), in.target.set(0, 1);  // (0.5 − 1) / 2
  in.logits.set(1, 2), in.target.set(1, 0);  // σ(2) / 2
  EXPECT_DOUBLE_EQ(reference_dlogits(in, 0), -0.25);
  EXPECT_DOUBLE_EQ(reference_dlogits(in, 1), 0.5 / (1 + std::exp(-2.0)));
  EXPECT_DOUBLE_EQ(reference_loss(in), (std::log(2.0) + reference_term(2, 0)) / 2);
}

// A correct result passes; a loss without one term, a loss or gradient without the / n, a gradient of
// the wrong sign and one wrong gradient element each fail.
TEST(BceLogits, VerifyCatchesAMissingTermAMissingMeanAWrongSignAndAWrongElement) {
  for (DType t : {DType::f32, DType::bf16})
    for (std::int64_t batch : {32, 4096}) {
      const std::string what = std::string(dtype_name(t)) + " batch " + std::to_string(batch);
      const Shape f = bce_shape(Direction::fwd, t, batch, 1);
      const Inputs in = make_inputs(f, 5);
      Outputs out = make_outputs(f);
      make_plan(f, Backend::cpu)->run({in.logits.data(), in.target.as<float>(), out.loss.as<float>(), nullptr});
      ASSERT_TRUE(verify(f, in, out).ok) << what << ": " << verify(f, in, out).message;
      const auto n = static_cast<double>(batch);
      Outputs missing = out, sum = out;
      missing.loss.set(0, out.loss.get(0) - reference_term(in.logits.get(3), in.target.get(3)) / n);
      sum.loss.set(0, out.loss.get(0) * n);
      EXPECT_FALSE(verify(f, in, missing).ok) << what;
      EXPECT_FALSE(verify(f, in, sum).ok) << what;

      const Shape b = bce_shape(Direction::bwd, t, batch, 1);
      Outputs grad = make_outputs(b);
      make_plan(b, Backend::cpu)->run({in.logits.data(), in.target.as<float>(), nullptr, grad.dlogits.data()});
      ASSERT_TRUE(verify(b, in, grad).ok) << what << ": " << verify(b, in, grad).message;
      Outputs unscaled = grad, sign = grad, wrong = grad;
      for (std::size_t i = 0; i < grad.dlogits.count(); ++i)
        unscaled.dlogits.set(i, grad.dlogits.get(i) * n), sign.dlogits.set(i, -grad.dlogits.get(i));
      wrong.dlogits.set(7, grad.dlogits.get(7) * 1.02);
      EXPECT_FALSE(verify(b, in, unscaled).ok) << what;
      EXPECT_FALSE(verify(b, in, sign).ok) << what;
      EXPECT_FALSE(verify(b, in, wrong).ok) << what;
    }
}

// The plan, built once, run on two sets of caller-owned tensors in turn (device memory on CUDA): each
// result is that of its own inputs. Both directions and dtypes; 1000 elements (4 CUDA blocks).
void expect_plan_runs_on_given_tensors(Backend backend) {
  for (DType t : {DType::f32, DType::bf16})
    for (Direction d : {Direction::fwd, Direction::bwd}) {
      const Shape s = bce_shape(d, t, 500, 2);
      const auto plan = make_plan(s, backend);
      const Inputs in[2] = {make_inputs(s, 1), make_inputs(s, 2)};
      Outputs out[2] = {make_outputs(s), make_outputs(s)};
      struct Device {
        gpu::DeviceBuffer logits, target, out;
      } dev[2];
      HostBuffer& (*primary)(Outputs&) = [](Outputs& o) -> HostBuffer& { return o.loss.count() ? o.loss : o.dlogits; };
      const auto args_of = [&](int k) {
        primary(out[k]).poison();
        Args a{in[k].logits.data(), in[k].target.as<float>(), out[k].loss.as<float>(), out[k].dlogits.data()};
        if (backend == Backend::cpu) return a;
        dev[k].logits = gpu::DeviceBuffer(in[k].logits), dev[k].target = gpu::DeviceBuffer(in[k].target);
        dev[k].out = gpu::DeviceBuffer(primary(out[k]));
        a.logits = dev[k].logits.get(), a.target = dev[k].target.as<float>();
        if (d == Direction::fwd)
          a.loss = dev[k].out.as<float>();
        else
          a.dlogits = dev[k].out.get();
        return a;
      };
      const auto check = [&](int i, int o) {
        if (backend == Backend::cuda) dev[o].out.download(primary(out[o]));
        return verify(s, in[i], out[o]);
      };
      plan_test::expect_each_run_on_its_own_tensors(*plan, args_of, check, std::string(dtype_name(t)) + " " + direction_name(d));
    }
}

HOTOPS_PLAN_TESTS(BceLogits, PlanRunsOnTheTensorsItIsGiven, expect_plan_runs_on_given_tensors)

}  // namespace
}  // namespace hotops::loss::bce
