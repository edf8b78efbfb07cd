// Reading Google Benchmark JSON: the 1.7 and 1.8 shapes, real bench output, repetitions and
// aggregates, NaN tokens, and every kind of bad input.
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "compare/src/run.h"

namespace hotops::compare {
namespace {

using RunData = Run;  // inside a TEST body, plain `Run` is gtest's Test::Run
const std::string kFixtures = HOTOPS_COMPARE_FIXTURES;

TEST(ReadRun, GoogleBenchmark17WithRepetitionsAndAggregates) {
  const RunData r = read_run(kFixtures + "/gb17_base.json");
  EXPECT_EQ(r.context.at("gpu_name"), "NVIDIA H100 80GB HBM3");
  EXPECT_EQ(r.context.at("num_cpus"), "32");
  EXPECT_EQ(r.context.count("caches"), 0u) << "arrays of the context are not scalars";
  const Entry* e = r.find("mm/cuda/f32/fwd/shape:bert.ffn_up/batch:32/M:4096/N:3072/K:768/manual_time");
  ASSERT_NE(e, nullptr);
  ASSERT_EQ(e->samples_ns.size(), 5u) << "the 5 repetitions, not the 4 aggregates";
  EXPECT_NEAR(e->time_ns(), 200e3, 1e-6) << "median of 196, 198, 200, 202, 204 us";
  EXPECT_NEAR(*e->counter("FLOP/s"), 2.0 * 4096 * 3072 * 768 / 200e-6, 1e3);
  EXPECT_EQ(e->label, "cublasLt");
  EXPECT_TRUE(e->name.hotops);
  EXPECT_EQ(e->name.op, "mm");
  EXPECT_EQ(e->name.backend, "cuda");
  EXPECT_EQ(e->name.suffix, "manual_time");
  EXPECT_EQ(e->name.batch(), 32);
  EXPECT_EQ(e->name.problem(), "mm/f32/fwd/shape:bert.ffn_up/batch:32/M:4096/N:3072/K:768");
}

TEST(ReadRun, GoogleBenchmark18SkippedAndNewContextKeys) {
  const RunData r = read_run(kFixtures + "/gb18_new.json");
  EXPECT_EQ(r.context.at("library_version"), "v1.8.3");
  EXPECT_EQ(r.context.at("json_schema_version"), "1");
  const Entry* skipped = r.find("copy/cuda/f32/fwd/kind:memcpy/bytes:1073741824/manual_time");
  ASSERT_NE(skipped, nullptr);
  EXPECT_TRUE(skipped->skipped);
  EXPECT_FALSE(skipped->error);
  EXPECT_FALSE(skipped->has_time());
  EXPECT_NE(skipped->message.find("no CUDA device"), std::string::npos);
  const Entry* failed = r.find("conv2d/cuda/bf16/fwd/shape:resnet50.conv1/batch:32/C:3/H:224/W:224/K:64/R:7/S:7/"
                               "stride:2/pad:3/dilation:1/bias:0/layout:nchw/manual_time");
  ASSERT_NE(failed, nullptr);
  EXPECT_TRUE(failed->error);
  EXPECT_NE(failed->message.find("verification failed"), std::string::npos);
}

// bench's own output (Google Benchmark 1.7.1, Debian 12), which repeats "threads": Google
// Benchmark's field, then hotops' counter of the same name.
TEST(ReadRun, RealBenchOutput) {
  const RunData r = read_run(kFixtures + "/bench_gb171_cpu.json");
  EXPECT_EQ(r.context.at("onednn_version"), "2.6.3");
  EXPECT_TRUE(r.context.count("roofline_cpu_copy_GBps"));
  ASSERT_FALSE(r.entries.empty());
  for (const Entry& e : r.entries) {
    EXPECT_TRUE(e.name.hotops) << e.name.full;
    EXPECT_EQ(e.name.backend, "cpu");
    EXPECT_EQ(e.samples_ns.size(), 3u) << e.name.full;
    EXPECT_GT(e.time_ns(), 0);
    EXPECT_TRUE(e.counter("items_per_second")) << e.name.full;
  }
}

TEST(ReadRun, AggregatesOnlyUseTheMedian) {
  const std::string text = R"({"context": {}, "benchmarks": [
    {"name": "a/cpu/f32/fwd/batch:1/real_time_mean", "run_name": "a/cpu/f32/fwd/batch:1/real_time",
     "run_type": "aggregate", "aggregate_name": "mean", "aggregate_unit": "time", "real_time": 12.0, "time_unit": "us"},
    {"name": "a/cpu/f32/fwd/batch:1/real_time_median", "run_name": "a/cpu/f32/fwd/batch:1/real_time",
     "run_type": "aggregate", "aggregate_name": "median", "aggregate_unit": "time", "real_time": 10.0, "time_unit": "us",
     "items_per_second": 1e5},
    {"name": "a/cpu/f32/fwd/batch:1/real_time_cv", "run_name": "a/cpu/f32/fwd/batch:1/real_time",
     "run_type": "aggregate", "aggregate_name": "cv", "aggregate_unit": "percentage", "real_time": 0.02, "time_unit": "us"}]})";
  const RunData r = parse_run(text, "agg.json");
  ASSERT_EQ(r.entries.size(), 1u);
  EXPECT_TRUE(r.entries[0].samples_ns.empty());
  EXPECT_DOUBLE_EQ(r.entries[0].time_ns(), 10e3);
  EXPECT_DOUBLE_EQ(*r.entries[0].counter("items_per_second"), 1e5);
}

