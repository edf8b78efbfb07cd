// The plan harness: a PlanCase's verification fails where the op is wrong (an output left unwritten,
// an in-out tensor not reset), and a plan runs on whatever buffers its caller passes, run to run.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "hotops/plan.h"
#include "kernels/softmax/softmax.h"

namespace hotops {
namespace {

// A toy op on the CPU: out[i] = 2 * x[i] (or, with `skip`, every element but the last), and acc[i]
// += 1 in place; its check, after two runs, compares with the reference.
struct Toy {
  struct Shape {
    std::size_t n = 5;
    bool skip = false;
  };
  struct Args {
    const void* x;
    void* out;
    void* acc;
  };
  struct Io {
    HostBuffer x, out, acc0, acc;
  };
  class Doubler final : public Plan<Args> {
   public:
    explicit Doubler(const Shape& s) : s_(s) {}
    void run(const Args& a) override {
      const auto* x = static_cast<const float*>(a.x);
      auto* out = static_cast<float*>(a.out);
      auto* acc = static_cast<float*>(a.acc);
      for (std::size_t i = 0; i < s_.n - (s_.skip ? 1 : 0); ++i) out[i] = 2 * x[i];
      for (std::size_t i = 0; i < s_.n; ++i) acc[i] += 1;
    }
    std::string label() const override { return "toy"; }

   private:
    Shape s_;
  };
  static Shape shape(const Problem& p) { return Shape{5, p.get("skip") == std::string("1")}; }
  static Io io(const Shape& s, std::uint64_t seed) {
    Io io{HostBuffer(DType::f32, s.n), HostBuffer(DType::f32, s.n), HostBuffer(DType::f32, s.n),
          HostBuffer(DType::f32, s.n)};
    io.x.fill_uniform(seed, 0);
    io.acc0.fill_uniform(seed, 1);
    return io;
  }
  static Args bind(const Shape&, Io& io, Binder& b) { return {b.in(io.x), b.out(io.out), b.inout(io.acc0, io.acc)}; }
  static std::unique_ptr<Plan<Args>> plan(const Shape& s, Backend) { return std::make_unique<Doubler>(s); }
  static int check_runs(const Shape&) { return 2; }  // the check sees two runs' in-place updates
  static Check check(const Shape& s, const Io& io) {
    std::vector<std::size_t> idx(s.n);
    for (std::size_t i = 0; i < s.n; ++i) idx[i] = i;
    Check c = compare(io.out, idx, [&](std::size_t i) { return 2 * io.x.get(i); }, 0);
    c.merge(compare(io.acc, idx, [&](std::size_t i) { return io.acc0.get(i) + 2; }, 1e-6), "acc");
    return c;
  }
};

Problem toy_problem(bool skip) { return Problem{"toy", Backend::cpu, DType::f32, Direction::fwd, {{"skip", skip ? "1" : "0"}}}; }

TEST(PlanCase, VerifiesTheOutputsAndResetsInOutTensors) {
  PlanCase<Toy> c(toy_problem(false));
  // Timed runs move the in-out tensor on; verification starts it again from its initial values.
  for (int i = 0; i < 3; ++i) c.run();
  const Check ok = c.verify();
  EXPECT_TRUE(ok.ok) << ok.message;
  EXPECT_EQ(c.label(), "toy");
}

TEST(PlanCase, AnOutputTheOpDoesNotWriteFailsVerification) {
  PlanCase<Toy> c(toy_problem(true));
  const Check bad = c.verify();
  EXPECT_FALSE(bad.ok);
}

// Every implementation of one problem computes on the same numbers: the inputs' seed is the
// problem's name less its `impl` arg.
struct SeedToy : Toy {
  static Io io(const Shape& s, std::uint64_t seed) {
    Io io = Toy::io(s, seed);
    seen() = seed;
    return io;
  }
  static std::uint64_t& seen() {
    static std::uint64_t seed = 0;
    return seed;
  }
};

TEST(PlanCase, EveryImplOfAProblemSeesTheSameInputs) {
  Problem a = toy_problem(false), b = a;
  b.args.push_back({"impl", "other"});
  PlanCase<SeedToy> ca(a);
  const std::uint64_t seed_a = SeedToy::seen();
  PlanCase<SeedToy> cb(b);
  EXPECT_EQ(SeedToy::seen(), seed_a);
  EXPECT_EQ(seed_a, a.seed());
  EXPECT_NE(a.seed(), b.seed());
}

// One softmax plan on the CPU, run on two pairs of caller-owned buffers in turn: each result is that
// of its own input (a plan that kept the first buffers would write the second result into the first).
TEST(Plan, RunsOnTheBuffersItIsGivenEachRun) {
  const Problem p{"softmax", Backend::cpu, DType::f32, Direction::fwd, {{"shape", "test"}, {"rows", "3"}, {"cols", "7"}}};
  const softmax::Shape s = softmax::shape_of(p);
  auto plan = softmax::make_plan(s, Backend::cpu);
  softmax::Inputs a = softmax::make_inputs(s, 1), b = softmax::make_inputs(s, 2);
  HostBuffer ya = softmax::make_output(s), yb = softmax::make_output(s);
  ya.poison(), yb.poison();
  plan->run({a.x.data(), nullptr, nullptr, ya.data()});
  plan->run({b.x.data(), nullptr, nullptr, yb.data()});
  const Check ca = softmax::verify(s, a, ya), cb = softmax::verify(s, b, yb);
  EXPECT_TRUE(ca.ok) << ca.message;
  EXPECT_TRUE(cb.ok) << cb.message;
  EXPECT_FALSE(softmax::verify(s, b, ya).ok);
}

}  // namespace
}  // namespace hotops
