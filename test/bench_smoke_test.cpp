// Runs the bench executable as a user would and checks what the user sees: names, counters,
// context keys and exit codes. The bench path comes from CMake (HOTOPS_BENCH_PATH).
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "test/spinners.h"

namespace {

struct Result {
  int exit_code = -1;
  std::string output;  // stdout and stderr
};

// `env` is prepended to the command line, e.g. "HOTOPS_TEST_FAULT=trap".
Result run(const std::string& args, const std::string& env = "") {
  const std::string cmd = env + (env.empty() ? "" : " ") + std::string(HOTOPS_BENCH_PATH) + " " + args + " 2>&1";
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

// Parses JSON as a strict reader does: a key repeated in one object is an error (nlohmann::json
// itself keeps the last value silently). Returns null and names the key in `duplicate` then.
nlohmann::json parse_strict(std::istream& in, std::string& duplicate) {
  std::vector<std::set<std::string>> open_objects;
  duplicate.clear();
  const nlohmann::json::parser_callback_t check = [&](int, nlohmann::json::parse_event_t event, nlohmann::json& parsed) {
    using E = nlohmann::json::parse_event_t;
    if (event == E::object_start) open_objects.emplace_back();
    if (event == E::object_end) open_objects.pop_back();
    if (event == E::key && !open_objects.back().insert(parsed.get<std::string>()).second && duplicate.empty())
      duplicate = parsed.get<std::string>();
    return true;
  };
  nlohmann::json j = nlohmann::json::parse(in, check);
  return duplicate.empty() ? j : nlohmann::json();
}

TEST(BenchSmoke, StrictParsingCatchesARepeatedKey) {
  std::istringstream text(R"({"benchmarks": [{"name": "a", "threads": 1, "b": {"threads": 1}, "threads": 2}]})");
  std::string duplicate;
  EXPECT_TRUE(parse_strict(text, duplicate).is_null());
  EXPECT_EQ(duplicate, "threads");
  std::istringstream fine(R"({"a": {"k": 1}, "b": {"k": 2}, "c": [{"k": 3}, {"k": 4}]})");
  EXPECT_FALSE(parse_strict(fine, duplicate).is_null());
  EXPECT_EQ(duplicate, "");
}

TEST(BenchSmoke, JsonNamesCountersAndContext) {
  const std::string out = temp_path("smoke");
  const Result r = run("--benchmark_filter='mlp_tiny.fc1/batch:10/' --benchmark_min_time=0.01 "
                       "--benchmark_format=json --benchmark_out=" + out);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::ifstream f(out);
  ASSERT_TRUE(f) << "no JSON written to " << out;
  std::string duplicate;
  const nlohmann::json j = parse_strict(f, duplicate);
  ASSERT_EQ(duplicate, "") << "a key repeated in one object of " << out;

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
    EXPECT_EQ(b.value("time_unit", ""), "us") << name;
    if (name.find("/cpu/") != std::string::npos) {
      ++cpu;
      EXPECT_NE(name.find("/real_time"), std::string::npos) << name;
      EXPECT_GT(b.value("cpu_threads", 0), 0) << name;
      EXPECT_EQ(b.value("threads", 0), 1) << name << ": Google Benchmark's own threads field";
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

std::size_t lines(const std::string& s) { return static_cast<std::size_t>(std::count(s.begin(), s.end(), '\n')); }

// Bad input: one line on stderr and exit 2, before anything runs (no roofline, no benchmark, no
// Google Benchmark banner), however the mistake is made.
TEST(BenchSmoke, BadInputIsOneLineAndExitTwoBeforeAnythingRuns) {
  const std::pair<std::string, std::string> cases[] = {
      {"--hotops_batch=0", "bad value '0' for --hotops_batch"},
      {"--hotops_batch=-4", "bad value '-4' for --hotops_batch"},
      {"--hotops_batch=abc", "bad value 'abc' for --hotops_batch"},
      {"--hotops_batch=99999999999", "bad value '99999999999' for --hotops_batch"},
      {"--hotops_threads=0", "bad value '0' for --hotops_threads"},
      {"--hotops_verify=3", "bad value '3' for --hotops_verify"},
      {"--hotops_seed=-1", "bad value '-1' for --hotops_seed"},
      {"--hotops_bogus", "unknown flag --hotops_bogus"},
      {"--hotops_help=yes", "--hotops_help takes no value"},
      {"--benchmark_filter=no_such_op_anywhere", "no benchmark matches --benchmark_filter=no_such_op_anywhere"},
      {"--benchmark_filter='('", "bad value '(' for --benchmark_filter"},
      {"--benchmark_format=xml", "bad value 'xml' for --benchmark_format"},
      {"--benchmark_repetitions=-1", "bad value '-1' for --benchmark_repetitions"},
      {"--benchmark_min_time=-1", "bad value '-1' for --benchmark_min_time"},
      {"--benchmark_min_time=abc", "bad value 'abc' for --benchmark_min_time"},
      {"--benchmark_list_tests=maybe", "bad value 'maybe' for --benchmark_list_tests"},
      {"--benchmark_out=/nonexistent_hotops_dir/x.json", "no such folder '/nonexistent_hotops_dir'"},
      {"--benchmark_nonsense=1", "unrecognized command-line flag: --benchmark_nonsense=1"},
      {"stray_argument", "unrecognized command-line flag: stray_argument"},
  };
  for (const auto& [args, expected] : cases) {
    const Result r = run(args);
    EXPECT_EQ(r.exit_code, 2) << args << ": " << r.output;
    EXPECT_EQ(lines(r.output), 1u) << args << ": " << r.output;
    EXPECT_NE(r.output.find(expected), std::string::npos) << args << ": " << r.output;
  }
  const Result r = run("--benchmark_filter=mm", "HOTOPS_TEST_FAULT=no_such_fault");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_EQ(lines(r.output), 1u) << r.output;
  EXPECT_NE(r.output.find("unknown HOTOPS_TEST_FAULT='no_such_fault'"), std::string::npos) << r.output;
}

bool has_gpu() {
  static const bool gpu =
      run("--benchmark_list_tests=true --benchmark_filter=mm/cuda/f32/fwd/shape:mlp_tiny.fc1/batch:10/").exit_code == 0;
  return gpu;
}

TEST(BenchSmoke, FilterOnlyOfBenchmarksThatCannotRunHereSaysWhy) {
  if (has_gpu()) GTEST_SKIP() << "a GPU is present: the CUDA benchmarks can run";
  const Result r = run("--benchmark_filter=mm/cuda/f32/fwd/shape:mlp_tiny.fc1/batch:10/");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_EQ(lines(r.output), 1u) << r.output;
  EXPECT_NE(r.output.find("none of the 2 benchmarks matching"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("can run here: "), std::string::npos) << r.output;
}

// Without a usable GPU the CUDA part is one line that says why; without the NVIDIA driver, plainly so.
TEST(BenchSmoke, NoGpuIsOneLineSayingWhy) {
  if (has_gpu()) GTEST_SKIP() << "a GPU is present: the CUDA benchmarks can run";
  const Result r = run("--benchmark_list_tests --benchmark_filter=/shape:mlp_tiny.fc1/batch:10/");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(std::regex_search(r.output, std::regex(R"((^|\n)hotops: [^\n]+: the CUDA benchmarks are not run \(18 selected\)\n)")))
      << r.output;
  const bool cuda_build = r.output.find("has no CUDA backend") == std::string::npos;
  if (cuda_build && ::access("/proc/driver/nvidia/version", F_OK) != 0) {
    EXPECT_NE(r.output.find("hotops: no NVIDIA driver found: the CUDA benchmarks are not run"), std::string::npos)
        << r.output;
  }
}

TEST(BenchSmoke, HelpExitsZero) {
  const Result r = run("--hotops_help");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  for (const char* flag : {"--hotops_batch", "--hotops_seed", "--hotops_verify", "--hotops_help"})
    EXPECT_NE(r.output.find(flag), std::string::npos) << flag << ": " << r.output;
}

// Runs bench with a JSON output file and returns the parsed JSON (null when none was written).
nlohmann::json run_json(const std::string& args, Result& r, const std::string& env = "") {
  const std::string out = temp_path("run");
  std::remove(out.c_str());
  r = run("--hotops_roofline=0 --benchmark_min_time=0.01 --benchmark_out=" + out + " " + args, env);
  std::ifstream f(out);
  std::string duplicate;
  nlohmann::json j = f ? parse_strict(f, duplicate) : nlohmann::json();
  EXPECT_EQ(duplicate, "") << "a key repeated in one object: " << args;
  std::remove(out.c_str());
  return j;
}

// A planted bug (HOTOPS_TEST_MUTATION, include/hotops/plan.h) makes every op entry it reaches an
// error entry that says its verification failed, and nothing is timed; an unknown name is refused.
// (swap_inputs reaches the ops with two inputs of one size: softmax's y and dy, layernorm's x and dy.)
const char* const kMutationFilter =
    " --hotops_batch=2 --benchmark_filter='^(softmax|layernorm|cross_entropy|embedding)/cpu/(f32|bf16)/bwd/'";
const char* const kSwapFilter = " --hotops_batch=2 --benchmark_filter='^(softmax|layernorm)/cpu/(f32|bf16)/bwd/'";

TEST(BenchSmoke, APlantedBugFailsEveryEntryItReaches) {
  for (const std::string m : {"shift_output", "zero_input", "swap_inputs"}) {
    Result r;
    const nlohmann::json j = run_json(m == "swap_inputs" ? kSwapFilter : kMutationFilter, r, "HOTOPS_TEST_MUTATION=" + m);
    const nlohmann::json entries = j.value("benchmarks", nlohmann::json::array());
    ASSERT_FALSE(entries.empty()) << m << ": " << r.output;
    for (const auto& e : entries) {
      EXPECT_TRUE(e.value("error_occurred", false)) << m << ": " << e.value("name", "");
      EXPECT_NE(e.value("error_message", "").find("verification failed"), std::string::npos)
          << m << ": " << e.value("error_message", "");
    }
  }
  Result clean;
  const nlohmann::json j = run_json(kMutationFilter, clean);
  for (const auto& e : j.value("benchmarks", nlohmann::json::array()))
    EXPECT_FALSE(e.value("error_occurred", false)) << e.value("name", "") << ": " << e.value("error_message", "");
  const Result r = run("--benchmark_filter=mm", "HOTOPS_TEST_MUTATION=drop_everything");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_EQ(lines(r.output), 1u) << r.output;
  EXPECT_NE(r.output.find("unknown HOTOPS_TEST_MUTATION='drop_everything'"), std::string::npos) << r.output;
}

const char* const kTinyCpuFilter = " --benchmark_filter='^mm/cpu/f32/fwd/shape:mlp_tiny.fc1/batch:10/'";

// Runs the one tiny CPU benchmark with `args` (after run_json's own) and returns its JSON entry
// (null when it did not run); `r` gets what bench printed.
nlohmann::json run_tiny(const std::string& args, Result& r) {
  const nlohmann::json j = run_json(args + kTinyCpuFilter, r);
  EXPECT_EQ(r.exit_code, 0) << args << ": " << r.output;
  const nlohmann::json entries = j.value("benchmarks", nlohmann::json::array());
  EXPECT_EQ(entries.size(), 1u) << args << ": " << r.output;
  return entries.size() == 1 ? entries[0] : nlohmann::json();
}

// --benchmark_min_time in each form a Google Benchmark release documents (the later flag wins over
// run_json's own), and Google Benchmark's BENCHMARK_MIN_TIME variable.
TEST(BenchSmoke, MinTimeTakesEveryDocumentedForm) {
  Result r;
  for (const char* form : {"0.01", "0.01s", "1e-2s"})
    EXPECT_GT(run_tiny(std::string("--benchmark_min_time=") + form, r).value("iterations", 0), 1) << form;
  EXPECT_EQ(run_tiny("--benchmark_min_time=7x", r).value("iterations", 0), 7);
  const std::string out = temp_path("min_time_env");
  r = run("--hotops_roofline=0 --benchmark_out=" + out + kTinyCpuFilter, "BENCHMARK_MIN_TIME=5x");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::ifstream f(out);
  EXPECT_EQ(nlohmann::json::parse(f)["benchmarks"][0].value("iterations", 0), 5) << "BENCHMARK_MIN_TIME=5x";
  std::remove(out.c_str());
  r = run("--benchmark_list_tests" + std::string(kTinyCpuFilter), "BENCHMARK_MIN_TIME=-1");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("bad value '-1' for BENCHMARK_MIN_TIME"), std::string::npos) << r.output;
}

// The time unit is microseconds unless --benchmark_time_unit says otherwise, in the JSON as on the
// console.
TEST(BenchSmoke, TimeUnitFlagWins) {
  for (const char* unit : {"ns", "ms", "s"}) {
    Result r;
    EXPECT_EQ(run_tiny(std::string("--benchmark_time_unit=") + unit, r).value("time_unit", ""), unit);
    EXPECT_NE(r.output.find(std::string(" ") + unit + " "), std::string::npos) << unit << ": " << r.output;
  }
}

// The console line: the roofline fractions as percentages, each time in the unit that suits it,
// the bookkeeping counters left to the JSON (which still has them).
TEST(BenchSmoke, ConsoleLineIsShortAndReadable) {
  const std::string out = temp_path("console");
  const Result r = run("--benchmark_min_time=0.01 --benchmark_out=" + out + kTinyCpuFilter);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::string line;
  std::istringstream lines(r.output);
  while (std::getline(lines, line) && line.rfind("mm/cpu/", 0) != 0) {
  }
  ASSERT_EQ(line.rfind("mm/cpu/", 0), 0u) << r.output;
  EXPECT_TRUE(std::regex_search(line, std::regex(R"( bw=[0-9.]+% flop=[0-9.]+% )"))) << line;
  EXPECT_TRUE(std::regex_search(line, std::regex(R"(real_time +[0-9.]+ (ns|us) )"))) << line;
  for (const char* hidden : {"bw_fraction", "flop_fraction", "cpu_threads", "threads="})
    EXPECT_EQ(line.find(hidden), std::string::npos) << hidden << ": " << line;
  std::ifstream f(out);
  const nlohmann::json j = nlohmann::json::parse(f);
  for (const char* kept : {"bw_fraction", "flop_fraction", "cpu_threads"})
    EXPECT_TRUE(j["benchmarks"][0].contains(kept)) << kept;
  std::remove(out.c_str());
}

TEST(BenchSmoke, SeedAndSubnormalModeAreRecordedInTheContext) {
  Result r;
  const auto filter = std::string(" --benchmark_filter='mm/cpu/f32/fwd/shape:mlp_tiny.fc1/batch:10/'");
  nlohmann::json j = run_json("--hotops_seed=7" + filter, r);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(j["context"].value("hotops_seed", ""), "7");
  j = run_json(filter, r);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(j["context"].value("hotops_seed", ""), "20261122");  // the default, also recorded
  EXPECT_EQ(j["context"].value("hotops_cpu_ftz", ""), "1");        // subnormals flushed by default
  j = run_json("--hotops_cpu_ftz=0" + filter, r);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(j["context"].value("hotops_cpu_ftz", ""), "0");
}

// With --hotops_verify=0 a CPU entry's set-up ends with one untimed execution in place of the
// verification's, so that its first timed execution is not its first ever: HOTOPS_TRACE_SETUP's
// line shows it as the warm-up; with verification the warm-up part is empty.
TEST(BenchSmoke, UnverifiedCpuEntryRunsOnceBeforeTiming) {
  const std::string filter =
      " --hotops_roofline=0 --benchmark_filter='^model.mlp_mnist/cpu/f32/train/batch:1024/real_time$' --benchmark_min_time=0.01";
  const auto parts = [](const Result& r, double& verify, double& warmup) {
    const std::size_t at = r.output.find("setup ");
    double total = 0, made = 0;
    return at != std::string::npos &&
           std::sscanf(r.output.c_str() + at, "setup %lf s (case %lf, verify %lf, warm-up %lf)", &total, &made, &verify, &warmup) == 4;
  };
  double verify = -1, warmup = -1;
  Result r = run("--hotops_verify=0" + filter, "HOTOPS_TRACE_SETUP=1");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  ASSERT_TRUE(parts(r, verify, warmup)) << r.output;
  EXPECT_EQ(verify, 0.0) << r.output;
  EXPECT_GT(warmup, 0.0) << r.output;
  r = run(filter, "HOTOPS_TRACE_SETUP=1");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  ASSERT_TRUE(parts(r, verify, warmup)) << r.output;
  EXPECT_GT(verify, 0.0) << r.output;
  EXPECT_EQ(warmup, 0.0) << r.output;
}

// The test-only benchmark and mm and addmm of mlp_tiny.fc1: 18 CUDA entries (three dtypes, three
// directions) and at least 6 CPU ones.
const char* const kCpuAndCudaFilter = "--benchmark_filter='test.fault|/shape:mlp_tiny.fc1/batch:10/'";

TEST(BenchSmoke, TestFaultsAreHiddenWithoutTheVariable) {
  Result r = run("--benchmark_list_tests=true");
  ASSERT_EQ(r.exit_code, 0) << r.output.substr(0, 2000);
  EXPECT_EQ(r.output.find("test.fault"), std::string::npos);
  r = run("--benchmark_list_tests=true --benchmark_filter=test.fault", "HOTOPS_TEST_FAULT=host_oom");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("test.fault/cpu/f32/fwd/kind:host_oom"), std::string::npos) << r.output;
}

// A case too large for host memory is an error entry that says how much it needs and how much is
// available; the rest of the run reports as usual.
TEST(BenchSmoke, HostOutOfMemoryIsOneErrorEntryAndTheRestRuns) {
  Result r;
  const nlohmann::json j = run_json(kCpuAndCudaFilter, r, "HOTOPS_TEST_FAULT=host_oom");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  ASSERT_GE(j["benchmarks"].size(), 3u) << r.output;
  const auto& fault = j["benchmarks"][0];
  EXPECT_EQ(fault["name"], "test.fault/cpu/f32/fwd/kind:host_oom/real_time");
  EXPECT_TRUE(fault.value("error_occurred", false));
  const std::string msg = fault.value("error_message", "");
  EXPECT_NE(msg.find("out of host memory: allocating 1048576.00 GiB with "), std::string::npos) << msg;
  EXPECT_NE(msg.find("GiB available of"), std::string::npos) << msg;
  for (std::size_t i = 1; i < j["benchmarks"].size(); ++i) {
    const auto& b = j["benchmarks"][i];
    EXPECT_FALSE(b.value("error_occurred", false)) << b["name"] << ": " << b.value("error_message", "");
    EXPECT_GT(b.value("real_time", 0.0), 0) << b["name"];
  }
}

// A memory cgroup with a limit of `limit` bytes that this test may move a process into (its
// cgroup.procs file), or "" where it cannot make one (not root, no writable memory controller).
std::string limited_cgroup(const std::string& name, const std::string& limit) {
  for (const auto& [dir, file] : {std::pair<std::string, std::string>{"/sys/fs/cgroup/memory/", "memory.limit_in_bytes"},
                                  {"/sys/fs/cgroup/", "memory.max"}}) {
    const std::string group = dir + name;
    if (std::system(("mkdir -p " + group + " 2>/dev/null").c_str()) != 0) continue;
    std::ofstream f(group + "/" + file);
    if (!(f << limit << std::flush)) continue;
    return group + "/cgroup.procs";
  }
  return "";
}

// A case whose buffers fit one by one but not together under a cgroup limit is an error entry
// that says what it needs and what is available, not a process the kernel kills.
TEST(BenchSmoke, HostBuffersOfACaseAreAccountedTogetherUnderACgroupLimit) {
  // copy f32 -> bf16 of 64M elements: a 256 MiB input and a 128 MiB output, together above the
  // limit whatever bench's own use (tens of MiB with the CUDA libraries loaded, a few without).
  const std::string procs = limited_cgroup("hotops-test-" + std::to_string(::getpid()), "380M");
  if (procs.empty()) GTEST_SKIP() << "no memory cgroup can be made here (needs root and a writable memory controller)";
  const std::string out = temp_path("cgroup");
  const Result r = run("--benchmark_filter='^copy/cpu/f32/fwd/kind:f32_to_bf16/elements:67108864/real_time' "
                       "--hotops_roofline=0 --benchmark_min_time=0.01 --benchmark_out=" + out,
                       "sh -c 'echo $$ > " + procs + "; exec \"$0\" \"$@\"'");
  ASSERT_EQ(r.exit_code, 0) << "killed instead of an error entry?\n" << r.output;
  std::ifstream f(out);
  const nlohmann::json j = nlohmann::json::parse(f);
  ASSERT_EQ(j["benchmarks"].size(), 1u) << r.output;
  const auto& b = j["benchmarks"][0];
  EXPECT_TRUE(b.value("error_occurred", false)) << r.output;
  const std::string msg = b.value("error_message", "");
  EXPECT_NE(msg.find("out of host memory"), std::string::npos) << msg;
  EXPECT_NE(msg.find("available"), std::string::npos) << msg;
  if (std::system(("rmdir " + procs.substr(0, procs.rfind('/')) + " 2>/dev/null").c_str()) != 0)
    std::fprintf(stderr, "could not remove the test's cgroup %s\n", procs.substr(0, procs.rfind('/')).c_str());
}

// The GPU faults: HOTOPS_TEST_FAULT=<kind> puts a faulting CUDA benchmark first.
struct GpuRun {
  Result r;
  nlohmann::json j;
  std::vector<nlohmann::json> cpu, cuda;  // the entries after the fault
  nlohmann::json fault;
};

GpuRun run_fault(const std::string& kind) {
  GpuRun g;
  g.j = run_json(kCpuAndCudaFilter, g.r, "HOTOPS_TEST_FAULT=" + kind);
  for (const auto& b : g.j.value("benchmarks", nlohmann::json::array())) {
    const std::string name = b["name"];
    if (name.rfind("test.fault/", 0) == 0) g.fault = b;
    else (name.find("/cuda/") != std::string::npos ? g.cuda : g.cpu).push_back(b);
  }
  return g;
}

// A fault that loses the CUDA context ends the GPU part: the faulting entry names the error, every
// later CUDA entry is skipped naming it, the CPU entries report, and bench exits 1.
TEST(BenchSmoke, GpuFaultEndsTheGpuPartAndTheCpuPartStillReports) {
  if (!has_gpu()) GTEST_SKIP() << "no GPU";
  // The error each fault raises; where CUDA versions differ in the name, each one seen is listed.
  const std::pair<const char*, std::vector<std::string>> kinds[] = {
      {"illegal_address", {"cudaErrorIllegalAddress"}},
      {"misaligned_address", {"cudaErrorMisalignedAddress"}},
      {"trap", {"cudaErrorLaunchFailure", "cudaErrorIllegalInstruction"}},
      {"assert", {"cudaErrorAssert"}}};
  for (const auto& [kind, errors] : kinds) {
    const GpuRun g = run_fault(kind);
    EXPECT_EQ(g.r.exit_code, 1) << kind << ": " << g.r.output;
    const std::string name = std::string("test.fault/cuda/f32/fwd/kind:") + kind;
    ASSERT_FALSE(g.fault.is_null()) << kind << ": " << g.r.output;
    const std::string msg = g.fault.value("error_message", "");
    std::string error = errors.front();
    for (const std::string& e : errors)
      if (msg.find(e) != std::string::npos) error = e;
    EXPECT_NE(msg.find(error), std::string::npos) << kind << ": " << msg;
    const std::string lost = "GPU context lost in " + name + ": " + error;
    EXPECT_NE(msg.find(lost), std::string::npos) << kind << ": " << msg;
    const std::string rest = "the remaining " + std::to_string(g.cuda.size()) + " CUDA benchmarks are skipped";
    EXPECT_NE(msg.find(rest), std::string::npos) << kind << ": " << msg;
    EXPECT_NE(g.r.output.find("hotops: " + lost), std::string::npos) << kind << ": " << g.r.output;
    EXPECT_EQ(g.cuda.size(), 18u) << kind;  // mm and addmm x three dtypes x three directions
    for (const auto& b : g.cuda) {
      EXPECT_TRUE(b.value("error_occurred", false)) << b["name"];
      EXPECT_NE(b.value("error_message", "").find("not run: " + lost), std::string::npos) << b.value("error_message", "");
    }
    EXPECT_GE(g.cpu.size(), 6u) << kind;
    for (const auto& b : g.cpu) {
      EXPECT_FALSE(b.value("error_occurred", false)) << b["name"] << ": " << b.value("error_message", "");
      EXPECT_GT(b.value("real_time", 0.0), 0) << b["name"];
    }
  }
}

// Errors that do not lose the context end only their own entry.
TEST(BenchSmoke, FailedLaunchAndGpuOutOfMemoryEndOnlyTheirEntry) {
  if (!has_gpu()) GTEST_SKIP() << "no GPU";
  const std::pair<const char*, std::vector<std::string>> kinds[] = {
      {"bad_launch", {"cudaError"}},  // cudaErrorInvalidConfiguration or, on the H100 host's driver, cudaErrorInvalidValue
      {"gpu_oom", {"out of GPU memory: allocating 1048576.00 GiB", "the case needs at least", "GiB free of"}}};
  for (const auto& [kind, expected] : kinds) {
    const GpuRun g = run_fault(kind);
    EXPECT_EQ(g.r.exit_code, 0) << kind << ": " << g.r.output;
    const std::string msg = g.fault.value("error_message", "");
    for (const std::string& e : expected) EXPECT_NE(msg.find(e), std::string::npos) << kind << ": " << msg;
    EXPECT_EQ(msg.find("GPU context lost"), std::string::npos) << kind << ": " << msg;
    EXPECT_EQ(g.cuda.size(), 18u) << kind;
    for (const auto& b : g.cuda) {
      EXPECT_FALSE(b.value("error_occurred", false)) << b["name"] << ": " << b.value("error_message", "");
      EXPECT_GT(b.value("real_time", 0.0), 0) << b["name"];
    }
    for (const auto& b : g.cpu) EXPECT_FALSE(b.value("error_occurred", false)) << b["name"];
  }
}

TEST(BenchSmoke, BatchFlagReplacesTheBatchAxis) {
  const Result r = run("--hotops_batch=3 --benchmark_list_tests=true --benchmark_filter=mlp_tiny.fc1");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("shape:mlp_tiny.fc1/batch:3/M:3/N:32/K:13"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("batch:10"), std::string::npos) << r.output;
}

// Every model step reports where its time goes: per-op counters in the JSON (not on the console),
// covering 95-105% of the instrumented step, and the instrumented step next to the headline. The
// outputs are checked elsewhere (ModelsVerify*, the model families' tests): here verification is off,
// which keeps this test to the breakdown and to seconds. Batch 10 is the smallest listed batch (of
// mlp_tiny), whose infer step takes about 2 us on the CPU: a step of well under a microsecond cannot
// be split to within 5% by clock reads that cost some 25 ns each. Inference and training run as two
// tests, each of a few seconds alone on 2 cores, which ctest can run side by side.
void expect_breakdowns(const std::string& direction) {
  const std::string out = temp_path("breakdown_" + direction);
  // Every CUDA variant; on the CPU all threads and the largest sweep entry (the one-thread steps of
  // the convnets take seconds each and break down no differently), and of the ConvNeXt block (named
  // by its stage) stage 3 alone.
  const Result r = run("--benchmark_filter='^model[.][^/]+/(cuda/[^/]+/" + direction + "/|cpu/[^/]+/" + direction +
                       "/(shape:convnext[.]s3/)?batch:10/(threads:8/)?real_time)' --hotops_batch=10 --hotops_roofline=0 --hotops_verify=0 "
                       "--benchmark_min_time=0.01 --benchmark_out=" + out);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output.find("breakdown"), std::string::npos) << "the console leaves the breakdown to the JSON";
  std::ifstream f(out);
  const nlohmann::json j = nlohmann::json::parse(f);
  int models = 0;
  for (const auto& b : j["benchmarks"]) {
    const std::string name = b["name"];
    ASSERT_FALSE(b.value("error_occurred", false)) << name << ": " << b.value("error_message", "");
    ++models;
    double parts = 0;
    int ops = 0;
    for (const auto& [key, value] : b.items())
      if (key.rfind("breakdown:", 0) == 0) parts += value.get<double>(), ++ops;
    EXPECT_GE(ops, 1) << name;  // a dense model's f32 inference is its addmms alone
    ASSERT_TRUE(b.contains("breakdown_step_us")) << name;
    const double step = b["breakdown_step_us"];
    EXPECT_GE(parts / step, 0.95) << name;
    EXPECT_LE(parts / step, 1.05) << name;
    EXPECT_NEAR(b["breakdown_coverage"].get<double>(), parts / step, 1e-3) << name;
    EXPECT_GT(b["breakdown_ratio"].get<double>(), 0) << name;
  }
  // A CPU without bf16 arithmetic (AVX2) runs the f32 steps alone and says which it left out.
  int not_run_here = 0;
  const std::regex left_out(R"(hotops: (\d+) benchmarks? not run: oneDNN has no [^\n]* for this CPU)");
  for (std::sregex_iterator it(r.output.begin(), r.output.end(), left_out), end; it != end; ++it)
    not_run_here += std::stoi((*it)[1]);
  EXPECT_GE(models + not_run_here, 16) << "every model, f32 and bf16, " << direction;
}

TEST(BenchSmoke, EveryModelInferStepReportsItsBreakdownByOp) { expect_breakdowns("infer"); }
TEST(BenchSmoke, EveryModelTrainStepReportsItsBreakdownByOp) { expect_breakdowns("train"); }

// A CPU step of 10 ms or more (cnn_mnist's inference at batch 512 on one thread: some 100 ms here,
// 60 ms on a 16-core Xeon) is broken down from its timed samples, every one after the first (which
// sizes the sampling), not by a pass of its own: its breakdown has one step fewer than it has
// samples, where a pass of 20 ms would have one. The stopping rule gives it four samples (or more,
// should they spread by over 100%) on a machine of any speed.
TEST(BenchSmoke, ALongCpuStepIsBrokenDownFromItsTimedSamples) {
  Result r;
  const nlohmann::json j = run_json("--benchmark_filter='^model[.]cnn_mnist/cpu/f32/infer/batch:512/real_time' --hotops_batch=512 "
                                    "--hotops_threads=1 --hotops_verify=0 --benchmark_min_time=0.01 "
                                    "--hotops_max_noise=100 --hotops_min_samples=4", r);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  ASSERT_EQ(j["benchmarks"].size(), 1u) << r.output;
  const auto& b = j["benchmarks"][0];
  ASSERT_FALSE(b.value("error_occurred", false)) << b.value("error_message", "");
  ASSERT_GE(b["real_time"].get<double>(), 10e3) << "the step is meant to take 10 ms or more (time in us)";
  const double samples = b["samples"];
  EXPECT_GE(samples, 4);
  EXPECT_EQ(b["breakdown_steps"].get<double>(), samples - 1);
  EXPECT_GT(b["breakdown:conv2d"].get<double>(), 0);
  EXPECT_GE(b["breakdown_coverage"].get<double>(), 0.95);
}

// Every entry says how many timed samples it has and, from two on, how much they spread.
TEST(BenchSmoke, EveryEntryHasSamplesAndNoise) {
  const std::string out = temp_path("noise");
  const Result r = run("--benchmark_filter='mlp_tiny' --hotops_roofline=0 --benchmark_min_time=0.01 --benchmark_out=" + out);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::ifstream f(out);
  const nlohmann::json j = nlohmann::json::parse(f);
  ASSERT_FALSE(j["benchmarks"].empty());
  for (const auto& b : j["benchmarks"]) {
    const std::string name = b["name"];
    if (b.value("error_occurred", false)) continue;
    ASSERT_TRUE(b.contains("samples")) << name;
    const double n = b["samples"];
    EXPECT_GE(n, 1) << name;
    if (n >= 2) {
      ASSERT_TRUE(b.contains("noise_pct")) << name;
      EXPECT_GE(b["noise_pct"].get<double>(), 0) << name;
    }
  }
}

// A CPU entry says how long its threads waited for a core while it was timed (cpu_wait_pct, from
// Linux's scheduler statistics), and marks its label when that is over 5% (kBusyWaitPct): here
// beside twice as many spinning threads as the machine has cores, which take most of them.
TEST(BenchSmoke, CpuEntriesSayHowLongTheirThreadsWaitedForACore) {
  if (!std::ifstream("/proc/self/schedstat")) GTEST_SKIP() << "this kernel reports no scheduler statistics";
  Result r;
  const nlohmann::json quiet = run_tiny("", r);
  ASSERT_TRUE(quiet.contains("cpu_wait_pct")) << quiet.dump();
  EXPECT_GE(quiet["cpu_wait_pct"].get<double>(), 0);
  EXPECT_LT(quiet["cpu_wait_pct"].get<double>(), 100);
  hotops::test::Spinners spinners;
  const nlohmann::json busy = run_tiny("", r);
  spinners.stop();
  ASSERT_TRUE(busy.contains("cpu_wait_pct")) << busy.dump();
  EXPECT_GT(busy["cpu_wait_pct"].get<double>(), 5);
  EXPECT_NE(busy.value("label", "").find(" [BUSY CPU: its threads waited "), std::string::npos) << busy.value("label", "");
}

// Two processes that share a choices file (--hotops_choices) run the same algorithms: the first
// writes its searches' choices, the second reads them and searches nothing. A file of another
// machine is refused before anything runs.
TEST(BenchSmoke, CudaRunsSharingAChoicesFileRunTheSameAlgorithms) {
  if (!has_gpu()) GTEST_SKIP() << "no GPU";
  const std::string file = temp_path("choices");
  std::remove(file.c_str());
  // f32 (NCHW: cuDNN's algorithms alone) and bf16 (NHWC: its first layer's forward may run hotops'
  // direct kernel, a choice timed against cuDNN's and kept in the file too).
  const std::string args = "--benchmark_filter='^model[.]cnn_mnist/cuda/(f32|bf16)/train/batch:32/manual_time$' --hotops_verify=0 "
                           "--hotops_choices=" + file;
  auto read = [](const std::string& path) {
    std::ifstream in(path);
    return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  };
  Result r;
  const nlohmann::json first = run_json(args, r);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string written = read(file);
  EXPECT_NE(written.find("\nmachine\t"), std::string::npos) << written;
  EXPECT_NE(written.find("\nconv\t"), std::string::npos) << "the convolutions' searches: " << written;
  EXPECT_NE(written.find("\ndirect\t"), std::string::npos) << "the direct kernel against cuDNN: " << written;
  const nlohmann::json second = run_json(args, r);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  ASSERT_EQ(first["benchmarks"].size(), 2u);
  ASSERT_EQ(second["benchmarks"].size(), 2u);
  for (std::size_t i = 0; i < 2; ++i)
    EXPECT_EQ(first["benchmarks"][i].value("label", ""), second["benchmarks"][i].value("label", ""));
  EXPECT_EQ(read(file), written) << "the second process searched nothing";
  EXPECT_EQ(second["context"].value("hotops_choices", ""), file);
  std::ofstream(file) << "machine\tsome other GPU, driver 1.0, cuBLAS 1.0, cuDNN 1.0\n";
  r = run(args);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_EQ(lines(r.output), 1u) << r.output;
  EXPECT_NE(r.output.find("timed on another machine (some other GPU"), std::string::npos) << r.output;
  std::remove(file.c_str());
}

// The stopping rule on `filter`'s entries: the names a run without the rule gives, each entry's
// samples at least the minimum, its executions at least its samples and reported as its
// iterations, one stop reason in its label, and the rule's settings in the context.
void expect_rule_keeps_names(const std::string& filter) {
  Result r;
  nlohmann::json plain = run_json("--benchmark_filter='" + filter + "'", r);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string ruled_args = "--benchmark_filter='" + filter + "' --hotops_max_noise=50 --hotops_min_samples=3";
  nlohmann::json ruled = run_json(ruled_args, r);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  ASSERT_FALSE(plain["benchmarks"].empty());
  ASSERT_EQ(plain["benchmarks"].size(), ruled["benchmarks"].size());
  for (std::size_t i = 0; i < plain["benchmarks"].size(); ++i) {
    const auto& b = ruled["benchmarks"][i];
    const std::string name = b["name"];
    EXPECT_EQ(name, plain["benchmarks"][i]["name"].get<std::string>());
    EXPECT_EQ(b["run_name"].get<std::string>(), name);
    if (b.value("error_occurred", false)) continue;
    EXPECT_EQ(b["iterations"].get<double>(), b["executions"].get<double>()) << name;
    EXPECT_GE(b["samples"].get<double>(), 3) << name;
    EXPECT_GE(b["executions"].get<double>(), b["samples"].get<double>()) << name;
    const std::string label = b["label"];
    const std::regex stopped(R"(\[stopped: (noise [0-9.e+-]+% <= 50%|noise settled at [0-9.e+-]+%|timeout \(15 s\) at noise [0-9.e+-]+%)\])");
    EXPECT_TRUE(std::regex_search(label, stopped)) << name << ": " << label;
    EXPECT_EQ(label.find("[stopped:"), label.rfind("[stopped:")) << name << ": " << label;
  }
  // The reported time is an execution's (the mean of the samples), not the sampling's: of the order
  // of the run without the rule. A loose bound, and one pair of runs in three must meet it: a sample
  // of a microsecond entry that other work on the machine holds up for a time slice moves either run
  // by thousands of times (StoppingRuleReportsTheMeanOfItsSamples checks the mean exactly).
  std::string off;
  for (int attempt = 0; attempt < 3; ++attempt) {
    off.clear();
    for (std::size_t i = 0; i < plain["benchmarks"].size(); ++i) {
      const auto& b = ruled["benchmarks"][i];
      if (b.value("error_occurred", false)) continue;
      const double t = b["real_time"], t0 = plain["benchmarks"][i]["real_time"];
      if (!(t > t0 / 10 && t < 10 * t0))
        off += b["name"].get<std::string>() + ": " + std::to_string(t) + " against " + std::to_string(t0) + " without the rule; ";
    }
    if (off.empty()) break;
    plain = run_json("--benchmark_filter='" + filter + "'", r);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    ruled = run_json(ruled_args, r);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    ASSERT_EQ(plain["benchmarks"].size(), ruled["benchmarks"].size());
  }
  EXPECT_TRUE(off.empty()) << off;
  EXPECT_EQ(ruled["context"]["hotops_max_noise"].get<std::string>().rfind("50", 0), 0u);
  EXPECT_EQ(ruled["context"]["hotops_min_samples"].get<std::string>(), "3");
  EXPECT_TRUE(ruled["context"].contains("hotops_timeout"));
  EXPECT_EQ(plain["context"]["hotops_max_noise"].get<std::string>().rfind("0", 0), 0u);
}

TEST(BenchSmoke, StoppingRuleKeepsTheNamesAndSaysWhyItStopped) {
  expect_rule_keeps_names("gelu/cpu/f32/fwd/shape:bert.ffn|mm/cpu/f32/fwd/shape:mlp_tiny.fc1/batch:10/");
}

TEST(BenchSmoke, StoppingRuleKeepsTheNamesAndSaysWhyItStoppedCuda) {
  if (!has_gpu()) GTEST_SKIP() << "no GPU";
  expect_rule_keeps_names("mm/cuda/f32/fwd/shape:mlp_tiny.fc1/batch:10/|gelu/cuda/bf16/fwd/shape:bert.ffn/|"
                          "model.mlp_tiny/cuda/f32/train/batch:10/");
}

// The entry of known timing (HOTOPS_TEST_FAULT=alternating: executions of 1 ms and 3 ms in turn,
// one a sample) under a target it cannot reach: its time is the mean of its samples, 2 ms, its
// noise theirs, about 50%, and its sampling ends when the noise has settled or at the timeout, not
// later. The bounds above leave room for other work on the machine, which lengthens some samples.
TEST(BenchSmoke, StoppingRuleReportsTheMeanOfItsSamples) {
  Result r;
  const auto start = std::chrono::steady_clock::now();
  const nlohmann::json j = run_json("--benchmark_filter='^test.fault/' --benchmark_time_unit=ms --hotops_max_noise=0.0001 "
                                    "--hotops_min_samples=3 --hotops_timeout=0.3",
                                    r, "HOTOPS_TEST_FAULT=alternating");
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ASSERT_EQ(r.exit_code, 0) << r.output;
  ASSERT_EQ(j["benchmarks"].size(), 1u) << r.output;
  const auto& b = j["benchmarks"][0];
  EXPECT_EQ(b["name"], "test.fault/cpu/f32/fwd/kind:alternating/real_time");
  const double ms = b["real_time"], samples = b["samples"], executions = b["executions"];
  EXPECT_EQ(executions, samples) << "each execution fills a CPU sample";
  EXPECT_GE(samples, 16) << "settling needs 16 noise values";
  EXPECT_GT(ms, 1.9) << "the mean of 1 ms and 3 ms (2 - 1/n with an odd count n)";
  EXPECT_LT(ms, 2.5) << "the mean of 1 ms and 3 ms";
  EXPECT_GT(b["noise_pct"].get<double>(), 45);
  const std::string label = b["label"];
  EXPECT_TRUE(label.find("[stopped: timeout (0.3 s)") != std::string::npos ||
              label.find("[stopped: noise settled") != std::string::npos)
      << label;
  // Sampling ends at the first check past the timeout: at most one 3 ms sample (and the execution
  // that sizes the batches) after it.
  EXPECT_LT(executions * ms / 1e3, 0.3 + 0.05) << label;
  EXPECT_LT(seconds, 10) << "the whole run, a process start and a 0.3 s entry";
}

// An unreachable target on real entries ends each at the timeout or when its noise has settled:
// each entry's sampling takes at most about the timeout.
TEST(BenchSmoke, StoppingRuleEndsAtTheTimeout) {
  Result r;
  const nlohmann::json j = run_json("--benchmark_filter='gelu/cpu/f32/fwd/shape:bert.ffn/.*/approx:none/' "
                                    "--benchmark_time_unit=ms --hotops_max_noise=0.0001 --hotops_timeout=0.3",
                                    r);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  ASSERT_EQ(j["benchmarks"].size(), 2u) << r.output;
  for (const auto& b : j["benchmarks"]) {
    const std::string label = b["label"];
    EXPECT_TRUE(label.find("[stopped: timeout (0.3 s)") != std::string::npos ||
                label.find("[stopped: noise settled") != std::string::npos)
        << label;
    // The sampling's time: its executions at their mean; one sample may end past the timeout.
    const double ms = b["real_time"], executions = b["executions"];
    EXPECT_LT(executions * ms / 1e3, 0.3 + 0.1) << b["name"] << ": " << label;
  }
}

// 0 is the rule off, as no flag: hotops' own loop with no noise target, its executions reported
// as the iterations, no stop reason; a count of iterations (<N>x) is Google Benchmark's loop.
TEST(BenchSmoke, StoppingRuleTargetZeroIsOff) {
  Result r;
  const nlohmann::json b = run_tiny("--hotops_max_noise=0", r);
  EXPECT_GE(b.value("samples", 0.0), 2) << r.output;
  EXPECT_EQ(b.value("iterations", 0.0), b.value("executions", -1.0)) << r.output;
  EXPECT_EQ(b.value("label", "").find("[stopped:"), std::string::npos) << r.output;
  const nlohmann::json counted = run_tiny("--benchmark_min_time=7x", r);
  EXPECT_EQ(counted.value("iterations", 0), 7) << r.output;
  EXPECT_FALSE(counted.contains("executions")) << r.output;
}

// hotops' own loop at the default least time on the entry of known timing (executions of 1 ms and
// 3 ms in turn, one a sample): that much sampling and not much more, the mean of its executions as
// the time. An execution that alone fills the least time is still one of two samples: the first
// execution, which sizes the batches, is the first sample when it fills one. (The case keeps its
// own schedule, so the first execution after a pause is shorter: only the long run's mean is 2 ms.)
TEST(BenchSmoke, OwnLoopSamplesForTheLeastTimeAndTwoSamples) {
  Result r;
  nlohmann::json j = run_json("--benchmark_filter='^test.fault/' --benchmark_time_unit=ms --benchmark_min_time=0.05", r,
                              "HOTOPS_TEST_FAULT=alternating");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  ASSERT_EQ(j["benchmarks"].size(), 1u) << r.output;
  nlohmann::json b = j["benchmarks"][0];
  EXPECT_EQ(b["name"], "test.fault/cpu/f32/fwd/kind:alternating/real_time");
  double ms = b["real_time"], executions = b["executions"];
  EXPECT_EQ(b["iterations"].get<double>(), executions);
  EXPECT_EQ(b["samples"].get<double>(), executions) << "each execution fills a CPU sample";
  EXPECT_GE(executions * ms / 1e3, 0.05 * 0.99) << "at least --benchmark_min_time (0.05 s) of samples";
  EXPECT_LT(executions * ms / 1e3, 0.05 + 0.02) << "ends at the first sample past it";
  EXPECT_GT(ms, 1.8) << "the mean of 1 ms and 3 ms";
  EXPECT_LT(ms, 2.5) << "the mean of 1 ms and 3 ms";
  j = run_json("--benchmark_filter='^test.fault/' --benchmark_time_unit=ms --benchmark_min_time=0.0001", r,
               "HOTOPS_TEST_FAULT=alternating");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  b = j["benchmarks"][0];
  ms = b["real_time"], executions = b["executions"];
  EXPECT_EQ(executions, 2) << "two samples, the first execution one of them";
  EXPECT_EQ(b["samples"].get<double>(), 2);
  EXPECT_GE(ms, 0.5) << "two executions of at least 0.5 ms";
  EXPECT_LT(ms, 3.5) << "two executions of at most 3 ms";
  EXPECT_TRUE(b.contains("noise_pct"));
}

TEST(BenchSmoke, StoppingRuleInputIsOneLineAndExitTwo) {
  const std::pair<std::string, std::string> cases[] = {
      {"--hotops_max_noise=-1", "bad value '-1' for --hotops_max_noise"},
      {"--hotops_max_noise=abc", "bad value 'abc' for --hotops_max_noise"},
      {"--hotops_max_noise=-0.5", "bad value '-0.5' for --hotops_max_noise"},
      {"--hotops_max_noise=101", "bad value '101' for --hotops_max_noise"},
      {"--hotops_max_noise=0 --hotops_timeout=5", "--hotops_timeout belongs to the stopping rule"},
      {"--hotops_max_noise=1 --hotops_min_samples=1", "bad value '1' for --hotops_min_samples"},
      {"--hotops_max_noise=1 --hotops_timeout=0", "bad value '0' for --hotops_timeout"},
      {"--hotops_timeout=5", "--hotops_timeout belongs to the stopping rule"},
      {"--hotops_min_samples=5", "--hotops_min_samples belongs to the stopping rule"},
      {"--hotops_max_noise=1 --benchmark_min_time=5x", "the stopping rule decides how many samples"},
  };
  for (const auto& [args, expected] : cases) {
    const Result r = run("--benchmark_filter=mlp_tiny " + args);
    EXPECT_EQ(r.exit_code, 2) << args << ": " << r.output;
    EXPECT_EQ(lines(r.output), 1u) << args << ": " << r.output;
    EXPECT_NE(r.output.find(expected), std::string::npos) << args << ": " << r.output;
  }
}

// Google Benchmark reads its flags' defaults from BENCHMARK_* variables: a bad one is refused as the
// flag would be, in one line that names the variable, with exit 2 before anything runs.
TEST(BenchSmoke, BadInputThroughTheEnvironmentIsOneLineAndExitTwo) {
  for (const char* env : {"BENCHMARK_FILTER='('", "BENCHMARK_REPETITIONS=-1", "BENCHMARK_FORMAT=xml",
                          "BENCHMARK_OUT=/nonexistent/folder/out.json"}) {
    const Result r = run("--hotops_roofline=0 --benchmark_filter=mlp_tiny.fc1/batch:10/", env);
    EXPECT_EQ(r.exit_code, 2) << env << ": " << r.output;
    const std::string var = std::string(env).substr(0, std::string(env).find('='));
    EXPECT_NE(r.output.find("(from " + var + " in the environment)"), std::string::npos) << r.output;
    EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 1) << env << ": " << r.output;
  }
}

// An output file the run could not write whole (a full disk) is an error, not exit 0.
TEST(BenchSmoke, AnOutputFileWrittenOnlyInPartIsAnError) {
  const std::string dir = testing::TempDir() + "/hotops_full_" + std::to_string(::getpid());
  if (std::system(("mkdir -p " + dir + " && mount -t tmpfs -o size=12k tmpfs " + dir + " 2>/dev/null").c_str()) != 0)
    GTEST_SKIP() << "no small file system can be mounted here (needs root) to fill";
  const Result r = run("--hotops_roofline=0 --benchmark_filter=mlp_tiny --benchmark_min_time=0.01 --benchmark_out=" + dir +
                       "/out.json");
  if (std::system(("umount " + dir + " && rmdir " + dir).c_str()) != 0)
    std::fprintf(stderr, "could not unmount and remove %s\n", dir.c_str());
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("is incomplete"), std::string::npos) << r.output;
}

