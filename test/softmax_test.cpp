// The softmax reference on hand-computed values, and verification that fails where it must: a
// planted error of one element, a bwd without the row sum, a written guard element.
#include <gtest/gtest.h>

#include <cmath>

#include "kernels/softmax/softmax.h"

namespace hotops::softmax {
namespace {

Problem test_problem(DType t, Direction d, std::int64_t rows, std::int64_t cols) {
  return Problem{"softmax", Backend::cpu, t, d,
                 {{"shape", "test"}, {"rows", std::to_string(rows)}, {"cols", std::to_string(cols)}}};
}

// Every output from the reference, rounded to the dtype; the guard left poisoned.
HostBuffer reference_output(const Shape& s, const Inputs& in) {
  HostBuffer out = make_output(s);
  out.poison();
  const auto cols = static_cast<std::size_t>(s.cols);
  std::vector<double> a(cols), b(cols), r(cols);
  for (std::size_t row = 0; row < static_cast<std::size_t>(s.rows); ++row) {
    const std::size_t base = row * cols;
    for (std::size_t j = 0; j < cols; ++j) {
      if (s.dir == Direction::fwd) {
        a[j] = in.x.get(base + j);
      } else {
        a[j] = in.y.get(base + j), b[j] = in.dy.get(base + j);
      }
    }
    if (s.dir == Direction::fwd) reference_fwd(a.data(), cols, r.data());
    else reference_bwd(a.data(), b.data(), cols, r.data());
    for (std::size_t j = 0; j < cols; ++j) out.set(base + j, r[j]);
  }
  return out;
}

TEST(SoftmaxReference, KnownValues) {
  // softmax(0, ln 2, ln 3) = (1, 2, 3) / 6; shifting every input changes nothing.
  const double x[3] = {100, 100 + std::log(2.0), 100 + std::log(3.0)};
  double y[3];
  reference_fwd(x, 3, y);
  EXPECT_NEAR(y[0], 1.0 / 6, 1e-15);
  EXPECT_NEAR(y[1], 2.0 / 6, 1e-15);
  EXPECT_NEAR(y[2], 3.0 / 6, 1e-15);
  // s = 1 * 0.5 + 0 * 0.25 + (-1) * 0.25 = 0.25; dx = y (dy - s) = (0.375, -0.0625, -0.3125).
  const double yy[3] = {0.5, 0.25, 0.25}, dy[3] = {1, 0, -1};
  double dx[3];
  reference_bwd(yy, dy, 3, dx);
  EXPECT_NEAR(dx[0], 0.375, 1e-15);
  EXPECT_NEAR(dx[1], -0.0625, 1e-15);
  EXPECT_NEAR(dx[2], -0.3125, 1e-15);
  // The gradient of a softmax sums to 0 over the row.
  EXPECT_NEAR(dx[0] + dx[1] + dx[2], 0, 1e-15);
}

TEST(SoftmaxInputs, BwdInputIsASoftmaxOutput) {
  const Shape s = shape_of(test_problem(DType::f32, Direction::bwd, 4, 33));
  const Inputs in = make_inputs(s, 7);
  for (std::size_t r = 0; r < 4; ++r) {
    double sum = 0;
    for (std::size_t j = 0; j < 33; ++j) {
      EXPECT_GT(in.y.get(r * 33 + j), 0);
      sum += in.y.get(r * 33 + j);
    }
    EXPECT_NEAR(sum, 1, 1e-6);
  }
}

class SoftmaxVerify : public testing::TestWithParam<std::tuple<DType, Direction, std::int64_t>> {};

TEST_P(SoftmaxVerify, PassesTheReferenceAndFailsAPlantedError) {
  const auto [t, d, cols] = GetParam();
  const Shape s = shape_of(test_problem(t, d, 5, cols));
  const Inputs in = make_inputs(s, 11);
  HostBuffer out = reference_output(s, in);
  const Check ok = verify(s, in, out);
  EXPECT_TRUE(ok.ok) << ok.message;

  // One element off by 5% of the row's largest output (well above the bf16 bound of 0.8%).
  std::size_t worst = 0;
  for (std::size_t i = 0; i < s.elements(); ++i)
    if (std::fabs(out.get(i)) > std::fabs(out.get(worst))) worst = i;
  HostBuffer bad = out;
  const std::size_t at = s.elements() / 2;
  bad.set(at, out.get(at) + 0.05 * std::fabs(out.get(worst)));
  EXPECT_FALSE(verify(s, in, bad).ok) << "a planted error passed";

  // A write past the end.
  HostBuffer guard = out;
  guard.set(s.elements(), 0);
  EXPECT_FALSE(verify(s, in, guard).ok) << "a written guard element passed";
}

INSTANTIATE_TEST_SUITE_P(Softmax, SoftmaxVerify,
                         testing::Combine(testing::Values(DType::f32, DType::bf16),
                                          testing::Values(Direction::fwd, Direction::bwd),
                                          testing::Values<std::int64_t>(5, 128, 1000)));

TEST(SoftmaxVerify, BwdWithoutTheRowSumFails) {
  for (DType t : {DType::f32, DType::bf16}) {
    const Shape s = shape_of(test_problem(t, Direction::bwd, 6, 128));
    const Inputs in = make_inputs(s, 3);
    HostBuffer out = make_output(s);
    out.poison();
    for (std::size_t i = 0; i < s.elements(); ++i) out.set(i, in.y.get(i) * in.dy.get(i));  // dx = y dy
    EXPECT_FALSE(verify(s, in, out).ok) << dtype_name(t);
  }
}

TEST(SoftmaxVerify, FwdWithoutTheNormalisationFails) {
  const Shape s = shape_of(test_problem(DType::f32, Direction::fwd, 4, 33));
  const Inputs in = make_inputs(s, 5);
  HostBuffer out = make_output(s);
  out.poison();
  for (std::size_t i = 0; i < s.elements(); ++i) out.set(i, std::exp(in.x.get(i)));  // exp without the sum
  EXPECT_FALSE(verify(s, in, out).ok);
}

TEST(SoftmaxFamily, NamesAndWork) {
  const Family& f = family();
  const auto problems = f.benchmark_problems({8});
  ASSERT_EQ(problems.size(), 3u * 8);
  const Problem& p = problems.front();
  EXPECT_EQ(p.name(), "softmax/cpu/f32/fwd/shape:bert.attn/batch:8/rows:12288/cols:128");
  const Work w = f.work(p);
  EXPECT_DOUBLE_EQ(w.bytes, 12288.0 * 128 * 4 * 2);
  EXPECT_DOUBLE_EQ(w.flops, 12288.0 * 128 * 5);
  EXPECT_DOUBLE_EQ(w.items, 8);
}

}  // namespace
}  // namespace hotops::softmax
