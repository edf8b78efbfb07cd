// batchnorm: the reference against hand-computed values, layout independence, and verification
// that accepts the reference's own outputs (f32 and bf16) and rejects planted errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <limits>
#include <vector>

#include "kernels/batchnorm/batchnorm.h"
#include "kernels/batchnorm/relu_maxpool.h"
#include "test/plan_test_util.h"

namespace hotops::batchnorm {
namespace {

// Three values in one channel, 1-D: x = {0, 1, 5}, dy = {1, 0, 2}, gamma 1.5, beta 0.25, running
// mean 0.5 and var 2. Expected values computed by hand (in double, outside hotops).
Inputs three_values(const Shape& s) {
  Inputs in;
  in.x = HostBuffer(s.dtype, 3);
  in.dy = HostBuffer(s.dtype, 3);
  const double x[] = {0, 1, 5}, dy[] = {1, 0, 2};
  for (std::size_t i = 0; i < 3; ++i) in.x.set(i, x[i]), in.dy.set(i, dy[i]);
  in.gamma = HostBuffer(DType::f32, 1);
  in.beta = HostBuffer(DType::f32, 1);
  in.running_mean = HostBuffer(DType::f32, 1);
  in.running_var = HostBuffer(DType::f32, 1);
  in.save_mean = HostBuffer(DType::f32, 1);
  in.save_invstd = HostBuffer(DType::f32, 1);
  in.gamma.set(0, 1.5);
  in.beta.set(0, 0.25);
  in.running_mean.set(0, 0.5);
  in.running_var.set(0, 2.0);
  in.save_mean.set(0, 2.0);
  in.save_invstd.set(0, 0.4629095539120194);
  return in;
}

Shape one_d(Direction d, std::int64_t N, std::int64_t C) {
  Shape s;
  s.dir = d;
  s.layout = Layout::nc;
  s.N = N;
  s.C = C;
  return s;
}

TEST(Batchnorm, ForwardMatchesHandComputedValues) {
  const Shape s = one_d(Direction::fwd, 3, 1);
  const Inputs in = three_values(s);
  const Reference r(s, in);
  EXPECT_NEAR(r.save_mean[0], 2.0, 1e-12);
  EXPECT_NEAR(r.save_invstd[0], 0.4629095539120194, 1e-12);  // 1/sqrt(14/3 + 1e-5): biased variance
  EXPECT_NEAR(r.running_mean[0], 0.65, 1e-12);               // 0.9*0.5 + 0.1*2
  EXPECT_NEAR(r.running_var[0], 2.5, 1e-12);                 // 0.9*2 + 0.1*(14/3)*3/2: unbiased
  EXPECT_NEAR(r.out(0), -1.1387286617360581, 1e-12);
  EXPECT_NEAR(r.out(1), -0.44436433086802907, 1e-12);
  EXPECT_NEAR(r.out(2), 2.333092992604087, 1e-12);
}

TEST(Batchnorm, InferenceUsesRunningStatistics) {
  const Shape s = one_d(Direction::infer, 3, 1);
  const Inputs in = three_values(s);
  const Reference r(s, in);
  EXPECT_NEAR(r.out(2), 1.5 * (5 - 0.5) / std::sqrt(2 + kEps) + 0.25, 1e-12);
}

TEST(Batchnorm, BackwardMatchesHandComputedValues) {
  const Shape s = one_d(Direction::bwd, 3, 1);
  const Inputs in = three_values(s);
  const Reference r(s, in);
  // The saved statistics are f32 inputs: the expected values hold to f32 rounding of invstd.
  EXPECT_NEAR(r.dbeta[0], 3.0, 1e-12);
  EXPECT_NEAR(r.dgamma[0], 1.8516382156480775, 1e-6);
  EXPECT_NEAR(r.out(0), 0.3967787673986579, 1e-6);
  EXPECT_NEAR(r.out(1), -0.4959749471687001, 1e-6);
  EXPECT_NEAR(r.out(2), 0.09919617977004226, 1e-6);
}

// The same logical tensor stored NCHW and NHWC has the same statistics and the same y.
TEST(Batchnorm, LayoutsAgree) {
  Shape a;
  a.N = 2, a.C = 3, a.H = 4, a.W = 5;
  Shape b = a;
  b.layout = Layout::nhwc;
  const Inputs ia = make_inputs(a, 42);
  Inputs ib = make_inputs(b, 42);
  const std::int64_t HW = a.H * a.W;
  for (std::int64_t n = 0; n < a.N; ++n)
    for (std::int64_t c = 0; c < a.C; ++c)
      for (std::int64_t k = 0; k < HW; ++k)
        ib.x.set(static_cast<std::size_t>((n * HW + k) * a.C + c), ia.x.get(static_cast<std::size_t>((n * a.C + c) * HW + k)));
  ib.gamma = ia.gamma, ib.beta = ia.beta, ib.running_mean = ia.running_mean, ib.running_var = ia.running_var;
  const Reference ra(a, ia), rb(b, ib);
  for (std::size_t c = 0; c < 3; ++c) {
    EXPECT_NEAR(ra.save_mean[c], rb.save_mean[c], 1e-12);
    EXPECT_NEAR(ra.save_invstd[c], rb.save_invstd[c], 1e-9);
  }
  EXPECT_NEAR(ra.out((1 * a.C + 2) * HW + 7), rb.out((1 * HW + 7) * a.C + 2), 1e-9);
}

TEST(Batchnorm, ChannelsHaveDistinctStatistics) {
  Shape s;
  s.N = 4, s.C = 8, s.H = 6, s.W = 6;
  const Inputs in = make_inputs(s, 7);
  const Reference r(s, in);
  for (std::size_t c = 1; c < 8; ++c) EXPECT_GT(std::fabs(r.save_mean[c] - r.save_mean[0]), 1e-3) << c;
}

// Outputs filled by the reference itself, rounded to the dtype.
Outputs reference_outputs(const Shape& s, const Inputs& in) {
  Outputs o = make_outputs(s);
  reference(s, in, o);
  return o;
}

class BatchnormVerify : public testing::TestWithParam<std::tuple<Direction, Layout, DType>> {
 protected:
  Shape shape() const {
    Shape s;
    std::tie(s.dir, s.layout, s.dtype) = GetParam();
    s.N = 2, s.C = 5, s.H = 4, s.W = 4;
    if (s.layout == Layout::nc) s.N = 32, s.H = s.W = 1;
    return s;
  }
};

TEST_P(BatchnormVerify, AcceptsTheReferenceAndRejectsPlantedErrors) {
  const Shape s = shape();
  const Inputs in = make_inputs(s, 11);
  const Outputs good = reference_outputs(s, in);
  const Check ok = verify(s, in, good);
  EXPECT_TRUE(ok.ok) << ok.message;

  {  // one element of y / dx off by half its rms
    double sumsq = 0;
    for (std::size_t i = 0; i < good.out.count(); ++i) sumsq += good.out.get(i) * good.out.get(i);
    Outputs bad = good;
    bad.out.set(17, bad.out.get(17) + 0.5 * std::sqrt(sumsq / static_cast<double>(good.out.count())));
    EXPECT_FALSE(verify(s, in, bad).ok);
  }
  {  // an element never written
    Outputs bad = good;
    bad.out.set(3, std::numeric_limits<double>::quiet_NaN());
    EXPECT_FALSE(verify(s, in, bad).ok);
  }
  if (s.dir == Direction::fwd) {
    Outputs bad = good;  // the running variance updated with the biased variance
    const Reference r(s, in);
    const double n = static_cast<double>(s.per_channel());
    for (std::size_t c = 0; c < bad.running_var.count(); ++c) {
      const double var = 1 / (r.save_invstd[c] * r.save_invstd[c]) - kEps;
      bad.running_var.set(c, r.running_var[c] - kMomentum * var / (n - 1));
    }
    EXPECT_FALSE(verify(s, in, bad).ok);
    bad = good;  // save_invstd off by 1%
    bad.save_invstd.set(1, bad.save_invstd.get(1) * 1.01);
    EXPECT_FALSE(verify(s, in, bad).ok);
  }
  if (s.dir == Direction::bwd) {
    Outputs bad = good;  // dgamma of one channel missing one term
    bad.dgamma.set(2, bad.dgamma.get(2) + 0.5);
    EXPECT_FALSE(verify(s, in, bad).ok);
    bad = good;
    bad.dbeta.set(0, bad.dbeta.get(0) - 0.5);
    EXPECT_FALSE(verify(s, in, bad).ok);
  }
}

INSTANTIATE_TEST_SUITE_P(AllDirections, BatchnormVerify,
                         testing::Combine(testing::Values(Direction::fwd, Direction::infer, Direction::bwd),
                                          testing::Values(Layout::nchw, Layout::nhwc, Layout::nc),
                                          testing::Values(DType::f32, DType::bf16)));

TEST(Batchnorm, SumToleranceGrowsWithTheAccumulation) {
  EXPECT_EQ(sum_tolerance(16), tolerance(DType::f32));
  EXPECT_GT(sum_tolerance(1 << 22), sum_tolerance(1 << 16));
  EXPECT_LT(sum_tolerance(32 * 112 * 112), 1e-2);  // still far below an O(1) error
}

TEST(Batchnorm, ImplementationsShareInputsAndNames) {
  Problem p{"batchnorm", Backend::cuda, DType::f32, Direction::fwd,
            {{"shape", "t"}, {"layout", "nchw"}, {"batch", "2"}, {"C", "3"}, {"H", "4"}, {"W", "5"}}};
  Problem q = p;
  q.args.push_back({"impl", "cudnn"});
  Problem cpu = p;
  cpu.backend = Backend::cpu;
  EXPECT_EQ(seed_without_impl(p), seed_without_impl(q));
  EXPECT_EQ(seed_without_impl(p), seed_without_impl(cpu));
  EXPECT_FALSE(wants_cudnn(p));
  EXPECT_TRUE(wants_cudnn(q));
  EXPECT_EQ(q.name(), "batchnorm/cuda/f32/fwd/shape:t/layout:nchw/batch:2/C:3/H:4/W:5/impl:cudnn");
}

TEST(Batchnorm, WorkCountsEachTensorOnce) {
  Problem p{"batchnorm", Backend::cpu, DType::bf16, Direction::bwd,
            {{"shape", "t"}, {"layout", "nchw"}, {"batch", "32"}, {"C", "64"}, {"H", "56"}, {"W", "56"}}};
  const Work w = family().work(p);
  const double n = 32.0 * 64 * 56 * 56;
  EXPECT_DOUBLE_EQ(w.bytes, 3 * 2 * n + 5 * 4 * 64);  // x, dy, dx in bf16; five f32 vectors of C
  EXPECT_DOUBLE_EQ(w.flops, 8 * n);
  EXPECT_DOUBLE_EQ(w.items, 32);
}

// The tensors of one direction's CPU plan, on host buffers; fwd's running statistics start from the
// inputs' values and are updated in place, as a training step's are.
Args host_args(const Shape& s, Inputs& in, Outputs& out) {
  Args a;
  a.x = in.x.data();
  a.gamma = in.gamma.as<float>();
  a.beta = in.beta.as<float>();
  a.out = out.out.data();
  out.out.poison();
  if (s.dir == Direction::bwd) {
    a.dy = in.dy.data();
    a.save_mean = in.save_mean.as<float>();
    a.save_invstd = in.save_invstd.as<float>();
    a.dgamma = out.dgamma.as<float>(), a.dbeta = out.dbeta.as<float>();
    out.dgamma.poison(), out.dbeta.poison();
    return a;
  }
  if (s.dir == Direction::infer) {
    a.running_mean = in.running_mean.as<float>(), a.running_var = in.running_var.as<float>();
    return a;
  }
  out.running_mean = in.running_mean, out.running_var = in.running_var;
  a.running_mean = out.running_mean.as<float>(), a.running_var = out.running_var.as<float>();
  a.save_mean = out.save_mean.as<float>(), a.save_invstd = out.save_invstd.as<float>();
  out.save_mean.poison(), out.save_invstd.poison();
  return a;
}

// One CPU plan per direction, run on two sets of caller-owned tensors in turn: each set's outputs
// (fwd's running statistics included) are those of its own inputs; a plan that kept the first
// set's pointers would leave the second unwritten and overwrite the first.
TEST(Batchnorm, PlanRunsOnTheTensorsItIsGivenEachRun) {
  for (Direction d : {Direction::fwd, Direction::infer, Direction::bwd}) {
    Shape s;
    s.dir = d, s.layout = Layout::nhwc, s.N = 2, s.C = 6, s.H = 5, s.W = 3;
    auto plan = make_plan(s, Backend::cpu);
    Inputs in[2] = {make_inputs(s, 1), make_inputs(s, 2)};
    Outputs out[2] = {make_outputs(s), make_outputs(s)};
    const auto args_of = [&](int k) { return host_args(s, in[k], out[k]); };
    const auto check = [&](int i, int o) { return verify(s, in[i], out[o]); };
    plan_test::expect_each_run_on_its_own_tensors(*plan, args_of, check, direction_name(d));
  }
}

TEST(Batchnorm, ShapeNamesTheCudaImplementation) {
  Problem p{"batchnorm", Backend::cuda, DType::f32, Direction::infer,
            {{"shape", "t"}, {"layout", "nc"}, {"batch", "4"}, {"C", "8"}}};
  EXPECT_FALSE(shape_of(p).cudnn);
  p.args.push_back({"impl", "cudnn"});
  EXPECT_TRUE(shape_of(p).cudnn);
}

TEST(Batchnorm, TrainingOnOneValuePerChannelIsUnsupported) {
  Problem p{"batchnorm", Backend::cpu, DType::f32, Direction::fwd,
            {{"shape", "t"}, {"layout", "nc"}, {"batch", "1"}, {"C", "64"}}};
  EXPECT_NE(family().unsupported_reason(p).find("more than one value"), std::string::npos);
}

}  // namespace

// ---- batchnorm_relu_maxpool ----
namespace relu_maxpool {
namespace {

// layout: z's; NCHW pools into `pooled`.
Shape fused(Direction d, DType t, bool bn = true, Layout layout = Layout::nhwc, Layout pooled = Layout::nhwc) {
  Shape s;
  s.dir = d, s.dtype = t, s.bn = bn, s.layout = layout, s.pooled_layout = layout == Layout::nhwc ? layout : pooled;
  s.N = 3, s.C = 8, s.H = 7, s.W = 8, s.k = 3;  // crops a row
  if (d != Direction::infer) s.dropout = 0.25, s.key = pointwise::dropout_key(5, 0.25);
  return s;
}

// Outputs filled by the reference itself, rounded to their types.
Outputs reference_outputs(const Shape& s, const Inputs& in) {
  Outputs o = make_outputs(s);
  const Reference r(s, in);
  auto fill = [](HostBuffer& b, const std::vector<double>& v) {
    for (std::size_t c = 0; c < b.count() && c < v.size(); ++c) b.set(c, v[c]);
  };
  if (s.dir == Direction::bwd) {
    for (std::int64_t i = 0; i < s.count(); ++i) o.dz.set(static_cast<std::size_t>(s.z_index(i)), r.dz(i));
    fill(o.dgamma, r.dgamma), fill(o.dbeta, r.dbeta), fill(o.dbias, r.dbias);
    return o;
  }
  for (std::int64_t j = 0; j < s.pooled(); ++j) {
    o.out.set(static_cast<std::size_t>(s.pooled_index(j)), r.out(j));
    std::uint8_t at = 0;
    for (std::int64_t q = s.k * s.k; q-- > 0;)
      if (r.pre(r.window_start(j) + ((q / s.k) * s.W + q % s.k) * s.C) == r.pooled(j)) at = static_cast<std::uint8_t>(q);
    if (s.pool) o.arg.as<std::uint8_t>()[s.pooled_index(j)] = at;
  }
  fill(o.scale, r.scale), fill(o.shift, r.shift), fill(o.mean, r.mean), fill(o.rstd, r.rstd);
  fill(o.running_mean, r.running_mean), fill(o.running_var, r.running_var);
  return o;
}

// Direction, dtype, batch norm, and the op and layouts: batchnorm_relu_maxpool in NHWC, NCHW, NCHW
// pooled into NHWC (0, 1, 2); batchnorm_relu in NC, NHWC, NCHW (3, 4, 5; NCHW without dropout).
class ReluMaxpoolVerify : public testing::TestWithParam<std::tuple<Direction, DType, bool, int>> {};

Shape fused_layouts(Direction d, DType t, bool bn, int layouts) {
  if (layouts < 3) return fused(d, t, bn, layouts == 0 ? Layout::nhwc : Layout::nchw, layouts == 2 ? Layout::nhwc : Layout::nchw);
  Shape s = fused(d, t, bn, layouts == 3 ? Layout::nc : layouts == 4 ? Layout::nhwc : Layout::nchw);
  s.pool = false, s.k = 1, s.pooled_layout = s.layout;
  if (s.layout == Layout::nc) s.N = 9, s.C = 12, s.H = s.W = 1;
  if (s.layout == Layout::nchw) s.dropout = 0;
  return s;
}

TEST_P(ReluMaxpoolVerify, AcceptsTheReferenceAndRejectsPlantedErrors) {
  const auto [d, t, bn, layouts] = GetParam();
  const Shape s = fused_layouts(d, t, bn, layouts);
  const Inputs in = make_inputs(s, 11);
  const Outputs good = reference_outputs(s, in);
  const Check ok = verify(s, in, good);
  EXPECT_TRUE(ok.ok) << ok.message;
  HostBuffer Outputs::*main = d == Direction::bwd ? &Outputs::dz : &Outputs::out;
  {  // one element off by half the largest
    Outputs bad = good;
    HostBuffer& b = bad.*main;
    double amax = 0;
    for (std::size_t i = 0; i < b.count(); ++i) amax = std::max(amax, std::fabs(b.get(i)));
    b.set(5, b.get(5) + 0.5 * amax);
    EXPECT_FALSE(verify(s, in, bad).ok);
  }
  {  // an element never written
    Outputs bad = good;
    (bad.*main).set(3, std::numeric_limits<double>::quiet_NaN());
    EXPECT_FALSE(verify(s, in, bad).ok);
  }
  if (d == Direction::bwd) {
    Outputs bad = good;  // the bias gradient of one channel off
    bad.dbias.set(2, bad.dbias.get(2) + (bn ? 0.5 : 0.5 * std::fabs(bad.dbias.get(2)) + 0.5));
    EXPECT_FALSE(verify(s, in, bad).ok);
    if (bn) {
      bad = good;
      bad.dgamma.set(1, bad.dgamma.get(1) + 0.5);
      EXPECT_FALSE(verify(s, in, bad).ok);
    }
    return;
  }
  Outputs bad = good;  // an argmax byte past the window
  if (s.pool) {
    bad.arg.as<std::uint8_t>()[4] = static_cast<std::uint8_t>(s.k * s.k);
    EXPECT_FALSE(verify(s, in, bad).ok);
  }
  bad = good;  // the shift of one channel off by 1%
  bad.shift.set(1, bad.shift.get(1) * 1.01 + 0.01);
  EXPECT_FALSE(verify(s, in, bad).ok);
  if (d == Direction::fwd && bn) {
    bad = good;  // the running mean without the conv's bias
    for (std::size_t c = 0; c < bad.running_mean.count(); ++c)
      bad.running_mean.set(c, good.running_mean.get(c) - s.momentum * in.bias.get(c));
    EXPECT_FALSE(verify(s, in, bad).ok);
  }
}

INSTANTIATE_TEST_SUITE_P(AllDirections, ReluMaxpoolVerify,
                         testing::Combine(testing::Values(Direction::fwd, Direction::infer, Direction::bwd),
                                          testing::Values(DType::f32, DType::bf16), testing::Bool(), testing::Range(0, 6)));

// The CPU plan's tensors of one direction on host buffers (fwd's running statistics start from the
// inputs' values and are updated in place).
Args host_args(const Shape& s, Inputs& in, Outputs& out) {
  Args a;
  a.z = in.z.data();
  a.gamma = in.gamma.as<float>();
  a.period = in.period.as<int>();
  if (s.dir == Direction::bwd) {
    a.dout = in.dout.data(), a.arg = s.pool ? in.arg.as<std::uint8_t>() : nullptr;
    a.scale = in.scale.as<float>(), a.shift = in.shift.as<float>(), a.mean = in.mean.as<float>(), a.rstd = in.rstd.as<float>();
    a.dz = out.dz.data(), a.dgamma = out.dgamma.as<float>(), a.dbeta = out.dbeta.as<float>(), a.dbias = out.dbias.as<float>();
    for (HostBuffer* h : {&out.dz, &out.dgamma, &out.dbeta, &out.dbias}) h->poison();
    return a;
  }
  a.beta = in.beta.as<float>(), a.bias = in.bias.as<float>();
  a.out = out.out.data(), a.arg = s.pool ? out.arg.as<std::uint8_t>() : nullptr;
  a.scale = out.scale.as<float>(), a.shift = out.shift.as<float>();
  for (HostBuffer* h : {&out.out, &out.arg, &out.scale, &out.shift}) h->poison();
  if (s.dir == Direction::infer) {
    a.running_mean = in.running_mean.as<float>(), a.running_var = in.running_var.as<float>();
    return a;
  }
  out.running_mean = in.running_mean, out.running_var = in.running_var;
  a.running_mean = out.running_mean.as<float>(), a.running_var = out.running_var.as<float>();
  a.mean = out.mean.as<float>(), a.rstd = out.rstd.as<float>();
  out.mean.poison(), out.rstd.poison();
  return a;
}

// One CPU plan per direction (with and without batch norm, in each layout), run on two sets of
// caller-owned tensors in turn: each set's outputs are those of its own inputs.
TEST(BatchnormReluMaxpool, PlanRunsOnTheTensorsItIsGivenEachRun) {
  for (int layouts = 0; layouts < 6; ++layouts)
    for (bool bn : {true, false})
      for (Direction d : {Direction::fwd, Direction::infer, Direction::bwd}) {
        const Shape s = fused_layouts(d, DType::f32, bn, layouts);
        auto plan = make_plan(s, Backend::cpu);
        Inputs in[2] = {make_inputs(s, 1), make_inputs(s, 2)};
        Outputs out[2] = {make_outputs(s), make_outputs(s)};
        const auto args_of = [&](int k) { return host_args(s, in[k], out[k]); };
        const auto check = [&](int i, int o) { return verify(s, in[i], out[o]); };
        const std::string what = std::string(direction_name(d)) + (bn ? " bn" : " bias") + " layouts " + std::to_string(layouts);
        plan_test::expect_each_run_on_its_own_tensors(*plan, args_of, check, what);
      }
}

// The latter half of a batch's tensor (its samples N/2 ..).
HostBuffer latter_half(const HostBuffer& b) {
  HostBuffer h(b.dtype(), b.count() / 2);
  std::memcpy(h.data(), static_cast<const std::byte*>(b.data()) + (b.bytes() - h.bytes()), h.bytes());
  return h;
}

// A shard of a batch (a data-parallel replica's) run with first_sample at its position draws the
// dropout masks its samples have in the whole batch: without batch norm (each sample on its own), the
// latter half of 4 samples run alone gives the whole run's latter half, forward and backward, bitwise;
// from sample 0 it draws other masks.
TEST(BatchnormReluMaxpool, ShardDrawsTheMasksOfItsPositionInTheBatch) {
  for (Direction d : {Direction::fwd, Direction::bwd}) {
    Shape whole = fused(d, DType::f32, false);
    whole.N = 4;
    Shape half = whole;
    half.N = 2;
    Inputs in = make_inputs(whole, 7);
    Outputs out = make_outputs(whole);
    make_plan(whole, Backend::cpu)->run(host_args(whole, in, out));
    const HostBuffer& full = d == Direction::fwd ? out.out : out.dz;
    Inputs shard = in;  // the period stays the whole batch's
    shard.z = latter_half(in.z);
    if (d == Direction::bwd) shard.dout = latter_half(in.dout), shard.arg = latter_half(in.arg);
    const auto plan = make_plan(half, Backend::cpu);
    for (std::int64_t first : {2, 0}) {
      Outputs o = make_outputs(half);
      Args a = host_args(half, shard, o);
      a.first_sample = first;
      plan->run(a);
      const HostBuffer& mine = d == Direction::fwd ? o.out : o.dz;
      const HostBuffer want = latter_half(full);
      const bool same = std::memcmp(mine.data(), want.data(), want.bytes()) == 0;
      EXPECT_EQ(same, first == 2) << direction_name(d) << " first_sample " << first;
    }
  }
}

// cpu_activation gives relu(z scale + shift) of every element, as the reference's pre() has it, from
// the affine a CPU forward saved: in each layout of z, in f32 and bf16.
TEST(BatchnormReluMaxpool, CpuActivationIsTheForwardsReluInput) {
  for (int layouts = 0; layouts < 6; ++layouts)
    for (DType t : {DType::f32, DType::bf16}) {
      const Shape s = fused_layouts(Direction::fwd, t, true, layouts);
      Inputs in = make_inputs(s, 3);
      Outputs out = make_outputs(s);
      make_plan(s, Backend::cpu)->run(host_args(s, in, out));
      std::vector<float> act(static_cast<std::size_t>(s.count()), std::numeric_limits<float>::quiet_NaN());
      cpu_activation(s, in.z.data(), out.scale.as<float>(), out.shift.as<float>(), act.data());
      const Reference ref(s, in);
      double worst = 0, rms = 0;
      for (std::int64_t i = 0; i < s.count(); ++i) {
        const double r = ref.pre(s.z_order(i));
        worst = std::max(worst, std::fabs(act[static_cast<std::size_t>(i)] - r)), rms += r * r;
        if (std::isnan(act[static_cast<std::size_t>(i)])) worst = std::numeric_limits<double>::infinity();
      }
      rms = std::sqrt(rms / static_cast<double>(s.count()));
      EXPECT_LT(worst, 1e-4 * rms) << "layouts " << layouts << " " << dtype_name(t);
    }
}

TEST(BatchnormReluMaxpool, NamesFollowTheScheme) {
  bool found = false;
  for (const Problem& p : benchmark_problems({}))
    if (p.name() == "batchnorm_relu_maxpool/cuda/bf16/bwd/shape:keras_cnn.bn0/layout:nhwc/batch:32/C:32/H:256/W:256/pool:3/dropout:0.25")
      found = true;
  EXPECT_TRUE(found);
  found = false;
  for (const Problem& p : benchmark_problems({}))
    if (p.name() == "batchnorm_relu/cpu/bf16/bwd/shape:keras_cnn.dense_bn/layout:nc/batch:1024/C:1024/dropout:0.5") {
      found = true;
      EXPECT_FALSE(shape_of(p).pool);
      EXPECT_EQ(shape_of(p).H * shape_of(p).W, 1);
    }
  EXPECT_TRUE(found);
  found = false;
  for (const Problem& p : benchmark_problems({}))
    if (p.name() == "batchnorm_relu_maxpool/cuda/f32/fwd/shape:keras_cnn.bn3/layout:nchw/batch:32/C:128/H:42/W:42/pool:2/dropout:0.25/pooled:nhwc") {
      found = true;
      EXPECT_EQ(shape_of(p).layout, Layout::nchw);
      EXPECT_EQ(shape_of(p).pooled_layout, Layout::nhwc);
    }
  EXPECT_TRUE(found);
  int vgg = 0;  // vgg_cifar's layers: the bias without batch norm
  for (const Problem& p : benchmark_problems({}))
    if (p.name() == "batchnorm_relu_maxpool/cuda/f32/fwd/shape:vgg_cifar.conv3/layout:nchw/batch:128/C:64/H:13/W:13/pool:2/dropout:0.25/pooled:nhwc/bn:0" ||
        p.name() == "batchnorm_relu/cpu/f32/bwd/shape:vgg_cifar.dense/layout:nc/batch:128/C:512/dropout:0.5/bn:0")
    {
      ++vgg;
      EXPECT_FALSE(shape_of(p).bn);
    }
  EXPECT_EQ(vgg, 2);
  Problem p = benchmark_problems({}).front();
  Problem q = p;
  q.backend = p.backend == Backend::cpu ? Backend::cuda : Backend::cpu;
  EXPECT_EQ(shape_of(p).key.k0, shape_of(q).key.k0);  // every backend draws the same mask
}

TEST(BatchnormReluMaxpool, CudaTakesTheKernelsWidths) {
  Shape s;
  s.C = 12;
  EXPECT_NE(cuda_unsupported_reason(s), "");
  s.C = 128;
  EXPECT_EQ(cuda_unsupported_reason(s), "");
  s.C = 12, s.layout = Layout::nchw;  // the NCHW kernels take any width
  EXPECT_EQ(cuda_unsupported_reason(s), "");
}

// The storage of NHWC-order elements in each layout, and back.
TEST(BatchnormReluMaxpool, IndexesEachLayout) {
  Shape s;
  s.N = 2, s.C = 3, s.H = 5, s.W = 4, s.k = 2;
  s.layout = Layout::nchw, s.pooled_layout = Layout::nhwc;
  const std::int64_t n = 1, h = 3, w = 2, c = 2, i = ((n * s.H + h) * s.W + w) * s.C + c;
  EXPECT_EQ(s.z_index(i), ((n * s.C + c) * s.H + h) * s.W + w);
  EXPECT_EQ(s.pooled_index(7), 7);
  s.pooled_layout = Layout::nchw;
  const std::int64_t j = ((n * s.PH() + 1) * s.PW() + 0) * s.C + c;
  EXPECT_EQ(s.pooled_index(j), ((n * s.C + c) * s.PH() + 1) * s.PW() + 0);
  for (std::int64_t k = 0; k < s.count(); ++k) EXPECT_EQ(s.z_order(s.z_index(k)), k);
  for (std::int64_t k = 0; k < s.pooled(); ++k) EXPECT_EQ(s.pooled_order(s.pooled_index(k)), k);
}

}  // namespace
}  // namespace relu_maxpool
}  // namespace hotops::batchnorm
