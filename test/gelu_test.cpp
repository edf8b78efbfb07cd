// The gelu reference on known values, verification that fails where it must, and the CUDA kernel's
// own code run on the host (its head / vector / tail indexing) where the build has CUDA; gelu_dbias's
// plans and the failures its verification must catch.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "hotops/check.h"
#include "hotops/gpu.h"
#include "kernels/gelu/gelu.h"
#include "kernels/gelu/gelu_dbias.h"
#include "test/plan_test_util.h"

namespace hotops::gelu {
namespace {

Problem flat_problem(DType t, Direction d, Approx a, std::int64_t n, std::int64_t offset = 0) {
  Problem p{"gelu", Backend::cpu, t, d, {{"shape", "flat"}, {"elements", std::to_string(n)}}};
  if (offset) p.args.push_back({"offset", std::to_string(offset)});
  p.args.push_back({"approx", approx_name(a)});
  return p;
}

// Every output element from the reference, rounded to the dtype; the rest left poisoned.
HostBuffer reference_output(const Shape& s, const Inputs& in) {
  HostBuffer out = make_output(s);
  out.poison();
  const bool bwd = s.dir == Direction::bwd;
  for (std::int64_t i = s.offset; i < s.offset + s.elements; ++i) {
    const auto k = static_cast<std::size_t>(i);
    out.set(k, reference(s.approx, s.dir, in.x.get(k), bwd ? in.dy.get(k) : 0.0));
  }
  return out;
}

TEST(GeluReference, KnownValues) {
  // gelu(x) = x * Phi(x), Phi the standard normal CDF: Phi(1) = 0.8413447460685429.
  EXPECT_NEAR(reference(Approx::none, Direction::fwd, 1, 0), 0.8413447460685429, 1e-15);
  EXPECT_NEAR(reference(Approx::none, Direction::fwd, -1, 0), -0.15865525393145707, 1e-15);
  EXPECT_NEAR(reference(Approx::none, Direction::fwd, -3, 0), -0.00404969409489031, 1e-15);
  EXPECT_NEAR(reference(Approx::tanh, Direction::fwd, 1, 0), 0.8411919906082768, 1e-15);
  EXPECT_NEAR(reference(Approx::tanh, Direction::fwd, -3, 0), -0.0036373920817729943, 1e-15);
  // gelu'(x) = Phi(x) + x phi(x); the gradient is scaled by dy.
  EXPECT_NEAR(reference(Approx::none, Direction::bwd, 1, 1), 1.0833154705876864, 1e-15);
  EXPECT_NEAR(reference(Approx::none, Direction::bwd, 2, -0.5), -0.5 * 1.085231801078197, 1e-15);
  EXPECT_DOUBLE_EQ(reference(Approx::none, Direction::bwd, 0, 1), 0.5);
  EXPECT_DOUBLE_EQ(reference(Approx::tanh, Direction::bwd, 0, 1), 0.5);
}

TEST(GeluReference, BackwardIsTheDerivativeOfForward) {
  const double h = 1e-5;
  for (Approx a : {Approx::none, Approx::tanh})
    for (double x = -6; x <= 6; x += 0.125) {
      const double numeric = (reference(a, Direction::fwd, x + h, 0) - reference(a, Direction::fwd, x - h, 0)) / (2 * h);
      EXPECT_NEAR(reference(a, Direction::bwd, x, 1), numeric, 1e-9) << approx_name(a) << " x=" << x;
    }
}

TEST(GeluShapes, NamesParseAndWorkCountsBytes) {
  const Problem p{"gelu", Backend::cuda, DType::bf16, Direction::bwd,
                  {{"shape", "bert.ffn"}, {"batch", "2"}, {"dims", "2x128x3072"}, {"approx", "tanh"}}};
  const Shape s = shape_of(p);
  EXPECT_EQ(s.elements, 2 * 128 * 3072);
  EXPECT_EQ(s.approx, Approx::tanh);
  const Work w = family().work(p);
  EXPECT_DOUBLE_EQ(w.bytes, 3.0 * 2 * s.elements);  // x, dy read, dx written, 2 bytes each
  EXPECT_DOUBLE_EQ(w.items, 2);
  EXPECT_GT(w.flops, 0);
  Problem bad = p;
  bad.args[2].value = "3x128x3072";  // dims that disagree with the batch
  EXPECT_THROW(shape_of(bad), Error);
  for (const Problem& b : family().benchmark_problems({7}))
    if (b.has("dims")) {
      EXPECT_EQ(b.get("dims").rfind("7x", 0), 0u) << b.name();
    }
}

TEST(GeluVerify, CatchesTheWrongFormulaAWrongElementAndStrayWrites) {
  const Shape s = shape_of(flat_problem(DType::f32, Direction::fwd, Approx::none, 1000, 3));
  const Inputs in = make_inputs(s, 5);
  const HostBuffer good = reference_output(s, in);
  EXPECT_TRUE(verify(s, in, good).ok);

  Shape tanh_shape = s;  // the tanh formula where erf was asked for: up to 2e-4 off relative to rms
  tanh_shape.approx = Approx::tanh;
  EXPECT_FALSE(verify(s, in, reference_output(tanh_shape, in)).ok);

  HostBuffer wrong = good;  // the largest output off by 1e-5 of itself
  std::size_t big = 0;
  for (std::size_t i = 0; i < wrong.count(); ++i)
    if (std::fabs(wrong.get(i)) > std::fabs(wrong.get(big)) || std::isnan(wrong.get(big))) big = i;
  wrong.set(big, wrong.get(big) * (1 + 1e-5));
  EXPECT_FALSE(verify(s, in, wrong).ok);

  HostBuffer unwritten = good;  // the last element left poisoned
  unwritten.set(static_cast<std::size_t>(s.offset + s.elements - 1), std::nan(""));
  EXPECT_FALSE(verify(s, in, unwritten).ok);

  for (std::size_t stray : {std::size_t(2), static_cast<std::size_t>(s.offset + s.elements)}) {
    HostBuffer over = good;
    over.set(stray, 0.0);
    const Check c = verify(s, in, over);
    EXPECT_FALSE(c.ok) << stray;
    EXPECT_NE(c.message.find("was written"), std::string::npos) << c.message;
  }
}

TEST(GeluVerify, RoundingToTheDtypePassesButAnUlpMoreFails) {
  for (DType t : {DType::bf16, DType::f16})
    for (Direction d : {Direction::fwd, Direction::bwd}) {
      const Shape s = shape_of(flat_problem(t, d, Approx::tanh, 4096));
      const Inputs in = make_inputs(s, 9);
      const HostBuffer rounded = reference_output(s, in);  // HostBuffer::set rounds to the dtype
      EXPECT_TRUE(verify(s, in, rounded).ok) << dtype_name(t);
      // The largest element 2 ulps off (rounding gives at most half of one) must fail.
      const double ulp = t == DType::bf16 ? 1.0 / 128 : 1.0 / 1024;  // relative spacing in [1, 2)
      HostBuffer off = rounded;
      std::size_t big = 0;
      for (std::size_t i = 0; i < off.count() - kGuard; ++i)
        if (std::fabs(off.get(i)) > std::fabs(off.get(big))) big = i;
      off.set(big, off.get(big) * (1 + 2 * ulp));
      EXPECT_FALSE(verify(s, in, off).ok) << dtype_name(t) << " " << direction_name(d);
    }
}

// The hand-written CPU loop's conversions against hotops' own (dtype.h): every f16, and for
// rounding every tie between neighbouring f16 / bf16 values and the f32 values next to it, plus a
// sweep over all f32 bit patterns (NaN, inf, subnormals, overflow included).
TEST(GeluCpuHotops, ConversionsMatchDtypeH) {
  auto as_float = [](std::uint32_t u) {
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  };
  auto same = [](float a, float b) { return std::memcmp(&a, &b, 4) == 0; };
  for (std::uint32_t h = 0; h < 0x10000; ++h)
    ASSERT_TRUE(same(hotops_f16_to_f32(static_cast<std::uint16_t>(h)), f16_to_float(static_cast<std::uint16_t>(h))))
        << std::hex << h;
  auto check = [&](std::uint32_t u) {
    const float f = as_float(u);
    ASSERT_EQ(hotops_f32_to_f16(f), float_to_f16(f)) << std::hex << u;
    ASSERT_EQ(hotops_f32_to_bf16(f), float_to_bf16(f)) << std::hex << u;
  };
  for (std::uint32_t h = 0; h < 0x10000; ++h)
    for (std::uint32_t delta : {0u, 1u, 0xffffffffu}) {
      if (h < 0xffff) {  // the f32 halfway between f16 h and h + 1, and its neighbours
        const float lo = f16_to_float(static_cast<std::uint16_t>(h)), hi = f16_to_float(static_cast<std::uint16_t>(h + 1));
        if (std::isfinite(lo) && std::isfinite(hi) && (h & 0x7fff) != 0x7fff) {
          float mid = 0.5f * (lo + hi);
          std::uint32_t u;
          std::memcpy(&u, &mid, 4);
          check(u + delta);
        }
      }
      check((h << 16 | 0x8000u) + delta);  // the tie between bf16 h and h + 1
    }
  for (std::uint64_t u = 0; u <= 0xffffffffull; u += 251) check(static_cast<std::uint32_t>(u));
}

TEST(GeluCpuHotops, ImplArgNamesTheOtherImplementationAndKeepsTheInputs) {
  int hotops_variants = 0;
  for (const Problem& p : family().test_problems()) {
    if (!p.has("impl")) continue;
    ++hotops_variants;
    EXPECT_EQ(p.backend, Backend::cpu) << p.name();
    EXPECT_NE(p.dtype, DType::f16) << p.name();  // f16 has one CPU implementation, the default
    const CpuImpl named = cpu_impl_of(p);
    EXPECT_EQ(p.get("impl"), named == CpuImpl::hotops ? "hotops" : "onednn") << p.name();
    Problem plain = p;
    plain.args.pop_back();
    EXPECT_NE(cpu_impl_of(plain), named) << plain.name();  // the plain name is the other one
    EXPECT_EQ(seed_without_impl(p), seed_without_impl(plain)) << p.name();  // the seed of the case's inputs
    EXPECT_EQ(seed_without_impl(plain), plain.seed());
  }
  EXPECT_GT(hotops_variants, 0);
  Problem f16 = flat_problem(DType::f16, Direction::fwd, Approx::none, 100);
  EXPECT_EQ(cpu_impl_of(f16), CpuImpl::hotops);
  Problem unknown = f16;
  unknown.args.push_back({"impl", "mkl"});
  EXPECT_THROW(cpu_impl_of(unknown), Error);
  Problem on_cuda = flat_problem(DType::f32, Direction::fwd, Approx::none, 100);
  on_cuda.backend = Backend::cuda;
  on_cuda.args.push_back({"impl", "hotops"});
  EXPECT_THROW(cpu_impl_of(on_cuda), Error);
}

// The hand-written loop on every dtype, direction and approximation, over several OpenMP chunks with
// an odd offset; its label names the clone this CPU runs.
TEST(GeluCpuHotops, MatchesTheReference) {
  for (DType t : {DType::f32, DType::bf16, DType::f16})
    for (Direction d : {Direction::fwd, Direction::bwd})
      for (Approx a : {Approx::none, Approx::tanh}) {
        Problem p = flat_problem(t, d, a, 3 * 16384 + 7, 1);
        p.args.push_back({"impl", "hotops"});
        const auto c = family().make(p);
        const Check r = c->verify();
        EXPECT_TRUE(r.ok) << p.name() << ": " << r.message;
        const std::string l = c->label();
        EXPECT_TRUE(l.find(" clone, ") != std::string::npos || l.find("AVX-512 version") != std::string::npos ||
                    l.find(" clone's results") != std::string::npos)
            << l;
      }
}

// Each CPU implementation's plan, built once, run on two pairs of caller-owned buffers in turn
// (tensors 3 elements into them): each result is that of its own input, and nothing outside the
// tensor is written.
TEST(GeluPlan, RunsOnTheBuffersItIsGivenEachRun) {
  for (CpuImpl impl : {CpuImpl::hotops, CpuImpl::onednn})
    for (DType t : {DType::f32, DType::bf16})
      for (Direction d : {Direction::fwd, Direction::bwd}) {
        Problem p = flat_problem(t, d, Approx::tanh, 3 * 16384 + 7, 3);
        p.args.push_back({"impl", cpu_impl_name(impl)});
        if (!family().unsupported_reason(p).empty()) continue;  // oneDNN without bf16 on this CPU
        const Shape s = shape_of(p);
        ASSERT_EQ(cpu_impl_of(s), impl);
        const auto plan = make_plan(s, Backend::cpu);
        const Inputs a = make_inputs(s, 1), b = make_inputs(s, 2);
        HostBuffer ya = make_output(s), yb = make_output(s);
        ya.poison(), yb.poison();
        const bool bwd = d == Direction::bwd;
        plan->run({a.x.data(), bwd ? a.dy.data() : nullptr, ya.data()});
        plan->run({b.x.data(), bwd ? b.dy.data() : nullptr, yb.data()});
        const Check ca = verify(s, a, ya), cb = verify(s, b, yb);
        EXPECT_TRUE(ca.ok) << p.name() << ": " << ca.message;
        EXPECT_TRUE(cb.ok) << p.name() << ": " << cb.message;
        EXPECT_FALSE(verify(s, b, ya).ok) << p.name();
      }
}

// A shape filled in directly, as a model does: no impl (the dtype's default), no offset.
TEST(GeluPlan, AShapeWithoutImplRunsTheDtypesDefault) {
  Shape s;
  s.dtype = DType::bf16;
  s.elements = 1000;
  EXPECT_EQ(cpu_impl_of(s), default_cpu_impl(DType::bf16));
  const Inputs in = make_inputs(s, 7);
  HostBuffer y = make_output(s);
  y.poison();
  make_plan(s, Backend::cpu)->run({in.x.data(), nullptr, y.data()});
  const Check c = verify(s, in, y);
  EXPECT_TRUE(c.ok) << c.message;
}

// The AVX-512 version (bf16 and f16, where this CPU has AVX-512 with BF16) on every finite 16-bit
// input up to |x| = 16, fwd and gelu' (bwd with dy = 1): within one unit in the last place of the
// exact value (rounding to the dtype gives half of one, the f32 math a little more).
TEST(GeluCpuAvx512, EveryInputWithinOneUlp) {
  for (DType t : {DType::bf16, DType::f16})
    for (Direction d : {Direction::fwd, Direction::bwd})
      for (Approx a : {Approx::none, Approx::tanh}) {
        const Shape s = shape_of(flat_problem(t, d, a, 1 << 16));
        const SpanFn span = avx512_span_for(s);
        if (!span) GTEST_SKIP() << "this CPU has no AVX-512 with BF16: the portable loop runs instead";
        HostBuffer x(t, 1 << 16), dy(t, 1 << 16), out(t, 1 << 16);
        for (std::size_t i = 0; i < x.count(); ++i) {
          const std::uint16_t code = static_cast<std::uint16_t>(i);
          std::memcpy(static_cast<std::uint16_t*>(x.data()) + i, &code, 2);
          dy.set(i, 1.0);
        }
        out.poison();
        span(x.data(), dy.data(), out.data(), static_cast<std::int64_t>(x.count()));
        const double rel = t == DType::bf16 ? 1.0 / 128 : 1.0 / 1024;
        int bad = 0;
        for (std::size_t i = 0; i < x.count(); ++i) {
          const double xi = x.get(i);
          if (!std::isfinite(xi) || std::fabs(xi) > 16) continue;
          const double ref = reference(a, d, xi, 1.0), got = out.get(i);
          if (!(std::fabs(got - ref) <= rel * std::fabs(ref) + 1e-6) && ++bad <= 5)
            ADD_FAILURE() << dtype_name(t) << " " << direction_name(d) << " " << approx_name(a) << " x=" << xi
                          << " got " << got << " want " << ref;
        }
      }
}

// A table version against the code it was built from, on every 16-bit code (shuffled), fwd and bwd
// (bwd with dy = 1 and a value of each sign), over a length that leaves a masked tail and 3
// elements that must stay untouched. Bit for bit; where `nan_sign_may_differ`, a NaN result may be
// a NaN of the other sign (see cpu_hotops.cpp).
void expect_table_matches(const Shape& s, SpanFn code, SpanFn table, bool nan_sign_may_differ) {
  const std::size_t n = (1 << 16) + 5;
  for (double dy_value : {1.0, -0.6875, 3.25}) {
    HostBuffer x(s.dtype, n), dy(s.dtype, n), want(s.dtype, n), got(s.dtype, n);
    for (std::size_t i = 0; i < n; ++i) {
      const std::uint16_t c = static_cast<std::uint16_t>(i * 40503u);
      std::memcpy(static_cast<std::uint16_t*>(x.data()) + i, &c, 2);
      dy.set(i, dy_value);
    }
    want.poison();
    got.poison();
    code(x.data(), dy.data(), want.data(), static_cast<std::int64_t>(n) - 3);
    table(x.data(), dy.data(), got.data(), static_cast<std::int64_t>(n) - 3);
    int bad = 0;
    for (std::size_t i = 0; i < n; ++i) {
      const std::uint16_t w = static_cast<const std::uint16_t*>(want.data())[i];
      const std::uint16_t g = static_cast<const std::uint16_t*>(got.data())[i];
      const bool nans = nan_sign_may_differ && std::isnan(want.get(i)) && std::isnan(got.get(i));
      if (w != g && !nans && ++bad <= 5)
        ADD_FAILURE() << dtype_name(s.dtype) << " " << direction_name(s.dir) << " " << approx_name(s.approx)
                      << " dy=" << dy_value << " element " << i << ": 0x" << std::hex << w << " vs table 0x" << g
                      << std::dec;
    }
    if (s.dir == Direction::fwd) return;  // dy plays no part
  }
}

// The portable loop's table version (the bf16/f16 default on CPUs without AVX-512 BF16).
TEST(GeluCpuHotops, TableMatchesTheLoop) {
  for (DType t : {DType::bf16, DType::f16})
    for (Direction d : {Direction::fwd, Direction::bwd})
      for (Approx a : {Approx::none, Approx::tanh}) {
        const Shape s = shape_of(flat_problem(t, d, a, 8));
        ASSERT_TRUE(portable_span_for(s) && portable_table_span_for(s));
        expect_table_matches(s, portable_span_for(s), portable_table_span_for(s), true);
      }
  EXPECT_EQ(portable_table_span_for(shape_of(flat_problem(DType::f32, Direction::fwd, Approx::none, 8))), nullptr);
}

// The AVX-512 version's table (the bf16/f16 default on CPUs with AVX-512 BF16): bit for bit, NaNs too.
TEST(GeluCpuAvx512, TableMatchesTheArithmeticVersionBitForBit) {
  for (DType t : {DType::bf16, DType::f16})
    for (Direction d : {Direction::fwd, Direction::bwd})
      for (Approx a : {Approx::none, Approx::tanh}) {
        const Shape s = shape_of(flat_problem(t, d, a, 8));
        const SpanFn compute = avx512_span_for(s), table = avx512_table_span_for(s);
        if (!compute || !table) GTEST_SKIP() << "this CPU has no AVX-512 with BF16: the portable loop runs instead";
        expect_table_matches(s, compute, table, false);
      }
}

#ifdef HOTOPS_HAVE_CUDA
// The kernel's body, thread by thread on the host, on sizes and offsets that exercise every path:
// an unaligned head, whole vectors over several grid-stride rounds, and a tail.
TEST(GeluCudaKernelOnHost, HeadVectorsAndTail) {
  const std::int64_t sizes[][2] = {{1, 0}, {7, 1}, {33, 3}, {1027, 5}, {70001, 2}};
  for (DType t : {DType::f32, DType::bf16, DType::f16})
    for (Direction d : {Direction::fwd, Direction::bwd})
      for (Approx a : {Approx::none, Approx::tanh})
        for (const auto& [n, offset] : sizes)
          for (unsigned blocks : {1u, 3u}) {
            const Problem p = flat_problem(t, d, a, n, offset);
            const Shape s = shape_of(p);
            const Inputs in = make_inputs(s, p.seed());
            HostBuffer out = make_output(s);
            out.poison();
            const std::size_t off = static_cast<std::size_t>(offset) * dtype_size(t);
            run_cuda_kernel_on_host(s, static_cast<const std::byte*>(in.x.data()) + off,
                                    d == Direction::bwd ? static_cast<const std::byte*>(in.dy.data()) + off : nullptr,
                                    static_cast<std::byte*>(out.data()) + off, blocks);
            const Check c = verify(s, in, out);
            EXPECT_TRUE(c.ok) << p.name() << " blocks " << blocks << ": " << c.message;
          }
}

// x one element further into its buffer than the output: no common 16-byte boundary, so the
// kernel must fall back to scalar accesses and still be right.
TEST(GeluCudaKernelOnHost, UnequallyAlignedTensors) {
  const Problem p = flat_problem(DType::bf16, Direction::bwd, Approx::none, 1000, 2);
  const Shape s = shape_of(p);
  const Inputs in = make_inputs(s, p.seed());
  HostBuffer x(s.dtype, in.x.count() + 1), dy(s.dtype, in.dy.count() + 1);
  for (std::size_t i = 0; i < in.x.count(); ++i) x.set(i + 1, in.x.get(i)), dy.set(i + 1, in.dy.get(i));
  HostBuffer out = make_output(s);
  out.poison();
  const std::size_t e = dtype_size(s.dtype);
  run_cuda_kernel_on_host(s, static_cast<const std::byte*>(x.data()) + 3 * e,
                          static_cast<const std::byte*>(dy.data()) + 3 * e, static_cast<std::byte*>(out.data()) + 2 * e,
                          2);
  const Check c = verify(s, in, out);
  EXPECT_TRUE(c.ok) << c.message;
}
#endif

}  // namespace
}  // namespace hotops::gelu

