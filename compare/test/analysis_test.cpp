// Diff, speed-up (grouping, crossover), cost and gate on the fixture runs, whose times were
// chosen by make_fixtures.py so that every answer here is known.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "compare/src/analysis.h"
#include "compare/src/report.h"

namespace hotops::compare {
namespace {

using RunData = Run;  // inside a TEST body, plain `Run` is gtest's Test::Run
const std::string kFixtures = HOTOPS_COMPARE_FIXTURES;
const std::string kSlow = "mm/cuda/f32/fwd/shape:bert.ffn_up/batch:32/M:4096/N:3072/K:768/manual_time";
const std::string kConv = "conv2d/cuda/bf16/fwd/shape:resnet50.conv1/batch:32/C:3/H:224/W:224/K:64/R:7/S:7/stride:2/"
                          "pad:3/dilation:1/bias:0/layout:nchw/manual_time";

RunData fixture(const std::string& name) { return read_run(kFixtures + "/" + name); }

// A run of one entry "a" whose repetitions took these times (ns).
RunData reps(const std::vector<double>& ns, const std::string& file) {
  std::string j = R"({"benchmarks": [)";
  for (std::size_t i = 0; i < ns.size(); ++i)
    j += (i ? ", " : "") + std::string(R"({"name": "a", "real_time": )") + std::to_string(ns[i]) + R"(, "time_unit": "ns"})";
  return parse_run(j + "]}", file);
}

const DiffRow& row(const Diff& d, const std::string& name) {
  const auto it = std::find_if(d.rows.begin(), d.rows.end(), [&name](const DiffRow& r) { return r.name == name; });
  if (it == d.rows.end()) throw std::runtime_error("no row " + name);
  return *it;
}

TEST(Diff, RepeatedRunHasNoSignificantChange) {
  const Diff d = diff(fixture("gb17_base.json"), fixture("gb17_repeat.json"));
  EXPECT_EQ(d.compared, 25);
  for (const DiffRow& r : d.rows) {
    if (r.status != DiffStatus::both) continue;
    ASSERT_TRUE(r.utest) << r.name;
    EXPECT_TRUE(r.utest->exact);
    EXPECT_GT(r.utest->p, 0.05) << r.name;
    EXPECT_NEAR(r.ratio, 1.005, 1e-9) << "repeat jitter is +0.5% on the median";
  }
  EXPECT_NEAR(d.geomean_ratio, 1.005, 1e-9);
  EXPECT_TRUE(d.warnings.empty()) << "same machine";
}

// A change counts only when it is significantly beyond the noise threshold. Five repetitions 1.5%
// slower, apart from the base's (p = 0.008): the ratio's interval still reaches below 1.01
// (p = 0.056 against base x 1.01), so not significant at --noise 1; at --noise 0.5 it is.
TEST(Diff, ConsistentShiftWithinTheNoiseIntervalIsNotSignificant) {
  const RunData base = reps({100, 100.2, 100.4, 100.6, 100.8}, "b.json");
  const RunData next = reps({101.5, 101.7, 101.9, 102.1, 102.3}, "n.json");
  const Diff d = diff(base, next);
  const DiffRow r = row(d, "a");
  EXPECT_NEAR(r.utest->p, 0.00794, 1e-5);
  EXPECT_NEAR(r.ratio, 101.9 / 100.4, 1e-12);
  EXPECT_NEAR(utest_against_scaled_base(r, 1.01)->p, 0.0556, 1e-4);
  Style s;
  EXPECT_FALSE(significant_change(r, s));
  s.noise_pct = 0.5;
  EXPECT_TRUE(significant_change(r, s));
  s.noise_pct = 0;
  EXPECT_TRUE(significant_change(r, s));
  // Faster the same way: the same answers, tested against base x 0.99.
  const DiffRow f = row(diff(next, base), "a");
  s.noise_pct = 1;
  EXPECT_FALSE(significant_change(f, s));
  s.noise_pct = 0.5;
  EXPECT_TRUE(significant_change(f, s));
}

TEST(Diff, ListsEveryKindOfEntry) {
  const Diff d = diff(fixture("gb17_base.json"), fixture("gb18_new.json"));
  const DiffRow& slow = row(d, kSlow);
  EXPECT_EQ(slow.status, DiffStatus::both);
  EXPECT_NEAR(slow.ratio, 1.2 * 1.005, 1e-9);
  ASSERT_TRUE(slow.utest);
  EXPECT_NEAR(slow.utest->p, 2.0 / 252.0, 1e-12) << "every new repetition slower than every base one";
  EXPECT_NEAR(slow.counter_ratio.at("FLOP/s"), 1 / (1.2 * 1.005), 0.01) << "the rate of the median repetition";
  EXPECT_EQ(slow.counter_ratio.count("samples/s"), 0u) << "mm reports no samples/s";
  EXPECT_EQ(row(d, "model.mlp_tiny/cpu/f32/train/batch:10/real_time").counter_ratio.count("samples/s"), 1u);
  EXPECT_EQ(row(d, "gelu/cpu/f32/fwd/shape:bert.ffn/batch:32/dims:32x128x3072/approx:none/real_time").status,
            DiffStatus::only_base);
  EXPECT_EQ(row(d, "softmax/cpu/f32/fwd/shape:bert.attn/batch:32/rows:49152/cols:128/real_time").status, DiffStatus::only_new);
  EXPECT_EQ(row(d, "copy/cuda/f32/fwd/kind:memcpy/bytes:1073741824/manual_time").status, DiffStatus::error_new);
  EXPECT_EQ(row(d, kConv).status, DiffStatus::error_both);
  EXPECT_EQ(d.rows.size(), 27u) << "26 of base (one failed in both) + 1 only in new: nothing dropped";
  // Geometric mean over the 23 compared: 21 at 1.005, one at 1.2 x 1.005, one at 0.9 x 1.005.
  EXPECT_NEAR(d.geomean_ratio, 1.005 * std::pow(1.2 * 0.9, 1.0 / 23), 1e-9);
}

TEST(Diff, WarnsAboutDifferentMachines) {
  const Diff d = diff(fixture("gb18_cpu_machine.json"), fixture("gb17_gpu_machine.json"));
  ASSERT_EQ(d.warnings.size(), 2u);
  EXPECT_NE(d.warnings[0].find("different machines"), std::string::npos);
  EXPECT_NE(d.warnings[0].find("cpu_model"), std::string::npos);
  EXPECT_NE(d.warnings[1].find("did not run the same entries"), std::string::npos) << "and their lists differ";
}

// An entry's time depends on what ran before it in its process: runs of other lists are flagged,
// also where a --filter leaves the same entries of both.
TEST(Diff, WarnsWhenTheRunsRanOtherEntries) {
  const auto warned = [](const Diff& d) {
    return std::any_of(d.warnings.begin(), d.warnings.end(),
                       [](const std::string& w) { return w.find("did not run the same entries") != std::string::npos; });
  };
  EXPECT_FALSE(warned(diff(fixture("gb17_base.json"), fixture("gb17_repeat.json"))));
  EXPECT_TRUE(warned(diff(fixture("gb17_base.json"), fixture("gb18_new.json"))));
  RunData base = fixture("gb17_base.json"), next = fixture("gb18_new.json");
  keep_matching(base, "^mm/"), keep_matching(next, "^mm/");
  EXPECT_TRUE(warned(diff(base, next)));
}

TEST(Diff, SingleRepetitionsHaveNoTest) {
  const RunData a = fixture("gb17_gpu_machine.json");
  const Diff d = diff(a, a);
  for (const DiffRow& r : d.rows) EXPECT_FALSE(r.utest) << r.name;
}

TEST(Cost, PerMillionItems) {
  const Prices p = parse_prices("cpu=3.6,cuda=7.2");
  EXPECT_DOUBLE_EQ(p.at("cpu"), 3.6);
  const RunData r = fixture("gb17_base.json");
  // mm at batch 8 on CUDA: 8 items per 60 us = 133333 items/s; 7.2 USD/h = 0.002 USD/s;
  // 1e6 items take 7.5 s: 0.015 USD.
  const Entry* e = r.find("mm/cuda/f32/fwd/shape:bert.ffn_up/batch:8/M:1024/N:3072/K:768/manual_time");
  ASSERT_NE(e, nullptr);
  EXPECT_NEAR(*cost_per_million(*e, p), 0.015, 1e-9);
  EXPECT_FALSE(cost_per_million(*e, parse_prices("cpu=1")));
  EXPECT_THROW(parse_prices("gpu=1"), InputError);
  EXPECT_THROW(parse_prices("cpu=abc"), InputError);
  EXPECT_THROW(parse_prices("cpu=-1"), InputError);
  EXPECT_THROW(parse_prices(""), InputError);
}

const SpeedupGroup& group(const Speedup& s, const std::string& op) {
  const auto it = std::find_if(s.groups.begin(), s.groups.end(), [&op](const SpeedupGroup& g) { return g.op == op; });
  if (it == s.groups.end()) throw std::runtime_error("no group " + op);
  return *it;
}

const SpeedupRow& variant(const SpeedupGroup& g, const std::string& v) {
  const auto it = std::find_if(g.rows.begin(), g.rows.end(), [&v](const SpeedupRow& r) { return r.variant == v; });
  if (it == g.rows.end()) throw std::runtime_error("no row " + v);
  return *it;
}

TEST(Speedup, OneRunWithBothBackends) {
  const RunData r = fixture("gb17_base.json");
  const Speedup s = speedup(r, r);
  EXPECT_EQ(s.pairs, 12);
  EXPECT_EQ(s.cpu_only, 1) << "gelu";
  EXPECT_EQ(s.cuda_only, 0) << "the failed conv2d has no time";
  ASSERT_EQ(s.unmeasured.size(), 1u) << "and is listed";
  EXPECT_EQ(s.unmeasured[0]->name.op, "conv2d");

  // M follows the batch (M = 128 x batch): one row spans batches 1, 8 and 32.
  const SpeedupGroup mm = group(s, "mm");
  ASSERT_EQ(mm.rows.size(), 1u);
  const SpeedupRow& ffn = mm.rows[0];
  EXPECT_EQ(ffn.variant, "f32/fwd/shape:bert.ffn_up/M:batch*128/N:3072/K:768");
  ASSERT_EQ(ffn.cells.size(), 3u);
  EXPECT_NEAR(ffn.cells[0].speedup, 400.0 / 500.0, 1e-9);
  EXPECT_NEAR(ffn.cells[1].speedup, 3000.0 / 60.0, 1e-9);
  EXPECT_EQ(ffn.crossover, 8);
  EXPECT_FALSE(ffn.crossover_at_smallest);

  // The GPU wins at 64, loses at 256, wins from 1024 on: the crossover is 1024, not 64.
  const SpeedupGroup mlp = group(s, "model.mlp_tiny");
  EXPECT_EQ(mlp.batches, (std::vector<long long>{10, 64, 256, 1024, 4096}));
  const SpeedupRow train = variant(mlp, "f32/train");
  EXPECT_EQ(train.crossover, 1024);
  // The GPU never wins at the largest batch: no crossover.
  EXPECT_FALSE(variant(mlp, "f32/infer").crossover);

  // No batch axis: one cell, no crossover.
  const SpeedupRow& copy = group(s, "copy").rows.at(0);
  ASSERT_EQ(copy.cells.size(), 1u);
  EXPECT_EQ(copy.cells[0].batch, 0);
  EXPECT_NEAR(copy.cells[0].speedup, 25000.0 / 400.0, 1e-9);
  EXPECT_FALSE(copy.crossover);
}

TEST(Speedup, CpuMachineAndGpuMachine) {
  const RunData cpu = fixture("gb18_cpu_machine.json"), gpu = fixture("gb17_gpu_machine.json");
  const Speedup s = speedup(cpu, gpu);
  EXPECT_EQ(s.pairs, 12);
  EXPECT_TRUE(s.warnings.empty());
  EXPECT_EQ(variant(group(s, "model.mlp_tiny"), "f32/train").crossover, 1024);
  // The other way round there is nothing to pair: each file holds one backend.
  const Speedup wrong = speedup(gpu, cpu);
  EXPECT_EQ(wrong.pairs, 0);
  EXPECT_EQ(wrong.warnings.size(), 2u);
}

// The model entries of a full-suite run on the H100 host (3129 entries; docs/compare.md):
// every model has its four variants, mlp_tiny's crossover is 64 and every other model's GPU wins at
// its smallest batch; the 11 keras_cnn entries that failed verification are listed, and the one
// plain pair among them (cpu bf16 train at batch 64) leaves its cell empty.
TEST(Speedup, EveryModelOfAFullSuiteRunOnTheH100Host) {
  const RunData r = fixture("h100_full_suite_models.json");
  const Speedup s = speedup(r, r);
  ASSERT_EQ(s.groups.size(), 8u);
  for (const SpeedupGroup& g : s.groups) {
    ASSERT_EQ(g.rows.size(), 4u) << g.op;
    for (const char* v : {"bf16/infer", "bf16/train", "f32/infer", "f32/train"}) {
      const SpeedupRow row = variant(g, v);
      ASSERT_TRUE(row.crossover) << g.op << " " << v;
      if (g.op == "model.mlp_tiny") {
        EXPECT_EQ(*row.crossover, 64) << v;
        EXPECT_FALSE(row.crossover_at_smallest) << v;
      } else {
        EXPECT_EQ(*row.crossover, g.batches.front()) << g.op << " " << v;
        EXPECT_TRUE(row.crossover_at_smallest) << g.op << " " << v;
      }
    }
  }
  EXPECT_EQ(s.pairs, 95);
  ASSERT_EQ(s.unmeasured.size(), 11u);
  for (const Entry* e : s.unmeasured) {
    EXPECT_EQ(e->name.op, "model.keras_cnn");
    EXPECT_EQ(e->message.rfind("verification failed", 0), 0u) << e->message;
  }
  const SpeedupGroup cnn = group(s, "model.keras_cnn");
  EXPECT_EQ(variant(cnn, "bf16/train").cells.size(), 2u) << "batch 64's CPU entry failed";
  EXPECT_EQ(variant(cnn, "f32/train").cells.size(), 3u);
}

TEST(Speedup, WinsAtTheSmallestBatch) {
  const RunData r = parse_run(R"({"benchmarks": [
    {"name": "a/cpu/f32/fwd/batch:2/real_time", "real_time": 10, "time_unit": "us"},
    {"name": "a/cuda/f32/fwd/batch:2/manual_time", "real_time": 5, "time_unit": "us"},
    {"name": "a/cpu/f32/fwd/batch:4/real_time", "real_time": 20, "time_unit": "us"},
    {"name": "a/cuda/f32/fwd/batch:4/manual_time", "real_time": 5, "time_unit": "us"}]})", "w.json");
  const Speedup s = speedup(r, r);
  const SpeedupRow& row = s.groups.at(0).rows.at(0);
  EXPECT_EQ(row.crossover, 2);
  EXPECT_TRUE(row.crossover_at_smallest);
}

