// The embedding reference and row grouping on hand-computed values, and verification that fails
// where it must: a wrong row gathered, a gradient row added to the wrong row of dW.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <utility>

#include "hotops/cpu.h"
#include "kernels/embedding/embedding.h"
#include "test/plan_test_util.h"

namespace hotops::embedding {
namespace {

Problem test_problem(DType t, Direction d, std::int64_t vocab, std::int64_t dim, std::vector<Arg> more = {}) {
  std::vector<Arg> args{{"shape", "test"}, {"N", "3"}, {"T", "7"}, {"vocab", std::to_string(vocab)}, {"dim", std::to_string(dim)}};
  args.insert(args.end(), more.begin(), more.end());
  return Problem{"embedding", Backend::cpu, t, d, args};
}

const std::vector<Arg> kTimeMajor{{"layout", "tnc"}};

TEST(EmbeddingReference, GroupByRowKeepsPositionOrder) {
  const Csr g = group_by_row({2, 0, 2, 3, 2, 0}, 5);
  EXPECT_EQ(g.offset, (std::vector<std::int32_t>{0, 2, 2, 5, 6, 6}));
  EXPECT_EQ(g.pos, (std::vector<std::int32_t>{1, 5, 0, 2, 4, 3}));
}

// Enough indices for several threads' shares (fastText's batch 1024 has 409,600): the grouping is
// the one-thread counting sort's, on 1, 2 and 3 threads, into a Csr that held a larger batch before.
TEST(EmbeddingReference, GroupByRowOnThreadsIsTheSerialSort) {
  const std::int64_t vocab = 777;
  std::vector<std::int64_t> idx(200003);
  std::uint64_t x = 12345;
  for (auto& i : idx) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    i = static_cast<std::int64_t>((x >> 33) % (x >> 63 ? 37 : vocab));  // rows below 37 hit most often
  }
  Csr want;
  want.offset.assign(vocab + 1, 0);
  for (const std::int64_t r : idx) ++want.offset[static_cast<std::size_t>(r) + 1];
  for (std::int64_t r = 0; r < vocab; ++r) want.offset[r + 1] += want.offset[r];
  want.pos.resize(idx.size());
  std::iota(want.pos.begin(), want.pos.end(), 0);
  std::stable_sort(want.pos.begin(), want.pos.end(), [&](std::int32_t a, std::int32_t b) { return idx[a] < idx[b]; });
  Csr g = group_by_row(std::vector<std::int64_t>(300000, 5), vocab);
  for (const int threads : {1, 2, 3}) {
    cpu::ThreadScope scope(threads);
    group_by_row(idx, vocab, g);
    EXPECT_EQ(g.offset, want.offset) << threads << " threads";
    EXPECT_EQ(g.pos, want.pos) << threads << " threads";
  }
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

TEST(EmbeddingReference, TimeMajorKnownValues) {
  // 2 sequences of 3 tokens, vocab 3, dim 1: idx [b, t] = {{2, 0, 1}, {1, 1, 0}}; out row t * 2 + b.
  Shape s;
  s.batch = 2, s.T = 3, s.vocab = 3, s.dim = 1, s.time_major = true;
  Inputs in;
  in.idx = {2, 0, 1, 1, 1, 0};
  in.W = HostBuffer(DType::f32, 3);
  for (std::size_t i = 0; i < 3; ++i) in.W.set(i, 10.0 * static_cast<double>(i));
  const double want[] = {20, 10, 0, 10, 10, 0};  // (t 0: b 0, b 1), (t 1: ...), (t 2: ...)
  for (std::size_t r = 0; r < 6; ++r) EXPECT_EQ(reference_fwd(s, in, r), want[r]) << r;
  // dout row r = r + 1: dW row 0 = rows (t 1, b 0) + (t 2, b 1) = 3 + 6; row 1 = (2, 0) + (0, 1) + (1, 1) = 5 + 2 + 4.
  in.dout = HostBuffer(DType::f32, 6);
  for (std::size_t r = 0; r < 6; ++r) in.dout.set(r, static_cast<double>(r + 1));
  EXPECT_EQ(reference_bwd(s, in, {0, 1, 2}), (std::vector<double>{9, 11, 1}));
  // An f32 table's rows as bf16: rounded to nearest even.
  s.f32_table = true, s.dtype = DType::bf16;
  in.W.set(2, 1.0 + 3.0 / 512);  // between the bf16 neighbours 1 + 2/256 and 1 + 1/256, rounds up
  EXPECT_EQ(reference_fwd(s, in, 0), 1.0 + 2.0 / 256);
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

class EmbeddingVerify : public testing::TestWithParam<std::tuple<DType, Direction, int>> {};

TEST_P(EmbeddingVerify, PassesTheReferenceAndFailsAPlantedError) {
  const auto [t, d, variant] = GetParam();  // variant 1: time-major; 2: time-major from an f32 table (bf16 fwd)
  if (variant == 2 && (t != DType::bf16 || d != Direction::fwd)) GTEST_SKIP() << "table:f32 is a bf16 fwd";
  std::vector<Arg> more = variant > 0 ? kTimeMajor : std::vector<Arg>{};
  if (variant == 2) more.push_back({"table", "f32"});
  const Shape s = shape_of(test_problem(t, d, 5, 6, more));
  const Inputs in = make_inputs(s, 13);
  HostBuffer out = reference_output(s, in);
  const Check ok = verify(s, in, out);
  EXPECT_TRUE(ok.ok) << ok.message;

  HostBuffer bad = out;
  const auto dim = static_cast<std::size_t>(s.dim);
  if (d == Direction::fwd) {
    // Index 4's output row gathered from the row after its index.
    const auto wrong = static_cast<std::size_t>((in.idx[4] + 1) % s.vocab);
    const auto row = static_cast<std::size_t>(s.row_of(4));
    for (std::size_t j = 0; j < dim; ++j) bad.set(row * dim + j, in.W.get(wrong * dim + j));
  } else {
    // Index 1's dout row added to the row after its index instead.
    const auto right = static_cast<std::size_t>(in.idx[1]), wrong = (right + 1) % static_cast<std::size_t>(s.vocab);
    const auto from = static_cast<std::size_t>(s.row_of(1)) * dim;
    for (std::size_t j = 0; j < dim; ++j) {
      bad.set(right * dim + j, out.get(right * dim + j) - in.dout.get(from + j));
      bad.set(wrong * dim + j, out.get(wrong * dim + j) + in.dout.get(from + j));
    }
  }
  if (variant > 0) {
    // Batch-major rows where time-major ones are due: the gathered rows in index order, or dout read so.
    Shape batch_major = s;
    batch_major.time_major = false;
    EXPECT_FALSE(verify(s, in, reference_output(batch_major, in)).ok);
  }
  if (variant == 2) {
    // The f32 rows truncated to bf16 instead of rounded to nearest.
    HostBuffer truncated = out;
    for (std::int64_t i = 0; i < s.n(); ++i)
      for (std::size_t j = 0; j < dim; ++j) {
        const float v = static_cast<float>(in.W.get(static_cast<std::size_t>(in.idx[static_cast<std::size_t>(i)]) * dim + j));
        std::uint32_t bits;
        std::memcpy(&bits, &v, sizeof bits);
        truncated.set(static_cast<std::size_t>(s.row_of(i)) * dim + j, bf16_to_float(static_cast<std::uint16_t>(bits >> 16)));
      }
    EXPECT_FALSE(verify(s, in, truncated).ok);
  }
  EXPECT_FALSE(verify(s, in, bad).ok);
  HostBuffer poisoned = out;
  poisoned.set(out.count() - 1, std::nan(""));
  EXPECT_FALSE(verify(s, in, poisoned).ok);
}

// A gather whose output is larger than the caches streams it out a block of rows at a time (rows of
// 100 and 200 bytes, which no block boundary lines up with): every row is its index's, in order.
TEST(Embedding, StreamedGatherMatchesTheReference) {
  for (const auto& [t, batch] : {std::pair{DType::f32, 421}, std::pair{DType::bf16, 841}}) {
    const Shape s = shape_of(Problem{"embedding", Backend::cpu, t, Direction::fwd,
                                     {{"shape", "test"}, {"N", std::to_string(batch)}, {"T", "400"}, {"vocab", "20000"}, {"dim", "50"}}});
    auto plan = make_plan(s, Backend::cpu);
    EXPECT_NE(plan->label().find("streaming stores"), std::string::npos) << plan->label();
    const Inputs in = make_inputs(s, 3);
    HostBuffer out = make_output(s);
    out.poison();
    Args a;
    a.idx = in.idx.data(), a.W = in.W.data(), a.out = out.data();
    plan->run(a);
    const Check c = verify(s, in, out);
    EXPECT_TRUE(c.ok) << dtype_name(t) << ": " << c.message;
  }
}

INSTANTIATE_TEST_SUITE_P(All, EmbeddingVerify,
                         testing::Combine(testing::Values(DType::f32, DType::bf16),
                                          testing::Values(Direction::fwd, Direction::bwd), testing::Values(0, 1, 2)));

// One CPU plan per direction, run on two sets of caller-owned tensors in turn: each result is that of
// its own inputs (a plan that kept the first pointers would write the second result into the first).
TEST(Embedding, PlanRunsOnTheTensorsItIsGivenEachRun) {
  for (const auto& [d, more] : {std::pair{Direction::fwd, std::vector<Arg>{}}, std::pair{Direction::bwd, std::vector<Arg>{}},
                                std::pair{Direction::fwd, kTimeMajor}, std::pair{Direction::bwd, kTimeMajor}}) {
    const Shape s = shape_of(test_problem(DType::f32, d, 11, 6, more));
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
      } else if (s.time_major) {  // the plan groups the indices itself
        a.idx = in[k].idx.data();
        a.dout = in[k].dout.data();
        a.dW = out[k].data();
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
    plan_test::expect_each_run_on_its_own_tensors(*plan, args_of, check,
                                                  std::string(direction_name(d)) + (s.time_major ? " tnc" : ""));
  }
}

}  // namespace
}  // namespace hotops::embedding
