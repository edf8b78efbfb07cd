// Runs the bench executable as a user would and checks what the user sees: names, counters,
// context keys and exit codes. The bench path comes from CMake (HOTOPS_BENCH_PATH).
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <string>

namespace {

struct Result {
  int exit_code = -1;
  std::string output;  // stdout and stderr
};

Result run(const std::string& args) {
  const std::string cmd = std::string(HOTOPS_BENCH_PATH) + " " + args + " 2>&1";
  Result r;
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return r;
  char buf[4096];
  while (std::fgets(buf, sizeof buf, p)) r.output += buf;
  const int status = pclose(p);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

std::string temp_path(const std::string& name) {
  return testing::TempDir() + "/hotops_" + name + "_" + std::to_string(::getpid()) + ".json";
}

TEST(BenchSmoke, JsonNamesCountersAndContext) {
  const std::string out = temp_path("smoke");
  const Result r = run("--benchmark_filter='mlp_tiny.fc1/batch:10/' --benchmark_min_time=0.01 "
                       "--benchmark_format=json --benchmark_out=" + out);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::ifstream f(out);
  ASSERT_TRUE(f) << "no JSON written to " << out;
  const nlohmann::json j = nlohmann::json::parse(f);

  for (const char* key : {"hotops_version", "hotops_git_revision", "compiler", "build_type", "cpu_model",
                          "onednn_isa", "onednn_version", "threads", "hotops_seed"})
    EXPECT_TRUE(j["context"].contains(key)) << "context lacks " << key;
  const bool gpu = j["context"].contains("gpu_name");
  if (gpu) {
    for (const char* key : {"gpu_sm_count", "gpu_memory_mib", "cuda_driver_version", "cuda_runtime_version",
                            "cublas_version", "cudnn_version", "gpu_sm_clock_mhz"})
      EXPECT_TRUE(j["context"].contains(key)) << "context lacks " << key;
  } else {
    EXPECT_TRUE(j["context"].contains("gpu")) << "a run without GPU must say why in context.gpu";
  }

  const std::regex scheme(R"(^(mm|addmm|bmm)/(cpu|cuda)/(f32|tf32|bf16|f16)/(fwd|bwd_data|bwd_weight)/)"
                          R"(shape:[a-z_0-9.]+(/[A-Za-z_]+:[0-9.]+)+/(real_time|manual_time)$)");
  int cpu = 0, cuda = 0;
  for (const auto& b : j["benchmarks"]) {
    const std::string name = b["name"];
    EXPECT_TRUE(std::regex_match(name, scheme)) << name;
    EXPECT_FALSE(b.value("error_occurred", false)) << name << ": " << b.value("error_message", "");
    for (const char* counter : {"FLOP/s", "bytes_per_second", "items_per_second"})
      EXPECT_TRUE(b.contains(counter)) << name << " lacks " << counter;
    EXPECT_GT(b.value("FLOP/s", 0.0), 0) << name;
    EXPECT_FALSE(b.value("label", "").empty()) << name;
    if (name.find("/cpu/") != std::string::npos) {
      ++cpu;
      EXPECT_NE(name.find("/real_time"), std::string::npos) << name;
    } else {
      ++cuda;
      EXPECT_NE(name.find("/manual_time"), std::string::npos) << name;
    }
  }
  EXPECT_GE(cpu, 6);  // mm and addmm x f32 x three directions at least
  if (gpu) {
    EXPECT_EQ(cuda, 18);  // mm and addmm x three dtypes x three directions
  }
  std::remove(out.c_str());
}

TEST(BenchSmoke, BadHotopsFlagIsOneLineAndExitTwo) {
  for (const char* flag : {"--hotops_batch=0", "--hotops_batch=abc", "--hotops_verify=3", "--hotops_bogus"}) {
    const Result r = run(flag);
    EXPECT_EQ(r.exit_code, 2) << flag << ": " << r.output;
    EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 1) << flag << ": " << r.output;
  }
}

TEST(BenchSmoke, FilterThatMatchesNothingExitsTwo) {
  const Result r = run("--benchmark_filter=no_such_op_anywhere");
  EXPECT_EQ(r.exit_code, 2) << r.output;
}

TEST(BenchSmoke, BatchFlagReplacesTheBatchAxis) {
  const Result r = run("--hotops_batch=3 --benchmark_list_tests=true --benchmark_filter=mlp_tiny.fc1");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("shape:mlp_tiny.fc1/batch:3/M:3/N:32/K:13"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("batch:10"), std::string::npos) << r.output;
}

}  // namespace