TEST(Speedup, ArgsThatDoNotFollowTheBatchKeepRowsApart) {
  // Two different layers, each at its own batch: C does not follow the batch (64 at 1, 256 at
  // 32 is not a fixed multiple), so they are two rows, not one row over two batches.
  const RunData r = parse_run(R"({"benchmarks": [
    {"name": "c/cpu/f32/fwd/batch:1/C:64/real_time", "real_time": 10, "time_unit": "us"},
    {"name": "c/cuda/f32/fwd/batch:1/C:64/manual_time", "real_time": 5, "time_unit": "us"},
    {"name": "c/cpu/f32/fwd/batch:32/C:256/real_time", "real_time": 20, "time_unit": "us"},
    {"name": "c/cuda/f32/fwd/batch:32/C:256/manual_time", "real_time": 5, "time_unit": "us"},
    {"name": "g/cpu/f32/fwd/batch:16/dims:16x32x8/real_time", "real_time": 10, "time_unit": "us"},
    {"name": "g/cuda/f32/fwd/batch:16/dims:16x32x8/manual_time", "real_time": 5, "time_unit": "us"},
    {"name": "g/cpu/f32/fwd/batch:64/dims:64x32x8/real_time", "real_time": 10, "time_unit": "us"},
    {"name": "g/cuda/f32/fwd/batch:64/dims:64x32x8/manual_time", "real_time": 5, "time_unit": "us"}]})", "l.json");
  const Speedup s = speedup(r, r);
  EXPECT_EQ(group(s, "c").rows.size(), 2u);
  // A shape that holds the batch does follow it.
  ASSERT_EQ(group(s, "g").rows.size(), 1u);
  EXPECT_EQ(group(s, "g").rows[0].variant, "f32/fwd/dims:batchx32x8");
}