TEST(ReadRun, TimeUnits) {
  const RunData r = parse_run(R"({"benchmarks": [
    {"name": "n", "real_time": 3, "time_unit": "ns"}, {"name": "u", "real_time": 3, "time_unit": "us"},
    {"name": "m", "real_time": 3, "time_unit": "ms"}, {"name": "s", "real_time": 3, "time_unit": "s"}]})", "t.json");
  EXPECT_DOUBLE_EQ(r.find("n")->time_ns(), 3);
  EXPECT_DOUBLE_EQ(r.find("u")->time_ns(), 3e3);
  EXPECT_DOUBLE_EQ(r.find("m")->time_ns(), 3e6);
  EXPECT_DOUBLE_EQ(r.find("s")->time_ns(), 3e9);
  EXPECT_FALSE(r.find("n")->name.hotops) << "a name outside hotops' scheme is still compared by its full name";
}

// Google Benchmark writes non-finite counters as bare NaN / Infinity, which JSON does not allow.
TEST(ReadRun, NanAndInfinityTokens) {
  const RunData r = parse_run(R"({"benchmarks": [{"name": "x/cpu/f32/fwd", "real_time": 1, "time_unit": "ns",
    "FLOP/s": NaN, "bytes_per_second": Infinity, "items_per_second": -Infinity, "label": "NaN Infinity"}]})", "nan.json");
  const Entry& e = r.entries.at(0);
  EXPECT_TRUE(std::isnan(e.counters.at("FLOP/s")));
  EXPECT_FALSE(e.counter("FLOP/s"));
  EXPECT_FALSE(e.counter("bytes_per_second"));
  EXPECT_EQ(e.label, "NaN Infinity") << "tokens inside strings are left alone";
}

TEST(ReadRun, SanitizeLeavesStringsAndEscapesAlone) {
  EXPECT_EQ(sanitize_nonfinite(R"({"a": NaN, "b": "x\"NaN", "c": -Infinity})"), R"({"a": null, "b": "x\"NaN", "c": null})");
}

TEST(ReadRun, OneFailedRepetitionFailsTheEntry) {
  const RunData r = parse_run(R"({"benchmarks": [
    {"name": "a", "run_type": "iteration", "real_time": 5, "time_unit": "ns"},
    {"name": "a", "run_type": "iteration", "error_occurred": true, "error_message": "boom", "real_time": 0, "time_unit": "ns"}]})",
                          "e.json");
  ASSERT_EQ(r.entries.size(), 1u);
  EXPECT_TRUE(r.entries[0].error);
  EXPECT_FALSE(r.entries[0].has_time());
  EXPECT_EQ(r.entries[0].message, "boom");
}

TEST(ParseName, HotopsScheme) {
  const Name n = parse_name("model.bert_layer/cpu/f32/train/batch:32/threads:4/real_time");
  EXPECT_TRUE(n.hotops);
  EXPECT_EQ(n.op, "model.bert_layer");
  EXPECT_EQ(n.direction, "train");
  ASSERT_EQ(n.args.size(), 2u);
  EXPECT_EQ(n.args[1].first, "threads") << "hotops' threads arg is not Google Benchmark's suffix";
  EXPECT_EQ(n.problem(), "model.bert_layer/f32/train/batch:32/threads:4");
  EXPECT_EQ(parse_name("model.bert_layer/cuda/f32/train/batch:32/threads:4/manual_time").problem(), n.problem());
  EXPECT_FALSE(parse_name("BM_Sort/1024").hotops);
  EXPECT_FALSE(parse_name("x/gpu/f32/fwd").hotops);
  EXPECT_FALSE(parse_name("x/cpu/f32/fwd/notanarg").hotops);
  EXPECT_FALSE(parse_name("x/cpu/f32/fwd/batch:abc").batch());
}

