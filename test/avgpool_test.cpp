// global_avgpool: the reference on hand-computed values, names and work, the plans on two sets of
// caller-owned tensors on both backends, the CPU's ncl loops, and verification that fails where it
// must: a position left out of a sum, a missing / L, one wrong element.
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "hotops/cpu.h"
#include "hotops/gpu.h"
#include "kernels/avgpool/avgpool.h"
#include "test/plan_test_util.h"

namespace hotops::avgpool {
namespace {

Shape shape(Direction d, DType t, Layout l, std::int64_t N, std::int64_t L, std::int64_t C) {
  Shape s;
  s.dir = d, s.dtype = t, s.layout = l, s.N = N, s.L = L, s.C = C;
  return s;
}

HostBuffer reference_output(const Shape& s, const Inputs& in) {
  HostBuffer out = make_output(s);
  for (std::size_t i = 0; i < out.count(); ++i)
    out.set(i, s.dir == Direction::fwd ? reference_fwd(s, in.x, i) : reference_bwd(s, in.dy, i));
  return out;
}

// x = [[1, 2, 3], [5, 6, 7]] as [L = 2, C = 3] (nlc) and the same numbers read as [C = 3, L = 2] (ncl).
TEST(GlobalAvgpoolReference, KnownValues) {
  for (Layout l : {Layout::nlc, Layout::ncl}) {
    const Shape s = shape(Direction::fwd, DType::f32, l, 1, 2, 3);
    Inputs in = make_inputs(s, 1);
    const double x[] = {1, 2, 3, 5, 6, 7};
    for (std::size_t i = 0; i < 6; ++i) in.x.set(i, x[i]);
    const double want_nlc[] = {3, 4, 5}, want_ncl[] = {1.5, 4, 6.5};
    for (std::size_t c = 0; c < 3; ++c)
      EXPECT_DOUBLE_EQ(reference_fwd(s, in.x, c), l == Layout::nlc ? want_nlc[c] : want_ncl[c]) << c;
    Shape b = s;
    b.dir = Direction::bwd;
    Inputs g = make_inputs(b, 1);
    for (std::size_t c = 0; c < 3; ++c) g.dy.set(c, 2.0 * static_cast<double>(c + 1));  // dy = [2, 4, 6]
    const double dx_nlc[] = {1, 2, 3, 1, 2, 3}, dx_ncl[] = {1, 1, 2, 2, 3, 3};
    for (std::size_t i = 0; i < 6; ++i)
      EXPECT_DOUBLE_EQ(reference_bwd(b, g.dy, i), l == Layout::nlc ? dx_nlc[i] : dx_ncl[i]) << i;
  }
}

TEST(GlobalAvgpoolFamily, NamesShapesAndWork) {
  const auto problems = family().benchmark_problems({});
  bool fasttext = false, nchw = false;
  for (const Problem& p : problems) {
    fasttext |= p.name() == "global_avgpool/cuda/bf16/bwd/shape:fasttext_imdb/batch:32/L:400/C:50/layout:nlc";
    nchw |= p.name() == "global_avgpool/cpu/f32/fwd/shape:resnet50.avgpool/batch:32/L:49/C:2048/layout:ncl";
  }
  EXPECT_TRUE(fasttext);
  EXPECT_TRUE(nchw);
  EXPECT_EQ(problems.size(), 3u * 8);  // fasttext in nlc, resnet50 in both: each 2 backends x 2 dtypes x 2 directions
  const Problem p{"global_avgpool", Backend::cpu, DType::bf16, Direction::fwd,
                  {{"shape", "fasttext_imdb"}, {"batch", "32"}, {"L", "400"}, {"C", "50"}, {"layout", "nlc"}}};
  const Shape s = shape_of(p);
  EXPECT_EQ(s.N, 32);
  EXPECT_EQ(s.in_elements(), 32u * 400 * 50);
  const Work w = family().work(p);
  EXPECT_DOUBLE_EQ(w.bytes, 2.0 * (32 * 400 * 50 + 32 * 50));
  EXPECT_DOUBLE_EQ(w.flops, 32.0 * 400 * 50);
  EXPECT_DOUBLE_EQ(w.items, 32);
  Problem bad = p;
  bad.args.back().value = "nhwc";
  EXPECT_THROW(shape_of(bad), Error);
  bad = p;
  bad.dir = Direction::bwd_data;
  EXPECT_THROW(shape_of(bad), Error);
}

TEST(GlobalAvgpoolVerify, CatchesADroppedPositionAMissingMeanAndAWrongElement) {
  for (DType t : {DType::f32, DType::bf16})
    for (Layout l : {Layout::nlc, Layout::ncl}) {
      const Shape s = shape(Direction::fwd, t, l, 2, 400, 50);
      const Inputs in = make_inputs(s, 3);
      HostBuffer out = reference_output(s, in);
      ASSERT_TRUE(verify(s, in, out).ok) << verify(s, in, out).message;
      HostBuffer dropped = out;  // (0, 7) without its last position
      dropped.set(7, out.get(7) - in.x.get(s.x_at(0, 399, 7)) / 400);
      EXPECT_FALSE(verify(s, in, dropped).ok) << dtype_name(t);
      HostBuffer sum = out;
      for (std::size_t i = 0; i < sum.count(); ++i) sum.set(i, out.get(i) * 400);
      EXPECT_FALSE(verify(s, in, sum).ok) << dtype_name(t);

      const Shape b = shape(Direction::bwd, t, l, 2, 400, 50);
      const Inputs g = make_inputs(b, 3);
      HostBuffer dx = reference_output(b, g);
      ASSERT_TRUE(verify(b, g, dx).ok) << verify(b, g, dx).message;
      HostBuffer wrong = dx;
      wrong.set(123, dx.get(123) * 1.02);
      EXPECT_FALSE(verify(b, g, wrong).ok) << dtype_name(t);
      HostBuffer unscaled = dx;
      for (std::size_t i = 0; i < dx.count(); ++i) unscaled.set(i, dx.get(i) * 400);
      EXPECT_FALSE(verify(b, g, unscaled).ok) << dtype_name(t);
    }
}

// The plan, built once, run on two sets of caller-owned tensors in turn (device memory on CUDA):
// each result is that of its own inputs. Both directions, layouts and dtypes, at fasttext's pool.
void expect_plan_runs_on_given_tensors(Backend backend) {
  for (DType t : {DType::f32, DType::bf16})
    for (Layout l : {Layout::nlc, Layout::ncl})
      for (Direction d : {Direction::fwd, Direction::bwd}) {
        const Shape s = shape(d, t, l, 3, 400, 50);
        const Problem p{"global_avgpool", Backend::cpu, t, d,
                        {{"shape", "test"}, {"N", "3"}, {"L", "400"}, {"C", "50"}, {"layout", "nlc"}}};
        if (backend == Backend::cpu && !onednn_unsupported_reason(p).empty()) continue;
        const std::string what = std::string(dtype_name(t)) + " " + direction_name(d) + (l == Layout::nlc ? " nlc" : " ncl");
        const auto plan = make_plan(s, backend);
        const Inputs in[2] = {make_inputs(s, 1), make_inputs(s, 2)};
        HostBuffer out[2] = {make_output(s), make_output(s)};
        gpu::DeviceBuffer dev_in[2], dev_out[2];
        const auto args_of = [&](int k) {
          out[k].poison();
          const HostBuffer& input = d == Direction::fwd ? in[k].x : in[k].dy;
          Args a;
          const void* x = input.data();
          void* o = out[k].data();
          if (backend == Backend::cuda) {
            dev_in[k] = gpu::DeviceBuffer(input), dev_out[k] = gpu::DeviceBuffer(out[k]);
            x = dev_in[k].get(), o = dev_out[k].get();
          }
          (d == Direction::fwd ? a.x : a.dy) = x;
          a.out = o;
          return a;
        };
        const auto check = [&](int i, int o) {
          if (backend == Backend::cuda) dev_out[o].download(out[o]);
          return verify(s, in[i], out[o]);
        };
        plan_test::expect_each_run_on_its_own_tensors(*plan, args_of, check, what);
      }
}

HOTOPS_PLAN_TESTS(GlobalAvgpool, PlanRunsOnTheTensorsItIsGiven, expect_plan_runs_on_given_tensors)

// The CPU plan of the ncl layout: hotops' loops where oneDNN's implementation is its simple one (the
// label names it), oneDNN's otherwise (where oneDNN has the dtype on this CPU); and the loops
// themselves, in both dtypes whatever oneDNN has, against the reference at the thread counts that
// split the rows unevenly (1, 2, 3).
TEST(GlobalAvgpoolCpu, NclTakesTheLoopsWhereOneDnnIsSimple) {
  for (DType t : {DType::f32, DType::bf16})
    for (Direction d : {Direction::fwd, Direction::bwd}) {
      const Problem p{"global_avgpool", Backend::cpu, t, d,
                      {{"shape", "test"}, {"N", "5"}, {"L", "49"}, {"C", "7"}, {"layout", "ncl"}}};
      const Shape s = shape_of(p);
      const std::string what = std::string(dtype_name(t)) + " " + direction_name(d);
      if (onednn_unsupported_reason(p).empty()) {
        const std::string label = make_plan(s, Backend::cpu)->label();
        if (label.rfind("hotops", 0) == 0) EXPECT_NE(label.find("offers only simple"), std::string::npos) << what << ": " << label;
        else EXPECT_EQ(label.find("simple"), std::string::npos) << what << ": " << label;
      }
      const Inputs in = make_inputs(s, 4);
      for (int threads : {1, 2, 3}) {
        const cpu::ThreadScope scope(threads);
        HostBuffer out = make_output(s);
        out.poison();
        Args a;
        (d == Direction::fwd ? a.x : a.dy) = (d == Direction::fwd ? in.x : in.dy).data();
        a.out = out.data();
        make_cpu_loops_plan(s, "simple_nchw:any")->run(a);
        const Check c = verify(s, in, out);
        EXPECT_TRUE(c.ok) << what << " on " << threads << " threads: " << c.message;
      }
    }
}

}  // namespace
}  // namespace hotops::avgpool
