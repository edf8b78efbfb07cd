// layernorm: the reference against hand-computed values, and verification that accepts the
// reference's own outputs (f32 and bf16) and rejects planted errors in every output; layernorm_dbias's
// plans and the failures its verification must catch.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "hotops/gpu.h"
#include "kernels/layernorm/layernorm.h"
#include "kernels/layernorm/layernorm_dbias.h"
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

namespace hotops::layernorm::dbias {
namespace {

Shape dbias_shape(DType t, std::int64_t batch, std::int64_t tokens, std::int64_t hidden, bool dres) {
  Shape s;
  s.dtype = t, s.batch = batch, s.tokens = tokens, s.hidden = hidden, s.dres = dres;
  return s;
}

Args args_of(const Inputs& in, Outputs& out, bool dres) {
  Args a;
  a.x = in.ln.x.data(), a.dy = in.ln.dy.data(), a.gamma = in.ln.gamma.as<float>();
  a.saved_mean = in.ln.mean.as<float>(), a.saved_rstd = in.ln.rstd.as<float>();
  a.dres = dres ? in.dres.data() : nullptr;
  a.dx = out.dx.data(), a.dgamma = out.dgamma.as<float>(), a.dbeta = out.dbeta.as<float>(), a.dbias = out.dbias.as<float>();
  return a;
}

// The name a benchmark gives, and the shape and work it reads back.
TEST(LayernormDbias, NameShapeAndWork) {
  const Problem p{"layernorm_dbias", Backend::cuda, DType::bf16, Direction::bwd,
                  {{"shape", "vit_b16.layer"}, {"batch", "32"}, {"tokens", "197"}, {"hidden", "768"}, {"eps", "1e-05"}, {"dres", "yes"}}};
  EXPECT_EQ(p.name(), "layernorm_dbias/cuda/bf16/bwd/shape:vit_b16.layer/batch:32/tokens:197/hidden:768/eps:1e-05/dres:yes");
  const Shape s = shape_of(p);
  EXPECT_EQ(s.rows(), 32 * 197);
  EXPECT_EQ(s.hidden, 768);
  EXPECT_TRUE(s.dres);
  const double n = 32.0 * 197 * 768;
  EXPECT_EQ(family().work(p).bytes, 4 * 2 * n + 4 * 4.0 * 768 + 2 * 4.0 * 32 * 197);
}

// The CPU plan, built once, run on two sets of caller-owned tensors in turn, with and without dres.
TEST(LayernormDbias, PlanRunsOnTheTensorsItIsGivenEachRun) {
  for (DType t : {DType::f32, DType::bf16})
    for (bool dres : {false, true}) {
      const Shape s = dbias_shape(t, 3, 23, 40, dres);
      const auto plan = make_plan(s, Backend::cpu);
      Inputs in[2] = {make_inputs(s, 1), make_inputs(s, 2)};
      Outputs out[2] = {make_outputs(s), make_outputs(s)};
      const auto check = [&](int i, int o) { return verify(s, in[i], out[o]); };
      const auto set = [&](int k) {
        out[k].dx.poison(), out[k].dgamma.poison(), out[k].dbeta.poison(), out[k].dbias.poison();
        return args_of(in[k], out[k], dres);
      };
      plan_test::expect_each_run_on_its_own_tensors(*plan, set, check, std::string(dtype_name(t)) + (dres ? " dres" : ""));
    }
}

// Without dx (a pre-LN layer's first LayerNorm) the plan writes dgamma and dbeta alone, the same bits
// as with it, and leaves dx's buffer and dbias alone.
TEST(LayernormDbias, WithoutDxOnlyDgammaAndDbeta) {
  for (DType t : {DType::f32, DType::bf16}) {
    const Shape s = dbias_shape(t, 2, 19, 33, false);
    const auto plan = make_plan(s, Backend::cpu);
    const Inputs in = make_inputs(s, 4);
    Outputs full = make_outputs(s), alone = make_outputs(s);
    plan->run(args_of(in, full, false));
    alone.dbias.poison();
    Args a = args_of(in, alone, false);
    a.dx = nullptr, a.dbias = nullptr;
    plan->run(a);
    EXPECT_EQ(0, std::memcmp(full.dgamma.data(), alone.dgamma.data(), full.dgamma.bytes())) << dtype_name(t);
    EXPECT_EQ(0, std::memcmp(full.dbeta.data(), alone.dbeta.data(), full.dbeta.bytes())) << dtype_name(t);
    EXPECT_TRUE(std::isnan(alone.dbias.get(0))) << dtype_name(t);
    a.dbias = alone.dbias.as<float>();  // dbias sums dx: refused without it
    EXPECT_THROW(plan->run(a), Error) << dtype_name(t);
  }
}

// A correct result passes; a dbias with one row left out of a column, a dbias of dy, dx without
// dres, and one wrong dx element each fail.
TEST(LayernormDbias, VerifyCatchesAMissingRowAWrongSumAMissingDresAndAWrongElement) {
  for (DType t : {DType::f32, DType::bf16}) {
    const Shape s = dbias_shape(t, 1, 97, 24, true);
    const Inputs in = make_inputs(s, 5);
    Outputs out = make_outputs(s);
    make_plan(s, Backend::cpu)->run(args_of(in, out, true));
    ASSERT_TRUE(verify(s, in, out).ok) << verify(s, in, out).message;
    const auto cols = static_cast<std::size_t>(s.hidden), rows = static_cast<std::size_t>(s.rows());
    Outputs missing = out;
    missing.dbias = plan_test::without_largest(out.dx, out.dbias, rows, cols, 5);
    EXPECT_FALSE(verify(s, in, missing).ok) << dtype_name(t);
    Outputs of_dy = out;
    of_dy.dbias = plan_test::column_sums_of(in.ln.dy, rows, cols);
    EXPECT_FALSE(verify(s, in, of_dy).ok) << dtype_name(t);
    Outputs no_dres = make_outputs(s);
    make_plan(s, Backend::cpu)->run(args_of(in, no_dres, false));
    EXPECT_FALSE(verify(s, in, no_dres).ok) << dtype_name(t);
    Outputs wrong = out;
    wrong.dx.set(7, out.dx.get(7) + 0.5);  // beyond bf16's bound, 4e-2 of rms(dx)
    EXPECT_FALSE(verify(s, in, wrong).ok) << dtype_name(t);
  }
}

#ifdef HOTOPS_HAVE_CUDA
// The CUDA plan's outputs for `in` (dx and dbias only `with_dx`), x placed `shift` elements past its
// allocation's start.
Outputs run_on_cuda(Plan& plan, const Shape& s, const Inputs& in, bool with_dx, std::size_t shift = 0) {
  const plan_test::ShiftedOnDevice x(in.ln.x, shift);
  gpu::DeviceBuffer dy(in.ln.dy), gamma(in.ln.gamma), mean(in.ln.mean), rstd(in.ln.rstd);
  gpu::DeviceBuffer res = s.dres ? gpu::DeviceBuffer(in.dres) : gpu::DeviceBuffer(1);
  gpu::DeviceBuffer dx(in.ln.dy.bytes()), dg(4 * s.hidden), db(4 * s.hidden), dbias(4 * s.hidden);
  Args a;
  a.x = x.data(), a.dy = dy.get(), a.gamma = gamma.as<float>(), a.saved_mean = mean.as<float>(), a.saved_rstd = rstd.as<float>();
  a.dres = s.dres ? res.get() : nullptr;
  a.dgamma = dg.as<float>(), a.dbeta = db.as<float>();
  if (with_dx) a.dx = dx.get(), a.dbias = dbias.as<float>();
  plan.run(a);
  Outputs out = make_outputs(s);
  dg.download(out.dgamma), db.download(out.dbeta);
  if (with_dx) dx.download(out.dx), dbias.download(out.dbias);
  return out;
}

// The CUDA plan with and without dres, then without dx (dgamma and dbeta the same bits as with it),
// on: 1067 rows of 768 (16-byte vectors, warps with unequal numbers of rows); 4736 rows of the
// widest row, 1024 (more rows than a full grid's warps: each takes several); H 100 (bf16: one
// element per access, f32: one vector per lane) and 99 (odd: one element per access) on row counts
// that leave the last block's warps part idle.
TEST(LayernormDbiasCuda, MatchesTheReferenceWithAndWithoutDresAndDx) {
  std::string why;
  if (!gpu::available(&why)) GTEST_SKIP() << why;
  struct Rows {
    std::int64_t batch, tokens, hidden;
  };
  for (const Rows& r : {Rows{11, 97, 768}, Rows{37, 128, 1024}, Rows{5, 77, 100}, Rows{3, 41, 99}})
    for (DType t : {DType::f32, DType::bf16})
      for (bool dres : {false, true}) {
        const Shape s = dbias_shape(t, r.batch, r.tokens, r.hidden, dres);
        const std::string what = std::string(dtype_name(t)) + " " + std::to_string(s.rows()) + "x" + std::to_string(s.hidden) +
                                 (dres ? " dres" : "");
        const auto plan = make_plan(s, Backend::cuda);
        const Inputs in = make_inputs(s, 3);
        const Outputs out = run_on_cuda(*plan, s, in, true);
        const Check c = verify(s, in, out);
        EXPECT_TRUE(c.ok) << what << ": " << c.message;
        const Outputs alone = run_on_cuda(*plan, s, in, false);
        EXPECT_EQ(0, std::memcmp(out.dgamma.data(), alone.dgamma.data(), out.dgamma.bytes())) << what;
        EXPECT_EQ(0, std::memcmp(out.dbeta.data(), alone.dbeta.data(), out.dbeta.bytes())) << what;
      }
}

// x one element off 16-byte alignment on a row that takes 16-byte vectors when aligned: the plan
// falls back to one element per access and still passes; run twice, the same bits (fixed-order sums).
TEST(LayernormDbiasCuda, MisalignedTensorsTakeTheElementPathAndRepeatBitForBit) {
  std::string why;
  if (!gpu::available(&why)) GTEST_SKIP() << why;
  for (DType t : {DType::f32, DType::bf16}) {
    const Shape s = dbias_shape(t, 3, 211, 768, true);
    const auto plan = make_plan(s, Backend::cuda);
    const Inputs in = make_inputs(s, 4);
    const Outputs first = run_on_cuda(*plan, s, in, true, 1), again = run_on_cuda(*plan, s, in, true, 1);
    const Check c = verify(s, in, first);
    EXPECT_TRUE(c.ok) << dtype_name(t) << ": " << c.message;
    EXPECT_EQ(0, std::memcmp(first.dx.data(), again.dx.data(), first.dx.bytes())) << dtype_name(t);
    EXPECT_EQ(0, std::memcmp(first.dbias.data(), again.dbias.data(), first.dbias.bytes())) << dtype_name(t);
    EXPECT_EQ(0, std::memcmp(first.dgamma.data(), again.dgamma.data(), first.dgamma.bytes())) << dtype_name(t);
  }
}
#endif

}  // namespace
}  // namespace hotops::layernorm::dbias
