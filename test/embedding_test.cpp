// The embedding reference and row grouping on hand-computed values, and verification that fails
// where it must: a wrong row gathered, a gradient row added to the wrong row of dW.
#include <gtest/gtest.h>

#include <cmath>

#include "kernels/embedding/embedding.h"
#include "test/plan_test_util.h"

namespace hotops::embedding {
namespace {

Problem test_problem(DType t, Direction d, std::int64_t vocab, std::int64_t dim) {
  return Problem{"embedding", Backend::cpu, t, d,
                 {{"shape", "test"}, {"N", "3"}, {"T", "7"}, {"vocab", std::to_string(vocab)},
                  {"dim", std::to_string(dim)}}};
}

TEST(EmbeddingReference, GroupByRowKeepsPositionOrder) {
  const Csr g = group_by_row({2, 0, 2, 3, 2, 0}, 5);
  EXPECT_EQ(g.offset, (std::vector<std::int32_t>{0, 2, 2, 5, 6, 6}));
  EXPECT_EQ(g.pos, (std::vector<std::int32_t>{1, 5, 0, 2, 4, 3}));
}

TEST(EmbeddingReference, KnownValues) {
  // vocab 3, dim 2, indices (2, 0, 2).
  Shape s;
  s.batch = 1, s.T = 3, s.vocab = 3, s.dim = 2;
  Inputs in;
  in.idx = {2, 0, 2};
  in.W = HostBuffer(DType::f32, 6);
  for (std::size_t i = 0; i < 6; ++i) in.W.set(i, static_cast<double>(i));  // row r = (2r, 2r + 1)
  EXPECT_EQ(reference_fwd(s, in, 0), 4);
  EXPECT_EQ(reference_fwd(s, in, 1), 5);
  EXPECT_EQ(reference_fwd(s, in, 2), 0);
  EXPECT_EQ(reference_fwd(s, in, 5), 5);
  in.dout = HostBuffer(DType::f32, 6);
  for (std::size_t i = 0; i < 6; ++i) in.dout.set(i, static_cast<double>(10 * (i + 1)));
  // dW row 0 = dout row 1 = (30, 40); row 1 = 0; row 2 = dout rows 0 + 2 = (10 + 50, 20 + 60).
  const std::vector<double> ref = reference_bwd(s, in, {0, 1, 2});
  EXPECT_EQ(ref, (std::vector<double>{30, 40, 0, 0, 60, 80}));
}

// The right answer for every element: fwd by gathering, bwd by the reference over every row.
HostBuffer reference_output(const Shape& s, const Inputs& in) {
  HostBuffer out = make_output(s);
  if (s.dir == Direction::fwd) {
    for (std::size_t i = 0; i < out.count(); ++i) out.set(i, reference_fwd(s, in, i));
    return out;
  }
  std::vector<std::size_t> rows(static_cast<std::size_t>(s.vocab));
  for (std::size_t r = 0; r < rows.size(); ++r) rows[r] = r;
  const std::vector<double> ref = reference_bwd(s, in, rows);
  for (std::size_t i = 0; i < out.count(); ++i) out.set(i, ref[i]);
  return out;
}

class EmbeddingVerify : public testing::TestWithParam<std::tuple<DType, Direction>> {};

TEST_P(EmbeddingVerify, PassesTheReferenceAndFailsAPlantedError) {
  const auto [t, d] = GetParam();
  const Shape s = shape_of(test_problem(t, d, 5, 6));
  const Inputs in = make_inputs(s, 13);
  HostBuffer out = reference_output(s, in);
  const Check ok = verify(s, in, out);
  EXPECT_TRUE(ok.ok) << ok.message;

  HostBuffer bad = out;
  const auto dim = static_cast<std::size_t>(s.dim);
  if (d == Direction::fwd) {
    // Output row 4 gathered from the row after its index.
    const auto wrong = static_cast<std::size_t>((in.idx[4] + 1) % s.vocab);
    for (std::size_t j = 0; j < dim; ++j) bad.set(4 * dim + j, in.W.get(wrong * dim + j));
  } else {
    // dout row 0 added to the row after its index instead.
    const auto right = static_cast<std::size_t>(in.idx[0]), wrong = (right + 1) % static_cast<std::size_t>(s.vocab);
    for (std::size_t j = 0; j < dim; ++j) {
      bad.set(right * dim + j, out.get(right * dim + j) - in.dout.get(j));
      bad.set(wrong * dim + j, out.get(wrong * dim + j) + in.dout.get(j));
    }
  }
  EXPECT_FALSE(verify(s, in, bad).ok);
  HostBuffer poisoned = out;
  poisoned.set(out.count() - 1, std::nan(""));
  EXPECT_FALSE(verify(s, in, poisoned).ok);
}

INSTANTIATE_TEST_SUITE_P(All, EmbeddingVerify,
                         testing::Combine(testing::Values(DType::f32, DType::bf16),
                                          testing::Values(Direction::fwd, Direction::bwd)));

// One CPU plan per direction, run on two sets of caller-owned tensors in turn: each result is that of
// its own inputs (a plan that kept the first pointers would write the second result into the first).
TEST(Embedding, PlanRunsOnTheTensorsItIsGivenEachRun) {
  for (Direction d : {Direction::fwd, Direction::bwd}) {
    const Shape s = shape_of(test_problem(DType::f32, d, 11, 6));
    auto plan = make_plan(s, Backend::cpu);
    Inputs in[2] = {make_inputs(s, 1), make_inputs(s, 2)};
    HostBuffer out[2] = {make_output(s), make_output(s)};
    Csr csr[2];
    const auto args_of = [&](int k) {
      out[k].poison();
      Args a;
      if (d == Direction::fwd) {
        a.idx = in[k].idx.data();
        a.W = in[k].W.data();
        a.out = out[k].data();
      } else {
        csr[k] = group_by_row(in[k].idx, s.vocab);
        a.offset = csr[k].offset.data();
        a.pos = csr[k].pos.data();
        a.dout = in[k].dout.data();
        a.dW = out[k].data();
      }
      return a;
    };
    const auto check = [&](int i, int o) { return verify(s, in[i], out[o]); };
    plan_test::expect_each_run_on_its_own_tensors(*plan, args_of, check, direction_name(d));
  }
}

}  // namespace
}  // namespace hotops::embedding