TEST(Speedup, CostOfEachSide) {
  const RunData r = fixture("gb17_base.json");
  const Speedup s = speedup(r, r, parse_prices("cpu=3.6,cuda=7.2"));
  const SpeedupCell& c = group(s, "mm").rows[0].cells[1];  // batch 8
  EXPECT_NEAR(*c.cuda_cost, 0.015, 1e-9);
  // CPU: 8 items per 3000 us; 0.001 USD/s: 1e6 items take 375 s: 0.375 USD.
  EXPECT_NEAR(*c.cpu_cost, 0.375, 1e-9);
}

TEST(Gate, PassesOnARepeatedRun) {
  const Gate g = gate(fixture("gb17_base.json"), fixture("gb17_repeat.json"), {5, 0.05});
  EXPECT_TRUE(g.passed());
  ASSERT_EQ(g.notes.size(), 1u) << "the conv2d that fails in both runs is noted, not failed";
  EXPECT_NE(g.notes[0].find("fails in both"), std::string::npos);
}

TEST(Gate, FailsOnAPlantedTwentyPercentSlowdown) {
  const Gate g = gate(fixture("gb17_base.json"), fixture("gb17_slow20.json"), {5, 0.05});
  ASSERT_EQ(g.failures.size(), 1u);
  EXPECT_EQ(g.failures[0].name, kSlow);
  EXPECT_NE(g.failures[0].reason.find("+20.6% slower"), std::string::npos) << g.failures[0].reason;
  EXPECT_NE(g.failures[0].reason.find("p = 0.00794"), std::string::npos) << g.failures[0].reason;
  // Above the threshold of the slowdown, the gate passes.
  EXPECT_TRUE(gate(fixture("gb17_base.json"), fixture("gb17_slow20.json"), {25, 0.05}).passed());
  // A stricter alpha than 5 repetitions can reach: failed on the threshold alone, and said so.
  const Gate strict = gate(fixture("gb17_base.json"), fixture("gb17_slow20.json"), {5, 0.001});
  ASSERT_EQ(strict.failures.size(), 1u);
  EXPECT_NE(strict.failures[0].reason.find("cannot reach"), std::string::npos) << strict.failures[0].reason;
}

