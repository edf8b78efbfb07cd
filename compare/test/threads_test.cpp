// hotops-compare threads: CPU entries by thread count (bench's threads:T sweep and the all-threads
// entry), the speed-up over one thread, the efficiency and the fastest count.
#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "compare/src/analysis.h"
#include "compare/src/report.h"

namespace hotops::compare {
namespace {

using RunData = Run;  // inside a TEST body, plain `Run` is gtest's Test::Run
using nlohmann::json;

json timed(const std::string& name, double us, json counters = json::object()) {
  json e{{"name", name}, {"run_name", name}, {"run_type", "iteration"}, {"iterations", 3},
         {"real_time", us}, {"time_unit", "us"}, {"label", "x"}};
  e.update(counters);
  return e;
}

// A model step swept over 1, 4 and 8 threads, its all-threads entry on 16 (cpu_threads), a second
// batch whose 4-thread entry failed, an op with no sweep and a CUDA entry (both left out).
RunData sweep_run() {
  const std::string m = "model.mlp_mnist/cpu/f32/train/batch:";
  json benchmarks = json::array({
      timed(m + "128/real_time", 1000, {{"cpu_threads", 16}}),
      timed(m + "128/threads:1/real_time", 8000),
      timed(m + "128/threads:4/real_time", 2500),
      timed(m + "128/threads:8/real_time", 900),
      timed(m + "1024/real_time", 5000, {{"cpu_threads", 16}, {"noise_pct", 12.0}}),
      timed(m + "1024/threads:1/real_time", 40000),
      {{"name", m + "1024/threads:4/real_time"}, {"run_name", m + "1024/threads:4/real_time"}, {"error_occurred", true},
       {"error_message", "verification failed: dW1"}, {"iterations", 0}, {"real_time", 0}, {"time_unit", "us"}},
      timed("mm/cpu/f32/fwd/M:64/N:64/K:64/real_time", 3),
      timed("model.mlp_mnist/cuda/f32/train/batch:128/manual_time", 70),
  });
  return parse_run(json{{"context", {{"threads", "16"}}}, {"benchmarks", benchmarks}}.dump(), "run.json");
}

TEST(Threads, SpeedupAndEfficiencyOverOneThreadByThreadCount) {
  const RunData run = sweep_run();
  const Threads th = threads(run);
  ASSERT_EQ(th.groups.size(), 1u) << "the op without a sweep and the CUDA entry stay out";
  const ThreadsGroup& g = th.groups[0];
  EXPECT_EQ(g.op, "model.mlp_mnist");
  EXPECT_EQ(g.threads, (std::vector<int>{1, 4, 8, 16}));
  ASSERT_EQ(g.rows.size(), 2u);
  const ThreadsRow& r = g.rows[0];
  EXPECT_EQ(r.variant, "f32/train/batch:128");
  ASSERT_EQ(r.cells.size(), 4u);
  EXPECT_EQ(r.cells[3].threads, 16) << "the all-threads entry counts as its cpu_threads";
  EXPECT_DOUBLE_EQ(*r.cells[0].speedup, 1.0);
  EXPECT_DOUBLE_EQ(*r.cells[1].speedup, 3.2);
  EXPECT_DOUBLE_EQ(*r.cells[1].efficiency, 0.8);
  EXPECT_DOUBLE_EQ(*r.cells[3].speedup, 8.0);
  EXPECT_DOUBLE_EQ(*r.cells[3].efficiency, 0.5);
  EXPECT_EQ(r.fastest, 8) << "8 threads beat all 16";
}

TEST(Threads, FailedEntryOfASweepIsListedAndNoisyOneMarked) {
  const RunData run = sweep_run();
  const Threads th = threads(run);
  const ThreadsRow& r = th.groups[0].rows[1];
  ASSERT_EQ(r.cells.size(), 2u) << "1 and 16 threads: the failed 4-thread entry has no cell";
  EXPECT_EQ(r.cells[1].marks, std::vector<std::string>{"noisy"});
  ASSERT_EQ(th.unmeasured.size(), 1u);
  EXPECT_EQ(th.unmeasured[0]->message, "verification failed: dW1");

  std::ostringstream md;
  Style s;
  s.format = Format::md;
  print_threads(md, th, s);
  EXPECT_NE(md.str().find("| f32/train/batch:128 | 8 ms | 2.5 ms (3.2x, 80%) | 900 us (8.89x, 111%) | 1 ms (8x, 50%) | 8 threads |"),
            std::string::npos)
      << md.str();
  EXPECT_NE(md.str().find("5 ms~ (8x, 50%)"), std::string::npos) << md.str();
  EXPECT_NE(md.str().find("verification failed: dW1"), std::string::npos);
}

TEST(Threads, WithoutOneThreadThereIsNoSpeedup) {
  json benchmarks = json::array({timed("model.x/cpu/f32/infer/batch:8/threads:4/real_time", 10),
                                 timed("model.x/cpu/f32/infer/batch:8/real_time", 8, {{"cpu_threads", 8}})});
  const RunData run = parse_run(json{{"context", json::object()}, {"benchmarks", benchmarks}}.dump(), "run.json");
  const Threads th = threads(run);
  ASSERT_EQ(th.groups.size(), 1u);
  for (const ThreadsCell& c : th.groups[0].rows[0].cells) EXPECT_FALSE(c.speedup.has_value());
  EXPECT_EQ(th.groups[0].rows[0].fastest, 8);
}

TEST(Threads, NoSweepIsBadInput) {
  json benchmarks = json::array({timed("model.x/cpu/f32/infer/batch:8/real_time", 8, {{"cpu_threads", 8}}),
                                 timed("model.x/cuda/f32/infer/batch:8/manual_time", 1)});
  const RunData run = parse_run(json{{"context", json::object()}, {"benchmarks", benchmarks}}.dump(), "run.json");
  EXPECT_THROW(threads(run), InputError);
}

// The model steps of a full-suite run on the H100 host (16 threads; its entries carry no cpu_threads,
// so the all-threads entry counts as the context's 16).
TEST(Threads, EveryModelSweepOfAFullSuiteRunOnTheH100Host) {
  const RunData run = read_run(std::string(HOTOPS_COMPARE_FIXTURES) + "/h100_full_suite_models.json");
  const Threads th = threads(run);
  bool found = false;
  for (const ThreadsGroup& g : th.groups) {
    // Every sweep starts at one thread and ends at the run's 16; the encoder layers skip 4.
    const std::vector<int> all{1, 4, 8, 16}, encoder{1, 8, 16};
    EXPECT_TRUE(g.threads == all || (g.threads == encoder && g.op.find("_layer") != std::string::npos)) << g.op;
    for (const ThreadsRow& r : g.rows) {
      if (g.op != "model.mlp_mnist" || r.variant != "f32/train/batch:128") continue;
      found = true;
      ASSERT_EQ(r.cells.size(), 4u);
      EXPECT_NEAR(*r.cells[1].speedup, 9114.911 / 2926.740, 1e-3);
      EXPECT_EQ(r.fastest, 8);
    }
  }
  EXPECT_TRUE(found);
}

}  // namespace
}  // namespace hotops::compare
