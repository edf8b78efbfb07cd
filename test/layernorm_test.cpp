// layernorm: the reference against hand-computed values, and verification that accepts the
// reference's own outputs (f32 and bf16) and rejects planted errors in every output.
#include <gtest/gtest.h>

#include <cmath>

#include "kernels/layernorm/layernorm.h"
#include "test/plan_test_util.h"

namespace hotops::layernorm {
namespace {

Shape one_row(Direction d, DType t = DType::f32) {
  Shape s;
  s.dir = d;
  s.dtype = t;
  s.hidden = 3;
  return s;
}

// One row: x = {0, 1, 5}, dy = {1, 0, 2}, gamma 1.5, beta 0.25. Expected values computed by hand
// (in double, outside hotops): mean 2, biased variance 14/3, rstd = 1/sqrt(14/3 + 1e-5).
Inputs three_values(const Shape& s) {
  Inputs in;
  in.x = HostBuffer(s.dtype, 3);
  in.dy = HostBuffer(s.dtype, 3);
  in.gamma = HostBuffer(DType::f32, 3);
  in.beta = HostBuffer(DType::f32, 3);
  const double x[] = {0, 1, 5}, dy[] = {1, 0, 2};
  for (std::size_t i = 0; i < 3; ++i) {
    in.x.set(i, x[i]);
    in.dy.set(i, dy[i]);
    in.gamma.set(i, 1.5);
    in.beta.set(i, 0.25);
  }
  in.mean = HostBuffer(DType::f32, 1);
  in.rstd = HostBuffer(DType::f32, 1);
  in.mean.set(0, 2.0);
  in.rstd.set(0, 0.4629095539120194);
  return in;
}

TEST(Layernorm, ForwardMatchesHandComputedValues) {
  const Shape s = one_row(Direction::fwd);
  const Inputs in = three_values(s);
  const Reference r(s, in);
  EXPECT_NEAR(r.mean[0], 2.0, 1e-12);
  EXPECT_NEAR(r.rstd[0], 0.4629095539120194, 1e-12);
  EXPECT_NEAR(r.out(0), -1.1387286617360581, 1e-12);
  EXPECT_NEAR(r.out(1), -0.44436433086802907, 1e-12);
  EXPECT_NEAR(r.out(2), 2.333092992604087, 1e-12);
}

TEST(Layernorm, BackwardMatchesHandComputedValues) {
  const Shape s = one_row(Direction::bwd);
  const Inputs in = three_values(s);
  const Reference r(s, in);
  // The saved rstd is an f32 input: compare to the precision it carries.
  EXPECT_NEAR(r.out(0), 0.39677876739865786, 1e-7);
  EXPECT_NEAR(r.out(1), -0.4959749471687001, 1e-7);
  EXPECT_NEAR(r.out(2), 0.09919617977004226, 1e-7);
  EXPECT_NEAR(r.dgamma[0], -0.9258191078240388, 1e-7);
  EXPECT_NEAR(r.dgamma[1], 0.0, 1e-12);
  EXPECT_NEAR(r.dgamma[2], 2.7774573234721163, 1e-7);
  EXPECT_DOUBLE_EQ(r.dbeta[0], 1.0);
  EXPECT_DOUBLE_EQ(r.dbeta[2], 2.0);
}

// The reference's own outputs, rounded to the output buffers' dtypes.
Outputs reference_outputs(const Shape& s, const Inputs& in) {
  const Reference r(s, in);
  Outputs o = make_outputs(s);
  for (std::size_t i = 0; i < o.out.count(); ++i) o.out.set(i, r.out(static_cast<std::int64_t>(i)));
  if (s.dir == Direction::fwd) {
    for (std::size_t i = 0; i < o.mean.count(); ++i) o.mean.set(i, r.mean[i]), o.rstd.set(i, r.rstd[i]);
  } else {
    for (std::size_t i = 0; i < o.dgamma.count(); ++i) o.dgamma.set(i, r.dgamma[i]), o.dbeta.set(i, r.dbeta[i]);
  }
  return o;
}

class LayernormVerify : public testing::TestWithParam<std::tuple<Direction, DType>> {};

TEST_P(LayernormVerify, AcceptsTheReferenceAndRejectsPlantedErrors) {
  Shape s;
  s.dir = std::get<0>(GetParam());
  s.dtype = std::get<1>(GetParam());
  s.batch = 2;
  s.tokens = 5;
  s.hidden = 33;
  const Inputs in = make_inputs(s, 42);
  const Outputs good = reference_outputs(s, in);
  ASSERT_TRUE(verify(s, in, good).ok) << verify(s, in, good).message;

  Outputs bad = good;
  bad.out.set(40, bad.out.get(40) + 0.5);  // one element of y / dx
  EXPECT_FALSE(verify(s, in, bad).ok);

  bad = good;
  bad.out.set(7, std::nan(""));  // an element left unwritten (poisoned)
  EXPECT_FALSE(verify(s, in, bad).ok);

  bad = good;
  if (s.dir == Direction::fwd) {
    bad.rstd.set(3, bad.rstd.get(3) * 1.01);  // one row's statistic 1% off
  } else {
    bad.dgamma.set(12, bad.dgamma.get(12) + 0.05 * std::abs(bad.dgamma.get(12)) + 0.05);
  }
  EXPECT_FALSE(verify(s, in, bad).ok);
}

INSTANTIATE_TEST_SUITE_P(Layernorm, LayernormVerify,
                         testing::Combine(testing::Values(Direction::fwd, Direction::bwd),
                                          testing::Values(DType::f32, DType::bf16)));

TEST(Layernorm, RowsHaveTheirOwnStatistics) {
  // Rows with the same statistics would let statistics over the wrong rows pass verification.
  Shape s = one_row(Direction::fwd);
  s.tokens = 4;
  s.hidden = 64;
  const Inputs in = make_inputs(s, 1);
  const Reference r(s, in);
  for (std::size_t i = 1; i < r.mean.size(); ++i) EXPECT_GT(std::abs(r.mean[i] - r.mean[0]), 1e-3);
}

// One CPU plan per direction, run on two sets of caller-owned tensors in turn: each result is that of
// its own inputs (a plan that kept the first pointers would write the second result into the first).
// bwd is given no beta, as a model's backward has none to pass.
TEST(Layernorm, PlanRunsOnTheTensorsItIsGivenEachRun) {
  for (Direction d : {Direction::fwd, Direction::bwd}) {
    Shape s;
    s.dir = d;
    s.batch = 2;
    s.tokens = 3;
    s.hidden = 40;
    auto plan = make_plan(s, Backend::cpu);
    Inputs in[2] = {make_inputs(s, 1), make_inputs(s, 2)};
    Outputs out[2] = {make_outputs(s), make_outputs(s)};
    const auto args_of = [&](int k) {
      Args a;
      a.x = in[k].x.data();
      a.gamma = in[k].gamma.data();
      if (d == Direction::fwd) {
        a.beta = in[k].beta.data();
        a.y = out[k].out.data();
        a.mean = out[k].mean.data();
        a.rstd = out[k].rstd.data();
      } else {
        a.dy = in[k].dy.data();
        a.saved_mean = in[k].mean.data();
        a.saved_rstd = in[k].rstd.data();
        a.dx = out[k].out.data();
        a.dgamma = out[k].dgamma.data();
        a.dbeta = out[k].dbeta.data();
      }
      return a;
    };
    const auto check = [&](int i, int o) { return verify(s, in[i], out[o]); };
    plan_test::expect_each_run_on_its_own_tensors(*plan, args_of, check, direction_name(d));
  }
}

}  // namespace
}  // namespace hotops::layernorm