namespace hotops::gelu::dbias {
namespace {

Shape dbias_shape(DType t, std::int64_t rows, std::int64_t cols) {
  Shape s;
  s.dtype = t, s.rows = rows, s.cols = cols;
  return s;
}

Args args_of(const Inputs& in, Outputs& out) {
  return {in.x.data(), in.dy.data(), out.dx.data(), out.dbias.as<float>()};
}

// The name a benchmark gives, and the shape it reads back: rows are the dims but the last.
TEST(GeluDbias, NameAndShape) {
  const Problem p{"gelu_dbias", Backend::cuda, DType::bf16, Direction::bwd,
                  {{"shape", "bert.ffn"}, {"batch", "32"}, {"dims", "32x128x3072"}, {"approx", "none"}}};
  EXPECT_EQ(p.name(), "gelu_dbias/cuda/bf16/bwd/shape:bert.ffn/batch:32/dims:32x128x3072/approx:none");
  const Shape s = shape_of(p);
  EXPECT_EQ(s.rows, 32 * 128);
  EXPECT_EQ(s.cols, 3072);
  EXPECT_EQ(family().work(p).bytes, 3.0 * 2 * 32 * 128 * 3072 + 4.0 * 3072);
}

// The CPU plan, built once, run on two sets of caller-owned tensors in turn, out of place and in
// place (dx over dy, as the model runs it).
TEST(GeluDbias, PlanRunsOnTheTensorsItIsGivenEachRun) {
  for (DType t : {DType::f32, DType::bf16}) {
    const Shape s = dbias_shape(t, 70, 36);
    const auto plan = make_plan(s, Backend::cpu);
    Inputs in[2] = {make_inputs(s, 1), make_inputs(s, 2)};
    Outputs out[2] = {make_outputs(s), make_outputs(s)};
    const auto check = [&](int i, int o) { return verify(s, in[i], out[o]); };
    const auto set = [&](int k) {
      out[k].dx.poison(), out[k].dbias.poison();
      return args_of(in[k], out[k]);
    };
    plan_test::expect_each_run_on_its_own_tensors(*plan, set, check, dtype_name(t));
    for (int k = 0; k < 2; ++k) {  // in place: dy's buffer becomes dx
      Inputs copy = make_inputs(s, static_cast<std::uint64_t>(k + 1));
      out[k].dbias.poison();
      plan->run({copy.x.data(), copy.dy.data(), copy.dy.data(), out[k].dbias.as<float>()});
      out[k].dx = copy.dy;
      const Check c = verify(s, in[k], out[k]);
      EXPECT_TRUE(c.ok) << dtype_name(t) << " in place " << k << ": " << c.message;
    }
  }
}

// A correct result passes; one row left out of a column's sum, a sum of dy instead of dx, and one
// wrong dx element each fail.
TEST(GeluDbias, VerifyCatchesAMissingRowAWrongSumAndAWrongElement) {
  for (DType t : {DType::f32, DType::bf16}) {
    const Shape s = dbias_shape(t, 97, 24);
    const Inputs in = make_inputs(s, 5);
    Outputs out = make_outputs(s);
    make_plan(s, Backend::cpu)->run(args_of(in, out));
    ASSERT_TRUE(verify(s, in, out).ok) << verify(s, in, out).message;
    const auto rows = static_cast<std::size_t>(s.rows), cols = static_cast<std::size_t>(s.cols);
    Outputs missing = out;
    missing.dbias = plan_test::without_largest(out.dx, out.dbias, rows, cols, 5);
    EXPECT_FALSE(verify(s, in, missing).ok) << dtype_name(t);
    Outputs of_dy = out;
    of_dy.dbias = plan_test::column_sums_of(in.dy, rows, cols);
    EXPECT_FALSE(verify(s, in, of_dy).ok) << dtype_name(t);
    Outputs wrong = out;
    wrong.dx.set(7, out.dx.get(7) * 1.1 + 0.05);
    EXPECT_FALSE(verify(s, in, wrong).ok) << dtype_name(t);
  }
}

#ifdef HOTOPS_HAVE_CUDA
// The CUDA plan out of place and in place (dx over dy: the model's kernel), with a partial last block
// of rows (70 rows: 8 rows a block on an H100 or H200, 8 x 8 + 6; 4100: 16 a block there, 256 x 16 +
// 4) and more than one block of columns: on 1100 columns (bf16: 4-element vectors), 3072 (16-byte
// vectors) and 3072 with x 4 elements off 16-byte alignment (bf16: 4-element vectors again). All
// pass, in place and out of place give the same bits.
TEST(GeluDbiasCuda, InPlaceAndOutOfPlaceMatchTheReferenceAndEachOther) {
  std::string why;
  if (!gpu::available(&why)) GTEST_SKIP() << why;
  struct Case {
    std::int64_t rows, cols;
    std::size_t shift;
  };
  for (const Case& k : {Case{70, 1100, 0}, Case{70, 3072, 0}, Case{70, 3072, 4}, Case{4100, 3072, 0}})
    for (DType t : {DType::f32, DType::bf16}) {
      const std::string what = std::string(dtype_name(t)) + " rows " + std::to_string(k.rows) + " cols " +
                               std::to_string(k.cols) + (k.shift ? " x misaligned" : "");
      const Shape s = dbias_shape(t, k.rows, k.cols);
      const auto plan = make_plan(s, Backend::cuda);
      const Inputs in = make_inputs(s, 3);
      const plan_test::ShiftedOnDevice x(in.x, k.shift);
      gpu::DeviceBuffer dy(in.dy), dx(in.dy.bytes()), db0(4 * s.cols), db1(4 * s.cols);
      plan->run({x.data(), dy.get(), dx.get(), db0.as<float>()});
      Outputs apart = make_outputs(s), in_place = make_outputs(s);
      dx.download(apart.dx), db0.download(apart.dbias);
      plan->run({x.data(), dy.get(), dy.get(), db1.as<float>()});
      dy.download(in_place.dx), db1.download(in_place.dbias);
      const Check a = verify(s, in, apart), b = verify(s, in, in_place);
      EXPECT_TRUE(a.ok) << what << " out of place: " << a.message;
      EXPECT_TRUE(b.ok) << what << " in place: " << b.message;
      EXPECT_EQ(0, std::memcmp(apart.dx.data(), in_place.dx.data(), apart.dx.bytes())) << what;
      EXPECT_EQ(0, std::memcmp(apart.dbias.data(), in_place.dbias.data(), apart.dbias.bytes())) << what;
    }
}
#endif

}  // namespace
}  // namespace hotops::gelu::dbias
