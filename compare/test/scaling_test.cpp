// hotops-compare scaling: entries over several GPUs by GPU count. Collectives give busbw per size;
// model steps give samples/s, the efficiency against one GPU and the multi-GPU crossover.
#include <gtest/gtest.h>

#include <cstdio>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "compare/src/analysis.h"
#include "compare/src/report.h"

namespace hotops::compare {
namespace {

using RunData = Run;  // inside a TEST body, plain `Run` is gtest's Test::Run

std::string entry(const std::string& name, const std::string& counters) {
  return R"({"name": ")" + name + R"(", "run_name": ")" + name +
         R"(", "run_type": "iteration", "iterations": 10, "real_time": 100, "cpu_time": 1, "time_unit": "us", "label": "x", )" +
         counters + "}";
}

std::string busbw(double gbps) { return R"("algbw": 1e9, "busbw": )" + std::to_string(gbps * 1e9); }
std::string sps(double v) { return R"("samples/s": )" + std::to_string(v); }

// Two collectives at two sizes over 2 and 4 GPUs, and a model step at three per-GPU batches on
// 1 (its plain single-GPU entry), 2 and 4 GPUs.
std::string run_json() {
  const std::string ar = "allreduce/cuda/f32/fwd/bytes:";
  const std::string m = "model.mlp_mnist/cuda/f32/train/batch:";
  std::string b = R"({"context": {}, "benchmarks": [)";
  b += entry(ar + "268435456/gpus:2/inplace:1/manual_time", busbw(329.4)) + ",";
  b += entry(ar + "268435456/gpus:4/inplace:1/manual_time", busbw(355.0)) + ",";
  b += entry(ar + "1073741824/gpus:2/inplace:1/manual_time", busbw(331.0)) + ",";
  b += entry(ar + "1073741824/gpus:4/inplace:1/manual_time", busbw(360.0)) + ",";
  b += entry(ar + "8/gpus:2/inplace:0/manual_time", busbw(0.001)) + ",";
  // The model: 2 GPUs win by 1.5x from batch 64; 4 GPUs only at 256, where they win by 3.2x.
  b += entry(m + "16/manual_time", sps(1000)) + ",";
  b += entry(m + "16/gpus:2/manual_time", sps(900)) + ",";
  b += entry(m + "16/gpus:4/manual_time", sps(800)) + ",";
  b += entry(m + "64/manual_time", sps(4000)) + ",";
  b += entry(m + "64/gpus:2/manual_time", sps(6400)) + ",";
  b += entry(m + "64/gpus:4/manual_time", sps(5000)) + ",";
  b += entry(m + "256/manual_time", sps(10000)) + ",";
  b += entry(m + "256/gpus:2/manual_time", sps(19000)) + ",";
  b += entry(m + "256/gpus:4/manual_time", sps(32000)) + ",";
  // Without its GPUs: an error entry, listed with why.
  b += R"({"name": "allreduce/cuda/f32/fwd/bytes:8/gpus:8/inplace:0/manual_time", "run_name": "allreduce/cuda/f32/fwd/bytes:8/gpus:8/inplace:0/manual_time",
          "error_occurred": true, "error_message": "verification failed: rank 3: 1 of 2 elements", "iterations": 0, "real_time": 0, "time_unit": "us"},)";
  // Single-GPU entries of other problems stay out.
  b += entry("mm/cuda/f32/fwd/M:2/N:2/K:2/manual_time", R"("items_per_second": 5)");
  return b + "]}";
}

TEST(Scaling, CollectivesGiveBusBandwidthByGpuCountAtEachSize) {
  const RunData run = parse_run(run_json(), "run.json");
  const Scaling sc = scaling(run);
  ASSERT_EQ(sc.groups.size(), 3u);  // allreduce in place, allreduce out of place, the model
  const ScalingGroup& g = sc.groups[0];
  EXPECT_EQ(g.title, "allreduce/cuda/f32/fwd/inplace:1");
  EXPECT_TRUE(g.collective);
  EXPECT_EQ(g.gpus, (std::vector<int>{2, 4}));
  ASSERT_EQ(g.rows.size(), 2u);
  EXPECT_EQ(g.rows[0].at, 268435456);
  EXPECT_DOUBLE_EQ(g.rows[0].cell(4)->value, 355e9);
  EXPECT_DOUBLE_EQ(g.rows[1].cell(2)->value, 331e9);
  EXPECT_FALSE(g.rows[0].cell(2)->speedup);
  ASSERT_EQ(sc.unmeasured.size(), 1u);
  EXPECT_NE(sc.unmeasured[0]->name.full.find("gpus:8"), std::string::npos);
}

