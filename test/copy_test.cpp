// The copy family: hand-computed layout indices and bf16 rounding, names, work, exact checks that
// fail on a planted error, and the plans on buffers their caller owns.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <set>

#include "hotops/check.h"
#include "kernels/copy/copy.h"
#include "test/plan_test_util.h"

namespace hotops::copy {
namespace {

Problem layout_problem(const std::string& kind, DType t = DType::f32) {
  return Problem{"copy", Backend::cpu, t, Direction::fwd,
                 {{"kind", kind}, {"batch", "2"}, {"C", "3"}, {"H", "2"}, {"W", "2"}}};
}

Problem convert_problem(const std::string& kind, DType t, int elements) {
  return Problem{"copy", Backend::cpu, t, Direction::fwd, {{"kind", kind}, {"elements", std::to_string(elements)}}};
}

TEST(CopyReference, LayoutIndicesByHand) {
  // [N=2, C=3, H=2, W=2]; NCHW offset of (n,c,h,w) = ((n*3 + c)*2 + h)*2 + w, NHWC = ((n*2 + h)*2 + w)*3 + c.
  const Shape to_nhwc = shape_of(layout_problem("nchw_to_nhwc"));
  EXPECT_EQ(source_index(to_nhwc, 0), 0u);   // (0,0,0,0)
  EXPECT_EQ(source_index(to_nhwc, 1), 4u);   // NHWC 1 = (n0,h0,w0,c1) <- NCHW (0,1,0,0) = 4
  EXPECT_EQ(source_index(to_nhwc, 5), 9u);   // (n0,h0,w1,c2) <- 2*4 + 1 = 9
  EXPECT_EQ(source_index(to_nhwc, 13), 16u);  // (n1,h0,w0,c1) <- NCHW (1,1,0,0) = 16
  const Shape to_nchw = shape_of(layout_problem("nhwc_to_nchw"));
  EXPECT_EQ(source_index(to_nchw, 4), 1u);   // NCHW (0,1,0,0) <- NHWC (0,0,0,1) = 1
  EXPECT_EQ(source_index(to_nchw, 9), 5u);   // NCHW (0,2,0,1) <- NHWC (0,0,1,2) = 5
  // The two layouts are inverse permutations.
  for (std::size_t i = 0; i < 24; ++i) EXPECT_EQ(source_index(to_nhwc, source_index(to_nchw, i)), i);
}

TEST(CopyReference, Bf16RoundsToNearestEven) {
  const Shape s = shape_of(convert_problem("f32_to_bf16", DType::f32, 4));
  HostBuffer src(DType::f32, 4), out(DType::bf16, 4);
  // Halfway cases: 1 + 2^-8 lies between 1 (even) and 1 + 2^-7 (odd): to 1; 1 + 3*2^-8 lies between
  // 1 + 2^-7 (odd) and 1 + 2^-6 (even): to 1 + 2^-6. Just above halfway rounds up.
  const float in[] = {1.00390625f, 1.01171875f, std::nextafter(1.00390625f, 2.f), -2.5f};
  const std::uint16_t want[] = {0x3f80, 0x3f82, 0x3f81, 0xc020};
  std::memcpy(src.data(), in, sizeof in);
  reference(s, src, out);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(out.as<std::uint16_t>()[i], want[i]) << i;
  EXPECT_TRUE(verify_exact(s, src, out).ok);
}

TEST(CopyVerify, ExactCheckCatchesOneUlpAndAnUnwrittenElement) {
  const Shape s = shape_of(layout_problem("nchw_to_nhwc", DType::bf16));
  const HostBuffer src = make_source(s, 3);
  HostBuffer out(DType::bf16, s.count);
  reference(s, src, out);
  ASSERT_TRUE(verify_exact(s, src, out).ok);
  EXPECT_EQ(verify_exact(s, src, out).checked, s.count);

  out.as<std::uint16_t>()[7] ^= 1;  // one ulp
  const Check c = verify_exact(s, src, out);
  EXPECT_FALSE(c.ok);
  EXPECT_NE(c.message.find("index 7"), std::string::npos) << c.message;

  reference(s, src, out);
  out.set(20, std::nan(""));
  EXPECT_FALSE(verify_exact(s, src, out).ok);
}

TEST(CopyVerify, BitwiseCheckCatchesASignFlipAndAMissingTail) {
  HostBuffer ref(DType::f32, 1000), out(DType::f32, 1000);
  ref.fill_uniform(9, 1);
  std::memcpy(out.data(), ref.data(), ref.bytes());
  EXPECT_TRUE(verify_bitwise(out.data(), ref.data(), ref.bytes(), DType::f32).ok);
  out.set(999, -out.get(999));
  Check c = verify_bitwise(out.data(), ref.data(), ref.bytes(), DType::f32);
  EXPECT_FALSE(c.ok);
  EXPECT_NE(c.message.find("1 of 1000"), std::string::npos) << c.message;
  out.poison();
  std::memcpy(out.data(), ref.data(), ref.bytes() - 16);  // a copy that stops 4 elements short
  c = verify_bitwise(out.data(), ref.data(), ref.bytes(), DType::f32);
  EXPECT_FALSE(c.ok);
  EXPECT_NE(c.message.find("4 of 1000"), std::string::npos) << c.message;
}

TEST(CopyFamily, NamesWorkAndBackendsAgree) {
  const Family& f = family();
  const auto problems = f.benchmark_problems({});
  std::set<std::string> names;
  for (const Problem& p : problems) names.insert(p.name());
  EXPECT_EQ(names.size(), problems.size()) << "duplicate names";
  EXPECT_TRUE(names.count("copy/cpu/f32/fwd/kind:memcpy/bytes:1073741824"));
  EXPECT_TRUE(names.count("copy/cpu/bf16/fwd/kind:nhwc_to_nchw/batch:32/C:64/H:56/W:56"));
  EXPECT_TRUE(names.count("copy/cpu/f32/fwd/kind:f32_to_bf16/elements:67108864"));
  EXPECT_TRUE(names.count("copy/cpu/bf16/fwd/kind:bf16_to_f32/elements:1024"));
  // Both CPU layout implementations: the default without `impl`, the other with it.
  const CpuImpl other = default_cpu_impl(Kind::nchw_to_nhwc) == CpuImpl::hotops ? CpuImpl::onednn : CpuImpl::hotops;
  EXPECT_TRUE(names.count("copy/cpu/f32/fwd/kind:nchw_to_nhwc/batch:32/C:256/H:56/W:56"));
  EXPECT_TRUE(names.count(std::string("copy/cpu/f32/fwd/kind:nchw_to_nhwc/batch:32/C:256/H:56/W:56/impl:") +
                          impl_name(other)));
#ifdef HOTOPS_HAVE_CUDA
  EXPECT_TRUE(names.count("copy/cuda/f32/fwd/kind:h2d/host:pinned/bytes:268435456"));
  EXPECT_TRUE(names.count("copy/cuda/f32/fwd/kind:d2h/host:pageable/bytes:4096"));
  // Every CPU problem has its CUDA twin, named the same but for the backend (the CPU's second layout
  // implementation, named with `impl`, has none).
  for (const Problem& p : problems) {
    if (p.backend != Backend::cpu || p.has("impl")) continue;
    Problem q = p;
    q.backend = Backend::cuda;
    EXPECT_TRUE(names.count(q.name())) << p.name();
  }
#endif
  for (const Problem& p : problems) {
    const Work w = f.work(p);
    const Shape s = shape_of(p);
    EXPECT_EQ(w.flops, 0) << p.name();
    const double size = static_cast<double>(s.src_bytes());
    if (s.kind == Kind::h2d || s.kind == Kind::d2h) EXPECT_EQ(w.bytes, size) << p.name();  // one-way
    else if (s.kind == Kind::f32_to_bf16) EXPECT_EQ(w.bytes, size * 1.5) << p.name();
    else if (s.kind == Kind::bf16_to_f32) EXPECT_EQ(w.bytes, size * 3) << p.name();
    else EXPECT_EQ(w.bytes, 2 * size) << p.name();
    EXPECT_EQ(w.items, s.is_layout() ? static_cast<double>(s.N) : 1.0) << p.name();
  }
}

TEST(CopyFamily, ImplArgNamesTheCpuLayoutImplementationAndKeepsTheSeed) {
  const CpuImpl other = default_cpu_impl(Kind::nhwc_to_nchw) == CpuImpl::hotops ? CpuImpl::onednn : CpuImpl::hotops;
  Problem plain = layout_problem("nhwc_to_nchw", DType::bf16);
  Problem named = plain;
  named.args.push_back({"impl", impl_name(other)});
  EXPECT_EQ(cpu_impl(plain), default_cpu_impl(Kind::nhwc_to_nchw));
  EXPECT_EQ(cpu_impl(named), other);
  EXPECT_EQ(seed_without_impl(named), seed_without_impl(plain));
  EXPECT_EQ(seed_without_impl(plain), plain.seed());
  EXPECT_EQ(family().work(named).bytes, family().work(plain).bytes);

  Problem wrong = plain;
  wrong.args.push_back({"impl", "mkl"});
  EXPECT_THROW(shape_of(wrong), Error);
  wrong.args.back().value = impl_name(default_cpu_impl(Kind::nhwc_to_nchw));  // the default is named without impl
  EXPECT_THROW(shape_of(wrong), Error);
  Problem cuda = named;
  cuda.backend = Backend::cuda;
  EXPECT_THROW(shape_of(cuda), Error);
  EXPECT_THROW(shape_of(Problem{"copy", Backend::cpu, DType::f32, Direction::fwd,
                                {{"kind", "memcpy"}, {"bytes", "64"}, {"impl", "hotops"}}}),
               Error);
}

// hotops' transpose on shapes with partial tiles and partial register blocks on either axis, one
// channel or one pixel, axes shorter than a tile, and one or two threads: every element exact.
TEST(CopyTranspose, MatchesTheReferenceOnOddShapes) {
  struct Dims {
    std::int64_t N, C, H, W;
  };
  const Dims dims[] = {{1, 1, 1, 1},  {2, 3, 1, 7},  {1, 1, 5, 13},  {3, 7, 1, 1},    {2, 5, 3, 3},
                       {1, 64, 8, 8}, {2, 67, 9, 15}, {1, 130, 3, 45}, {2, 9, 33, 31}, {1, 200, 1, 3}};
  for (const Dims& d : dims)
    for (DType t : {DType::f32, DType::bf16})
      for (const char* kind : {"nchw_to_nhwc", "nhwc_to_nchw"})
        for (int threads : {1, 2}) {
          const Problem p{"copy", Backend::cpu, t, Direction::fwd,
                          {{"kind", kind}, {"batch", std::to_string(d.N)}, {"C", std::to_string(d.C)},
                           {"H", std::to_string(d.H)}, {"W", std::to_string(d.W)}}};
          const Shape s = shape_of(p);
          const HostBuffer src = make_source(s, 11);
          HostBuffer out(s.dst, s.count);
          out.poison();
          transpose_layout(s, src.data(), out.data(), threads);
          const Check c = verify_exact(s, src, out);
          EXPECT_TRUE(c.ok) << p.name() << " threads " << threads << ": " << c.message;
          EXPECT_EQ(c.checked, s.count) << p.name();
        }
}

// Each CPU plan (memcpy, both layout and both conversion implementations) run on two caller-owned
// source and destination pairs in turn: each destination is its own source copied (a plan that kept
// the first pair's pointers would write the second result into the first destination).
TEST(CopyPlan, RunsOnTheBuffersItIsGivenEachRun) {
  const Problem memcpy_problem{"copy", Backend::cpu, DType::f32, Direction::fwd, {{"kind", "memcpy"}, {"bytes", "4100"}}};
  const Problem problems[] = {memcpy_problem, layout_problem("nchw_to_nhwc", DType::bf16),
                              layout_problem("nhwc_to_nchw"), convert_problem("f32_to_bf16", DType::f32, 1003),
                              convert_problem("bf16_to_f32", DType::bf16, 1003)};
  for (const Problem& p : problems)
    for (CpuImpl impl : {CpuImpl::hotops, CpuImpl::onednn}) {
      Shape s = shape_of(p);
      if (s.is_raw() && impl == CpuImpl::onednn) continue;
      s.impl = impl;
      SCOPED_TRACE(p.name() + " " + impl_name(impl));
      const auto plan = make_plan(s, Backend::cpu);
      const HostBuffer a = make_source(s, 1), b = make_source(s, 2);
      HostBuffer ya(s.dst, s.count), yb(s.dst, s.count);
      ya.poison(), yb.poison();
      plan->run({a.data(), ya.data()});
      plan->run({b.data(), yb.data()});
      const Check ca = verify_exact(s, a, ya), cb = verify_exact(s, b, yb);
      EXPECT_TRUE(ca.ok) << ca.message;
      EXPECT_TRUE(cb.ok) << cb.message;
      EXPECT_FALSE(verify_exact(s, b, ya).ok);
    }
}

// A memcpy and a conversion a few grains of work long run on all threads, not on a smaller team than
// the last full one (hotops/cpu.h).
TEST(CopyPlan, CpuPlanKeepsTheThreadPool) {
  const cpu::ThreadScope scope(4);  // the plan takes its team when it is built
  const Problem memcpy_problem{"copy", Backend::cpu, DType::f32, Direction::fwd, {{"kind", "memcpy"}, {"bytes", "393216"}}};
  for (const Problem& p : {memcpy_problem, convert_problem("f32_to_bf16", DType::f32, 98304)}) {
    const Shape s = shape_of(p);
    const auto plan = make_plan(s, Backend::cpu);
    const HostBuffer src = make_source(s, 1);
    HostBuffer dst(s.dst, s.count);
    plan_test::expect_keeps_thread_pool([&] { plan->run({src.data(), dst.data()}); }, p.name());
  }
}

TEST(CopyTranspose, TilesCoverShortAxesWithLongerTiles) {
  const auto shape = [](std::int64_t C, std::int64_t H, std::int64_t W, const char* kind) {
    return shape_of(Problem{"copy", Backend::cpu, DType::f32, Direction::fwd,
                            {{"kind", kind}, {"batch", "1"}, {"C", std::to_string(C)}, {"H", std::to_string(H)},
                             {"W", std::to_string(W)}}});
  };
  // A tile never exceeds the matrix, and one of 3 channels spans many pixels.
  const auto [r1, k1] = transpose_tile(shape(3, 1, 7, "nchw_to_nhwc"));
  EXPECT_EQ(r1, 3);
  EXPECT_EQ(k1, 7);
  const auto [r2, k2] = transpose_tile(shape(3, 256, 256, "nchw_to_nhwc"));
  EXPECT_EQ(r2, 3);
  EXPECT_GT(k2, 256);
  const auto [r3, k3] = transpose_tile(shape(3, 256, 256, "nhwc_to_nchw"));  // [H*W, C]
  EXPECT_EQ(k3, 3);
  EXPECT_GT(r3, 256);
}

TEST(CopyFamily, IllFormedProblemsAreRejected) {
  EXPECT_THROW(shape_of(convert_problem("f32_to_bf16", DType::bf16, 8)), Error);  // dtype = source dtype
  EXPECT_THROW(shape_of(Problem{"copy", Backend::cpu, DType::f32, Direction::fwd, {{"kind", "memcpy"}, {"bytes", "6"}}}),
               Error);
  EXPECT_THROW(shape_of(Problem{"copy", Backend::cpu, DType::f32, Direction::fwd, {{"kind", "nchw_to_chwn"}}}), Error);
  EXPECT_FALSE(family().unsupported_reason(
                   Problem{"copy", Backend::cpu, DType::f32, Direction::fwd,
                           {{"kind", "h2d"}, {"host", "pinned"}, {"bytes", "4096"}}})
                   .empty());
}

}  // namespace
}  // namespace hotops::copy
