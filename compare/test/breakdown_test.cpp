// hotops-compare breakdown: a model step's time by op from bench's breakdown counters, CPU and GPU
// side by side, on runs of one backend or both (the command line: cli_test.cpp).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "compare/src/analysis.h"
#include "compare/src/report.h"

namespace hotops::compare {
namespace {

using RunData = Run;  // inside a TEST body, plain `Run` is gtest's Test::Run

// One model entry as bench writes it: its time (us) and its breakdown counters.
std::string entry(const std::string& name, double us, const std::string& parts, double step_us, double coverage,
                  double ratio) {
  return R"({"name": ")" + name + R"(", "run_name": ")" + name + R"(", "run_type": "iteration", "iterations": 10,
             "real_time": )" + std::to_string(us) + R"(, "cpu_time": 1, "time_unit": "us", "label": "x",
             "breakdown_step_us": )" + std::to_string(step_us) + R"(, "breakdown_coverage": )" + std::to_string(coverage) +
         R"(, "breakdown_ratio": )" + std::to_string(ratio) + (parts.empty() ? "" : ", " + parts) + "}";
}

const std::string kCpu = "model.bert_layer/cpu/f32/train/batch:32/real_time";
const std::string kGpu = "model.bert_layer/cuda/f32/train/batch:32/manual_time";

std::string two_backends() {
  return R"({"context": {}, "benchmarks": [)" +
         entry(kCpu, 100000, R"("breakdown:addmm": 60000, "breakdown:softmax": 30000, "breakdown:adamw": 9000)", 100000,
               0.99, 1.0) +
         ", " +
         entry(kGpu, 4000, R"("breakdown:addmm": 2000, "breakdown:softmax": 1000, "breakdown:adamw": 1000)", 4100, 0.9756,
               1.025) +
         ", " +
         R"({"name": "model.bert_layer/cuda/f32/infer/batch:32/manual_time", "run_name": "model.bert_layer/cuda/f32/infer/batch:32/manual_time",
             "error_occurred": true, "error_message": "verification failed: y off", "iterations": 0, "real_time": 0,
             "time_unit": "us"},
           {"name": "mm/cpu/f32/fwd/M:2/N:2/K:2/real_time", "run_name": "mm/cpu/f32/fwd/M:2/N:2/K:2/real_time",
             "iterations": 1, "real_time": 3, "time_unit": "us"}]})";
}

TEST(Breakdown, PairsTheBackendsOfOneProblemAndRanksTheOps) {
  const RunData run = parse_run(two_backends(), "two.json");
  const Breakdown b = breakdown(run);
  ASSERT_EQ(b.pairs.size(), 1u);
  const BreakdownPair& p = b.pairs[0];
  EXPECT_EQ(p.problem, "model.bert_layer/f32/train/batch:32");
  ASSERT_TRUE(p.cpu && p.cuda);
  EXPECT_EQ(p.cpu->ops.front().op, "addmm");
  EXPECT_DOUBLE_EQ(p.cpu->ops.front().share, 0.6);
  EXPECT_DOUBLE_EQ(p.cuda->ops.back().share, 1000.0 / 4100.0);
  EXPECT_DOUBLE_EQ(p.cuda->coverage, 0.9756);
  EXPECT_EQ(p.ops, (std::vector<std::string>{"addmm", "softmax", "adamw"}));
  ASSERT_EQ(b.without.size(), 1u) << "the failed model entry is listed, the op entry is not";
  EXPECT_EQ(b.without[0]->name.direction, "infer");
}

TEST(Breakdown, ConsoleShowsBothSidesAndTheRatioPerOp) {
  const RunData run = parse_run(two_backends(), "two.json");
  std::ostringstream out;
  Style st;
  print_breakdown(out, breakdown(run), st);
  const std::string s = out.str();
  EXPECT_NE(s.find("model.bert_layer/f32/train/batch:32"), std::string::npos) << s;
  EXPECT_NE(s.find("CPU/GPU"), std::string::npos) << s;
  EXPECT_NE(s.find("30x"), std::string::npos) << "addmm: 60 ms on the CPU, 2 ms on the GPU\n" << s;
  EXPECT_NE(s.find("60.0%"), std::string::npos) << s;
  EXPECT_NE(s.find("the ops cover 97.6%"), std::string::npos) << s;
  EXPECT_NE(s.find("verification failed: y off"), std::string::npos) << s;
}

TEST(Breakdown, JsonHasTheDocumentedShape) {
  const RunData run = parse_run(two_backends(), "two.json");
  std::ostringstream out;
  Style st;
  st.format = Format::json;
  print_breakdown(out, breakdown(run), st);
  const auto j = nlohmann::json::parse(out.str());
  ASSERT_EQ(j["models"].size(), 2u);
  const auto& gpu = j["models"][1];
  EXPECT_EQ(gpu["name"], "bert_layer");
  EXPECT_EQ(gpu["backend"], "cuda");
  EXPECT_EQ(gpu["dtype"], "f32");
  EXPECT_EQ(gpu["direction"], "train");
  EXPECT_EQ(gpu["batch"], 32);
  EXPECT_DOUBLE_EQ(gpu["step_us"].get<double>(), 4100);
  EXPECT_DOUBLE_EQ(gpu["coverage"].get<double>(), 0.9756);
  ASSERT_EQ(gpu["ops"].size(), 3u);
  EXPECT_EQ(gpu["ops"][0]["op"], "addmm");
  EXPECT_DOUBLE_EQ(gpu["ops"][0]["us"].get<double>(), 2000);
  EXPECT_DOUBLE_EQ(gpu["ops"][0]["share"].get<double>(), 2000.0 / 4100.0);
}

TEST(Breakdown, OneBackendRunHasItsSideOnly) {
  const std::string cpu_only = R"({"benchmarks": [)" +
                               entry(kCpu, 100, R"("breakdown:addmm": 70, "breakdown:adamw": 30)", 101, 0.99, 1.01) + "]}";
  const RunData run = parse_run(cpu_only, "cpu.json");  // the breakdown points into it
  const Breakdown b = breakdown(run);
  ASSERT_EQ(b.pairs.size(), 1u);
  EXPECT_TRUE(b.pairs[0].cpu);
  EXPECT_FALSE(b.pairs[0].cuda);
  std::ostringstream out;
  print_breakdown(out, b, Style{});
  EXPECT_EQ(out.str().find("GPU time"), std::string::npos) << out.str();
  EXPECT_NE(out.str().find("the entry's 100 us"), std::string::npos) << out.str();
}

TEST(Breakdown, ARunWithoutModelStepsIsBadInput) {
  const std::string ops = R"({"benchmarks": [{"name": "mm/cpu/f32/fwd/M:2/real_time", "real_time": 3, "time_unit": "us"}]})";
  EXPECT_THROW(breakdown(parse_run(ops, "ops.json")), InputError);
}

}  // namespace
}  // namespace hotops::compare
