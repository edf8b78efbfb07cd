// The conv2d reference on hand-computed values, layout consistency, argument parsing, and
// verification that can fail.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "hotops/check.h"
#include "hotops/cpu.h"
#include "hotops/gpu.h"
#include "kernels/conv2d/conv2d.h"
#include "kernels/conv2d/cpu_onednn.h"
#include "test/plan_test_util.h"
#ifdef HOTOPS_HAVE_CUDA
#include "hotops/cudnn_util.h"
#include "kernels/conv2d/cuda_direct.h"
#endif

namespace hotops::conv2d {
namespace {

Problem problem(Direction d, const std::string& layout = "nchw", bool bias = true) {
  return Problem{"conv2d", Backend::cpu, DType::f32, d,
                 {{"shape", "test"}, {"batch", "1"}, {"C", "1"}, {"H", "3"}, {"W", "3"}, {"K", "1"}, {"R", "2"},
                  {"S", "2"}, {"stride", "1"}, {"pad", "0"}, {"dilation", "1"}, {"bias", bias ? "1" : "0"},
                  {"layout", layout}}};
}

// x = [[1,2,3],[4,5,6],[7,8,9]], w = [[1,0],[0,1]], b = 10, dy = [[1,2],[3,4]] (one channel each).
Inputs hand_inputs(const Shape& s) {
  Inputs in = make_inputs(s, 1);
  for (std::size_t i = 0; i < in.x.count(); ++i) in.x.set(i, static_cast<double>(i + 1));
  const double w[] = {1, 0, 0, 1}, dy[] = {1, 2, 3, 4};
  for (std::size_t i = 0; i < in.w.count(); ++i) in.w.set(i, w[i]);
  for (std::size_t i = 0; i < in.b.count(); ++i) in.b.set(i, 10);
  for (std::size_t i = 0; i < in.dy.count(); ++i) in.dy.set(i, dy[i]);
  return in;
}

TEST(Conv2dReference, ForwardIsCrossCorrelationPlusBias) {
  const Shape s = shape_of(problem(Direction::fwd));
  Outputs out = make_outputs(s);
  reference(s, hand_inputs(s), out);
  const double want[] = {1 + 5 + 10, 2 + 6 + 10, 4 + 8 + 10, 5 + 9 + 10};  // x[p,q] + x[p+1,q+1] + b
  ASSERT_EQ(out.primary.count(), 4u);
  for (int i = 0; i < 4; ++i) EXPECT_DOUBLE_EQ(out.primary.get(i), want[i]) << i;
}

TEST(Conv2dReference, BackwardDataScattersThroughTheFilter) {
  const Shape s = shape_of(problem(Direction::bwd_data));
  Outputs out = make_outputs(s);
  reference(s, hand_inputs(s), out);
  const double want[] = {1, 2, 0, 3, 5, 2, 0, 3, 4};  // dx[h,w] = dy[h,w] + dy[h-1,w-1]
  ASSERT_EQ(out.primary.count(), 9u);
  for (int i = 0; i < 9; ++i) EXPECT_DOUBLE_EQ(out.primary.get(i), want[i]) << i;
}

TEST(Conv2dReference, BackwardWeightAndBias) {
  const Shape s = shape_of(problem(Direction::bwd_weight));
  Outputs out = make_outputs(s);
  reference(s, hand_inputs(s), out);
  const double want[] = {37, 47, 67, 77};  // dw[r,s] = sum_{p,q} x[p+r,q+s] dy[p,q]
  for (int i = 0; i < 4; ++i) EXPECT_DOUBLE_EQ(out.primary.get(i), want[i]) << i;
  ASSERT_EQ(out.db.count(), 1u);
  EXPECT_DOUBLE_EQ(out.db.get(0), 10);
  EXPECT_EQ(make_outputs(shape_of(problem(Direction::bwd_weight, "nchw", false))).db.count(), 0u);
}

TEST(Conv2dShape, OutputSizeAndPerAxisArgs) {
  Problem p = problem(Direction::fwd);
  p.args = {{"shape", "t"}, {"batch", "2"}, {"C", "3"}, {"H", "11"}, {"W", "6"}, {"K", "4"}, {"R", "3"},
            {"S", "2"}, {"stride", "2x1"}, {"pad", "1x0"}, {"dilation", "1x2"}, {"bias", "0"}, {"layout", "nhwc"}};
  const Shape s = shape_of(p);
  EXPECT_EQ(s.stride_h, 2);
  EXPECT_EQ(s.stride_w, 1);
  EXPECT_EQ(s.pad_h, 1);
  EXPECT_EQ(s.pad_w, 0);
  EXPECT_EQ(s.dil_w, 2);
  EXPECT_EQ(s.P(), 6);  // (11 + 2 - 2 - 1) / 2 + 1
  EXPECT_EQ(s.Q(), 4);  // (6 - 2 - 1) / 1 + 1
  EXPECT_EQ(s.layout, Layout::nhwc);
  p.args[8].value = "two";
  EXPECT_THROW(shape_of(p), Error);
  p.args[8].value = "1";
  p.args[12].value = "chwn";
  EXPECT_THROW(shape_of(p), Error);
}

TEST(Conv2dWork, StandardFlopsAndMinimalBytes) {
  Problem p = problem(Direction::fwd, "nchw", false);
  p.args = {{"shape", "resnet50.res2_3x3"}, {"batch", "32"}, {"C", "64"}, {"H", "56"}, {"W", "56"}, {"K", "64"},
            {"R", "3"}, {"S", "3"}, {"stride", "1"}, {"pad", "1"}, {"dilation", "1"}, {"bias", "0"},
            {"layout", "nchw"}};
  const Family& f = family();
  const Work w = f.work(p);
  EXPECT_DOUBLE_EQ(w.flops, 2.0 * 32 * 64 * 64 * 9 * 56 * 56);
  EXPECT_DOUBLE_EQ(w.bytes, 4.0 * (32 * 64 * 56 * 56 * 2 + 64 * 64 * 9));
  EXPECT_DOUBLE_EQ(w.items, 32);
}

// The same random problem in NCHW and NHWC must give the same numbers once transposed: this pins
// the user-layout indexing of x, w, dy and every output.
TEST(Conv2dReference, NhwcIsNchwTransposed) {
  for (Direction d : {Direction::fwd, Direction::bwd_data, Direction::bwd_weight}) {
    Problem pc = problem(d, "nchw");
    pc.args = {{"shape", "t"}, {"batch", "2"}, {"C", "3"}, {"H", "7"}, {"W", "5"}, {"K", "4"}, {"R", "3"},
               {"S", "2"}, {"stride", "2x1"}, {"pad", "1"}, {"dilation", "1x2"}, {"bias", "1"}, {"layout", "nchw"}};
    Problem ph = pc;
    ph.args.back().value = "nhwc";
    const Shape sc = shape_of(pc), sh = shape_of(ph);
    const Inputs ic = make_inputs(sc, 5);
    Inputs ih = make_inputs(sh, 99);  // overwritten with ic's values, transposed
    const std::int64_t P = sc.P(), Q = sc.Q();
    for (std::int64_t n = 0; n < sc.N; ++n)
      for (std::int64_t c = 0; c < sc.C; ++c)
        for (std::int64_t h = 0; h < sc.H; ++h)
          for (std::int64_t w = 0; w < sc.W; ++w)
            if (ic.x.count()) ih.x.set(sh.x_at(n, c, h, w), ic.x.get(sc.x_at(n, c, h, w)));
    for (std::int64_t k = 0; k < sc.K; ++k)
      for (std::int64_t c = 0; c < sc.C; ++c)
        for (std::int64_t r = 0; r < sc.R; ++r)
          for (std::int64_t t = 0; t < sc.S; ++t)
            if (ic.w.count()) ih.w.set(sh.w_at(k, c, r, t), ic.w.get(sc.w_at(k, c, r, t)));
    for (std::int64_t n = 0; n < sc.N; ++n)
      for (std::int64_t k = 0; k < sc.K; ++k)
        for (std::int64_t p = 0; p < P; ++p)
          for (std::int64_t q = 0; q < Q; ++q)
            if (ic.dy.count()) ih.dy.set(sh.y_at(n, k, p, q), ic.dy.get(sc.y_at(n, k, p, q)));
    for (std::size_t k = 0; k < ic.b.count(); ++k) ih.b.set(k, ic.b.get(k));

    Outputs oc = make_outputs(sc), oh = make_outputs(sh);
    reference(sc, ic, oc);
    reference(sh, ih, oh);
    // Walk the output's logical coordinates and compare through each layout's offsets.
    const auto at = [&](const Shape& s, std::int64_t a, std::int64_t b, std::int64_t i, std::int64_t j) {
      return d == Direction::fwd ? s.y_at(a, b, i, j) : d == Direction::bwd_data ? s.x_at(a, b, i, j) : s.w_at(a, b, i, j);
    };
    const std::int64_t A = d == Direction::bwd_weight ? sc.K : sc.N;
    const std::int64_t B = d == Direction::fwd ? sc.K : sc.C;
    const std::int64_t I = d == Direction::fwd ? P : d == Direction::bwd_data ? sc.H : sc.R;
    const std::int64_t J = d == Direction::fwd ? Q : d == Direction::bwd_data ? sc.W : sc.S;
    for (std::int64_t a = 0; a < A; ++a)
      for (std::int64_t b = 0; b < B; ++b)
        for (std::int64_t i = 0; i < I; ++i)
          for (std::int64_t j = 0; j < J; ++j)
            ASSERT_DOUBLE_EQ(oc.primary.get(at(sc, a, b, i, j)), oh.primary.get(at(sh, a, b, i, j)))
                << direction_name(d) << " " << a << "," << b << "," << i << "," << j;
    for (std::size_t k = 0; k < oc.db.count(); ++k) EXPECT_DOUBLE_EQ(oc.db.get(k), oh.db.get(k));
  }
}

// The whole weight gradient that verify() computes in one pass (reference_weight_grads) is the
// per-element reference at every element: dense, grouped and depthwise, both layouts, with strides,
// padding and dilation.
TEST(Conv2dReference, WholeWeightGradientIsThePerElementOne) {
  struct G {
    std::int64_t C, K, groups, stride, dilation;
  };
  for (const G& g : {G{3, 5, 1, 1, 1}, G{6, 4, 2, 2, 1}, G{4, 4, 4, 1, 2}, G{3, 6, 3, 2, 1}})
    for (Layout layout : {Layout::nchw, Layout::nhwc}) {
      Shape s;
      s.dir = Direction::bwd_weight, s.layout = layout, s.bias = true;
      s.N = 3, s.C = g.C, s.H = 7, s.W = 6, s.K = g.K, s.R = 3, s.S = 2, s.groups = g.groups;
      s.stride_h = g.stride, s.dil_w = g.dilation, s.pad_h = 1, s.pad_w = 2;
      const Inputs in = make_inputs(s, 4);
      const RefData d(in);
      const WeightGrads whole = reference_weight_grads(s, d);
      const std::string what = std::string(layout == Layout::nhwc ? "nhwc" : "nchw") + " groups " + std::to_string(g.groups);
      ASSERT_EQ(whole.dw.size(), static_cast<std::size_t>(s.K * s.Cg() * s.R * s.S)) << what;
      for (std::size_t i = 0; i < whole.dw.size(); ++i)
        ASSERT_NEAR(whole.dw[i], reference_primary(s, d, i), 1e-12 * (1 + std::fabs(whole.dw[i]))) << what << " " << i;
      ASSERT_EQ(whole.db.size(), static_cast<std::size_t>(s.K)) << what;
      for (std::int64_t k = 0; k < s.K; ++k)
        ASSERT_NEAR(whole.db[static_cast<std::size_t>(k)], reference_db(s, d, k), 1e-12) << what << " " << k;
    }
}

// A grouped convolution is the dense one with a block-diagonal filter: output channel k sees only
// its group's input channels. The grouped reference (every direction, both layouts, depthwise and two
// groups of several channels, with a stride) against the dense reference on that filter.
TEST(Conv2dReference, GroupedIsDenseWithABlockDiagonalFilter) {
  struct G {
    std::int64_t C, K, groups, stride;
  };
  for (const G& g : {G{4, 4, 4, 1}, G{6, 4, 2, 2}, G{3, 6, 3, 1}})
    for (Layout layout : {Layout::nchw, Layout::nhwc})
      for (Direction d : {Direction::fwd, Direction::bwd_data, Direction::bwd_weight}) {
        Shape grouped;
        grouped.dir = d, grouped.layout = layout, grouped.bias = true;
        grouped.N = 2, grouped.C = g.C, grouped.H = 6, grouped.W = 5, grouped.K = g.K, grouped.R = 3, grouped.S = 2;
        grouped.stride_h = g.stride, grouped.pad_h = grouped.pad_w = 1, grouped.groups = g.groups;
        Shape dense = grouped;
        dense.groups = 1;
        const Inputs gi = make_inputs(grouped, 8);
        Inputs di = make_inputs(dense, 9);
        di.x = gi.x, di.b = gi.b, di.dy = gi.dy;
        const std::int64_t Kg = grouped.Kg(), Cg = grouped.Cg();
        for (std::int64_t k = 0; k < g.K; ++k)  // the dense filter: grouped's in k's group, 0 elsewhere
          for (std::int64_t c = 0; c < g.C; ++c)
            for (std::int64_t r = 0; r < 3; ++r)
              for (std::int64_t t = 0; t < 2; ++t)
                if (di.w.count())
                  di.w.set(dense.w_at(k, c, r, t),
                           c / Cg == k / Kg ? gi.w.get(grouped.w_at(k, c % Cg, r, t)) : 0.0);
        Outputs go = make_outputs(grouped), dout = make_outputs(dense);
        reference(grouped, gi, go);
        reference(dense, di, dout);
        const std::string what = std::string(direction_name(d)) + " groups " + std::to_string(g.groups);
        if (d == Direction::bwd_weight) {  // grouped's dw is the dense dw's in-group part
          ASSERT_EQ(go.primary.count(), static_cast<std::size_t>(g.K * Cg * 6)) << what;
          for (std::int64_t k = 0; k < g.K; ++k)
            for (std::int64_t c = 0; c < Cg; ++c)
              for (std::int64_t r = 0; r < 3; ++r)
                for (std::int64_t t = 0; t < 2; ++t)
                  ASSERT_DOUBLE_EQ(go.primary.get(grouped.w_at(k, c, r, t)),
                                   dout.primary.get(dense.w_at(k, k / Kg * Cg + c, r, t)))
                      << what << " " << k << "," << c << "," << r << "," << t;
          for (std::size_t k = 0; k < go.db.count(); ++k) EXPECT_DOUBLE_EQ(go.db.get(k), dout.db.get(k)) << what;
        } else {
          ASSERT_EQ(go.primary.count(), dout.primary.count()) << what;
          for (std::size_t i = 0; i < go.primary.count(); ++i)
            ASSERT_DOUBLE_EQ(go.primary.get(i), dout.primary.get(i)) << what << " " << i;
        }
      }
}

// groups: parsed, checked to divide C and K, absent from the name at 1; the filter and the FLOPs
// shrink by the groups.
TEST(Conv2dShape, GroupsArg) {
  Problem p = problem(Direction::fwd, "nchw", false);
  p.args = {{"shape", "convnext.s1_dwconv"}, {"batch", "8"}, {"C", "96"}, {"H", "56"}, {"W", "56"}, {"K", "96"},
            {"R", "7"}, {"S", "7"}, {"stride", "1"}, {"pad", "3"}, {"dilation", "1"}, {"groups", "96"},
            {"bias", "1"}, {"layout", "nhwc"}};
  const Shape s = shape_of(p);
  EXPECT_EQ(s.groups, 96);
  EXPECT_EQ(s.Cg(), 1);
  EXPECT_EQ(s.P(), 56);
  EXPECT_EQ(make_inputs(s, 1).w.count(), 96u * 49);
  const Work w = family().work(p);
  EXPECT_DOUBLE_EQ(w.flops, 2.0 * 8 * 96 * 49 * 56 * 56 + 8.0 * 96 * 56 * 56);
  EXPECT_DOUBLE_EQ(w.bytes, 4.0 * (2 * 8 * 96 * 56 * 56 + 96 * 49 + 96));
  EXPECT_EQ(shape_of(problem(Direction::fwd)).groups, 1);
  p.args[11].value = "5";  // divides neither 96 nor 96
  EXPECT_THROW(shape_of(p), Error);
  p.args[11].value = "0";
  EXPECT_THROW(shape_of(p), Error);

  bool convnext = false;
  for (const Problem& q : family().benchmark_problems({})) {
    if (!q.has("groups")) continue;
    EXPECT_NE(q.get("groups"), "1") << q.name();
    convnext |= q.name() ==
                "conv2d/cuda/bf16/bwd_weight/shape:convnext.s3_dwconv/batch:32/C:384/H:14/W:14/K:384/R:7/S:7/stride:1/"
                "pad:3/dilation:1/groups:384/bias:1/layout:nhwc";
  }
  EXPECT_TRUE(convnext);
}

TEST(Conv2dVerify, CatchesAWrongElementNaNAndAWrongBiasGradient) {
  for (Direction d : {Direction::fwd, Direction::bwd_data, Direction::bwd_weight}) {
    const Shape s = shape_of(problem(d));
    const Inputs in = make_inputs(s, 42);
    Outputs out = make_outputs(s);
    reference(s, in, out);
    EXPECT_TRUE(verify(s, in, out).ok) << direction_name(d);
    const double v = out.primary.get(0);
    out.primary.set(0, v + 0.5);
    EXPECT_FALSE(verify(s, in, out).ok) << direction_name(d);
    out.primary.set(0, std::nan(""));
    const Check c = verify(s, in, out);
    EXPECT_FALSE(c.ok);
    EXPECT_NE(c.message.find("non-finite"), std::string::npos) << c.message;
    out.primary.set(0, v);
    if (out.db.count()) {
      out.db.set(0, out.db.get(0) + 1);
      const Check cb = verify(s, in, out);
      EXPECT_FALSE(cb.ok);
      EXPECT_NE(cb.message.find("db"), std::string::npos) << cb.message;
    }
  }
}

// The CPU case end to end (primitive, reorder back to the user's layout, compare), and a label that
// says the user-layout reorders are not timed.
TEST(Conv2dCpu, LabelNamesOneDnnAndCaseVerifies) {
  const Problem p = problem(Direction::fwd, "nhwc");
  if (!family().unsupported_reason(p).empty()) GTEST_SKIP() << family().unsupported_reason(p);
  const auto c = family().make(p);
  EXPECT_TRUE(c->verify().ok);
  EXPECT_NE(c->label().find("oneDNN convolution"), std::string::npos) << c->label();
  EXPECT_NE(c->label().find("not timed"), std::string::npos) << c->label();
}

// The sampled reference of a problem is computed once for its entries: a second case of it, and its
// CUDA entry (the same seeded inputs), take the first one's; another problem's is its own, and
// the first one's is still kept after it.
TEST(Conv2dVerify, EntriesOfOneProblemShareOneReference) {
  std::vector<Problem> problems;
  for (const Problem& p : family().test_problems())
    if (p.backend == Backend::cpu && p.dtype == DType::f32 && !p.has("relu")) problems.push_back(p);
  plan_test::expect_entries_share_one_reference(family(), problems);
}

// A model's use of the CPU plan: a Shape filled by hand, tensors in the user's layout (the run reorders
// them where oneDNN's layouts differ), run on two sets of caller-owned buffers in turn; each result is
// that of its own inputs. Every direction, with a stride and a bias, in both layouts; dense, in 4
// groups, and in 16 groups of one input channel (depthwise with two outputs a channel), f32 and bf16.
TEST(Conv2dPlan, RunsOnTheBuffersItIsGivenEachRun) {
  for (std::int64_t groups : {1, 4, 16})
  for (DType t : {DType::f32, DType::bf16})
  for (Layout layout : {Layout::nchw, Layout::nhwc})
    for (Direction d : {Direction::fwd, Direction::bwd_data, Direction::bwd_weight}) {
      Shape s;
      s.dir = d, s.dtype = t, s.layout = layout, s.bias = true, s.groups = groups;
      s.N = 2, s.C = 16, s.H = 9, s.W = 7, s.K = 32, s.R = 3, s.S = 3, s.stride_h = 2, s.pad_h = s.pad_w = 1;
      Problem p = problem(d);
      p.dtype = t;
      if (!family().unsupported_reason(p).empty()) continue;
      auto plan = make_plan(s, Backend::cpu);
      const Inputs in[2] = {make_inputs(s, 1), make_inputs(s, 2)};
      Outputs out[2] = {make_outputs(s), make_outputs(s)};
      const auto args_of = [&](int k) {
        out[k].primary.poison(), out[k].db.poison();
        return Args{in[k].x.data(), in[k].w.data(), in[k].b.data(), in[k].dy.data(), out[k].primary.data(),
                    out[k].db.data()};
      };
      const auto check = [&](int i, int o) { return verify(s, in[i], out[o]); };
      plan_test::expect_each_run_on_its_own_tensors(
          *plan, args_of, check, std::string(dtype_name(t)) + " " + direction_name(d) + " groups " + std::to_string(groups));
    }
}

// The benchmark's CPU plan takes oneDNN's own layouts: inputs reordered in by the caller, the output
// reordered back, and the run the convolution alone.
TEST(Conv2dPlan, OneDnnLayoutsRoundTrip) {
  Shape s;
  s.N = 2, s.C = 16, s.H = 8, s.W = 8, s.K = 16, s.R = 3, s.S = 3, s.pad_h = s.pad_w = 1;
  s.layout = Layout::nhwc, s.onednn_layouts = true;
  if (!family().unsupported_reason(problem(Direction::fwd)).empty()) GTEST_SKIP();
  const Inputs in = make_inputs(s, 3);
  const auto onednn = [&](const HostBuffer& user, Tensor t) {
    HostBuffer h(DType::f32, onednn_bytes(s, t) / 4);
    to_onednn_layout(s, t, user.data(), h.data());
    return h;
  };
  const HostBuffer x = onednn(in.x, Tensor::x), w = onednn(in.w, Tensor::w);
  HostBuffer y(DType::f32, onednn_bytes(s, Tensor::y) / 4);
  Outputs out = make_outputs(s);
  auto plan = make_plan(s, Backend::cpu);
  EXPECT_NE(plan->label().find("not timed"), std::string::npos) << plan->label();
  plan->run(Args{x.data(), w.data(), nullptr, nullptr, y.data(), nullptr});
  to_user_layout(s, Tensor::y, y.data(), out.primary.data());
  const Check c = verify(s, in, out);
  EXPECT_TRUE(c.ok) << c.message;
}

// A model's layer on the CPU (model_cnn's training step): the bias and a ReLU post-op, x and y fixed
// in the user's layout (the primitive takes them as they are), f32 master weights under bf16 (the run
// casts w; dw and db are written f32). Run on two sets of caller-owned buffers in turn; each result
// is that of its own inputs, and the layouts the plan reports are the fixed ones.
TEST(Conv2dPlan, ModelLayerOptionsMatchTheReference) {
  for (DType t : {DType::f32, DType::bf16})
    for (Layout layout : {Layout::nchw, Layout::nhwc})
      for (Direction d : {Direction::fwd, Direction::bwd_data, Direction::bwd_weight}) {
        Shape s;
        s.dir = d, s.dtype = t, s.layout = layout, s.bias = s.relu = s.f32_params = true;
        s.x_pick = s.y_pick = layout == Layout::nchw ? Shape::Pick::nchw : Shape::Pick::nhwc;
        s.N = 2, s.C = 16, s.H = 9, s.W = 7, s.K = 32, s.R = s.S = 3, s.pad_h = s.pad_w = 1;
        Problem p = problem(d);
        p.dtype = t;
        if (!family().unsupported_reason(p).empty()) continue;
        const std::string what = std::string(dtype_name(t)) + " " + direction_name(d);
        auto plan = make_plan(s, Backend::cpu);
        const auto tag = layout == Layout::nchw ? dnnl::memory::format_tag::nchw : dnnl::memory::format_tag::nhwc;
        EXPECT_TRUE(onednn_desc(*plan, Tensor::x) == cpu::md({s.N, s.C, s.H, s.W}, t, tag)) << what;
        EXPECT_TRUE(onednn_desc(*plan, Tensor::y) == cpu::md({s.N, s.K, s.P(), s.Q()}, t, tag)) << what;
        if (d == Direction::fwd) {
          EXPECT_NE(plan->label().find("ReLU post-op"), std::string::npos) << plan->label();
        }
        const Inputs in[2] = {make_inputs(s, 1), make_inputs(s, 2)};
        Outputs out[2] = {make_outputs(s), make_outputs(s)};
        if (t == DType::bf16 && d != Direction::bwd_data) {  // dw f32, y bf16
          EXPECT_EQ(out[0].primary.dtype() == DType::f32, d == Direction::bwd_weight) << what;
        }
        const auto args_of = [&](int k) {
          out[k].primary.poison(), out[k].db.poison();
          return Args{in[k].x.data(), in[k].w.data(), in[k].b.data(), in[k].dy.data(), out[k].primary.data(),
                      out[k].db.data()};
        };
        const auto check = [&](int i, int o) { return verify(s, in[i], out[o]); };
        plan_test::expect_each_run_on_its_own_tensors(*plan, args_of, check, what);
      }
}

// The depthwise weight-gradient loops (cpu_depthwise.cpp): the plan a wide NHWC depthwise bwd_weight
// gets, within the reference's bounds for f32 and bf16, the weights' gradients in the dtype or f32
// (f32_params), with and without db, at strides 1 and 2 and channel counts with and without a tail
// of 16 lanes, over inputs the 7x7 filter overhangs, on 1 and 3 threads (each run on its own tensors).
TEST(Conv2dCpuDepthwise, WeightGradientLoopsMatchTheReference) {
  for (const DType t : {DType::f32, DType::bf16})
    for (const bool f32_params : {false, true})
      for (const bool bias : {false, true})
        for (const auto& [C, stride, H, W] : {std::tuple{20, 1, 9, 11}, std::tuple{48, 2, 12, 10}, std::tuple{3, 1, 5, 6}})
          for (const int threads : {1, 3}) {
            Shape s;
            s.dir = Direction::bwd_weight, s.dtype = t, s.layout = Layout::nhwc, s.bias = bias, s.f32_params = f32_params;
            s.x_pick = s.y_pick = Shape::Pick::nhwc;
            s.N = 2, s.C = s.K = s.groups = C, s.H = H, s.W = W, s.R = s.S = 7, s.pad_h = s.pad_w = 3;
            s.stride_h = s.stride_w = stride;
            ASSERT_TRUE(cpu_depthwise_loops_take(s));
            cpu::ThreadScope scope(threads);
            auto plan = make_plan(s, Backend::cpu);
            const std::string what = std::string(dtype_name(t)) + (f32_params ? " f32 params" : "") +
                                     (bias ? " bias" : "") + " C " + std::to_string(C) + " stride " +
                                     std::to_string(stride) + ", " + std::to_string(threads) + " threads";
            EXPECT_NE(plan->label().find("depthwise weight-gradient loops"), std::string::npos) << plan->label();
            const Inputs in[2] = {make_inputs(s, 1), make_inputs(s, 2)};
            Outputs out[2] = {make_outputs(s), make_outputs(s)};
            const auto args_of = [&](int k) {
              out[k].primary.poison(), out[k].db.poison();
              return Args{in[k].x.data(), nullptr, nullptr, in[k].dy.data(), out[k].primary.data(),
                          out[k].db.count() ? out[k].db.data() : nullptr};
            };
            const auto check = [&](int i, int o) { return verify(s, in[i], out[o]); };
            plan_test::expect_each_run_on_its_own_tensors(*plan, args_of, check, what);
          }
  Shape narrow;  // oneDNN's own depthwise kernel takes 3 columns: the loops do not
  narrow.dir = Direction::bwd_weight, narrow.layout = Layout::nhwc, narrow.x_pick = narrow.y_pick = Shape::Pick::nhwc;
  narrow.C = narrow.K = narrow.groups = 8, narrow.H = narrow.W = 6, narrow.R = narrow.S = 3;
  EXPECT_FALSE(cpu_depthwise_loops_take(narrow));
}

// The benchmark's entry of a wide depthwise weight gradient times the loops, on the user's NHWC
// tensors, and verifies.
TEST(Conv2dCpuDepthwise, TheEntryRunsTheLoops) {
  const auto depthwise = [](const std::string& layout) {
    return Problem{"conv2d", Backend::cpu, DType::f32, Direction::bwd_weight,
                   {{"shape", "test"}, {"batch", "2"}, {"C", "16"}, {"H", "8"}, {"W", "8"}, {"K", "16"}, {"R", "7"},
                    {"S", "7"}, {"stride", "1"}, {"pad", "3"}, {"dilation", "1"}, {"groups", "16"}, {"bias", "1"},
                    {"layout", layout}}};
  };
  const Problem p = depthwise("nhwc");
  const Shape s = shape_of(p);
  EXPECT_TRUE(cpu_depthwise_loops_take(s));
  EXPECT_FALSE(s.onednn_layouts);
  EXPECT_EQ(family().unsupported_reason(p), "");
  const auto c = family().make(p);
  EXPECT_TRUE(c->verify().ok);
  EXPECT_NE(c->label().find("depthwise weight-gradient loops"), std::string::npos) << c->label();
  EXPECT_TRUE(shape_of(depthwise("nchw")).onednn_layouts) << "NCHW stays oneDNN's";
}

// A model's layer in inference: forward_inference with the bias and a ReLU, x and y in the layouts
// oneDNN picked (the caller reorders them), the weights in the user's layout and dtype f32, reordered
// (and for bf16 cast) by each run.
TEST(Conv2dPlan, InferenceInOneDnnLayoutsReordersTheUsersWeights) {
  for (DType t : {DType::f32, DType::bf16}) {
    Shape s;
    s.dtype = t, s.layout = Layout::nhwc, s.bias = s.relu = s.f32_params = true;
    s.inference = s.onednn_layouts = s.w_from_user = true;
    s.N = 2, s.C = 16, s.H = 8, s.W = 8, s.K = 16, s.R = s.S = 3, s.pad_h = s.pad_w = 1;
    Problem p = problem(Direction::fwd);
    p.dtype = t;
    if (!family().unsupported_reason(p).empty()) continue;
    auto plan = make_plan(s, Backend::cpu);
    EXPECT_NE(plan->label().find("weights reordered in the run"), std::string::npos) << plan->label();
    const Inputs in = make_inputs(s, 3);
    HostBuffer x(t, onednn_desc(*plan, Tensor::x).get_size() / dtype_size(t));
    HostBuffer y(t, onednn_desc(*plan, Tensor::y).get_size() / dtype_size(t));
    EXPECT_EQ(onednn_bytes(s, Tensor::y), y.bytes());
    to_onednn_layout(s, Tensor::x, in.x.data(), x.data());
    Outputs out = make_outputs(s);
    plan->run(Args{x.data(), in.w.data(), in.b.data(), nullptr, y.data(), nullptr});
    to_user_layout(s, Tensor::y, y.data(), out.primary.data());
    const Check c = verify(s, in, out);
    EXPECT_TRUE(c.ok) << dtype_name(t) << " " << c.message;
  }
}

// A model's inference conv whose x another primitive wrote in its own layout (here NHWC, or
// nChw16c): the plan takes x as it is, reordering it in the run where the conv picked another.
TEST(Conv2dPlan, InferenceTakesXInTheCallersLayout) {
  using dnnl::memory;
  Shape s;
  s.layout = Layout::nhwc, s.bias = s.relu = s.f32_params = true;
  s.inference = s.onednn_layouts = true;
  s.N = 2, s.C = 16, s.H = 8, s.W = 8, s.K = 16, s.R = s.S = 3, s.pad_h = s.pad_w = 1;
  if (!family().unsupported_reason(problem(Direction::fwd)).empty()) GTEST_SKIP();
  const Inputs in = make_inputs(s, 5);
  const memory::dims xd{s.N, s.C, s.H, s.W};
  const memory::desc user = cpu::md(xd, s.dtype, memory::format_tag::nhwc);
  for (memory::format_tag t : {memory::format_tag::nhwc, memory::format_tag::nChw16c}) {
    const memory::desc xl = cpu::md(xd, s.dtype, t);
    auto plan = make_cpu_plan(s, xl);
    HostBuffer x(s.dtype, xl.get_size() / 4), w(s.dtype, onednn_bytes(s, Tensor::w) / 4), y(s.dtype, onednn_bytes(s, Tensor::y) / 4);
    cpu::reorder(cpu::mem(user, const_cast<void*>(in.x.data())), cpu::mem(xl, x.data()));
    EXPECT_EQ(xl != onednn_desc(*plan, Tensor::x), plan->label().find("x reordered from the caller's layout") != std::string::npos)
        << plan->label();
    to_onednn_layout(s, Tensor::w, in.w.data(), w.data());
    plan->run(Args{x.data(), w.data(), in.b.data(), nullptr, y.data(), nullptr});
    Outputs out = make_outputs(s);
    to_user_layout(s, Tensor::y, y.data(), out.primary.data());
    const Check c = verify(s, in, out);
    EXPECT_TRUE(c.ok) << plan->label() << ": " << c.message;
  }
}

#ifdef HOTOPS_HAVE_CUDA
// The re-timed search's choice: the fastest, unless others are within kRetimeTie of it; then the
// least workspace, then the lowest algorithm number, whatever order the timings came in. A host
// test: it needs a CUDA build, not a GPU.
TEST(ConvSearch, NearTiesGoToTheLeastWorkspaceThenTheLowestAlgorithm) {
  const auto algo = [](int a, std::size_t ws, float ms) {
    gpu::ConvAlgo c;
    c.algo = a, c.workspace = ws, c.retimed_ms = ms;
    return c;
  };
  const float near = 1 + gpu::kRetimeTie / 2, far = 1 + 2 * gpu::kRetimeTie;
  std::vector<gpu::ConvAlgo> timed = {algo(4, 4 << 20, 1.f), algo(7, 0, near), algo(1, 0, near), algo(5, 0, -1)};
  for (int turn = 0; turn < 4; ++turn) {  // every rotation: the order of the candidates does not matter
    EXPECT_EQ(gpu::pick_retimed(timed).algo, 1) << turn;
    std::rotate(timed.begin(), timed.begin() + 1, timed.end());
  }
  timed = {algo(4, 4 << 20, 1.f), algo(7, 0, far), algo(2, 1 << 20, -1)};  // beyond the tie: the fastest
  EXPECT_EQ(gpu::pick_retimed(timed).algo, 4);
  timed = {algo(3, 0, -1)};
  EXPECT_THROW(gpu::pick_retimed(timed), Error);
}

// A model step's CUDA plans: Find's fastest taken as timed, bf16 with tensor-op math only, run on a
// workspace of the caller's (shared by all three passes) and on the buffers each run is given.
TEST(Conv2dCudaPlan, FindsFastestTensorOpsAndRunsOnASharedWorkspace) {
  std::string why;
  if (!gpu::available(&why)) GTEST_SKIP() << why;
  for (Layout layout : {Layout::nchw, Layout::nhwc}) {
    std::vector<std::unique_ptr<Plan>> plans;
    std::vector<Shape> shapes;
    std::size_t ws = 0;
    for (Direction d : {Direction::fwd, Direction::bwd_data, Direction::bwd_weight}) {
      Shape s;
      s.dir = d, s.dtype = DType::bf16, s.layout = layout;
      s.N = 4, s.C = 16, s.H = 8, s.W = 8, s.K = 32, s.R = s.S = 3, s.pad_h = s.pad_w = 1;
      s.retime = false, s.tensor_ops_only = true;
      plans.push_back(make_cuda_plan(s));
      shapes.push_back(s);
      const std::string label = plans.back()->label();
      EXPECT_NE(label.find("not re-timed"), std::string::npos) << label;
      EXPECT_NE(label.find("tensor ops"), std::string::npos) << label;
      EXPECT_EQ(label.find("FMA"), std::string::npos) << label;
      ws = std::max(ws, cuda_choice(*plans.back()).workspace);
    }
    gpu::DeviceBuffer shared(std::max<std::size_t>(ws, 1));
    for (auto& p : plans) use_cuda_workspace(*p, shared.get(), ws);
    for (std::size_t i = 0; i < plans.size(); ++i) {
      const Shape& s = shapes[i];
      const Inputs in = make_inputs(s, 7);
      Outputs out = make_outputs(s);
      const gpu::DeviceBuffer x(in.x), w(in.w), dy(in.dy);
      gpu::DeviceBuffer o(out.primary.bytes());
      plans[i]->run(Args{x.get(), w.get(), nullptr, dy.get(), o.get(), nullptr});
      o.download(out.primary);
      const Check c = verify(s, in, out);
      EXPECT_TRUE(c.ok) << direction_name(s.dir) << " " << c.message;
    }
  }
}

// hotops' direct forward kernel alone (whatever the plan's timing keeps), against the reference (as
// bench verifies it): 3 input channels into 32 with padding and an odd output width (the last thread's
// second pixel past the row), 1 into 16 with a 5x5 filter and stride 2, 3 into 16 with a 2x3 filter
// and unequal strides; with and without the bias, f32 and bf16.
TEST(Conv2dDirectCuda, MatchesTheReference) {
  std::string why;
  if (!gpu::available(&why)) GTEST_SKIP() << why;
  struct Case {
    std::int64_t N, C, H, W, K, R, S, sh, sw, ph, pw;
    bool bias;
  };
  for (const Case& k : {Case{2, 3, 9, 11, 32, 3, 3, 1, 1, 1, 1, true}, Case{3, 1, 12, 10, 16, 5, 5, 2, 2, 2, 2, false},
                        Case{1, 3, 7, 6, 16, 2, 3, 2, 1, 0, 1, true}})
    for (DType t : {DType::f32, DType::bf16}) {
      Shape s;
      s.dir = Direction::fwd, s.dtype = t, s.layout = Layout::nhwc, s.bias = k.bias;
      s.N = k.N, s.C = k.C, s.H = k.H, s.W = k.W, s.K = k.K, s.R = k.R, s.S = k.S;
      s.stride_h = k.sh, s.stride_w = k.sw, s.pad_h = k.ph, s.pad_w = k.pw;
      const std::string what = std::string(dtype_name(t)) + " C " + std::to_string(k.C) + " K " + std::to_string(k.K) + " " +
                               std::to_string(k.R) + "x" + std::to_string(k.S);
      ASSERT_TRUE(direct::takes(s)) << what;
      const Inputs in = make_inputs(s, 11);
      Outputs out = make_outputs(s);
      out.primary.poison();
      const gpu::DeviceBuffer x(in.x), w(in.w), b(k.bias ? gpu::DeviceBuffer(in.b) : gpu::DeviceBuffer(1));
      gpu::DeviceBuffer y(out.primary);
      direct::run(s, Args{x.get(), w.get(), k.bias ? b.get() : nullptr, nullptr, y.get(), nullptr});
      y.download(out.primary);
      const Check c = verify(s, in, out);
      EXPECT_TRUE(c.ok) << what << ": " << c.message;
      EXPECT_GT(c.checked, 0u) << what;
    }
  Shape wide;  // 4 input channels: cuDNN's
  wide.C = 4, wide.K = 16, wide.layout = Layout::nhwc;
  EXPECT_FALSE(direct::takes(wide));
}

// A problem's algorithm is searched once per process: a second plan of the same problem takes the
// first one's choice without a search, another problem searches.
TEST(Conv2dCudaPlan, OneSearchPerProblemPerProcess) {
  std::string why;
  if (!gpu::available(&why)) GTEST_SKIP() << why;
  Shape s;
  s.dir = Direction::fwd, s.dtype = DType::f32, s.layout = Layout::nchw;
  s.N = 2, s.C = 8, s.H = 10, s.W = 10, s.K = 12, s.R = s.S = 3, s.pad_h = s.pad_w = 1;
  const int before = gpu::conv_algo_searches();
  const auto first = make_cuda_plan(s);
  const int searched = gpu::conv_algo_searches() - before;
  EXPECT_GE(searched, 1);
  const auto again = make_cuda_plan(s);
  EXPECT_EQ(gpu::conv_algo_searches() - before, searched);
  EXPECT_EQ(cuda_choice(*again).algo, cuda_choice(*first).algo);
  EXPECT_EQ(cuda_choice(*again).workspace, cuda_choice(*first).workspace);
  s.K = 16;
  const auto other = make_cuda_plan(s);
  EXPECT_GT(gpu::conv_algo_searches() - before, searched);
}

// The CUDA plan of a depthwise 7x7 (cudnnSetConvolutionGroupCount), every direction and dtype, both
// layouts, run on two sets of device buffers in turn: each result is that of its own inputs.
TEST(Conv2dCudaPlan, DepthwiseRunsOnTheBuffersItIsGivenEachRun) {
  std::string why;
  if (!gpu::available(&why)) GTEST_SKIP() << why;
  for (DType t : {DType::f32, DType::tf32, DType::bf16})
    for (Layout layout : {Layout::nchw, Layout::nhwc})
      for (Direction d : {Direction::fwd, Direction::bwd_data, Direction::bwd_weight}) {
        Shape s;
        s.dir = d, s.dtype = t, s.layout = layout, s.bias = true, s.groups = 24;
        s.N = 2, s.C = 24, s.H = 14, s.W = 14, s.K = 24, s.R = s.S = 7, s.pad_h = s.pad_w = 3;
        const std::string what = std::string(dtype_name(t)) + " " + direction_name(d);
        auto plan = make_cuda_plan(s);
        const Inputs in[2] = {make_inputs(s, 1), make_inputs(s, 2)};
        Outputs out[2] = {make_outputs(s), make_outputs(s)};
        struct Device {  // one set's tensors on the device (null where the pass has none)
          gpu::DeviceBuffer x, w, b, dy, out, db;
        };
        const auto up = [](const HostBuffer& h) { return h.count() ? gpu::DeviceBuffer(h) : gpu::DeviceBuffer(); };
        Device dev[2];
        for (int k = 0; k < 2; ++k)
          dev[k] = Device{up(in[k].x), up(in[k].w), up(in[k].b), up(in[k].dy), up(out[k].primary), up(out[k].db)};
        const auto args_of = [&](int k) {
          dev[k].out.poison();
          if (dev[k].db.get()) dev[k].db.poison();
          return Args{dev[k].x.get(), dev[k].w.get(), dev[k].b.get(), dev[k].dy.get(), dev[k].out.get(), dev[k].db.get()};
        };
        const auto check = [&](int i, int k) {
          dev[k].out.download(out[k].primary);
          if (dev[k].db.get()) dev[k].db.download(out[k].db);
          return verify(s, in[i], out[k]);
        };
        plan_test::expect_each_run_on_its_own_tensors(*plan, args_of, check, what);
      }
}
#endif

TEST(Conv2dFamily, BenchmarkListCoversBothLayoutsAndTheResNetTarget) {
  const auto problems = family().benchmark_problems({});
  bool target = false, nhwc = false;
  for (const Problem& p : problems) {
    if (p.name().find("shape:resnet50.res2_3x3/batch:32/C:64/H:56/W:56/K:64/R:3/S:3/stride:1/pad:1/") !=
        std::string::npos)
      target = true;
    nhwc |= p.get("layout") == "nhwc";
  }
  EXPECT_TRUE(target);
  EXPECT_TRUE(nhwc);
}

// The convnets' fused conv + ReLU: listed fwd, NHWC, on the CPU only, after the layer's plain entries;
// the name carries relu:1 and the shape the post-op.
TEST(Conv2dFamily, ReluEntriesAreCpuForwardsOfTheConvnetLayers) {
  std::vector<std::string> relu;
  for (const Problem& p : family().benchmark_problems({})) {
    if (!p.has("relu")) continue;
    relu.push_back(p.name());
    EXPECT_EQ(p.backend, Backend::cpu) << p.name();
    EXPECT_EQ(p.dir, Direction::fwd) << p.name();
    EXPECT_EQ(p.get("layout"), "nhwc") << p.name();
    EXPECT_TRUE(shape_of(p).relu) << p.name();
  }
  EXPECT_EQ(relu.size(), 10u);  // cifar10_vgg.conv2|3, keras_cnn.conv2, cnn_mnist.conv1|2; f32 and bf16
  EXPECT_NE(std::find(relu.begin(), relu.end(),
                      "conv2d/cpu/f32/fwd/shape:cifar10_vgg.conv2/batch:32/C:32/H:32/W:32/K:32/R:3/S:3/stride:1/pad:0/"
                      "dilation:1/bias:1/layout:nhwc/relu:1"),
            relu.end());
  Problem p = problem(Direction::bwd_data);
  p.args.push_back({"relu", "1"});
  EXPECT_THROW(shape_of(p), Error);
}

}  // namespace
}  // namespace hotops::conv2d
