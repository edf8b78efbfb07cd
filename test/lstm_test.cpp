// lstm: the reference against a hand computation and against finite differences of itself, and
// verification that must fail on planted errors.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "hotops/gpu.h"
#include "hotops/verify.h"

#include "kernels/lstm/lstm.h"
#include "test/plan_test_util.h"

namespace hotops::lstm {
namespace {

Shape tiny(bool bi, Direction dir = Direction::bwd) {
  Shape s;
  s.dir = dir;
  s.T = 3, s.B = 2, s.I = 3, s.H = 4;
  s.bidirectional = bi;
  return s;
}

double sigmoid(double v) { return 1 / (1 + std::exp(-v)); }

TEST(LstmReference, OneStepByHand) {
  Shape s;
  s.T = 1, s.B = 1, s.I = 1, s.H = 1;
  RefInputs in;
  in.x = {0.5};
  in.h0 = {-0.25};
  in.c0 = {0.75};
  in.w_ih = {0.1, -0.2, 0.3, 0.4};   // gates i, f, g, o
  in.w_hh = {0.5, 0.6, -0.7, 0.8};
  in.b_ih = {0.01, 0.02, 0.03, 0.04};
  in.b_hh = {-0.05, 0.06, 0.07, -0.08};
  auto pre = [&](int g) { return in.w_ih[g] * 0.5 + in.w_hh[g] * -0.25 + in.b_ih[g] + in.b_hh[g]; };
  const double i = sigmoid(pre(0)), f = sigmoid(pre(1)), g = std::tanh(pre(2)), o = sigmoid(pre(3));
  const double c = f * 0.75 + i * g, h = o * std::tanh(c);
  const Forward r = reference_forward(s, in);
  EXPECT_NEAR(r.y[0], h, 1e-15);
  EXPECT_NEAR(r.hT[0], h, 1e-15);
  EXPECT_NEAR(r.cT[0], c, 1e-15);
}

// loss = sum(dy * y) + sum(dhT * hT) + sum(dcT * cT), so its gradient is what the backward gives.
double loss(const Shape& s, const RefInputs& in) {
  const Forward f = reference_forward(s, in);
  double l = 0;
  for (std::size_t k = 0; k < f.y.size(); ++k) l += in.dy[k] * f.y[k];
  for (std::size_t k = 0; k < f.hT.size(); ++k) l += in.dhT[k] * f.hT[k] + in.dcT[k] * f.cT[k];
  return l;
}

// Central differences on every element of `v` (a member of `in`) against `grad`.
void check_gradient(const Shape& s, RefInputs& in, std::vector<double>& v, const std::vector<double>& grad,
                    const char* what) {
  ASSERT_EQ(v.size(), grad.size()) << what;
  const double eps = 1e-6;
  for (std::size_t k = 0; k < v.size(); ++k) {
    const double keep = v[k];
    v[k] = keep + eps;
    const double up = loss(s, in);
    v[k] = keep - eps;
    const double down = loss(s, in);
    v[k] = keep;
    const double fd = (up - down) / (2 * eps);
    EXPECT_NEAR(grad[k], fd, 1e-7 * std::max(1.0, std::fabs(fd))) << what << "[" << k << "]";
  }
}

class LstmFiniteDifferences : public testing::TestWithParam<bool> {};

TEST_P(LstmFiniteDifferences, BackwardIsTheGradientOfTheForward) {
  const Shape s = tiny(GetParam());
  RefInputs in = to_double(make_inputs(s, 42));
  const Backward b = reference_backward(s, in, reference_forward(s, in));
  std::vector<double> dh0 = b.dh0, dc0 = b.dc0;
  check_gradient(s, in, in.x, b.dx, "dx");
  check_gradient(s, in, in.h0, b.dh0, "dh0");
  check_gradient(s, in, in.c0, b.dc0, "dc0");
  check_gradient(s, in, in.w_ih, b.dw_ih, "dW_ih");
  check_gradient(s, in, in.w_hh, b.dw_hh, "dW_hh");
  check_gradient(s, in, in.b_ih, b.db, "db (b_ih)");
  check_gradient(s, in, in.b_hh, b.db, "db (b_hh)");
}

INSTANTIATE_TEST_SUITE_P(UniAndBi, LstmFiniteDifferences, testing::Values(false, true),
                         [](const testing::TestParamInfo<bool>& i) { return i.param ? "bi" : "uni"; });

// The reference's results as an f32 backend would hand them back.
HostBuffer as_f32(const std::vector<double>& v) {
  HostBuffer b(DType::f32, v.size());
  for (std::size_t k = 0; k < v.size(); ++k) b.set(k, v[k]);
  return b;
}

Outputs outputs_of(const Shape& s, const RefInputs& in) {
  const Forward f = reference_forward(s, in);
  Outputs o;
  if (s.dir == Direction::fwd) {
    o.y = as_f32(f.y), o.hT = as_f32(f.hT), o.cT = as_f32(f.cT);
    return o;
  }
  const Backward b = reference_backward(s, in, f);
  o.dx = as_f32(b.dx), o.dh0 = as_f32(b.dh0), o.dc0 = as_f32(b.dc0);
  o.dw_ih = as_f32(b.dw_ih), o.dw_hh = as_f32(b.dw_hh), o.db = as_f32(b.db);
  return o;
}

TEST(LstmVerify, PassesTheReferenceAndFailsPlantedErrors) {
  for (bool bi : {false, true})
    for (Direction dir : {Direction::fwd, Direction::bwd}) {
      const Shape s = tiny(bi, dir);
      const Inputs in = make_inputs(s, 7);
      const RefInputs d = to_double(in);
      ReferenceCache cache;
      EXPECT_TRUE(verify(s, in, outputs_of(s, d), cache).ok);

      // One element off by 1%: far above the f32 bound of 1e-4.
      Outputs one = outputs_of(s, d);
      HostBuffer& victim = dir == Direction::fwd ? one.y : one.dw_hh;
      victim.set(5, victim.get(5) * 1.01 + 0.01);
      const Check c1 = verify(s, in, one, cache);
      EXPECT_FALSE(c1.ok);
      EXPECT_NE(c1.message.find(dir == Direction::fwd ? "y" : "dW_hh"), std::string::npos) << c1.message;

      // A classic bug: gates i and f swapped in W_hh.
      RefInputs swapped = d;
      const std::size_t H = static_cast<std::size_t>(s.H);
      for (std::size_t k = 0; k < H * H; ++k) std::swap(swapped.w_hh[k], swapped.w_hh[H * H + k]);
      EXPECT_FALSE(verify(s, in, outputs_of(s, swapped), cache).ok);

      // The backward direction run left to right (bi only): y's second half must not match.
      if (bi && dir == Direction::fwd) {
        Outputs uni = outputs_of(s, d);
        Shape one_way = s;
        one_way.bidirectional = false;
        RefInputs dd = d;  // the bwd direction's parameters as a unidirectional layer
        const std::size_t BH = static_cast<std::size_t>(s.B * s.H);
        dd.h0.assign(d.h0.begin() + BH, d.h0.end());
        dd.c0.assign(d.c0.begin() + BH, d.c0.end());
        dd.w_ih.assign(d.w_ih.begin() + static_cast<long>(d.w_ih.size() / 2), d.w_ih.end());
        dd.w_hh.assign(d.w_hh.begin() + static_cast<long>(d.w_hh.size() / 2), d.w_hh.end());
        dd.b_ih.assign(d.b_ih.begin() + static_cast<long>(d.b_ih.size() / 2), d.b_ih.end());
        dd.b_hh.assign(d.b_hh.begin() + static_cast<long>(d.b_hh.size() / 2), d.b_hh.end());
        const Forward wrong = reference_forward(one_way, dd);
        for (std::int64_t t = 0; t < s.T; ++t)
          for (std::size_t k = 0; k < BH; ++k) {
            const std::size_t b = k / H, j = k % H;
            uni.y.set(static_cast<std::size_t>(t) * 2 * BH + b * 2 * H + H + j,
                      wrong.y[static_cast<std::size_t>(t) * BH + k]);
          }
        EXPECT_FALSE(verify(s, in, uni, cache).ok);
      }
    }
}

// The tensors of one CPU run of a plan, in host memory the test owns.
struct Tensors {
  Inputs in;
  HostBuffer weights, y, hT, cT, gradients;
  Outputs out;
  Args args;
};

Tensors tensors_of(const Shape& s, const Layout& layout, std::uint64_t seed) {
  Tensors t;
  t.in = make_inputs(s, seed);
  t.weights = layout.pack(t.in.w_ih, t.in.w_hh, t.in.b_ih, t.in.b_hh);
  const auto T = static_cast<std::size_t>(s.T), B = static_cast<std::size_t>(s.B), I = static_cast<std::size_t>(s.I),
             H = static_cast<std::size_t>(s.H), D = static_cast<std::size_t>(s.D());
  t.y = HostBuffer(DType::f32, T * B * D * H);
  t.hT = HostBuffer(DType::f32, D * B * H);
  t.cT = HostBuffer(DType::f32, D * B * H);
  t.args = Args{t.in.x.data(), t.in.h0.data(), t.in.c0.data(), t.weights.data(), t.y.data(), t.hT.data(), t.cT.data()};
  if (s.dir == Direction::fwd) return t;
  t.out.dx = HostBuffer(DType::f32, T * B * I);
  t.out.dh0 = HostBuffer(DType::f32, D * B * H);
  t.out.dc0 = HostBuffer(DType::f32, D * B * H);
  t.gradients = HostBuffer(DType::f32, layout.gradient_bytes() / 4);
  t.args.dy = t.in.dy.data(), t.args.dhT = t.in.dhT.data(), t.args.dcT = t.in.dcT.data();
  t.args.dx = t.out.dx.data(), t.args.dh0 = t.out.dh0.data(), t.args.dc0 = t.out.dc0.data();
  t.args.dweights = t.gradients.data();
  return t;
}

Check check_of(const Shape& s, const Layout& layout, Tensors& t) {
  if (s.dir == Direction::fwd) {
    t.out.y = t.y, t.out.hT = t.hT, t.out.cT = t.cT;
  } else {
    layout.unpack(t.gradients, t.out);
  }
  ReferenceCache cache;
  return verify(s, t.in, t.out, cache);
}

// One CPU plan, two sets of tensors: each run works on the pointers it is given (and a bwd run on
// new inputs makes its own training forward first); a second run on the same tensors (gradients
// zeroed, not accumulated) gives the same answer.
TEST(LstmPlan, RunsOnTheBuffersItIsGivenEachRun) {
  for (bool bi : {false, true})
    for (Direction dir : {Direction::fwd, Direction::bwd}) {
      const Shape s = tiny(bi, dir);
      const auto plan = make_cpu_plan(s);
      const auto layout = make_cpu_layout(s);
      Tensors a = tensors_of(s, *layout, 1), b = tensors_of(s, *layout, 2);
      for (Tensors* t : {&a, &b, &a}) {
        for (HostBuffer* o : {&t->y, &t->hT, &t->cT, &t->out.dx, &t->out.dh0, &t->out.dc0, &t->gradients}) o->poison();
        plan->run(t->args);
        plan->run(t->args);
        const Check c = check_of(s, *layout, *t);
        EXPECT_TRUE(c.ok) << (bi ? "bi " : "uni ") << direction_name(dir) << ": " << c.message;
      }
    }
}

// Masters: a weight space packed each step from f32 masters in PyTorch's layouts is the one the
// Layout packs, byte for byte, and the gradient space unpacks into PyTorch's layouts as the Layout
// unpacks it (db into both bias gradients).
TEST(LstmMasters, PackAndUnpackAgreeWithTheLayout) {
  for (bool bi : {false, true})
    for (Direction dir : {Direction::fwd, Direction::bwd}) {
      const Shape s = tiny(bi, dir);
      const std::string what = std::string(bi ? "bi " : "uni ") + direction_name(dir);
      const auto plan = make_cpu_plan(s);
      const auto layout = make_cpu_layout(s);
      const auto masters = make_cpu_masters(s);
      Tensors t = tensors_of(s, *layout, 3);
      HostBuffer space(DType::f32, layout->weight_bytes() / 4);
      std::memset(space.data(), 0, space.bytes());  // the padding between regions, as pack() leaves it
      MasterArgs m;
      m.w_ih = t.in.w_ih.as<float>(), m.w_hh = t.in.w_hh.as<float>();
      m.b_ih = t.in.b_ih.as<float>(), m.b_hh = t.in.b_hh.as<float>();
      m.weights = space.data();
      masters->pack(m);
      EXPECT_EQ(std::memcmp(space.data(), t.weights.data(), space.bytes()), 0) << what;
      if (dir == Direction::fwd) continue;
      plan->run(t.args);
      layout->unpack(t.gradients, t.out);
      HostBuffer dw_ih = t.out.dw_ih, dw_hh = t.out.dw_hh, db_ih = t.out.db, db_hh = t.out.db;
      for (HostBuffer* b : {&dw_ih, &dw_hh, &db_ih, &db_hh}) b->poison();
      m.dweights = t.gradients.data();
      m.dw_ih = dw_ih.as<float>(), m.dw_hh = dw_hh.as<float>(), m.db_ih = db_ih.as<float>(), m.db_hh = db_hh.as<float>();
      masters->unpack(m);
      EXPECT_EQ(std::memcmp(dw_ih.data(), t.out.dw_ih.data(), dw_ih.bytes()), 0) << what;
      EXPECT_EQ(std::memcmp(dw_hh.data(), t.out.dw_hh.data(), dw_hh.bytes()), 0) << what;
      EXPECT_EQ(std::memcmp(db_ih.data(), t.out.db.data(), db_ih.bytes()), 0) << what;
      EXPECT_EQ(std::memcmp(db_hh.data(), t.out.db.data(), db_hh.bytes()), 0) << what;
    }
}

// hotops' CPU layer on every kind of bf16 problem it can run, including those make_cpu_plan gives
// to oneDNN (inference, two directions), against the reference: fwd's y, hT, cT and bwd's
// gradients, a last step part of the batch per thread (batch 5 on the threads there are).
TEST(LstmCpuHotops, EveryDirectionAndBothDirectionsMatchTheReference) {
  const auto in_f32 = [](const HostBuffer& b) {
    HostBuffer out(DType::f32, b.count());
    for (std::size_t i = 0; i < b.count(); ++i) out.set(i, b.get(i));
    return out;
  };
  for (bool bi : {false, true})
    for (Direction dir : {Direction::fwd, Direction::bwd}) {
      Shape s = tiny(bi, dir);
      s.dtype = DType::bf16, s.T = 4, s.B = 5, s.I = 6, s.H = 16;
      const std::string what = std::string(bi ? "bi " : "uni ") + direction_name(dir);
      const auto plan = make_cpu_hotops_plan(s);
      const auto layout = make_cpu_hotops_layout(s);
      const Inputs in = make_inputs(s, 11);
      HostBuffer weights = layout->pack(in.w_ih, in.w_hh, in.b_ih, in.b_hh);
      const auto T = static_cast<std::size_t>(s.T), B = static_cast<std::size_t>(s.B),
                 I = static_cast<std::size_t>(s.I), H = static_cast<std::size_t>(s.H),
                 D = static_cast<std::size_t>(s.D());
      Outputs out;
      out.y = HostBuffer(DType::bf16, T * B * D * H);
      out.hT = HostBuffer(DType::bf16, D * B * H);
      out.cT = HostBuffer(DType::bf16, D * B * H);
      Args a{in.x.data(), in.h0.data(), in.c0.data(), weights.data(), out.y.data(), out.hT.data(), out.cT.data()};
      HostBuffer dy, dhT, dcT, gradients;
      if (dir == Direction::bwd) {
        dy = in_f32(in.dy), dhT = in_f32(in.dhT), dcT = in_f32(in.dcT);
        out.dx = HostBuffer(DType::f32, T * B * I);
        out.dh0 = HostBuffer(DType::f32, D * B * H);
        out.dc0 = HostBuffer(DType::f32, D * B * H);
        gradients = HostBuffer(DType::f32, layout->gradient_bytes() / 4);
        a.dy = dy.data(), a.dhT = dhT.data(), a.dcT = dcT.data();
        a.dx = out.dx.data(), a.dh0 = out.dh0.data(), a.dc0 = out.dc0.data(), a.dweights = gradients.data();
      }
      plan->run(a);
      if (dir == Direction::bwd) layout->unpack(gradients, out);
      ReferenceCache cache;
      const Check c = verify(s, in, out, cache);
      EXPECT_TRUE(c.ok) << what << ": " << c.message;
    }
}

// hotops' CPU layer (bf16, training): its weight space is the f32 masters' bf16 copy, as its
// Layout packs the same values, and its f32 gradient space goes back to the masters' gradients as the
// Layout unpacks it (db_ih and db_hh each their own region).
TEST(LstmMasters, HotopsCpuLayerAgreesWithItsLayout) {
  for (bool bi : {false, true}) {
    Shape s = tiny(bi);
    s.dtype = DType::bf16;
    EXPECT_EQ(cpu_takes_hotops(s), !bi) << "make_cpu_plan's choice";
    const auto layout = make_cpu_hotops_layout(s);
    const auto masters = make_cpu_hotops_masters(s);
    const Inputs in = make_inputs(s, 6);
    const HostBuffer want = layout->pack(in.w_ih, in.w_hh, in.b_ih, in.b_hh);
    const auto f32 = [](const HostBuffer& b) {
      HostBuffer out(DType::f32, b.count());
      for (std::size_t i = 0; i < b.count(); ++i) out.set(i, b.get(i));
      return out;
    };
    const HostBuffer w_ih = f32(in.w_ih), w_hh = f32(in.w_hh), b_ih = f32(in.b_ih), b_hh = f32(in.b_hh);
    HostBuffer space(DType::bf16, layout->weight_bytes() / 2);
    MasterArgs m;
    m.w_ih = w_ih.as<float>(), m.w_hh = w_hh.as<float>(), m.b_ih = b_ih.as<float>(), m.b_hh = b_hh.as<float>();
    m.weights = space.data();
    masters->pack(m);
    ASSERT_EQ(space.bytes(), want.bytes());
    EXPECT_EQ(std::memcmp(space.data(), want.data(), space.bytes()), 0) << (bi ? "bi" : "uni");
    HostBuffer gradients(DType::f32, layout->gradient_bytes() / 4);
    for (std::size_t i = 0; i < gradients.count(); ++i) gradients.set(i, 0.25 * static_cast<double>(i) - 7);
    Outputs out;
    layout->unpack(gradients, out);
    HostBuffer dw_ih(DType::f32, w_ih.count()), dw_hh(DType::f32, w_hh.count()), db_ih(DType::f32, b_ih.count()),
        db_hh(DType::f32, b_hh.count());
    m.dweights = gradients.data();
    m.dw_ih = dw_ih.as<float>(), m.dw_hh = dw_hh.as<float>(), m.db_ih = db_ih.as<float>(), m.db_hh = db_hh.as<float>();
    masters->unpack(m);
    EXPECT_EQ(std::memcmp(dw_ih.data(), out.dw_ih.data(), dw_ih.bytes()), 0);
    EXPECT_EQ(std::memcmp(dw_hh.data(), out.dw_hh.data(), dw_hh.bytes()), 0);
    EXPECT_EQ(std::memcmp(db_ih.data(), out.db.data(), db_ih.bytes()), 0);
    EXPECT_EQ(std::memcmp(db_hh.data(), out.db2.data(), db_hh.bytes()), 0);
  }
}

// The same at the models' shapes (lstm_textgen's 57 input channels, the IMDB BiLSTM's), f32 and, where
// this CPU runs it, bf16, with the machine's threads: the weight formats oneDNN picks there (AMX-blocked
// bf16 on an AMX Xeon) are packed from the f32 masters into the bytes the Layout packs.
TEST(LstmMasters, PackAgreesWithTheLayoutAtTheModelsShapes) {
  int compared = 0;
  for (DType t : {DType::f32, DType::bf16})
    for (bool bi : {false, true})
      for (Direction dir : {Direction::fwd, Direction::bwd}) {
        Shape s;
        s.dtype = t, s.dir = dir, s.bidirectional = bi;
        if (bi) s.T = 200, s.B = 64, s.I = 128, s.H = 128;
        else s.T = 40, s.B = 32, s.I = 57, s.H = 128;
        const std::string what = std::string(dtype_name(t)) + (bi ? " bi " : " uni ") + direction_name(dir);
        std::unique_ptr<Layout> layout;
        try {
          layout = make_cpu_layout(s);
        } catch (const Error& e) {
          if (e.kind() == ErrorKind::unsupported) continue;  // bf16 on a CPU without it
          throw;
        }
        const auto masters = make_cpu_masters(s);
        const Inputs in = make_inputs(s, 5);
        const HostBuffer want = layout->pack(in.w_ih, in.w_hh, in.b_ih, in.b_hh);
        const auto f32 = [](const HostBuffer& b) {  // the masters: the inputs' values in f32 (exact)
          HostBuffer out(DType::f32, b.count());
          for (std::size_t i = 0; i < b.count(); ++i) out.set(i, b.get(i));
          return out;
        };
        const HostBuffer w_ih = f32(in.w_ih), w_hh = f32(in.w_hh), b_ih = f32(in.b_ih), b_hh = f32(in.b_hh);
        HostBuffer space(DType::f32, layout->weight_bytes() / 4);
        std::memset(space.data(), 0, space.bytes());
        MasterArgs m;
        m.w_ih = w_ih.as<float>(), m.w_hh = w_hh.as<float>(), m.b_ih = b_ih.as<float>(), m.b_hh = b_hh.as<float>();
        m.weights = space.data();
        masters->pack(m);
        EXPECT_EQ(std::memcmp(space.data(), want.data(), space.bytes()), 0) << what;
        ++compared;
      }
  EXPECT_GE(compared, 4);  // f32 everywhere
}

// cuDNN's weight space and hotops' (H 16) are plain arrays: positions() names where pack() put each
// element of W_ih, W_hh, b_ih and b_hh. oneDNN's is not: no positions.
TEST(LstmLayout, PositionsSayWherePackPutsEachElement) {
  EXPECT_TRUE(make_cpu_layout(tiny(true))->positions().w_ih.empty()) << "oneDNN's f32 space";
  const bool gpu = gpu::available();
  for (Backend b : {Backend::cpu, Backend::cuda})
    for (DType t : {DType::f32, DType::bf16})
      for (bool bi : {false, true})
        for (std::int64_t H : {4, 16}) {
          Shape s = tiny(bi);
          s.dtype = t, s.H = H;
          if (b == Backend::cuda && !gpu) continue;
          if (b == Backend::cpu && !cpu_takes_hotops(s)) continue;  // oneDNN's space: no positions
          std::unique_ptr<Layout> layout;
          try {
            layout = make_layout(s, b);
          } catch (const Error& e) {
            if (e.kind() == ErrorKind::unsupported) continue;
            throw;
          }
          const Inputs in = make_inputs(s, 4);
          const HostBuffer space = layout->pack(in.w_ih, in.w_hh, in.b_ih, in.b_hh);
          const Layout::Positions p = layout->positions();
          const std::pair<const HostBuffer*, const std::vector<std::size_t>*> tensors[] = {
              {&in.w_ih, &p.w_ih}, {&in.w_hh, &p.w_hh}, {&in.b_ih, &p.b_ih}, {&in.b_hh, &p.b_hh}};
          for (const auto& [tensor, where] : tensors) {
            ASSERT_EQ(where->size(), tensor->count());
            for (std::size_t i = 0; i < where->size(); ++i)
              ASSERT_EQ(space.get((*where)[i]), tensor->get(i)) << dtype_name(t) << (bi ? " bi" : " uni") << " element " << i;
          }
        }
}

// The CPU and CUDA entries of one problem verify against one reference: their seeded inputs are the
// same numbers, and a family lists them a few entries apart. Another problem (here: the other
// direction) computes its own.
TEST(LstmVerify, EntriesOfOneProblemShareOneReference) {
  std::vector<Problem> problems;
  for (const Problem& p : family().test_problems())
    if (p.backend == Backend::cpu && p.dtype == DType::f32 && !p.has("threads")) problems.push_back(p);
  plan_test::expect_entries_share_one_reference(family(), problems);
}

TEST(LstmVerify, AnErrorSpreadOverAnOutputFailsTheRmsBound) {
  // Every element of one output off by half the per-element bound (a wrong term, not rounding): the
  // per-element bound alone lets it through, the rms bound does not; a tenth of it passes both.
  for (Direction dir : {Direction::fwd, Direction::bwd}) {
    Shape s = tiny(true, dir);
    s.dtype = DType::bf16;
    const Inputs in = make_inputs(s, 11);
    const RefInputs d = to_double(in);
    ReferenceCache cache;
    const Bounds b = bounds_of(s);
    for (double part : {0.5, 0.05}) {
      Outputs o = outputs_of(s, d);
      HostBuffer& victim = dir == Direction::fwd ? o.y : o.dw_hh;
      double sumsq = 0;
      for (std::size_t k = 0; k < victim.count(); ++k) sumsq += victim.get(k) * victim.get(k);
      const double rms = std::sqrt(sumsq / static_cast<double>(victim.count()));
      for (std::size_t k = 0; k < victim.count(); ++k) victim.set(k, victim.get(k) + (k % 2 ? part : -part) * b.max * rms);
      const Check c = verify(s, in, o, cache);
      EXPECT_EQ(c.ok, part < 0.1) << part << ": " << c.message;
      if (part > 0.1) {
        EXPECT_NE(c.message.find("rms(out-ref)/rms(ref)"), std::string::npos) << c.message;
      }
    }
  }
}

TEST(LstmVerify, ToleranceGrowsAsSqrtTBeyond25Steps) {
  Shape s;
  s.T = 25;
  const double base = tolerance_of(s);
  s.T = 3;
  EXPECT_EQ(tolerance_of(s), base);
  s.T = 100;
  EXPECT_DOUBLE_EQ(tolerance_of(s), 2 * base);
}

}  // namespace
}  // namespace hotops::lstm
