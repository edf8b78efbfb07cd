// The maxpool reference on hand-computed values, tie-free inputs, and verification that fails
// where it must: a planted error in y, a gradient routed to the wrong element of its window.
#include <gtest/gtest.h>

#include <cmath>
#include <set>

#include "hotops/cpu.h"
#include "kernels/maxpool/cpu_onednn.h"
#include "kernels/maxpool/maxpool.h"

namespace hotops::maxpool {
namespace {

Problem test_problem(DType t, Direction d, std::int64_t H, std::int64_t W, std::int64_t k, std::int64_t s,
                     std::int64_t pad, const char* layout) {
  return Problem{"maxpool", Backend::cpu, t, d,
                 {{"shape", "test"}, {"N", "2"}, {"C", "3"}, {"H", std::to_string(H)}, {"W", std::to_string(W)},
                  {"k", std::to_string(k)}, {"s", std::to_string(s)}, {"pad", std::to_string(pad)},
                  {"layout", layout}}};
}

// Every output from the reference, rounded to the dtype.
HostBuffer reference_output(const Shape& s, const Inputs& in) {
  HostBuffer out = make_output(s);
  for (std::size_t i = 0; i < out.count(); ++i)
    out.set(i, s.dir == Direction::fwd ? reference_fwd(s, in.x, i) : reference_bwd(s, in.x, in.dy, i));
  return out;
}

TEST(MaxpoolReference, KnownValues) {
  // One 4x5 plane, 2x2 stride 2 (the last column falls in no window):
  //   1  5  2  0  9
  //   3  4  8  7  9
  //   6  0  1  2  9
  //   2  9  3  4  9      y = [[5, 8], [9, 4]]
  Problem p = test_problem(DType::f32, Direction::bwd, 4, 5, 2, 2, 0, "nchw");
  p.args[1].value = "1", p.args[2].value = "1";  // N = C = 1
  const Shape s = shape_of(p);
  ASSERT_EQ(s.OH(), 2);
  ASSERT_EQ(s.OW(), 2);
  Inputs in;
  in.x = HostBuffer(DType::f32, 20);
  const double x[20] = {1, 5, 2, 0, 9, 3, 4, 8, 7, 9, 6, 0, 1, 2, 9, 2, 9, 3, 4, 9};
  for (std::size_t i = 0; i < 20; ++i) in.x.set(i, x[i]);
  EXPECT_EQ(reference_fwd(s, in.x, 0), 5);
  EXPECT_EQ(reference_fwd(s, in.x, 1), 8);
  EXPECT_EQ(reference_fwd(s, in.x, 2), 9);
  EXPECT_EQ(reference_fwd(s, in.x, 3), 4);
  in.dy = HostBuffer(DType::f32, 4);
  for (std::size_t i = 0; i < 4; ++i) in.dy.set(i, 10.0 * static_cast<double>(i + 1));
  // dx: dy lands on each window's argmax (positions 1, 7, 16, 18), zero elsewhere and in column 4.
  for (std::size_t i = 0; i < 20; ++i) {
    const double want = i == 1 ? 10 : i == 7 ? 20 : i == 16 ? 30 : i == 18 ? 40 : 0;
    EXPECT_EQ(reference_bwd(s, in.x, in.dy, i), want) << i;
  }
}

TEST(MaxpoolReference, OverlappingWindowsSumTheirGradients) {
  // 3x3 stride 2 padding 1 on a 3x3 plane whose centre is the max: all four windows pick it.
  Problem p = test_problem(DType::f32, Direction::bwd, 3, 3, 3, 2, 1, "nhwc");
  p.args[1].value = "1", p.args[2].value = "1";
  const Shape s = shape_of(p);
  ASSERT_EQ(s.OH(), 2);
  Inputs in;
  in.x = HostBuffer(DType::f32, 9);
  for (std::size_t i = 0; i < 9; ++i) in.x.set(i, i == 4 ? 100.0 : static_cast<double>(i));
  in.dy = HostBuffer(DType::f32, 4);
  for (std::size_t i = 0; i < 4; ++i) in.dy.set(i, 1.0 + static_cast<double>(i));
  EXPECT_EQ(reference_bwd(s, in.x, in.dy, 4), 1 + 2 + 3 + 4);
  EXPECT_EQ(reference_bwd(s, in.x, in.dy, 0), 0);
}

TEST(MaxpoolInputs, NoTiesInAnyWindow) {
  for (DType t : {DType::f32, DType::bf16}) {
    const Shape s = shape_of(test_problem(t, Direction::fwd, 9, 7, 3, 2, 1, "nhwc"));
    const Inputs in = make_inputs(s, 5);
    for (std::int64_t n = 0; n < s.N; ++n)
      for (std::int64_t c = 0; c < s.C; ++c)
        for (std::int64_t oh = 0; oh < s.OH(); ++oh)
          for (std::int64_t ow = 0; ow < s.OW(); ++ow) {
            std::set<double> seen;
            int count = 0;
            for (std::int64_t i = 0; i < s.k; ++i)
              for (std::int64_t j = 0; j < s.k; ++j) {
                const std::int64_t h = oh * s.s - s.pad + i, w = ow * s.s - s.pad + j;
                if (h < 0 || h >= s.H || w < 0 || w >= s.W) continue;
                seen.insert(in.x.get(s.offset(n, c, h, w, s.H, s.W)));
                ++count;
              }
            EXPECT_EQ(static_cast<int>(seen.size()), count);
          }
  }
}

class MaxpoolVerify : public testing::TestWithParam<std::tuple<DType, Direction, const char*>> {};

TEST_P(MaxpoolVerify, PassesTheReferenceAndFailsAPlantedError) {
  const auto [t, d, layout] = GetParam();
  const Shape s = shape_of(test_problem(t, d, 9, 7, 3, 2, 1, layout));
  const Inputs in = make_inputs(s, 11);
  HostBuffer out = reference_output(s, in);
  const Check ok = verify(s, in, out);
  EXPECT_TRUE(ok.ok) << ok.message;

  if (d == Direction::fwd) {
    // The second largest of a window instead of its max: off by one step of x's grid.
    HostBuffer bad = out;
    bad.set(5, out.get(5) - (t == DType::bf16 ? 1.0 / 128 : 1.0 / (1 << 21)));
    EXPECT_FALSE(verify(s, in, bad).ok);
  } else {
    // One window's gradient moved from its argmax to a neighbour.
    std::size_t from = 0;
    while (out.get(from) == 0) ++from;
    const std::size_t to = from + (s.layout == Layout::nchw ? 1 : static_cast<std::size_t>(s.C));
    HostBuffer bad = out;
    bad.set(to, out.get(to) + out.get(from));
    bad.set(from, 0);
    EXPECT_FALSE(verify(s, in, bad).ok);
  }
  HostBuffer poisoned = out;
  poisoned.set(out.count() - 1, std::nan(""));
  EXPECT_FALSE(verify(s, in, poisoned).ok);
}

// A model's use of the CPU plans: the forward writes y and its workspace into caller-owned buffers,
// the backward reads that workspace; run on two sets of buffers in turn, each result is that of its
// own inputs.
// A model's inference pool: forward_inference on x in a blocked layout a conv picked (nChw8c), y
// written in NHWC (the plan reorders its own output) or in the layout the pool picks; both match the
// reference once read back in NHWC.
TEST(MaxpoolPlan, InferenceOnOneDnnLayouts) {
  using dnnl::memory;
  const Problem p = test_problem(DType::f32, Direction::fwd, 9, 8, 2, 2, 0, "nhwc");
  if (!family().unsupported_reason(p).empty()) GTEST_SKIP() << family().unsupported_reason(p);
  Shape s = shape_of(p);
  s.inference = true;
  const Inputs in = make_inputs(s, 4);
  const memory::dims xd{s.N, s.C, s.H, s.W}, yd{s.N, s.C, s.OH(), s.OW()};
  const memory::desc x8 = cpu::md(xd, s.dtype, memory::format_tag::nChw8c), y_nhwc = cpu::md(yd, s.dtype, memory::format_tag::nhwc);
  HostBuffer x(s.dtype, x8.get_size() / 4);
  cpu::reorder(cpu::mem(cpu::md(xd, s.dtype, memory::format_tag::nhwc), const_cast<void*>(in.x.data())), cpu::mem(x8, x.data()));
  for (bool own : {false, true}) {
    auto plan = make_cpu_plan(s, x8, own ? cpu::md(yd, s.dtype, memory::format_tag::any) : y_nhwc);
    EXPECT_NE(plan->label().find("forward_inference"), std::string::npos) << plan->label();
    const memory::desc yl = onednn_y_desc(*plan);
    EXPECT_EQ(own, yl != y_nhwc) << plan->label();
    HostBuffer y(s.dtype, yl.get_size() / 4);
    y.poison();
    plan->run(Args{x.data(), nullptr, nullptr, y.data(), nullptr});
    HostBuffer out = make_output(s);
    cpu::reorder(cpu::mem(yl, y.data()), cpu::mem(y_nhwc, out.data()));
    const Check c = verify(s, in, out);
    EXPECT_TRUE(c.ok) << (own ? "the pool's layout: " : "NHWC: ") << c.message;
  }
}

TEST(MaxpoolPlan, RunsOnTheBuffersItIsGivenEachRun) {
  const Problem p = test_problem(DType::f32, Direction::bwd, 9, 7, 3, 2, 1, "nhwc");
  if (!family().unsupported_reason(p).empty()) GTEST_SKIP() << family().unsupported_reason(p);
  const Shape bwd = shape_of(p);
  Shape fwd = bwd;
  fwd.dir = Direction::fwd;
  auto forward = make_plan(fwd, Backend::cpu), backward = make_plan(bwd, Backend::cpu);
  struct Buffers {
    Inputs in;
    HostBuffer y, dx, workspace;
  };
  const auto buffers = [&](std::uint64_t seed) {
    Buffers b{make_inputs(bwd, seed), make_output(fwd), make_output(bwd),
              HostBuffer(DType::f32, (cpu_workspace_bytes(fwd) + 3) / 4)};
    b.y.poison(), b.dx.poison();
    return b;
  };
  Buffers a = buffers(1), b = buffers(2);
  for (Buffers* t : {&a, &b}) forward->run(Args{t->in.x.data(), nullptr, nullptr, t->y.data(), t->workspace.data()});
  for (Buffers* t : {&a, &b})
    backward->run(Args{nullptr, nullptr, t->in.dy.data(), t->dx.data(), t->workspace.data()});
  for (Buffers* t : {&a, &b}) {
    const Check y = verify(fwd, Inputs{t->in.x, {}}, t->y), dx = verify(bwd, t->in, t->dx);
    EXPECT_TRUE(y.ok) << y.message;
    EXPECT_TRUE(dx.ok) << dx.message;
  }
  EXPECT_FALSE(verify(bwd, b.in, a.dx).ok);
}

INSTANTIATE_TEST_SUITE_P(All, MaxpoolVerify,
                         testing::Combine(testing::Values(DType::f32, DType::bf16),
                                          testing::Values(Direction::fwd, Direction::bwd),
                                          testing::Values("nchw", "nhwc")));

}  // namespace
}  // namespace hotops::maxpool
