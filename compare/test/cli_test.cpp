// hotops-compare as a user runs it: exit codes, one-line errors, and every output format.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

namespace {

const std::string kTool = HOTOPS_COMPARE_PATH;
const std::string kFixtures = HOTOPS_COMPARE_FIXTURES;

struct Result {
  int code = -1;
  std::string out, err;
};

std::string temp(const std::string& name) { return testing::TempDir() + "/hc_" + std::to_string(::getpid()) + "_" + name; }

std::string slurp(const std::string& path) {
  std::ifstream f(path);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

Result run(const std::string& args) {
  const std::string out = temp("stdout"), err = temp("stderr");
  const std::string cmd = kTool + " " + args + " >" + out + " 2>" + err;
  const int status = std::system(cmd.c_str());
  Result r;
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.out = slurp(out);
  r.err = slurp(err);
  return r;
}

std::string fx(const std::string& name) { return kFixtures + "/" + name; }

int lines(const std::string& s) {
  int n = 0;
  for (char c : s) n += c == '\n';
  return n;
}

TEST(Cli, DiffConsoleWithoutColourWhenPiped) {
  const Result r = run("diff " + fx("gb17_base.json") + " " + fx("gb18_new.json"));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out.find('\033'), std::string::npos) << "no ANSI colour outside a terminal";
  EXPECT_NE(r.out.find("geometric mean of time ratios (new/base) over 23 entries"), std::string::npos);
  EXPECT_NE(r.out.find("only in base"), std::string::npos);
  EXPECT_NE(r.out.find("only in new"), std::string::npos);
  EXPECT_NE(r.out.find("error in new: skipped: no CUDA device"), std::string::npos);
  EXPECT_NE(r.out.find("error in both: verification failed"), std::string::npos);
  EXPECT_NE(r.out.find("0.00794 *"), std::string::npos) << "significant p marked";
  EXPECT_EQ(r.err.rfind("hotops-compare: warning: the runs did not run the same entries", 0), 0u) << r.err;
  EXPECT_EQ(lines(r.err), 1) << r.err;
}

TEST(Cli, DiffFormats) {
  const std::string args = "diff " + fx("gb17_base.json") + " " + fx("gb17_slow20.json");
  const Result md = run(args + " --format=md");
  ASSERT_EQ(md.code, 0);
  EXPECT_NE(md.out.find("| benchmark | base | new | change | p |"), std::string::npos) << md.out;
  EXPECT_NE(md.out.find("|---|---:|"), std::string::npos);

  const Result csv = run(args + " --format=csv");
  ASSERT_EQ(csv.code, 0);
  EXPECT_EQ(csv.out.rfind("name,status,base_ns,new_ns,time_ratio,p_value,exact", 0), 0u) << csv.out;
  EXPECT_EQ(lines(csv.out), 1 + 26 + 1) << "header, every entry, geomean";

  const Result js = run(args + " --format=json");
  ASSERT_EQ(js.code, 0);
  const auto j = nlohmann::json::parse(js.out);
  EXPECT_EQ(j["entries"].size(), 26u);
  EXPECT_EQ(j["compared"], 25);
  bool found = false;
  for (const auto& e : j["entries"]) {
    if (e["name"] != "mm/cuda/f32/fwd/shape:bert.ffn_up/batch:32/M:4096/N:3072/K:768/manual_time") continue;
    found = true;
    EXPECT_NEAR(e["time_ratio"].get<double>(), 1.2 * 1.005, 1e-9);
    EXPECT_TRUE(e["utest"]["significant"].get<bool>());
    EXPECT_TRUE(e["utest"]["exact"].get<bool>());
    EXPECT_EQ(e["base"]["repetitions"], 5);
  }
  EXPECT_TRUE(found);
}

TEST(Cli, DiffNoiseThresholdAndSignificantCount) {
  const std::string args = "diff " + fx("gb17_base.json") + " " + fx("gb17_slow20.json");
  const Result dflt = run(args);
  ASSERT_EQ(dflt.code, 0) << dflt.err;
  EXPECT_NE(dflt.out.find("significant changes (p < 0.05 and significantly beyond +-1%): 1 of 25 entries with repetitions in "
                          "both runs (1 slower, 0 faster)"),
            std::string::npos)
      << dflt.out;
  // A 20.6% slowdown with p = 0.008 is below a 30% noise threshold: not marked, not counted.
  const Result loose = run(args + " --noise 30");
  ASSERT_EQ(loose.code, 0) << loose.err;
  EXPECT_EQ(loose.out.find("0.00794 *"), std::string::npos);
  EXPECT_NE(loose.out.find("0.00794"), std::string::npos) << "the p-value is still shown";
  EXPECT_NE(loose.out.find(": 0 of 25 entries"), std::string::npos) << loose.out;
  const Result js = run(args + " --noise 30 --format=json");
  ASSERT_EQ(js.code, 0);
  const auto j = nlohmann::json::parse(js.out);
  EXPECT_EQ(j["noise_pct"], 30.0);
  EXPECT_EQ(j["tested"], 25);
  EXPECT_EQ(j["significant_changes"]["slower"], 0);
  for (const auto& e : j["entries"]) {
    if (e.contains("utest") && e["utest"].is_object()) {
      EXPECT_FALSE(e["utest"]["significant"].get<bool>()) << e["name"];
    }
  }
}

TEST(Cli, DiffOfTwoMachinesWarnsButSucceeds) {
  const Result r = run("diff " + fx("gb18_cpu_machine.json") + " " + fx("gb17_gpu_machine.json"));
  EXPECT_EQ(r.code, 0);
  EXPECT_EQ(lines(r.err), 2) << r.err;  // and their lists differ
  EXPECT_EQ(r.err.rfind("hotops-compare: warning: the runs come from different machines", 0), 0u) << r.err;
}

TEST(Cli, DiffWithCost) {
  const Result r = run("diff " + fx("gb17_base.json") + " " + fx("gb17_repeat.json") + " --cost cpu=3.6,cuda=7.2 --format=json");
  ASSERT_EQ(r.code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_TRUE(j["entries"][0].contains("usd_per_million_items"));
}

TEST(Cli, Speedup) {
  const Result r = run("speedup " + fx("gb17_base.json"));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("model.mlp_tiny"), std::string::npos);
  EXPECT_NE(r.out.find("batch:1024"), std::string::npos);
  EXPECT_NE(r.out.find("crossover"), std::string::npos);
  EXPECT_NE(r.out.find("12 problems on both backends; 1 only on cpu, 0 only on cuda; 1 entries without a time"), std::string::npos);
  // The failed conv2d leaves its cell empty and says why.
  EXPECT_NE(r.out.find("entries without a time"), std::string::npos);
  EXPECT_NE(r.out.find("verification failed: max|out - ref| / rms(ref) = 0.21 > 0.04"), std::string::npos);

  const Result two = run("speedup " + fx("gb18_cpu_machine.json") + " " + fx("gb17_gpu_machine.json") + " --format=json");
  ASSERT_EQ(two.code, 0) << two.err;
  const auto j = nlohmann::json::parse(two.out);
  EXPECT_EQ(j["pairs"], 12);
  EXPECT_TRUE(j["unmeasured"].empty());
  int checked = 0;
  for (const auto& g : j["groups"]) {
    if (g["op"] != "model.mlp_tiny") continue;
    for (const auto& row : g["rows"]) {
      if (row["variant"] != "f32/train") continue;
      EXPECT_EQ(row["crossover_batch"], 1024);
      ++checked;
    }
  }
  EXPECT_EQ(checked, 1);

  const Result csv = run("speedup " + fx("gb17_base.json") + " --format=csv --cost cpu=1,cuda=4");
  ASSERT_EQ(csv.code, 0);
  EXPECT_EQ(lines(csv.out), 1 + 12);
  EXPECT_NE(csv.out.find("cpu_usd_per_million_items"), std::string::npos);

  const Result md = run("speedup " + fx("gb17_base.json") + " --format=md --cost cpu=1,cuda=4");
  ASSERT_EQ(md.code, 0);
  EXPECT_NE(md.out.find("#### cost per million items"), std::string::npos);
}

TEST(Cli, SpeedupWithoutPairsIsAnError) {
  const Result r = run("speedup " + fx("bench_gb171_cpu.json"));
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(lines(r.err), 1) << r.err;
  EXPECT_NE(r.err.find("no problem is measured on both backends"), std::string::npos);
}

TEST(Cli, GateExitCodes) {
  const Result pass = run("gate " + fx("gb17_base.json") + " " + fx("gb17_repeat.json") + " --max-slowdown 5");
  EXPECT_EQ(pass.code, 0) << pass.out;
  EXPECT_NE(pass.out.find("gate passed"), std::string::npos);

  const Result slow = run("gate " + fx("gb17_base.json") + " " + fx("gb17_slow20.json") + " --max-slowdown 5");
  EXPECT_EQ(slow.code, 1);
  EXPECT_NE(slow.out.find("FAIL mm/cuda/f32/fwd/shape:bert.ffn_up/batch:32"), std::string::npos) << slow.out;
  EXPECT_NE(slow.out.find("gate FAILED: 1 failing"), std::string::npos);

  const Result lenient = run("gate " + fx("gb17_base.json") + " " + fx("gb17_slow20.json") + " --max-slowdown 25");
  EXPECT_EQ(lenient.code, 0);

  const Result gone = run("gate " + fx("gb17_base.json") + " " + fx("gb18_new.json") + " --max-slowdown 5 --format=json");
  EXPECT_EQ(gone.code, 1);
  const auto j = nlohmann::json::parse(gone.out);
  EXPECT_FALSE(j["passed"].get<bool>());
  EXPECT_EQ(j["failures"].size(), 3u);

  const Result md = run("gate " + fx("gb17_base.json") + " " + fx("gb18_new.json") + " --max-slowdown 5 --format=md");
  EXPECT_EQ(md.code, 1);
  EXPECT_NE(md.out.find("### hotops-compare gate: **FAILED**"), std::string::npos);
}

// --filter keeps the entries whose names match in both runs: the planted CUDA slowdown fails a gate
// over the CUDA entries and passes one over the CPU entries; diff counts only what matched.
TEST(Cli, FilterSelectsEntriesOfBothRuns) {
  const std::string slow = "gate " + fx("gb17_base.json") + " " + fx("gb17_slow20.json") + " --max-slowdown 5";
  const Result cuda = run(slow + " --filter /cuda/");
  EXPECT_EQ(cuda.code, 1) << cuda.out;
  EXPECT_NE(cuda.out.find("FAIL mm/cuda/f32/fwd/shape:bert.ffn_up/batch:32"), std::string::npos) << cuda.out;
  const Result cpu = run(slow + " --filter /cpu/");
  EXPECT_EQ(cpu.code, 0) << cpu.out;
  EXPECT_EQ(cpu.out.find("/cuda/"), std::string::npos) << cpu.out;

  const Result all = run("diff " + fx("gb17_base.json") + " " + fx("gb17_slow20.json") + " --format=json");
  const Result some = run("diff " + fx("gb17_base.json") + " " + fx("gb17_slow20.json") + " --format=json --filter '^mm/'");
  ASSERT_EQ(all.code, 0) << all.err;
  ASSERT_EQ(some.code, 0) << some.err;
  const auto a = nlohmann::json::parse(all.out), s = nlohmann::json::parse(some.out);
  EXPECT_LT(s["entries"].size(), a["entries"].size());
  EXPECT_GT(s["entries"].size(), 0u);
  for (const auto& e : s["entries"]) EXPECT_EQ(e["name"].get<std::string>().rfind("mm/", 0), 0u) << e["name"];
}

TEST(Cli, Exports) {
  const Result gh = run("export " + fx("gb18_new.json") + " --format=github-action-benchmark");
  ASSERT_EQ(gh.code, 0) << gh.err;
  const auto a = nlohmann::json::parse(gh.out);
  ASSERT_TRUE(a.is_array());
  EXPECT_EQ(a.size(), 24u) << "every entry with a time; the skipped and the failed one left out";
  for (const auto& e : a) {
    EXPECT_TRUE(e["name"].is_string());
    EXPECT_EQ(e["unit"], "ns");
    EXPECT_TRUE(e["value"].is_number());
  }
  EXPECT_NE(gh.err.find("2 failed entries left out"), std::string::npos) << gh.err;

  const Result bmf = run("export " + fx("gb17_base.json") + " --format=bencher");
  ASSERT_EQ(bmf.code, 0);
  const auto b = nlohmann::json::parse(bmf.out);
  const auto& e = b["mm/cuda/f32/fwd/shape:bert.ffn_up/batch:8/M:1024/N:3072/K:768/manual_time"];
  EXPECT_NEAR(e["latency"]["value"].get<double>(), 60e3, 1e-6);
  EXPECT_NEAR(e["latency"]["lower_value"].get<double>(), 60e3 * 0.98, 1e-6);
  EXPECT_NEAR(e["latency"]["upper_value"].get<double>(), 60e3 * 1.02, 1e-6);
  EXPECT_NEAR(e["throughput"]["value"].get<double>(), 8 / 60e-6, 1e-3);
}

// Every error: exit 2 and one line on stderr, nothing on stdout.
void expect_error(const std::string& args, const std::string& says) {
  const Result r = run(args);
  EXPECT_EQ(r.code, 2) << args << "\n" << r.err;
  EXPECT_EQ(lines(r.err), 1) << args << "\n" << r.err;
  EXPECT_NE(r.err.find(says), std::string::npos) << args << "\n" << r.err;
  EXPECT_TRUE(r.out.empty()) << args << "\n" << r.out;
}

TEST(Cli, BadInputExitsTwoWithOneLine) {
  const std::string not_json = temp("not.json"), not_gb = temp("notgb.json");
  std::ofstream(not_json) << "Benchmark   Time   CPU   Iterations\n---\nBM_x  1 ns  1 ns  100\n";
  std::ofstream(not_gb) << R"({"results": [{"name": "x", "value": 1}]})";
  const std::string base = fx("gb17_base.json");
  expect_error("diff " + base + " " + fx("missing.json"), "missing.json: cannot open");
  expect_error("diff " + not_json + " " + base, "not JSON");
  expect_error("diff " + not_gb + " " + base, "not Google Benchmark output");
  expect_error("gate " + base + " " + not_json + " --max-slowdown 5", "not JSON");
  expect_error("speedup " + not_gb, "not Google Benchmark output");
  expect_error("export " + not_json + " --format=bencher", "not JSON");
  expect_error("diff " + base + " " + base + " --format=xml", "--format");
  expect_error("export " + base + " --format=md", "github-action-benchmark, bencher");
  expect_error("speedup " + base + " --cost gpu=3", "--cost");
  expect_error("gate " + base + " " + base, "--max-slowdown");
  expect_error("gate " + base + " " + base + " --max-slowdown -3", "--max-slowdown");
  expect_error("gate " + base + " " + base + " --max-slowdown 5 --alpha 2", "--alpha");
  expect_error("diff " + base + " " + base + " --noise -1", "--noise");
  expect_error("diff " + base + " " + base + " --filter '('", "not a valid regular expression");
  expect_error("diff " + base + " " + base + " --filter '^nothing/'", "matches no entry");
  expect_error("gate " + base + " " + base + " --max-slowdown 5 --filter '^nothing/'", "matches --filter");
  expect_error("diff " + base + " " + base + " --noise 100", "--noise");
  expect_error("gate " + base + " " + base + " --max-slowdown five", "--max-slowdown");
  expect_error("frobnicate", "hotops-compare");
  expect_error("", "subcommand");
  std::remove(not_json.c_str());
  std::remove(not_gb.c_str());
}

TEST(Cli, ThreadsOfTheModelStepsByThreadCount) {
  const std::string models = fx("h100_full_suite_models.json");
  const Result r = run("threads " + models + " --filter '^model\\.mlp_mnist/cpu/f32/'");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("model.mlp_mnist"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("16 threads"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("f32/train/batch:128"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("bf16"), std::string::npos) << "--filter keeps the f32 entries only";
  for (const char* f : {"md", "csv", "json"}) {
    const Result x = run(std::string("threads --format=") + f + " " + models + " --filter mlp_mnist");
    EXPECT_EQ(x.code, 0) << f << ": " << x.err;
    EXPECT_NE(x.out.find("batch:1024"), std::string::npos) << f;
  }
  const Result j = run("threads --format=json " + models + " --filter 'mlp_mnist/cpu/f32/train/batch:128/'");
  ASSERT_EQ(j.code, 0) << j.err;
  const auto rows = nlohmann::json::parse(j.out)["groups"][0]["rows"];
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_EQ(rows[0]["cells"].size(), 4u);
  EXPECT_EQ(rows[0]["cells"][0]["threads"], 1);
  EXPECT_EQ(rows[0]["cells"][3]["threads"], 16);
}

TEST(Cli, ThreadsAndSpeedupFilterBadInputIsOneLineAndExit2) {
  const std::string models = fx("h100_full_suite_models.json");
  for (const std::string& args : {"threads " + fx("gb17_base.json"), "threads " + models + " --filter '^nothing/'",
                                   "threads " + models + " --filter '('", "threads " + models + " --format=xml",
                                   "speedup " + models + " --filter '^nothing/'",
                                   "speedup " + models + " --filter '^model\\.mlp_tiny/cpu/'"}) {
    const Result r = run(args);
    EXPECT_EQ(r.code, 2) << args;
    EXPECT_EQ(r.out, "") << args;
    EXPECT_EQ(lines(r.err), 1) << args << ": " << r.err;
  }
}

TEST(Cli, SpeedupFilterKeepsOneModel) {
  const Result r = run("speedup " + fx("h100_full_suite_models.json") + " --filter '^model\\.mlp_tiny/' --format=json");
  ASSERT_EQ(r.code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  ASSERT_EQ(j["groups"].size(), 1u);
  EXPECT_EQ(j["groups"][0]["op"], "model.mlp_tiny");
}

// --cuda-variant e2e:1 sets the CPU against what a program pays on the GPU; --cpu-variant threads:1
// against the CPU's one-thread entries. The entries of that backend without the arg are left out.
TEST(Cli, SpeedupOfOneVariantOfEachBackend) {
  const std::string models = fx("h100_full_suite_models.json");
  struct Case {
    std::string option, side, other_side, arg;
  };
  for (const Case& k : {Case{"--cuda-variant e2e:1", "cuda", "cpu", "/e2e:1/"}, Case{"--cpu-variant threads:1", "cpu", "cuda", "/threads:1/"}}) {
    const Result r = run("speedup " + models + " --filter '^model\\.mlp_tiny/[a-z]+/f32/' " + k.option + " --format=json");
    ASSERT_EQ(r.code, 0) << k.option << ": " << r.err;
    const auto j = nlohmann::json::parse(r.out);
    EXPECT_EQ(j["pairs"], 10) << k.option;
    EXPECT_EQ(j[k.side + "_only"], 0) << k.option << ": that backend's other entries are left out";
    for (const auto& row : j["groups"][0]["rows"])
      for (const auto& c : row["cells"]) {
        EXPECT_NE(c[k.side + "_name"].get<std::string>().find(k.arg), std::string::npos) << c[k.side + "_name"];
        EXPECT_EQ(c[k.other_side + "_name"].get<std::string>().find(k.arg), std::string::npos) << c[k.other_side + "_name"];
      }
  }
  for (const char* bad : {"--cuda-variant e2e", "--cuda-variant :1", "--cuda-variant e2e:1/graph:1", "--cpu-variant threads"}) {
    const Result b = run("speedup " + models + " " + bad);
    EXPECT_EQ(b.code, 2) << bad;
    EXPECT_EQ(lines(b.err), 1) << bad << ": " << b.err;
    EXPECT_NE(b.err.find(std::string(bad).substr(0, 14)), std::string::npos) << b.err;
  }
}

TEST(Cli, HelpExitsZero) {
  const Result r = run("--help");
  EXPECT_EQ(r.code, 0);
  EXPECT_NE(r.out.find("Exit codes"), std::string::npos);
  EXPECT_NE(r.out.find("gate"), std::string::npos);
}

// The first of python3 and /usr/bin/python3 that imports `modules` ("" when neither does): Debian's
// python3 packages belong to /usr/bin/python3, which another python3 on PATH may hide.
std::string python_with(const std::string& modules) {
  for (const char* p : {"python3", "/usr/bin/python3"})
    if (std::system((std::string(p) + " -c 'import " + modules + "' >/dev/null 2>&1").c_str()) == 0) return p;
  return "";
}

// The plots read the same JSON; matplotlib is optional, so without it the test says so and skips.
TEST(Plot, SpeedupAndRooflinePngAndSvg) {
  const std::string python = python_with("matplotlib");
  if (python.empty()) GTEST_SKIP() << "python3-matplotlib not installed (optional)";
  const std::string dir = temp("plots");
  const std::string cmd = python + " " + std::string(HOTOPS_COMPARE_PLOT) + " --tool " + kTool + " --out " + dir + " " +
                          fx("gb17_base.json") + " >" + temp("plot.log") + " 2>&1";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << slurp(temp("plot.log"));
  for (const char* f : {"speedup_mm.png", "speedup_mm.svg", "speedup_model.mlp_tiny.png", "roofline_cuda.png",
                        "roofline_cuda.svg", "roofline_cpu.png"}) {
    std::ifstream in(dir + "/" + f, std::ios::binary);
    EXPECT_TRUE(in.good()) << f << "\n" << slurp(temp("plot.log"));
    in.seekg(0, std::ios::end);
    EXPECT_GT(in.tellg(), 1000) << f;
  }
  std::filesystem::remove_all(dir);
}

// bench's JSON stays readable by Google Benchmark's own compare.py (Debian: libbenchmark-tools,
// which needs python3-scipy). Without it the test says so and skips.
TEST(CompareDotPy, ReadsBenchJson) {
  const std::string script = "/usr/share/benchmark/compare.py";
  if (!std::ifstream(script).good()) GTEST_SKIP() << script << " not installed (libbenchmark-tools)";
  const std::string python = python_with("scipy, numpy");
  if (python.empty()) GTEST_SKIP() << "compare.py needs scipy and numpy";
  const std::string log = temp("comparepy.log");
  const std::string cmd = python + " " + script + " benchmarks " + fx("bench_gb171_cpu.json") + " " + fx("bench_gb171_cpu.json") +
                          " >" + log + " 2>&1";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << slurp(log);
  const std::string out = slurp(log);
  EXPECT_NE(out.find("model.mlp_tiny/cpu/f32/infer/batch:10/real_time_pvalue"), std::string::npos) << out;
  EXPECT_NE(out.find("addmm/cpu/f32/fwd/shape:mlp_tiny.fc1/batch:4096/M:4096/N:32/K:13/real_time"), std::string::npos);
}

// A run with one model step on both backends, as bench writes its breakdown counters.
std::string breakdown_run() {
  const std::string path = temp("breakdown.json");
  std::ofstream(path) << R"({"context": {}, "benchmarks": [
    {"name": "model.mlp_tiny/cpu/f32/train/batch:10/real_time", "iterations": 9, "real_time": 80, "time_unit": "us",
     "breakdown_step_us": 81, "breakdown_coverage": 0.99, "breakdown_ratio": 1.01,
     "breakdown:addmm": 10, "breakdown:adamw": 70.2},
    {"name": "model.mlp_tiny/cuda/f32/train/batch:10/manual_time", "iterations": 9, "real_time": 30, "time_unit": "us",
     "breakdown_step_us": 33, "breakdown_coverage": 0.98, "breakdown_ratio": 1.1,
     "breakdown:addmm": 20, "breakdown:adamw": 12.34}]})";
  return path;
}

TEST(Cli, BreakdownPrintsEveryFormat) {
  const std::string path = breakdown_run();
  for (const char* f : {"console", "md", "csv", "json"}) {
    const Result r = run(std::string("breakdown --format=") + f + " " + path);
    EXPECT_EQ(r.code, 0) << f << ": " << r.err;
    EXPECT_NE(r.out.find("adamw"), std::string::npos) << f;
  }
  const Result filtered = run("breakdown --filter=/cpu/ --format=json " + path);
  ASSERT_EQ(filtered.code, 0) << filtered.err;
  EXPECT_EQ(nlohmann::json::parse(filtered.out)["models"].size(), 1u);
}

TEST(Cli, BreakdownBadInputIsOneLineAndExit2) {
  const std::string ops = temp("ops.json");
  std::ofstream(ops) << R"({"benchmarks": [{"name": "mm/cpu/f32/fwd/M:2/real_time", "real_time": 3, "time_unit": "us"}]})";
  const std::vector<std::string> bad = {"breakdown " + ops, "breakdown /nonexistent/run.json", "breakdown --format=xml " + ops,
                                        "breakdown --filter=( " + breakdown_run(), "breakdown"};
  for (const std::string& args : bad) {
    const Result r = run(args);
    EXPECT_EQ(r.code, 2) << args;
    EXPECT_EQ(r.out, "") << args;
    ASSERT_FALSE(r.err.empty()) << args;
    EXPECT_EQ(r.err.find('\n'), r.err.size() - 1) << args << ": " << r.err;
  }
}

TEST(Cli, ScalingOfCollectivesByGpuCount) {
  const Result r = run("scaling " + fx("scaling_collectives.json"));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("allreduce/cuda/f32/fwd/inplace:1 - busbw (GB/s)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("1 GiB"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("358.9"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("rank 2's allreduce result are not exact"), std::string::npos) << "the failed entry says why";
  const Result j = run("scaling " + fx("scaling_collectives.json") + " --format json --filter inplace:1");
  ASSERT_EQ(j.code, 0) << j.err;
  EXPECT_EQ(nlohmann::json::parse(j.out)["groups"].size(), 1u);
}

TEST(Cli, ScalingWithoutMultiGpuEntriesIsBadInput) {
  for (const std::string& args : {"scaling " + fx("gb17_base.json"), "scaling " + fx("scaling_collectives.json") + " --filter nothing",
                                   "scaling " + fx("scaling_collectives.json") + " --min-speedup 0"}) {
    const Result r = run(args);
    EXPECT_EQ(r.code, 2) << args;
    EXPECT_EQ(lines(r.err), 1) << args << ": " << r.err;
  }
}

}  // namespace