// ---- runs over several GPUs (bench --hotops_gpus=G; docs/scaling.md) ----

// Launch input that cannot work is one line and exit 2, before anything runs or is spawned.
TEST(BenchSmoke, MultiGpuLaunchInputIsOneLineAndExitTwo) {
  const std::string filter = " --hotops_roofline=0 --benchmark_filter=mlp_tiny.fc1/batch:10/";
  for (const auto& [args, env, says] : std::vector<std::tuple<std::string, std::string, std::string>>{
           {"--hotops_gpus=0", "", "bad value '0' for --hotops_gpus"},
           {"--hotops_gpus=1024", "", "hotops: "},  // no such machine: no GPU, or too few, or no NCCL
           {"", "HOTOPS_RANK=1", "HOTOPS_WORLD_SIZE is not"},
           {"", "OMPI_COMM_WORLD_RANK=1 OMPI_COMM_WORLD_SIZE=2", "needs rank 0's address"},
           {"", "HOTOPS_RANK=1 HOTOPS_WORLD_SIZE=2 HOTOPS_ROOT_ADDR=127.0.0.1:1 HOTOPS_STALL_TIMEOUT_S=x", "HOTOPS_STALL_TIMEOUT_S"}}) {
    const Result r = run(args + filter, env);
    EXPECT_EQ(r.exit_code, 2) << args << " " << env << ": " << r.output;
    EXPECT_NE(r.output.find(says), std::string::npos) << r.output;
    EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 1) << args << " " << env << ": " << r.output;
  }
}