std::string input_error(const std::string& text) {
  try {
    parse_run(text, "in.json");
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

TEST(ReadRun, BadInputIsOneClearError) {
  EXPECT_NE(input_error("this is not json").find("in.json: not JSON"), std::string::npos);
  EXPECT_NE(input_error("").find("not JSON"), std::string::npos);
  EXPECT_NE(input_error("[1, 2]").find("not Google Benchmark output"), std::string::npos);
  EXPECT_NE(input_error(R"({"name": "x"})").find("no \"benchmarks\""), std::string::npos);
  EXPECT_NE(input_error(R"({"benchmarks": {}})").find("not an array"), std::string::npos);
  EXPECT_NE(input_error(R"({"benchmarks": [], "context": 3})").find("\"context\" is not an object"), std::string::npos);
  EXPECT_NE(input_error(R"({"benchmarks": [1]})").find("benchmarks[0] is not an object"), std::string::npos);
  EXPECT_NE(input_error(R"({"benchmarks": [{"real_time": 1}]})").find("has no \"name\""), std::string::npos);
  EXPECT_NE(input_error(R"({"benchmarks": [{"name": "a"}]})").find("has no \"real_time\""), std::string::npos);
  EXPECT_NE(input_error(R"({"benchmarks": [{"name": "a", "real_time": "1"}]})").find("not a number"), std::string::npos);
  EXPECT_NE(input_error(R"({"benchmarks": [{"name": "a", "real_time": -1}]})").find("not a time"), std::string::npos);
  EXPECT_NE(input_error(R"({"benchmarks": [{"name": "a", "real_time": NaN}]})").find("not a number"), std::string::npos);
  EXPECT_NE(input_error(R"({"benchmarks": [{"name": "a", "real_time": 0}]})").find("not a time"), std::string::npos);
  EXPECT_NE(input_error(R"({"benchmarks": [{"name": "a", "real_time": 1e300, "time_unit": "s"}]})").find("too large a time"),
            std::string::npos);
  EXPECT_NE(input_error(R"({"benchmarks": [{"name": "a", "real_time": 1, "time_unit": "fortnight"}]})").find("unknown time_unit"),
            std::string::npos);
  // A number beyond a double: nlohmann throws out_of_range, not parse_error (found by fuzzing).
  EXPECT_NE(input_error(R"({"benchmarks": [{"name": "a", "real_time": 1e6054421}]})").find("in.json: not JSON: number overflow"),
            std::string::npos);
  // Every message is one line.
  for (const char* bad : {"{", "[1]", R"({"benchmarks": [{"name": "a"}]})"}) EXPECT_EQ(input_error(bad).find('\n'), std::string::npos);
}

TEST(ReadRun, MissingFile) {
  try {
    read_run(kFixtures + "/does_not_exist.json");
    FAIL() << "no error";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("cannot open"), std::string::npos);
  }
}

TEST(ReadRun, EmptyBenchmarksIsARunWithNothingInIt) {
  EXPECT_TRUE(parse_run(R"({"context": {}, "benchmarks": []})", "e.json").entries.empty());
}

// A join looks entries up by name: after a filter removed some, the rest are still found, and the
// removed ones are not.
TEST(ReadRun, FindFollowsTheEntriesThroughAFilter) {
  RunData r = parse_run(R"({"benchmarks": [{"name": "a/x", "real_time": 1}, {"name": "b/y", "real_time": 2},
                                            {"name": "c/x", "real_time": 3}]})",
                        "f.json");
  ASSERT_NE(r.find("b/y"), nullptr);
  keep_matching(r, "/x");
  EXPECT_EQ(r.find("b/y"), nullptr);
  ASSERT_NE(r.find("c/x"), nullptr);
  EXPECT_DOUBLE_EQ(r.find("c/x")->time_ns(), 3);
}

}  // namespace
}  // namespace hotops::compare