// Every new repetition slower than every base one (p = 0.008) and the median 27% slower, but two
// of them within 5% of the base: not significantly beyond a 5% threshold, so a note, not a
// failure. The same slowdown with tight repetitions fails.
TEST(Gate, FailsOnlyWhenSignificantlyBeyondTheThreshold) {
  const RunData base = reps({100, 101, 102, 103, 104}, "b.json");
  const Gate wide = gate(base, reps({105.5, 106, 130, 131, 132}, "n.json"), {5, 0.05});
  EXPECT_TRUE(wide.passed()) << (wide.failures.empty() ? "" : wide.failures[0].reason);
  ASSERT_EQ(wide.notes.size(), 1u);
  EXPECT_NE(wide.notes[0].find("+27.5% slower than base (threshold 5%) but not significantly beyond it"), std::string::npos)
      << wide.notes[0];
  EXPECT_NE(wide.notes[0].find("p = 0.00794 against base"), std::string::npos) << wide.notes[0];
  const Gate tight = gate(base, reps({126, 127, 130, 131, 132}, "n.json"), {5, 0.05});
  ASSERT_EQ(tight.failures.size(), 1u);
  EXPECT_NE(tight.failures[0].reason.find("significantly beyond it: p = 0.00794 for new against base x 1.05 < 0.05"),
            std::string::npos)
      << tight.failures[0].reason;
}

