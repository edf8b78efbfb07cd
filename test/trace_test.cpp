// The per-op breakdown of a model step: the bookkeeping of the instrumented pass, the CPU pass on
// a step of known shape, and a real model step whose ops must cover its time.
#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "hotops/op.h"
#include "hotops/trace.h"

namespace hotops {
namespace {

double us_of(const trace::Breakdown& b, const std::string& op) {
  for (const trace::Part& p : b.parts)
    if (p.op == op) return p.us;
  return -1;
}

TEST(Trace, MarksOutsideAPassDoNothing) {
  ASSERT_EQ(trace::active(), nullptr);
  trace::op("addmm");  // no recorder: must not crash or record
  EXPECT_EQ(trace::active(), nullptr);
}

TEST(Trace, SpansGoToTheOpThatStartedThemAndAverageOverSteps) {
  trace::Breakdown b;
  // Step 1 starts at 0, ends at 10 s: nothing before 1 s, a for 1..4 and 8..10, b for 4..8.
  trace::add_step({"a", "b", "a"}, {1, 4, 8}, 0, 10, b);
  ASSERT_EQ(b.parts.size(), 2u);
  EXPECT_DOUBLE_EQ(us_of(b, "a"), 5e6);
  EXPECT_DOUBLE_EQ(us_of(b, "b"), 4e6);
  EXPECT_DOUBLE_EQ(b.step_us, 10e6);
  EXPECT_DOUBLE_EQ(b.covered_us(), 9e6) << "what ran before the first mark is not covered";
  // Step 2: only b, 2 s of a 2 s step. Means: a 2.5 s, b 3 s, the step 6 s.
  trace::add_step({"b"}, {20}, 20, 22, b);
  EXPECT_EQ(b.steps, 2);
  EXPECT_DOUBLE_EQ(us_of(b, "a"), 2.5e6);
  EXPECT_DOUBLE_EQ(us_of(b, "b"), 3e6);
  EXPECT_DOUBLE_EQ(b.step_us, 6e6);
  EXPECT_EQ(b.parts[0].op, "a") << "parts keep the order of first appearance";
}

TEST(Trace, CpuPassTimesEachOpOfTheStep) {
  const auto sleep_ms = [](int ms) { std::this_thread::sleep_for(std::chrono::milliseconds(ms)); };
  int steps = 0;
  const trace::Breakdown b = trace::measure_on_cpu(
      [&] {
        ++steps;
        trace::op("slow"), sleep_ms(6);
        trace::op("fast"), sleep_ms(2);
      },
      0.0, 5);
  EXPECT_EQ(b.steps, 5);
  EXPECT_EQ(steps, 5);
  EXPECT_EQ(trace::active(), nullptr) << "the recorder is removed after the pass";
  // A sleep lasts at least as long as asked; a busy machine may stretch it, never shorten it.
  EXPECT_GE(us_of(b, "slow"), 6e3);
  EXPECT_GE(us_of(b, "fast"), 2e3);
  EXPECT_GE(b.covered_us() / b.step_us, 0.9);
  EXPECT_LE(b.covered_us() / b.step_us, 1.0 + 1e-9);
}

TEST(Trace, CpuPassRemovesItsRecorderWhenTheStepThrows) {
  EXPECT_THROW(trace::measure_on_cpu([] { trace::op("x"), throw std::runtime_error("boom"); }, 0.0, 1), std::runtime_error);
  EXPECT_EQ(trace::active(), nullptr);
}

// A real model step on the CPU: the ops it marks cover its instrumented time (a batch whose step
// takes some hundreds of microseconds, so that a busy machine's preemptions stay small in it).
TEST(Trace, ModelStepOpsCoverTheStep) {
  const Family* models = nullptr;
  for (const Family* f : families())
    if (f->name() == "models") models = f;
  ASSERT_NE(models, nullptr);
  Problem p{"model.mlp_tiny", Backend::cpu, DType::f32, Direction::train, {{"batch", "4096"}}};
  const auto c = models->make(p);
  const trace::Breakdown b = trace::measure_on_cpu([&] { c->run(); }, 0.01, 5);
  for (const char* op : {"addmm", "cross_entropy", "mm", "adamw"}) EXPECT_GT(us_of(b, op), 0) << op;
  EXPECT_GE(b.covered_us() / b.step_us, 0.9);
  EXPECT_LE(b.covered_us() / b.step_us, 1.0 + 1e-9);
}

}  // namespace
}  // namespace hotops
