// The adamw family: parameter counts of the model lists, the reference on a hand-computed step,
// verification that fails on planted errors (a wrong step count above all), the step count advancing
// across runs and restored by verify(), the plan on the caller's states, the CPU step equal to the bit to the scalar formula with
// std::sqrt whatever the team, and the CUDA kernel's own code run on the host.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

#include "hotops/check.h"
#include "kernels/adamw/adamw.h"
#include "test/plan_test_util.h"

namespace hotops::adamw {
namespace {

Problem problem(Backend be, DType t, const std::string& params, std::int64_t elements = 0) {
  Problem p{"adamw", be, t, Direction::step, {{"params", params}}};
  if (params == "flat") p.args.push_back({"elements", std::to_string(elements)});
  for (const auto& [k, v] : std::vector<std::pair<std::string, std::string>>{
           {"lr", "0.001"}, {"beta1", "0.9"}, {"beta2", "0.999"}, {"eps", "1e-08"}, {"wd", "0.01"}})
    p.args.push_back({k, v});
  return p;
}

std::int64_t sum(const std::vector<std::int64_t>& v) {
  std::int64_t s = 0;
  for (std::int64_t x : v) s += x;
  return s;
}

TEST(AdamwLists, ModelParameterCounts) {
  // Hugging Face's bert-base-uncased: 109,482,240 parameters in 199 tensors.
  EXPECT_EQ(tensor_sizes("bert_base", 0).size(), 199u);
  EXPECT_EQ(sum(tensor_sizes("bert_base", 0)), 109482240);
  // The TensorFlow 2 comparison's Keras summary: 58,088,516 trainable parameters.
  EXPECT_EQ(tensor_sizes("keras_cnn", 0).size(), 26u);
  EXPECT_EQ(sum(tensor_sizes("keras_cnn", 0)), 58088516);
  // The PyTorch tiny-MLP notebook's 13 -> 32 -> 16 -> 2.
  EXPECT_EQ(sum(tensor_sizes("mlp_tiny", 0)), 13 * 32 + 32 + 32 * 16 + 16 + 16 * 2 + 2);
  EXPECT_EQ(tensor_sizes("flat", 1 << 20), std::vector<std::int64_t>{1 << 20});
  EXPECT_THROW(tensor_sizes("resnet", 0), Error);
}

TEST(AdamwNames, SchemeWorkAndLabel) {
  const Family& f = family();
  bool found = false;
  for (const Problem& p : f.benchmark_problems({})) {
    if (p.name() != "adamw/cpu/f32/step/params:bert_base/lr:0.001/beta1:0.9/beta2:0.999/eps:1e-08/wd:0.01") continue;
    found = true;
    const Work w = f.work(p);
    EXPECT_DOUBLE_EQ(w.bytes, 28.0 * 109482240);
    EXPECT_DOUBLE_EQ(w.flops, 14.0 * 109482240);
    EXPECT_DOUBLE_EQ(w.items, 1);
    EXPECT_EQ(describe(shape_of(p)), "199 tensors, 109.5M params");
  }
  EXPECT_TRUE(found);
  Problem bad = problem(Backend::cpu, DType::f32, "mlp_tiny");
  bad.args[1].value = "fast";
  EXPECT_THROW(shape_of(bad), Error);
  EXPECT_THROW(shape_of(problem(Backend::cpu, DType::f16, "mlp_tiny")), Error);
}

TEST(AdamwLayout, AlignedTensorsZeroPaddingAndSpan) {
  const std::vector<std::int64_t> sizes = {1, 3, 32773};
  const Layout l = layout_of(sizes);
  EXPECT_EQ(l.offset, (std::vector<std::size_t>{0, kAlignElements, 2 * kAlignElements}));
  EXPECT_EQ(l.span, 2 * kAlignElements + 32773);
  EXPECT_EQ(l.arena, 2 * kAlignElements + static_cast<std::size_t>(32773 + 59) + kGuard);
  Shape s;
  s.dtype = DType::bf16;
  s.sizes = sizes;
  State st = make_state(s, l);
  restore(s, st, 7);
  for (std::size_t a : {std::size_t{1}, kAlignElements - 1, kAlignElements + 3, l.span, l.arena - 1}) {
    EXPECT_EQ(st.p.get(a), 0) << a;
    EXPECT_EQ(st.g.get(a), 0) << a;
    EXPECT_EQ(st.m.get(a), 0) << a;
    EXPECT_EQ(st.v.get(a), 0) << a;
  }
  EXPECT_NE(st.v.get(kAlignElements + 2), 0);
}

TEST(AdamwReference, FirstStepFromZeroStateIsLrTimesSign) {
  // p = 1, g = 0.5, m = v = 0, t = 1: m = 0.05, v = 0.00025, bc1 = 0.1, bc2 = 0.001, so
  // m_hat = 0.5, sqrt(v_hat) = 0.5 and the update is lr * 0.5 / (0.5 + eps); weight decay first.
  Element e{1, 0, 0};
  const Hyper h;
  reference_step(h, 1, 0.5, e);
  EXPECT_NEAR(e.m, 0.05, 1e-16);
  EXPECT_NEAR(e.v, 0.00025, 1e-18);
  EXPECT_NEAR(e.p, (1 - 1e-5) - 1e-3 * 0.5 / (0.5 + 1e-8), 1e-15);
  // Step 2 with the same gradient: m = 0.095, v = 0.00049975, bc1 = 0.19, bc2 = 0.001999.
  reference_step(h, 2, 0.5, e);
  const double p1 = (1 - 1e-5) - 1e-3 * 0.5 / (0.5 + 1e-8);
  const double denom = std::sqrt(0.00049975) / std::sqrt(1 - 0.999 * 0.999) + 1e-8;
  EXPECT_NEAR(e.p, p1 * (1 - 1e-5) - (1e-3 / 0.19) * 0.095 / denom, 1e-15);
}

TEST(AdamwReference, ScalarsMatchTheFormula) {
  const Hyper h;
  const StepScalars s = scalars_for(h, 3);
  EXPECT_FLOAT_EQ(s.step_size, static_cast<float>(1e-3 / (1 - 0.9 * 0.9 * 0.9)));
  EXPECT_FLOAT_EQ(s.inv_sqrt_bc2, static_cast<float>(1 / std::sqrt(1 - 0.999 * 0.999 * 0.999)));
  EXPECT_FLOAT_EQ(s.decay, static_cast<float>(1 - 1e-5));
}

// The state after steps first..last of the reference, stored as the op stores it (f32, bf16 p; the
// flat pass writes the padding's bf16 p too: the zero master rounded).
void reference_steps(const Shape& s, const Layout& l, State& st, std::int64_t first, std::int64_t last) {
  if (s.dtype == DType::bf16) std::fill_n(st.p16.as<std::uint16_t>(), l.span, std::uint16_t{0});
  for (std::size_t t = 0; t < s.sizes.size(); ++t)
    for (std::int64_t i = 0; i < s.sizes[t]; ++i) {
      const std::size_t a = l.offset[t] + static_cast<std::size_t>(i);
      Element e{st.p.get(a), st.m.get(a), st.v.get(a)};
      for (std::int64_t k = first; k <= last; ++k) reference_step(s.hyper, k, st.g.get(a), e);
      st.p.set(a, e.p), st.m.set(a, e.m), st.v.set(a, e.v);
      if (s.dtype == DType::bf16) st.p16.as<std::uint16_t>()[a] = float_to_bf16(st.p.as<float>()[a]);
    }
}

struct Fixture {
  Shape s;
  Layout l;
  State st;
  Snapshot snap;
  explicit Fixture(DType t) : s(shape_of(problem(Backend::cpu, t, "odd"))), l(layout_of(s.sizes)), st(make_state(s, l)) {
    restore(s, st, 42);
    snap = snapshot(s, l, st, 42);
  }
};

TEST(AdamwVerify, PassesTheReferenceAndFailsPlantedErrors) {
  for (DType t : {DType::f32, DType::bf16}) {
    SCOPED_TRACE(dtype_name(t));
    {
      Fixture f(t);
      reference_steps(f.s, f.l, f.st, 1, kVerifySteps);
      const Check c = check(f.s, f.snap, f.st, kVerifySteps);
      EXPECT_TRUE(c.ok) << c.message;
      EXPECT_GT(c.checked, 0u);
    }
    {  // a step count off by one: steps 2, 3, 4 instead of 1, 2, 3
      Fixture f(t);
      reference_steps(f.s, f.l, f.st, 2, kVerifySteps + 1);
      const Check c = check(f.s, f.snap, f.st, kVerifySteps);
      EXPECT_FALSE(c.ok);
      EXPECT_NE(c.message.find("p - p0"), std::string::npos) << c.message;
      EXPECT_GT(c.max_err, 1e-2);  // far beyond the bound, not a near miss
    }
    {  // one step too few
      Fixture f(t);
      reference_steps(f.s, f.l, f.st, 1, kVerifySteps - 1);
      EXPECT_FALSE(check(f.s, f.snap, f.st, kVerifySteps).ok);
    }
    {  // every step count the same (t = 1 three times: bias correction never advancing)
      Fixture f(t);
      for (int k = 0; k < kVerifySteps; ++k) reference_steps(f.s, f.l, f.st, 1, 1);
      EXPECT_FALSE(check(f.s, f.snap, f.st, kVerifySteps).ok);
    }
    {  // a write between two tensors
      Fixture f(t);
      reference_steps(f.s, f.l, f.st, 1, kVerifySteps);
      f.st.m.as<float>()[f.l.offset[1] - 1] += 1;
      const Check c = check(f.s, f.snap, f.st, kVerifySteps);
      EXPECT_FALSE(c.ok);
      EXPECT_NE(c.message.find("gaps"), std::string::npos) << c.message;
    }
    {  // m off by 1e-3 at the last element of a tensor
      Fixture f(t);
      reference_steps(f.s, f.l, f.st, 1, kVerifySteps);
      const std::size_t last = f.l.offset[2] + 1026;
      f.st.m.as<float>()[last] += 1e-3f;
      EXPECT_FALSE(check(f.s, f.snap, f.st, kVerifySteps).ok);
    }
  }
  {  // a NaN reference (here from a NaN gradient the reference sees) fails, whatever the output
    Fixture f(DType::f32);
    reference_steps(f.s, f.l, f.st, 1, kVerifySteps);
    f.snap.g[0] = std::nanf("");
    const Check c = check(f.s, f.snap, f.st, kVerifySteps);
    EXPECT_FALSE(c.ok);
    EXPECT_NE(c.message.find("non-finite reference"), std::string::npos) << c.message;
  }
  // The bf16 parameters must be the master rounded, to the bit.
  Fixture f(DType::bf16);
  reference_steps(f.s, f.l, f.st, 1, kVerifySteps);
  f.st.p16.as<std::uint16_t>()[f.snap.idx[0]] ^= 1;
  const Check c = check(f.s, f.snap, f.st, kVerifySteps);
  EXPECT_FALSE(c.ok);
  EXPECT_NE(c.message.find("bf16 p"), std::string::npos) << c.message;
}

TEST(AdamwCpu, StepCountAdvancesAcrossRunsAndVerifyRestoresIt) {
  for (DType t : {DType::f32, DType::bf16}) {
    const auto c = family().make(problem(Backend::cpu, t, "odd"));
    EXPECT_TRUE(c->verify().ok);
    for (int i = 0; i < 7; ++i) c->run();  // timed runs: steps 4 to 10
    const Check after = c->verify();
    EXPECT_TRUE(after.ok) << after.message;
    EXPECT_NE(c->label().find("9 tensors"), std::string::npos) << c->label();
  }
}

// One CPU plan run on two caller-owned states in turn, each with its own step count: each state is
// three steps of its own start (a plan that kept the first state's pointers, or one step count for
// both, would fail), and the bf16 copy is written into each state's own p16.
TEST(AdamwPlan, RunsOnTheStatesItIsGivenEachRun) {
  for (DType t : {DType::f32, DType::bf16}) {
    SCOPED_TRACE(dtype_name(t));
    const Shape s = shape_of(problem(Backend::cpu, t, "odd"));
    const Layout l = layout_of(s.sizes);
    const auto plan = make_plan(s, Backend::cpu);
    State a = make_state(s, l), b = make_state(s, l);
    restore(s, a, 1), restore(s, b, 2);
    const Snapshot sa = snapshot(s, l, a, 1), sb = snapshot(s, l, b, 2);
    DeviceStep step_a = first_step(s.hyper), step_b = first_step(s.hyper);
    const auto args = [&](State& st, DeviceStep& step) {
      return Args{st.p.as<float>(), st.g.data(), st.m.as<float>(), st.v.as<float>(),
                  t == DType::bf16 ? st.p16.as<std::uint16_t>() : nullptr, &step};
    };
    for (int k = 0; k < kVerifySteps; ++k) plan->run(args(a, step_a)), plan->run(args(b, step_b));
    const Check ca = check(s, sa, a, kVerifySteps), cb = check(s, sb, b, kVerifySteps);
    EXPECT_TRUE(ca.ok) << ca.message;
    EXPECT_TRUE(cb.ok) << cb.message;
    EXPECT_TRUE(check_step(step_a, kVerifySteps).ok);
    EXPECT_TRUE(check_step(step_b, kVerifySteps).ok);
    EXPECT_FALSE(check(s, sa, b, kVerifySteps).ok);
    const Check off = check_step(step_a, kVerifySteps + 1);
    EXPECT_FALSE(off.ok);
    EXPECT_NE(off.message.find("step count is 3"), std::string::npos) << off.message;
  }
}

// The CPU plan of a parameter list a few grains of work long runs on all threads, not on a smaller
// team than the last full one (hotops/cpu.h).
TEST(AdamwPlan, CpuPlanKeepsTheThreadPool) {
  const cpu::ThreadScope scope(4);  // the plan takes its team when it is built
  const Shape s = shape_of(problem(Backend::cpu, DType::f32, "flat", 100003));
  const auto plan = make_plan(s, Backend::cpu);
  State st = make_state(s, layout_of(s.sizes));
  restore(s, st, 1);
  DeviceStep step = first_step(s.hyper);
  const Args a{st.p.as<float>(), st.g.data(), st.m.as<float>(), st.v.as<float>(), nullptr, &step};
  plan_test::expect_keeps_thread_pool([&] { plan->run(a); }, plan->label());
}

// The CPU step is the scalar formula with std::sqrt to the bit (the vector clones round as the
// scalar code does), whatever the team; the bf16 copy (bf16, and f32 given one: a model's copy for
// its bf16 GEMMs) is the master rounded. n: parts that end off the 16-element cuts, a scalar epilogue.
TEST(AdamwCpu, StepIsTheScalarFormulaToTheBit) {
  const std::int64_t n = 100003;
  Shape s;
  s.sizes = {n};
  const Layout l = layout_of(s.sizes);
  const StepScalars sc = scalars_for(Hyper{}, 3);
  for (const auto& [t, copy] : {std::pair{DType::f32, false}, std::pair{DType::f32, true}, std::pair{DType::bf16, true}})
    for (int threads : {0, 1, 2, 3}) {
      SCOPED_TRACE(std::string(dtype_name(t)) + (copy ? " with the bf16 copy" : "") + " threads " + std::to_string(threads));
      s.dtype = t;
      State st = make_state(s, l);
      restore(s, st, 11);
      if (t == DType::f32 && copy) st.p16 = HostBuffer(DType::bf16, l.arena), st.p16.poison();
      std::vector<float> p(st.p.as<float>(), st.p.as<float>() + n), m(st.m.as<float>(), st.m.as<float>() + n),
          v(st.v.as<float>(), st.v.as<float>() + n);
      for (std::int64_t i = 0; i < n; ++i) {
        const auto a = static_cast<std::size_t>(i);
        step_element(p[a], static_cast<float>(st.g.get(a)), m[a], v[a], sc, [](float x) { return std::sqrt(x); });
      }
      if (t == DType::f32 && !copy)
        cpu_step(st.p.as<float>(), st.g.as<float>(), st.m.as<float>(), st.v.as<float>(), n, sc, threads);
      else if (t == DType::f32)
        cpu_step(st.p.as<float>(), st.g.as<float>(), st.m.as<float>(), st.v.as<float>(), st.p16.as<std::uint16_t>(), n, sc, threads);
      else
        cpu_step(st.p.as<float>(), st.g.as<std::uint16_t>(), st.m.as<float>(), st.v.as<float>(),
                 st.p16.as<std::uint16_t>(), n, sc, threads);
      std::int64_t differ = 0;
      for (std::int64_t i = 0; i < n; ++i) {
        const auto a = static_cast<std::size_t>(i);
        differ += st.p.as<float>()[a] != p[a] || st.m.as<float>()[a] != m[a] || st.v.as<float>()[a] != v[a] ||
                  (copy && st.p16.as<std::uint16_t>()[a] != float_to_bf16(p[a]));
      }
      EXPECT_EQ(differ, 0) << cpu_clone_name();
    }
}

#ifdef HOTOPS_HAVE_CUDA
// The CUDA kernel's code on the host: grid strides (one block, and a grid whose stride does not
// divide the vectors), 16-byte vectors over tensors and padding, the tail, the bf16 copy; step t
// given as the device state would give it.
TEST(AdamwCudaKernelOnHost, MatchesTheReference) {
  for (DType t : {DType::f32, DType::bf16})
    for (unsigned blocks : {1u, 3u}) {
      SCOPED_TRACE(std::string(dtype_name(t)) + " blocks " + std::to_string(blocks));
      Fixture f(t);
      for (int k = 1; k <= kVerifySteps; ++k) run_cuda_kernel_on_host(f.s, f.st, k, blocks);
      const Check c = check(f.s, f.snap, f.st, kVerifySteps);
      EXPECT_TRUE(c.ok) << c.message;

      Fixture wrong(t);  // the step count not advancing: must fail
      for (int k = 1; k <= kVerifySteps; ++k) run_cuda_kernel_on_host(wrong.s, wrong.st, 1, blocks);
      EXPECT_FALSE(check(wrong.s, wrong.snap, wrong.st, kVerifySteps).ok);
    }
}

std::vector<unsigned char> bytes_of(const HostBuffer& b) {
  const auto* at = static_cast<const unsigned char*>(b.data());
  return std::vector<unsigned char>(at, at + b.bytes());
}

// A data-parallel step's AdamW: a launch per gradient bucket, each over its range of the flat pass
// (tensor bounds, from the end towards the start) with a grid of its own, all at one step number,
// gives bitwise what one launch over the whole pass gives; f32 with a bf16 copy (a model's, each
// launch over its range of it), the copy is the master rounded over the whole pass, padding included.
TEST(AdamwCudaKernelOnHost, BucketRangesAreTheWholeStepBitwise) {
  for (const auto& [t, copy] : {std::pair{DType::f32, false}, std::pair{DType::f32, true}, std::pair{DType::bf16, true}}) {
    SCOPED_TRACE(std::string(dtype_name(t)) + (copy ? " with the bf16 copy" : ""));
    Fixture whole(t), parts(t);
    if (t == DType::f32 && copy) parts.st.p16 = HostBuffer(DType::bf16, parts.l.arena), parts.st.p16.poison();
    ASSERT_GE(whole.l.offset.size(), 3u);
    const std::vector<std::size_t> bounds = {whole.l.span, whole.l.offset[2], whole.l.offset[1], 0};
    for (int k = 1; k <= kVerifySteps; ++k) {
      run_cuda_kernel_on_host(whole.s, whole.st, k, 3);
      for (std::size_t b = 0; b + 1 < bounds.size(); ++b)
        run_cuda_kernel_on_host(parts.s, parts.st, k, static_cast<unsigned>(b + 1), bounds[b + 1], bounds[b]);
    }
    for (const auto& [a, c] : {std::pair{&whole.st.p, &parts.st.p}, std::pair{&whole.st.m, &parts.st.m},
                               std::pair{&whole.st.v, &parts.st.v}, std::pair{&whole.st.p16, &parts.st.p16}}) {
      if (a->bytes() == 0) continue;
      EXPECT_EQ(bytes_of(*a), bytes_of(*c));
    }
    std::size_t copy_differs = 0;
    for (std::size_t a = 0; copy && a < parts.l.span; ++a)
      copy_differs += parts.st.p16.as<std::uint16_t>()[a] != float_to_bf16(parts.st.p.as<float>()[a]);
    EXPECT_EQ(copy_differs, 0u);
    EXPECT_THROW(run_cuda_kernel_on_host(parts.s, parts.st, 1, 1, 2, 6), Error);  // off the 16-byte vectors
  }
}
#endif

}  // namespace
}  // namespace hotops::adamw