TEST(Gate, VanishedAndNowFailingEntriesFail) {
  const Gate g = gate(fixture("gb17_base.json"), fixture("gb18_new.json"), {5, 0.05});
  std::vector<std::string> names;
  for (const auto& f : g.failures) names.push_back(f.name + " | " + f.reason);
  ASSERT_EQ(g.failures.size(), 3u) << ::testing::PrintToString(names);
  EXPECT_EQ(g.failures[0].name, kSlow);
  EXPECT_NE(g.failures[1].reason.find("now fails"), std::string::npos);
  EXPECT_NE(g.failures[2].reason.find("vanished"), std::string::npos);
}

TEST(Gate, SlowerButNotSignificantPasses) {
  // 5 and 5 repetitions that interleave: 10% slower in the median, far from significant.
  const RunData base = parse_run(R"({"benchmarks": [
    {"name": "a", "real_time": 100, "time_unit": "ns"}, {"name": "a", "real_time": 130, "time_unit": "ns"},
    {"name": "a", "real_time": 90, "time_unit": "ns"}, {"name": "a", "real_time": 120, "time_unit": "ns"},
    {"name": "a", "real_time": 95, "time_unit": "ns"}]})", "b.json");
  const RunData next = parse_run(R"({"benchmarks": [
    {"name": "a", "real_time": 110, "time_unit": "ns"}, {"name": "a", "real_time": 80, "time_unit": "ns"},
    {"name": "a", "real_time": 140, "time_unit": "ns"}, {"name": "a", "real_time": 105, "time_unit": "ns"},
    {"name": "a", "real_time": 125, "time_unit": "ns"}]})", "n.json");
  const Gate g = gate(base, next, {5, 0.05});
  EXPECT_TRUE(g.passed()) << (g.failures.empty() ? "" : g.failures[0].reason);
  ASSERT_EQ(g.notes.size(), 1u);
  EXPECT_NE(g.notes[0].find("not significant"), std::string::npos);
  // Single measurements: the threshold alone decides.
  const RunData b1 = parse_run(R"({"benchmarks": [{"name": "a", "real_time": 100, "time_unit": "ns"}]})", "b1.json");
  const RunData n1 = parse_run(R"({"benchmarks": [{"name": "a", "real_time": 106, "time_unit": "ns"}]})", "n1.json");
  EXPECT_FALSE(gate(b1, n1, {5, 0.05}).passed());
  EXPECT_TRUE(gate(b1, n1, {6.5, 0.05}).passed());
}