// Without a run over several GPUs, a multi-GPU entry says why it does not run, and the rest runs.
TEST(BenchSmoke, MultiGpuEntriesSayWhyWithoutTheirGpus) {
  const Result r = run("--hotops_roofline=0 --benchmark_min_time=0.01 "
                       "--benchmark_filter='allreduce/cuda/f32/fwd/bytes:8/gpus:2/inplace:0|mm/cpu/f32/fwd/shape:mlp_tiny.fc1/batch:10/'");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("mm/cpu/f32/fwd/shape:mlp_tiny.fc1/batch:10/"), std::string::npos) << r.output;
  const bool no_gpu = r.output.find("the CUDA benchmarks are not run (1 selected)") != std::string::npos;
  const bool no_nccl = r.output.find("has no NCCL") != std::string::npos;
  if (!no_gpu && !no_nccl) {
    EXPECT_NE(r.output.find("1 benchmarks not run: needs 2 GPUs in the run; start bench with --hotops_gpus=2"), std::string::npos)
        << r.output;
  }
}

// Whether bench --hotops_gpus=G refused to start for want of G GPUs or of NCCL (exit 2, its own line).
bool lacks_gpus_or_nccl(const Result& r) {
  return r.exit_code == 2 && (r.output.find("needs them") != std::string::npos || r.output.find("CUDA device") != std::string::npos ||
                              r.output.find("needs NCCL") != std::string::npos);
}

