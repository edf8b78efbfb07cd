// The matmul reference on hand-computed values, and verification that can fail.
#include <gtest/gtest.h>

#include <cmath>

#include "kernels/matmul/matmul.h"

namespace hotops::matmul {
namespace {

Problem addmm_problem(Direction d, double alpha = 1, double beta = 1) {
  Problem p{"addmm", Backend::cpu, DType::f32, d, {{"M", "2"}, {"N", "2"}, {"K", "3"}}};
  p.args.push_back({"alpha", std::to_string(alpha)});
  p.args.push_back({"beta", std::to_string(beta)});
  return p;
}

// A = [[1,2,3],[4,5,6]], B = [[1,0],[0,1],[1,1]], bias = [10, 20], dOut = [[1,2],[3,4]]
Inputs hand_inputs(const Shape& s) {
  Inputs in = make_inputs(s, 1);
  const double a[] = {1, 2, 3, 4, 5, 6}, b[] = {1, 0, 0, 1, 1, 1}, bias[] = {10, 20}, d[] = {1, 2, 3, 4};
  if (in.a.count()) for (int i = 0; i < 6; ++i) in.a.set(i, a[i]);
  if (in.b.count()) for (int i = 0; i < 6; ++i) in.b.set(i, b[i]);
  if (in.bias.count()) for (int i = 0; i < 2; ++i) in.bias.set(i, bias[i]);
  if (in.dout.count()) for (int i = 0; i < 4; ++i) in.dout.set(i, d[i]);
  return in;
}

TEST(MatmulReference, ForwardIsPyTorchAddmm) {
  const Shape s = shape_of(addmm_problem(Direction::fwd, 0.5, 2));
  const Inputs in = hand_inputs(s);
  Outputs out = make_outputs(s);
  reference(s, in, out);
  // A.B = [[4,5],[10,11]]; 0.5 * A.B + 2 * bias
  const double want[] = {22, 42.5, 25, 45.5};
  for (int i = 0; i < 4; ++i) EXPECT_DOUBLE_EQ(out.primary.get(i), want[i]) << i;
}

TEST(MatmulReference, BackwardDataAndWeight) {
  const Shape sd = shape_of(addmm_problem(Direction::bwd_data));
  Outputs od = make_outputs(sd);
  reference(sd, hand_inputs(sd), od);
  const double da[] = {1, 2, 3, 3, 4, 7};  // dOut . B^T
  for (int i = 0; i < 6; ++i) EXPECT_DOUBLE_EQ(od.primary.get(i), da[i]) << i;

  const Shape sw = shape_of(addmm_problem(Direction::bwd_weight, 1, 3));
  Outputs ow = make_outputs(sw);
  reference(sw, hand_inputs(sw), ow);
  const double db[] = {13, 18, 17, 24, 21, 30};  // A^T . dOut
  for (int i = 0; i < 6; ++i) EXPECT_DOUBLE_EQ(ow.primary.get(i), db[i]) << i;
  EXPECT_DOUBLE_EQ(ow.dbias.get(0), 3 * (1 + 3));
  EXPECT_DOUBLE_EQ(ow.dbias.get(1), 3 * (2 + 4));
}

TEST(MatmulVerify, CatchesAWrongElementNaNAndAnUnwrittenOutput) {
  const Shape s = shape_of(addmm_problem(Direction::fwd));
  const Inputs in = make_inputs(s, 42);
  Outputs out = make_outputs(s);
  reference(s, in, out);
  EXPECT_TRUE(verify(s, in, out).ok);

  Outputs wrong = out;
  wrong.primary.set(3, wrong.primary.get(3) + 0.5);
  const Check c = verify(s, in, wrong);
  EXPECT_FALSE(c.ok);
  EXPECT_GT(c.max_err, c.tol);
  EXPECT_NE(c.message.find("index 3"), std::string::npos) << c.message;

  Outputs nan = out;
  nan.primary.set(1, std::nan(""));
  EXPECT_FALSE(verify(s, in, nan).ok);

  Outputs inf = out;
  inf.primary.set(0, INFINITY);
  EXPECT_FALSE(verify(s, in, inf).ok);

  Outputs poisoned = out;
  poisoned.primary.poison();
  EXPECT_FALSE(verify(s, in, poisoned).ok);
}

TEST(MatmulVerify, Bf16OutputRoundingPassesButATf32SizedErrorFailsF32) {
  Problem p = addmm_problem(Direction::fwd);
  p.args = {{"M", "64"}, {"N", "64"}, {"K", "256"}};
  const Shape s = shape_of(p);
  const Inputs in = make_inputs(s, 3);
  Outputs out = make_outputs(s);
  reference(s, in, out);
  // A relative error of 2^-10 on every element (what tf32 inputs give) must fail the f32 bound.
  for (std::size_t i = 0; i < out.primary.count(); ++i) out.primary.set(i, out.primary.get(i) * (1 + 1.0 / 1024));
  EXPECT_FALSE(verify(s, in, out).ok);
}

TEST(MatmulShapes, NamedShapesComeWithBatchesAndPositiveDims) {
  for (const NamedShape& ns : named_shapes()) {
    EXPECT_FALSE(ns.name.empty());
    EXPECT_GT(ns.N, 0) << ns.name;
    EXPECT_GT(ns.K, 0) << ns.name;
    if (ns.rows_per_sample > 0 || ns.heads > 0) EXPECT_FALSE(ns.batches.empty()) << ns.name;
    else EXPECT_GT(ns.M, 0) << ns.name;
  }
}

}  // namespace
}  // namespace hotops::matmul