// ---- what hotops-compare does not judge as it stands -----------------------------------------

// Repetitions of one entry per name: {name, label, times (us)}, with a context.
RunData run_of(const std::string& context, const std::vector<std::tuple<std::string, std::string, std::vector<double>>>& entries,
               const std::string& file) {
  std::string j = R"({"context": {)" + context + R"(}, "benchmarks": [)";
  bool first = true;
  for (const auto& [name, label, times] : entries)
    for (double t : times) {
      j += (first ? "" : ", ") + std::string(R"({"name": ")") + name + R"(", "real_time": )" + std::to_string(t) +
           R"(, "time_unit": "us", "label": ")" + label + R"("})";
      first = false;
    }
  return parse_run(j + "]}", file);
}

const std::string kNotVerified = "cublasLt [NOT VERIFIED: --hotops_verify=0]";

TEST(Trust, AnUnverifiedSpeedUpIsMarkedAndNotCountedAsAChange) {
  const RunData base = run_of(R"("hotops_verify": "1")", {{"mm/cuda/f32/fwd/M:8/manual_time", "cublasLt", {10, 10.1, 9.9, 10, 10.05}}}, "b.json");
  const RunData next = run_of(R"("hotops_verify": "0")", {{"mm/cuda/f32/fwd/M:8/manual_time", kNotVerified, {3.5, 3.6, 3.5, 3.4, 3.5}}}, "n.json");
  const Diff d = diff(base, next);
  ASSERT_EQ(d.rows.size(), 1u);
  EXPECT_EQ(d.rows[0].marks, std::vector<std::string>{"unverified"});
  Style st;
  EXPECT_FALSE(significant_change(d.rows[0], st)) << "an unverified time is not judged";
  bool warned = false;
  for (const auto& w : d.warnings) warned |= w.find("--hotops_verify=0") != std::string::npos && w.find("hotops_verify 1 vs 0") == std::string::npos;
  EXPECT_TRUE(warned);
  std::ostringstream out;
  print_diff(out, d, base, next, st);
  EXPECT_NE(out.str().find("compared [unverified]"), std::string::npos) << out.str();
  EXPECT_NE(out.str().find("0 of 1 entries"), std::string::npos) << out.str();
}

TEST(Trust, TheGateFailsOnAnUnverifiedEntryNewOrNot) {
  const RunData base = run_of("", {{"a/cpu/f32/fwd/real_time", "x", {10, 10}}}, "b.json");
  const RunData next = run_of("", {{"a/cpu/f32/fwd/real_time", kNotVerified, {10, 10}},
                                   {"b/cpu/f32/fwd/real_time", kNotVerified, {5, 5}}},
                              "n.json");
  GateOptions o;
  const Gate g = gate(base, next, o);
  EXPECT_FALSE(g.passed());
  ASSERT_EQ(g.failures.size(), 2u);
  for (const auto& f : g.failures) EXPECT_NE(f.reason.find("not verified"), std::string::npos) << f.name;
}

TEST(Trust, DifferentThreadCountsAndSettingsAreSaid) {
  const RunData base = run_of(R"("threads": "16", "hotops_seed": "1")", {{"mm/cpu/f32/fwd/M:8/real_time", "x", {10, 10, 10}}}, "b.json");
  const RunData next = run_of(R"("threads": "8", "hotops_seed": "2")", {{"mm/cpu/f32/fwd/M:8/real_time", "x", {10, 10, 10}}}, "n.json");
  const Diff d = diff(base, next);
  ASSERT_EQ(d.rows.size(), 1u);
  EXPECT_EQ(d.rows[0].marks, std::vector<std::string>{"threads 16 vs 8"});
  ASSERT_FALSE(d.warnings.empty());
  EXPECT_NE(d.warnings[0].find("threads 16 vs 8"), std::string::npos) << d.warnings[0];
  EXPECT_NE(d.warnings[0].find("hotops_seed 1 vs 2"), std::string::npos) << d.warnings[0];
}

TEST(Trust, ARunFromBeforeTheSubnormalFlagCountsAsIeee) {
  // A hotops run without hotops_cpu_ftz in its context ran with IEEE subnormals.
  const RunData base = run_of(R"("hotops_version": "0.1.0")", {{"mm/cpu/f32/fwd/M:8/real_time", "x", {10, 10, 10}}}, "b.json");
  const RunData next =
      run_of(R"("hotops_version": "0.1.0", "hotops_cpu_ftz": "1")", {{"mm/cpu/f32/fwd/M:8/real_time", "x", {10, 10, 10}}}, "n.json");
  const Diff d = diff(base, next);
  ASSERT_FALSE(d.warnings.empty());
  EXPECT_NE(d.warnings[0].find("hotops_cpu_ftz 0 vs 1"), std::string::npos) << d.warnings[0];
  EXPECT_TRUE(diff(next, next).warnings.empty());
}

TEST(Trust, RunsWithAndWithoutTheStoppingRuleAreSaid) {
  const RunData base = run_of(R"("hotops_max_noise": "0.000000")", {{"mm/cpu/f32/fwd/M:8/real_time", "x", {10, 10, 10}}}, "b.json");
  const RunData next = run_of(R"("hotops_max_noise": "0.500000")", {{"mm/cpu/f32/fwd/M:8/real_time", "x", {10, 10, 10}}}, "n.json");
  const Diff d = diff(base, next);
  ASSERT_FALSE(d.warnings.empty());
  EXPECT_NE(d.warnings[0].find("hotops_max_noise 0.000000 vs 0.500000"), std::string::npos) << d.warnings[0];
}

TEST(Trust, RunsSampledForDifferentTimesOrLoopsAreSaid) {
  const RunData base = run_of(R"("hotops_min_time": "0.050000")", {{"mm/cpu/f32/fwd/M:8/real_time", "x", {10, 10, 10}}}, "b.json");
  const RunData next =
      run_of(R"("hotops_min_time": "google benchmark's loop")", {{"mm/cpu/f32/fwd/M:8/real_time", "x", {10, 10, 10}}}, "n.json");
  const Diff d = diff(base, next);
  ASSERT_FALSE(d.warnings.empty());
  EXPECT_NE(d.warnings[0].find("hotops_min_time 0.050000 vs google benchmark's loop"), std::string::npos) << d.warnings[0];
  EXPECT_TRUE(diff(base, base).warnings.empty());
}

// bench marks a CPU entry whose threads waited for a core (other work held them): its change is
// not judged and its speed-up carries the mark.
TEST(Trust, ATimeFromABusyCpuIsMarkedAndNotJudged) {
  const std::string busy = "oneDNN, 2 threads [BUSY CPU: its threads waited 48% of their time for a core]";
  const RunData base = run_of("", {{"mm/cpu/f32/fwd/batch:8/real_time", "oneDNN, 2 threads", {100, 100, 100}},
                                   {"mm/cuda/f32/fwd/batch:8/manual_time", "cublasLt", {10, 10, 10}}},
                              "b.json");
  const RunData next = run_of("", {{"mm/cpu/f32/fwd/batch:8/real_time", busy, {3000, 3000, 3000}},
                                   {"mm/cuda/f32/fwd/batch:8/manual_time", "cublasLt", {10, 10, 10}}},
                              "n.json");
  const Diff d = diff(base, next);
  ASSERT_EQ(d.rows.size(), 2u);
  EXPECT_EQ(d.rows[0].marks, std::vector<std::string>{"busy"});
  EXPECT_TRUE(d.rows[1].marks.empty());
  Style st;
  EXPECT_FALSE(significant_change(d.rows[0], st)) << "a time from a busy CPU is not judged";
  const Speedup sp = speedup(next, next);
  ASSERT_EQ(sp.groups.size(), 1u);
  ASSERT_EQ(sp.groups[0].rows.size(), 1u);
  EXPECT_EQ(sp.groups[0].rows[0].cells[0].marks, std::vector<std::string>{"busy"});
  std::ostringstream out;
  print_speedup(out, sp, Style{});
  EXPECT_NE(out.str().find("300x^"), std::string::npos) << out.str();
  EXPECT_NE(out.str().find("^ from an entry whose threads waited for a core"), std::string::npos) << out.str();
}

TEST(Trust, ANoisySpeedUpIsMarked) {
  // The CPU entry's repetitions spread 20%: its ratio carries the mark; the quiet pair does not.
  const RunData run = run_of("", {{"mm/cpu/f32/fwd/batch:8/real_time", "x", {100, 80, 120}},
                                  {"mm/cuda/f32/fwd/batch:8/manual_time", "x", {10, 10, 10}},
                                  {"mm/cpu/f32/fwd/batch:64/real_time", "x", {100, 101, 99}},
                                  {"mm/cuda/f32/fwd/batch:64/manual_time", "x", {10, 10, 10}}},
                             "r.json");
  const Speedup sp = speedup(run, run);
  ASSERT_EQ(sp.groups.size(), 1u);
  ASSERT_EQ(sp.groups[0].rows.size(), 1u);
  const auto& cells = sp.groups[0].rows[0].cells;
  ASSERT_EQ(cells.size(), 2u);
  EXPECT_EQ(cells[0].marks, std::vector<std::string>{"noisy"});
  EXPECT_TRUE(cells[1].marks.empty());
  std::ostringstream out;
  print_speedup(out, sp, Style{});
  EXPECT_NE(out.str().find("10x~"), std::string::npos) << out.str();
  EXPECT_NE(out.str().find("~ from an entry whose samples spread"), std::string::npos) << out.str();
}

TEST(Trust, ExportsKeepTheNotVerifiedMark) {
  const RunData next = run_of("", {{"a/cpu/f32/fwd/real_time", kNotVerified, {10}}}, "n.json");
  for (Tracker t : {Tracker::github_action_benchmark, Tracker::bencher}) {
    std::ostringstream out;
    export_run(out, next, t);
    EXPECT_NE(out.str().find("a/cpu/f32/fwd/real_time [NOT VERIFIED]"), std::string::npos) << out.str();
  }
}

}  // namespace
}  // namespace hotops::compare

