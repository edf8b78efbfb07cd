// The lstm_cell reference: hand-computed values, its backward against finite differences of its
// forward (in double), and verification that fails on a planted error.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "kernels/lstm_cell/lstm_cell.h"
#include "test/model_test_util.h"

namespace hotops::lstm_cell {
namespace {

Shape tiny(Direction d, std::int64_t B, std::int64_t I, std::int64_t H) {
  Shape s;
  s.dir = d;
  s.B = B, s.I = I, s.H = H;
  return s;
}

// Double inputs of a shape, uniform in [-1, 1) (W and b scaled as make_inputs does).
struct DoubleInputs {
  std::vector<double> xh, W, b, c, dh, dc;
  RefInputs views() const { return {view(xh), view(W), view(b), view(c), view(dh), view(dc)}; }
};

DoubleInputs random_inputs(const Shape& s, unsigned seed) {
  std::mt19937_64 gen(seed);
  std::uniform_real_distribution<double> u(-1, 1);
  const auto B = static_cast<std::size_t>(s.B), H = static_cast<std::size_t>(s.H),
             K = static_cast<std::size_t>(s.K()), G = 4 * H;
  DoubleInputs in;
  auto fill = [&](std::vector<double>& v, std::size_t n, double scale) {
    v.resize(n);
    for (double& x : v) x = scale * u(gen);
  };
  fill(in.xh, B * K, 1), fill(in.W, G * K, 0.7), fill(in.b, G, 0.5), fill(in.c, B * H, 1);
  fill(in.dh, B * H, 1), fill(in.dc, B * H, 1);
  return in;
}

// L = sum(dh' . h') + sum(dc' . c'): its gradient is what the backward returns for (dh', dc').
double loss(const Shape& s, const DoubleInputs& in) {
  const RefForward f = reference_forward(s, in.views());
  double l = 0;
  for (std::size_t k = 0; k < f.h.size(); ++k) l += in.dh[k] * f.h[k] + in.dc[k] * f.c[k];
  return l;
}

// The analytic gradients of every input, in one struct, from the reference backward.
struct Grads {
  std::vector<double> xh, W, b, c;
};

Grads analytic(const Shape& s, const DoubleInputs& in) {
  const RefInputs ri = in.views();
  const RefBackward r = reference_backward(s, ri, reference_forward(s, ri));
  Grads g;
  g.xh.resize(in.xh.size()), g.W.resize(in.W.size());
  for (std::size_t k = 0; k < g.xh.size(); ++k) g.xh[k] = reference_dxh(s, ri, r, k);
  for (std::size_t k = 0; k < g.W.size(); ++k) g.W[k] = reference_dW(s, ri, r, k);
  g.b = r.db, g.c = r.dc;
  return g;
}

// The largest |analytic - central difference| over every element of every input, relative to the
// largest gradient. In double with h = 1e-5 the difference is exact to ~1e-10.
double worst_fd_error(const Shape& s, DoubleInputs in, const Grads& g) {
  const double h = 1e-5;
  double worst = 0, scale = 0;
  auto check = [&](std::vector<double>& x, const std::vector<double>& grad) {
    const std::vector<double> x0 = x;
    const model_test::FiniteDifferences fd = model_test::finite_differences(x0, grad, [&](const std::vector<double>& p) {
      x = p;
      return loss(s, in);
    }, h);
    x = x0;
    worst = std::max(worst, fd.worst);
    for (double v : grad) scale = std::max(scale, std::fabs(v));
  };
  check(in.xh, g.xh), check(in.W, g.W), check(in.b, g.b), check(in.c, g.c);
  return worst / scale;
}

TEST(LstmCellReference, ForwardOnHandComputedValues) {
  // B = 1, I = 1, H = 1, x = 1, h = 0, W = [0.5, 0; 0, 0; 1, 0; -0.5, 0] (rows i, f, g, o), b = 0.
  const Shape s = tiny(Direction::fwd, 1, 1, 1);
  DoubleInputs in;
  in.xh = {1, 0}, in.W = {0.5, 0, 0, 0, 1, 0, -0.5, 0}, in.b = {0, 0, 0, 0}, in.c = {2};
  const RefForward f = reference_forward(s, in.views());
  const double i = 1 / (1 + std::exp(-0.5)), fg = 0.5, g = std::tanh(1.0), o = 1 / (1 + std::exp(0.5));
  EXPECT_NEAR(f.c[0], fg * 2 + i * g, 1e-15);
  EXPECT_NEAR(f.h[0], o * std::tanh(fg * 2 + i * g), 1e-15);
  // Gate order i, f, g, o along W's rows.
  EXPECT_NEAR(f.act[0], i, 1e-15);
  EXPECT_NEAR(f.act[1], fg, 1e-15);
  EXPECT_NEAR(f.act[2], g, 1e-15);
  EXPECT_NEAR(f.act[3], o, 1e-15);
}

TEST(LstmCellReference, BackwardMatchesFiniteDifferencesOfForward) {
  for (const Shape& s : {tiny(Direction::bwd, 2, 3, 4), tiny(Direction::bwd, 3, 2, 5), tiny(Direction::bwd, 1, 1, 1)}) {
    const DoubleInputs in = random_inputs(s, 7);
    EXPECT_LT(worst_fd_error(s, in, analytic(s, in)), 1e-8) << "B=" << s.B << " I=" << s.I << " H=" << s.H;
  }
}

TEST(LstmCellReference, FiniteDifferencesCatchAPlantedError) {
  const Shape s = tiny(Direction::bwd, 2, 3, 4);
  const DoubleInputs in = random_inputs(s, 11);
  const Grads good = analytic(s, in);
  // A gradient that forgot one path (dh' through tanh(c') into dc), and one slipped element.
  Grads bad = good;
  bad.c[1] -= in.dh[1] * 0.1;
  EXPECT_GT(worst_fd_error(s, in, bad), 1e-3);
  Grads bad_w = good;
  bad_w.W[5] *= 1.01;
  EXPECT_GT(worst_fd_error(s, in, bad_w), 1e-5);
}

// The reference outputs of a problem as Outputs in f32, to feed verify().
Outputs reference_outputs(const Shape& s, const Inputs& in) {
  Outputs o = make_outputs(s);
  const RefInputs ri = ref_inputs(in);
  const RefForward f = reference_forward(s, ri);
  if (s.dir == Direction::fwd) {
    for (std::size_t k = 0; k < f.h.size(); ++k) o.h.set(k, f.h[k]), o.c.set(k, f.c[k]);
    return o;
  }
  const RefBackward r = reference_backward(s, ri, f);
  for (std::size_t k = 0; k < o.dxh.count(); ++k) o.dxh.set(k, reference_dxh(s, ri, r, k));
  for (std::size_t k = 0; k < o.dW.count(); ++k) o.dW.set(k, reference_dW(s, ri, r, k));
  for (std::size_t k = 0; k < o.dc.count(); ++k) o.dc.set(k, r.dc[k]);
  for (std::size_t k = 0; k < o.db.count(); ++k) o.db.set(k, r.db[k]);
  return o;
}

TEST(LstmCellVerify, PassesTheReferenceAndCatchesPlantedErrors) {
  for (Direction d : {Direction::fwd, Direction::bwd}) {
    const Shape s = tiny(d, 3, 5, 7);
    const Inputs in = make_inputs(s, 42);
    const Outputs good = reference_outputs(s, in);
    EXPECT_TRUE(verify(s, in, good).ok) << verify(s, in, good).message;
    // Each output in turn: one wrong element, then one NaN (an element never written).
    std::vector<HostBuffer Outputs::*> outs = d == Direction::fwd
                                                  ? std::vector<HostBuffer Outputs::*>{&Outputs::h, &Outputs::c}
                                                  : std::vector<HostBuffer Outputs::*>{&Outputs::dxh, &Outputs::dc,
                                                                                       &Outputs::dW, &Outputs::db};
    for (HostBuffer Outputs::*m : outs) {
      Outputs bad = good;
      (bad.*m).set(2, (bad.*m).get(2) + 0.05);
      EXPECT_FALSE(verify(s, in, bad).ok);
      Outputs nan = good;
      (nan.*m).set(1, std::nan(""));
      EXPECT_FALSE(verify(s, in, nan).ok);
    }
  }
}

TEST(LstmCellVerify, AnErrorSpreadOverAnOutputFailsTheRmsBound) {
  // Every element of h' off by half the dtype's per-element bound (a wrong term, not rounding): it
  // fails the rms bound; a tenth of it passes.
  Shape s = tiny(Direction::fwd, 3, 5, 7);
  s.dtype = DType::bf16;
  const Inputs in = make_inputs(s, 42);
  const Outputs good = reference_outputs(s, in);
  double sumsq = 0;
  for (std::size_t k = 0; k < good.h.count(); ++k) sumsq += good.h.get(k) * good.h.get(k);
  const double rms = std::sqrt(sumsq / static_cast<double>(good.h.count())), tol = tolerance(s.dtype);
  for (double part : {0.5, 0.05}) {
    Outputs o = make_outputs(s);
    o.c = good.c;
    o.h = HostBuffer(DType::f32, good.h.count());  // f32: the error is what the test plants, not bf16's rounding
    for (std::size_t k = 0; k < o.h.count(); ++k) o.h.set(k, good.h.get(k) + (k % 2 ? part : -part) * tol * rms);
    const Check c = verify(s, in, o);
    EXPECT_EQ(c.ok, part < 0.1) << part << ": " << c.message;
  }
}

TEST(LstmCellVerify, SwappedGatesFail) {
  // W's f and i rows exchanged: a gate-order slip every backend could make.
  const Shape s = tiny(Direction::fwd, 4, 3, 5);
  Inputs in = make_inputs(s, 5);
  Inputs swapped = in;
  const auto H = static_cast<std::size_t>(s.H), K = static_cast<std::size_t>(s.K());
  for (std::size_t k = 0; k < H * K; ++k) {
    swapped.W.set(k, in.W.get(H * K + k));
    swapped.W.set(H * K + k, in.W.get(k));
  }
  EXPECT_FALSE(verify(s, in, reference_outputs(s, swapped)).ok);
}

// One CPU plan per implementation and direction, two sets of tensors the test owns: each run works
// on the pointers it is given (and what the plan keeps of its inputs follows them).
TEST(LstmCellPlan, RunsOnTheBuffersItIsGivenEachRun) {
  for (CpuImpl impl : {CpuImpl::hotops, CpuImpl::onednn})
    for (Direction d : {Direction::fwd, Direction::bwd}) {
      Shape s = tiny(d, 3, 5, 8);
      s.cpu_impl = impl;
      const auto plan = make_cpu_plan(s);
      struct Tensors {
        Inputs in;
        Outputs out;
      };
      Tensors one{make_inputs(s, 1), make_outputs(s)}, two{make_inputs(s, 2), make_outputs(s)};
      for (Tensors* t : {&one, &two, &one}) {
        Outputs& o = t->out;
        for (HostBuffer* b : {&o.h, &o.c, &o.dxh, &o.dc, &o.dW, &o.db}) b->poison();
        Args a{t->in.xh.data(), t->in.W.data(), t->in.b.data(), t->in.c.data(), o.h.data(), o.c.data(),
               t->in.dh.data(), t->in.dc.data(), o.dxh.data(), o.dc.data(), o.dW.data(), o.db.data()};
        plan->run(a);
        plan->run(a);
        const Check c = verify(s, t->in, o);
        EXPECT_TRUE(c.ok) << cpu_impl_name(impl) << " " << direction_name(d) << ": " << c.message;
      }
    }
}

TEST(LstmCellFamily, NamesWorkAndTheRequiredProblem) {
  const Family& f = family();
  bool found = false;
  for (const Problem& p : f.benchmark_problems({})) {
    if (p.name() == "lstm_cell/cuda/f32/fwd/shape:deepbench.h1024/batch:64/input:1024/hidden:1024") {
      found = true;
      const Work w = f.work(p);
      EXPECT_DOUBLE_EQ(w.flops, 2.0 * 64 * 4096 * 2048 + 64.0 * 1024 * kPointwiseFlopsFwd);
      EXPECT_DOUBLE_EQ(w.bytes, 4.0 * (64 * 2048 + 4096.0 * 2048 + 4096 + 64 * 1024 + 2 * 64 * 1024));
      EXPECT_DOUBLE_EQ(w.items, 64);
    }
  }
  EXPECT_TRUE(found);
  // impl: only on the CPU, and it does not change the inputs.
  Problem a{"lstm_cell", Backend::cpu, DType::f32, Direction::fwd,
            {{"shape", "t"}, {"batch", "2"}, {"input", "3"}, {"hidden", "4"}}};
  Problem b = a;
  b.args.push_back({"impl", "onednn"});
  EXPECT_EQ(seed_without_impl(a), seed_without_impl(b));
  EXPECT_EQ(cpu_impl_of(b), CpuImpl::onednn);
}

}  // namespace
}  // namespace hotops::lstm_cell