// bench --hotops_gpus=G over the entries of `filter`, briefly, and its JSON output (null when it did not exit 0).
struct GpusRun {
  Result result;
  nlohmann::json json;
};
GpusRun run_on_gpus(int gpus, const std::string& filter) {
  const std::string g = std::to_string(gpus), out = temp_path("gpus" + g);
  GpusRun r;
  r.result = run("--hotops_gpus=" + g + " --hotops_roofline=0 --benchmark_min_time=0.02 --benchmark_filter=" + filter +
                 " --benchmark_out=" + out);
  std::ifstream f(out);
  if (r.result.exit_code == 0 && f) r.json = nlohmann::json::parse(f);
  std::remove(out.c_str());
  return r;
}

// bench --hotops_gpus=G on a machine with G GPUs: every collective of 1 MiB over them, exact and
// with nccl-tests' bandwidths; every rank's GPU in the context; a planted bug fails the entries it
// reaches. Skipped, with bench's own line, where the machine has fewer GPUs or no NCCL.
void expect_collectives_on(int gpus) {
  const std::string g = std::to_string(gpus);
  const GpusRun on = run_on_gpus(gpus, "'^(allreduce|reduce_scatter|allgather|broadcast)/cuda/(f32|bf16)/fwd/bytes:1048576/gpus:" + g + "/'");
  if (lacks_gpus_or_nccl(on.result)) GTEST_SKIP() << "needs " << gpus << " GPUs and NCCL: " << on.result.output;
  ASSERT_EQ(on.result.exit_code, 0) << on.result.output;
  const nlohmann::json& j = on.json;
  EXPECT_EQ(j["context"].value("gpus_in_run", ""), g);
  for (int rank = 0; rank < gpus; ++rank)
    EXPECT_TRUE(j["context"].contains("rank_" + std::to_string(rank) + "_gpu")) << "context lacks rank " << rank << "'s GPU";
  EXPECT_FALSE(j["context"].value("nccl_version", "").empty());
  int entries = 0;
  for (const auto& b : j["benchmarks"]) {
    const std::string name = b["name"];
    ++entries;
    EXPECT_FALSE(b.value("error_occurred", false)) << name << ": " << b.value("error_message", "");
    const double algbw = b.value("algbw", 0.0), busbw = b.value("busbw", 0.0);
    EXPECT_GT(algbw, 0) << name;
    const double n = gpus;
    const double factor = name.rfind("allreduce", 0) == 0 ? 2 * (n - 1) / n : name.rfind("broadcast", 0) == 0 ? 1 : (n - 1) / n;
    EXPECT_NEAR(busbw / algbw, factor, 1e-9) << name;
    EXPECT_NEAR(algbw * b.value("real_time", 0.0) * 1e-6, 1048576.0, 1048576.0 * 1e-6) << name << ": algbw = bytes / time";
    EXPECT_NE(b.value("label", "").find("NCCL"), std::string::npos) << name;
    EXPECT_GT(b.value("samples", 0), 0) << name;
  }
  EXPECT_EQ(entries, 16) << "4 collectives x 2 dtypes x in place or not";

  // The input of every rank zeroed: each entry it reaches is an error naming a rank's wrong element.
  const Result bad = run("--hotops_gpus=" + g + " --hotops_roofline=0 --benchmark_min_time=0.02 --benchmark_format=json "
                         "--benchmark_filter='^allreduce/cuda/f32/fwd/bytes:1048576/gpus:" + g + "/inplace:0'",
                         "HOTOPS_TEST_MUTATION=zero_input");
  ASSERT_EQ(bad.exit_code, 0) << bad.output;
  EXPECT_NE(bad.output.find("\"error_occurred\": true"), std::string::npos) << bad.output;
  EXPECT_NE(bad.output.find("verification failed: rank 0: "), std::string::npos) << bad.output;
  EXPECT_NE(bad.output.find("are not exact"), std::string::npos) << bad.output;
}