namespace hotops::compare {
namespace {

// spread: each entry's slowest / fastest - 1 over the runs that timed it, and its label sets with
// the times in the labels left out (they differ whatever ran), the algorithms kept.
TEST(Spread, SpreadAndLabelSetsOverSeparateRuns) {
  const std::string a = "model.m/cuda/f32/train/batch:32/manual_time", b = "conv2d/cuda/f32/fwd/x:1/manual_time";
  std::vector<RunData> runs;
  runs.push_back(run_of(R"("hotops_seed": "1")", {{a, "convs (fwd 7 data 5)", {100}}, {b, "cuDNN (cudnnFind: 0.0123 ms) algo 1", {50}}}, "1.json"));
  runs.push_back(run_of(R"("hotops_seed": "1")", {{a, "convs (fwd 5 data 5)", {110}}, {b, "cuDNN (from --hotops_choices, as a search found it: cudnnFind: 0.0150 ms) algo 1 [NOT VERIFIED: --hotops_verify=0]", {51}}}, "2.json"));
  runs.push_back(run_of(R"("hotops_seed": "2")", {{a, "convs (fwd 7 data 5) [stopped: noise settled at 0.31%]", {102}}, {"only/cpu/f32/fwd/x:1/real_time", "x", {1}}}, "3.json"));
  const Spread sp = spread(runs, 3);
  ASSERT_EQ(sp.rows.size(), 2u) << "an entry timed in one run has no spread";
  EXPECT_EQ(sp.rows[0].first->name.full, a);
  EXPECT_EQ(sp.rows[0].timed, 3);
  EXPECT_NEAR(sp.rows[0].spread_pct, 10, 1e-9);
  EXPECT_EQ(sp.rows[0].label_sets, 2) << "two sets of algorithms";
  EXPECT_EQ(sp.rows[1].timed, 2);
  EXPECT_NEAR(sp.rows[1].spread_pct, 2, 1e-9);
  EXPECT_EQ(sp.rows[1].label_sets, 1) << "neither the search's times, where the choice came from nor verification is the algorithm";
  EXPECT_TRUE(std::isnan(sp.rows[1].times_ns[2]));
  EXPECT_EQ(sp.over, 1);
  EXPECT_NEAR(sp.median_spread_pct, 6, 1e-9);
  ASSERT_EQ(sp.warnings.size(), 1u);
  EXPECT_NE(sp.warnings[0].find("3.json ran with other settings than 1.json (hotops_seed 1 vs 2)"), std::string::npos) << sp.warnings[0];
  std::ostringstream md;
  Style st;
  st.format = Format::md;
  print_spread(md, sp, st);
  EXPECT_NE(md.str().find("2 entries over 3 runs: median spread 6.00%, 1 over 3.00%"), std::string::npos) << md.str();
  EXPECT_NE(md.str().find("| " + a + " | 3 | 100 us | 110 us | 10.0% | 2 |"), std::string::npos) << md.str();
  EXPECT_THROW(spread({runs[0]}), InputError);
}

}  // namespace
}  // namespace hotops::compare