TEST(Scaling, ModelStepsGiveEfficiencyAndTheCrossover) {
  const RunData run = parse_run(run_json(), "run.json");
  const Scaling sc = scaling(run);
  const ScalingGroup& g = sc.groups[2];
  EXPECT_EQ(g.title, "model.mlp_mnist/cuda/f32/train");
  EXPECT_FALSE(g.collective);
  EXPECT_EQ(g.gpus, (std::vector<int>{1, 2, 4}));  // one GPU: the entry without a gpus arg
  ASSERT_EQ(g.rows.size(), 3u);
  EXPECT_EQ(g.rows[1].at, 64);
  EXPECT_DOUBLE_EQ(*g.rows[1].cell(2)->speedup, 1.6);
  EXPECT_DOUBLE_EQ(*g.rows[1].cell(2)->efficiency, 0.8);
  EXPECT_DOUBLE_EQ(*g.rows[2].cell(4)->efficiency, 0.8);
  EXPECT_EQ(g.crossover.at(2), 64);
  EXPECT_EQ(g.crossover.at(4), 256);
  // A higher bar: 2 GPUs never give 2x, 4 GPUs give 3.2x at 256.
  const Scaling strict = scaling(run, 2.0);
  EXPECT_FALSE(strict.groups[2].crossover.at(2).has_value());
  EXPECT_EQ(strict.groups[2].crossover.at(4), 256);
}

TEST(Scaling, ReportsInEveryFormat) {
  const RunData run = parse_run(run_json(), "run.json");
  const Scaling sc = scaling(run);
  std::ostringstream console, md, csv, js;
  Style s;
  print_scaling(console, sc, s);
  EXPECT_NE(console.str().find("256 MiB"), std::string::npos) << console.str();
  EXPECT_NE(console.str().find("355.0"), std::string::npos) << console.str();
  EXPECT_NE(console.str().find("6400 (0.80)"), std::string::npos) << console.str();
  EXPECT_NE(console.str().find("2 GPUs: 64; 4 GPUs: 256"), std::string::npos) << console.str();
  EXPECT_NE(console.str().find("verification failed: rank 3"), std::string::npos) << console.str();
  s.format = Format::md;
  print_scaling(md, sc, s);
  EXPECT_NE(md.str().find("| 1 GiB |"), std::string::npos) << md.str();
  s.format = Format::csv;
  print_scaling(csv, sc, s);
  EXPECT_NE(csv.str().find("allreduce/cuda/f32/fwd/inplace:1,collective,268435456,4,355,"), std::string::npos) << csv.str();
  s.format = Format::json;
  print_scaling(js, sc, s);
  const nlohmann::json j = nlohmann::json::parse(js.str());
  EXPECT_EQ(j["groups"][2]["crossover_batch_per_gpu"]["2"], 64);
  EXPECT_DOUBLE_EQ(j["groups"][0]["rows"][1]["cells"][1]["busbw_GBps"].get<double>(), 360.0);
}

TEST(Scaling, ARunWithoutMultiGpuEntriesIsBadInput) {
  const RunData run = parse_run(R"({"context": {}, "benchmarks": [)" + entry("mm/cuda/f32/fwd/M:2/manual_time", "\"x\": 1") + "]}",
                                "single.json");
  EXPECT_THROW(scaling(run), InputError);
  EXPECT_EQ(format_bytes(8), "8 B");
  EXPECT_EQ(format_bytes(1 << 20), "1 MiB");
  EXPECT_EQ(format_bytes(3 << 10), "3 KiB");
  EXPECT_EQ(format_bytes(1000), "1000 B");
}

}  // namespace
}  // namespace hotops::compare