TEST(BenchSmoke, CudaCollectivesOnTwoGpus) { expect_collectives_on(2); }
TEST(BenchSmoke, CudaCollectivesOnFourGpus) { expect_collectives_on(4); }

// bench --hotops_gpus=G: data-parallel train steps (the small models, the BERT layer and the VGG-like
// convnet, whose replicas after rank 0 draw the dropout masks of their samples' global positions)
// beside their single-GPU entries, every one verified (the replicas bitwise alike, one step over the
// global batch against the reference), samples/s over the G GPUs' samples, the per-op breakdown with
// the all-reduce's wait. Skipped, with bench's own line, where the machine has fewer GPUs or no NCCL.
void expect_data_parallel_on(int gpus) {
  const std::string g = std::to_string(gpus);
  const GpusRun on = run_on_gpus(gpus, "'^model[.](mlp_tiny/cuda/(f32|bf16)/train/batch:64|mlp_mnist/cuda/(f32|bf16)/train/batch:128|"
                                        "bert_layer/cuda/(f32|bf16)/train/batch:8|vgg_cifar/cuda/(f32|bf16)/train/batch:32|"
                                        "(bilstm_imdb|lstm_textgen|fasttext_imdb)/cuda/(f32|bf16)/train/batch:32)(/gpus:" + g +
                                        ")?/manual_time$'");
  if (lacks_gpus_or_nccl(on.result)) GTEST_SKIP() << "needs " << gpus << " GPUs and NCCL: " << on.result.output;
  ASSERT_EQ(on.result.exit_code, 0) << on.result.output;
  const nlohmann::json& j = on.json;
  int entries = 0, parallel = 0;
  for (const auto& b : j["benchmarks"]) {
    const std::string name = b["name"];
    ++entries;
    EXPECT_FALSE(b.value("error_occurred", false)) << name << ": " << b.value("error_message", "");
    EXPECT_GT(b.value("samples/s", 0.0), 0) << name;
    if (name.find("/gpus:") == std::string::npos) continue;
    ++parallel;
    const std::int64_t batch = std::stoll(name.substr(name.find("batch:") + 6));
    // samples/s counts every GPU's samples: G x B per step.
    EXPECT_NEAR(b.value("samples/s", 0.0) * b.value("real_time", 0.0) * 1e-6, double(gpus * batch), 1e-3 * gpus * batch) << name;
    EXPECT_NE(b.value("label", "").find("data parallel over " + g + " GPUs"), std::string::npos) << name;
    EXPECT_TRUE(b.contains("breakdown:allreduce")) << name;
    EXPECT_FALSE(b.contains("flop_fraction")) << name;
  }
  EXPECT_EQ(entries, 28) << "7 models x 2 dtypes x (one GPU, " << g << " GPUs)";
  EXPECT_EQ(parallel, 14);
}

TEST(BenchSmoke, CudaDataParallelStepsOnTwoGpus) { expect_data_parallel_on(2); }
TEST(BenchSmoke, CudaDataParallelStepsOnFourGpus) { expect_data_parallel_on(4); }

}  // namespace
