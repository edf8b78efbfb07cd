// The repository's scripts as CI and users run them: the workflow's gate step (tools/ci_gate.sh),
// whose exit code decides the job, tools/compare_plot.py (which machines each chart names, one
// roofline per machine, the install command when matplotlib is missing), tools/studies.sh (the
// tables of docs/studies.md), tools/ab.sh (two builds in alternating processes) and tools/fullrun.sh
// (a list in one process, where its time went).
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

namespace {

// The repository's tools/, known to the build through the plot script's path.
std::string tools_dir() {
  const std::string plot = HOTOPS_COMPARE_PLOT;
  return plot.substr(0, plot.rfind('/'));
}

std::string slurp(const std::string& path) {
  std::ifstream f(path);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

std::string temp(const std::string& name) { return testing::TempDir() + "/sc_" + std::to_string(::getpid()) + "_" + name; }

std::string fx(const std::string& name) { return std::string(HOTOPS_COMPARE_FIXTURES) + "/" + name; }

struct Ran {
  int code = -1;
  std::string log;  // stdout and stderr
};

Ran sh(const std::string& cmd) {
  const std::string log = temp("log");
  const int status = std::system((cmd + " >" + log + " 2>&1").c_str());
  Ran r;
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.log = slurp(log);
  std::remove(log.c_str());
  return r;
}

struct Step : Ran {
  std::string summary;  // what the step appended to the job summary
};

// The step under `bash -e` without pipefail, the shell that let a piped gate pass; the job summary
// is a fresh file, as on a runner.
Step run_gate(const std::string& base, const std::string& run) {
  const std::string summary = temp("summary.md");
  std::remove(summary.c_str());
  Step s;
  static_cast<Ran&>(s) = sh("HOTOPS_COMPARE=" + std::string(HOTOPS_COMPARE_PATH) + " GITHUB_STEP_SUMMARY=" + summary +
                            " MAX_SLOWDOWN_PCT=5 ALPHA=0.05 GATE_FILTER=. bash -e -c 'bash " + tools_dir() +
                            "/ci_gate.sh " + fx(base) + " " + fx(run) + "'");
  s.summary = slurp(summary);
  std::remove(summary.c_str());
  return s;
}

TEST(CiGate, PlantedSlowdownFailsTheStep) {
  // gb17_slow20.json is gb17_base.json with one CUDA entry 20% slower in every repetition.
  const Step s = run_gate("gb17_base.json", "gb17_slow20.json");
  EXPECT_EQ(s.code, 1) << s.log;
  EXPECT_NE(s.summary.find("### hotops-compare gate: **FAILED**"), std::string::npos) << s.summary;
  EXPECT_NE(s.summary.find("mm/cuda/f32/fwd/shape:bert.ffn_up/batch:32"), std::string::npos) << s.summary;
  EXPECT_NE(s.log.find("the gate failed"), std::string::npos) << s.log;
}

TEST(CiGate, RepeatedRunPasses) {
  const Step s = run_gate("gb17_base.json", "gb17_repeat.json");
  EXPECT_EQ(s.code, 0) << s.log;
  EXPECT_NE(s.summary.find("passed"), std::string::npos) << s.summary;
}

TEST(CiGate, UnreadableInputFailsTheStep) {
  const Step s = run_gate("gb17_base.json", "no_such_run.json");
  EXPECT_EQ(s.code, 2) << s.log;
}

// The workflow runs this script as its gate step, under bash with pipefail.
TEST(CiGate, WorkflowRunsTheScript) {
  const std::string wf = slurp(tools_dir() + "/../.github/workflows/gpu-bench.yml");
  ASSERT_FALSE(wf.empty()) << "cannot read .github/workflows/gpu-bench.yml";
  EXPECT_NE(wf.find("run: bash tools/ci_gate.sh baseline.json run.json"), std::string::npos);
  EXPECT_NE(wf.find("shell: bash\n"), std::string::npos) << "steps must run under bash -eo pipefail";
  EXPECT_EQ(wf.find("| tee"), std::string::npos) << "a pipe into tee hides the exit code of what feeds it";
}

// python3 on PATH runs the script; the script itself looks for an interpreter with matplotlib.
Ran plot(const std::string& runs, const std::string& dir) {
  return sh("python3 " + std::string(HOTOPS_COMPARE_PLOT) + " --tool " + HOTOPS_COMPARE_PATH + " --out " + dir +
            " --formats svg " + runs);
}

bool matplotlib_missing(const Ran& p) { return p.code == 2 && p.log.find("matplotlib is missing") != std::string::npos; }

// The one line the script prints without matplotlib, as the skip's reason.
std::string reason(const Ran& p) { return p.log.substr(0, p.log.find('\n')); }

// A CPU-only machine's run against a GPU machine's: each roofline holds one machine's entries under
// that machine's ceilings and names it; the speed-up chart names both.
TEST(Plot, TwoMachinesOneRooflineEachNamed) {
  const std::string dir = temp("two");
  const Ran p = plot(fx("gb18_cpu_machine.json") + " " + fx("gb17_gpu_machine.json"), dir);
  if (matplotlib_missing(p)) GTEST_SKIP() << reason(p);
  ASSERT_EQ(p.code, 0) << p.log;
  const std::string cpu = slurp(dir + "/roofline_cpu_cpu-box-7.svg"), gpu = slurp(dir + "/roofline_cuda_gpu-box-1.svg");
  EXPECT_NE(cpu.find("AMD EPYC 9654 96-Core Processor, 192 CPUs on cpu-box-7"), std::string::npos) << p.log;
  EXPECT_NE(gpu.find("NVIDIA H100 80GB HBM3 on gpu-box-1"), std::string::npos) << p.log;
  EXPECT_EQ(gpu.find("AMD EPYC"), std::string::npos) << "the GPU machine's chart names the other machine";
  EXPECT_FALSE(std::ifstream(dir + "/roofline_cpu.svg").good()) << "one chart mixes both runs";
  const std::string speedup = slurp(dir + "/speedup_mm.svg");
  EXPECT_NE(speedup.find("CPU: AMD EPYC 9654"), std::string::npos) << p.log;
  EXPECT_NE(speedup.find("GPU: NVIDIA H100 80GB HBM3 on gpu-box-1"), std::string::npos) << p.log;
  std::filesystem::remove_all(dir);
}

TEST(Plot, OneRunNamesItsCpuAndGpu) {
  const std::string dir = temp("one");
  const Ran p = plot(fx("gb17_base.json"), dir);
  if (matplotlib_missing(p)) GTEST_SKIP() << reason(p);
  ASSERT_EQ(p.code, 0) << p.log;
  EXPECT_NE(slurp(dir + "/roofline_cpu.svg").find("Intel(R) Xeon(R) Platinum 8480+, 32 CPUs on gpu-box-1"), std::string::npos);
  EXPECT_NE(slurp(dir + "/roofline_cuda.svg").find("NVIDIA H100 80GB HBM3 on gpu-box-1"), std::string::npos);
  std::filesystem::remove_all(dir);
}

// Without matplotlib anywhere, the script names the interpreter and the command that installs it.
TEST(Plot, WithoutMatplotlibSaysHowToInstallIt) {
  const std::string dir = temp("none");
  const Ran p = plot(fx("gb17_base.json"), dir);
  if (!matplotlib_missing(p)) GTEST_SKIP() << "a python3 with matplotlib is installed";
  EXPECT_NE(p.log.find("install it with: "), std::string::npos) << p.log;
  EXPECT_TRUE(p.log.find("apt-get install python3-matplotlib") != std::string::npos ||
              p.log.find(" -m pip install matplotlib") != std::string::npos)
      << p.log;
  std::filesystem::remove_all(dir);
}


// tools/studies.sh with hotops-compare from this build.
Ran studies(const std::string& args) {
  return sh("HOTOPS_COMPARE=" + std::string(HOTOPS_COMPARE_PATH) + " bash " + tools_dir() + "/studies.sh " + args);
}

TEST(Studies, TablesOfAStudyFromAFullSuiteRun) {
  const Ran r = studies("tables --study tinymlp " + fx("h100_full_suite_models.json"));
  ASSERT_EQ(r.code, 0) << r.log;
  for (const char* part : {"### The PyTorch tiny-MLP notebook: tables from", "NVIDIA H100 80GB HBM3",
                           "the CPU machine 0.80 USD/hour", "#### CPU vs GPU, GPU device time", "##### model.mlp_tiny",
                           "##### cost per million items", "#### CPU vs GPU, GPU end to end", "#### CPU thread scaling",
                           "| f32/train/batch:10 |", "16 threads", "#### Where the time goes"})
    EXPECT_NE(r.log.find(part), std::string::npos) << part << "\n" << r.log;
  EXPECT_EQ(r.log.find("model.mlp_mnist"), std::string::npos) << "one study's models only";

  const Ran one = studies("tables --study tinymlp --cpu-variant threads:1 " + fx("h100_full_suite_models.json"));
  ASSERT_EQ(one.code, 0) << one.log;
  EXPECT_NE(one.log.find("#### CPU vs GPU, GPU device time, the CPU's threads:1 entries"), std::string::npos) << one.log;
  EXPECT_NE(one.log.find("| f32/train | 0."), std::string::npos) << "the GPU is slower than one thread at batch 10: " << one.log;
  EXPECT_EQ(one.log.find("bf16"), std::string::npos) << "the studies trained in f32";
}

TEST(Studies, AReportTheRunCannotGiveIsOneLineAndTheOthersGoOn) {
  // The CPU-only fixture has no CUDA entry, so no speed-up; its thread scaling is missing too.
  const Ran r = studies("tables --study tinymlp " + fx("bench_gb171_cpu.json"));
  ASSERT_EQ(r.code, 0) << r.log;
  EXPECT_NE(r.log.find("_No table: no problem is measured on both backends"), std::string::npos) << r.log;
  EXPECT_NE(r.log.find("#### Where the time goes"), std::string::npos) << r.log;
}

TEST(Studies, BadUsageExitsTwo) {
  for (const std::string& args : {std::string("tables"), "tables --study nosuch " + fx("gb17_base.json"), std::string("tables /nonexistent.json"),
                                  std::string("frobnicate")})
    EXPECT_EQ(studies(args).code, 2) << args;
  const Ran f = studies("filter");
  ASSERT_EQ(f.code, 0);
  EXPECT_NE(f.log.find("model\\.(mlp_tiny"), std::string::npos) << f.log;
  for (const std::string& args : {std::string("filter --study nosuch"), std::string("filter --study"),
                                  std::string("run --study nosuch out.json")})
    EXPECT_EQ(studies(args).code, 2) << args;
}

TEST(Studies, OneStudysFilterHoldsItsModelsAndNoOthers) {
  const Ran p = studies("filter --study pyspark");
  ASSERT_EQ(p.code, 0) << p.log;
  for (const char* part : {"model\\.(bert_layer|vit_layer|convnext_block)/(cpu|cuda)/", "threads:1/real_time",
                           "e2e:1/manual_time", "^bmm/(cpu|cuda)/f32/", "^conv2d/(cpu|cuda)/f32/"})
    EXPECT_NE(p.log.find(part), std::string::npos) << part << "\n" << p.log;
  for (const char* other : {"mlp_tiny", "keras_cnn", "threads:(4|8)", "graph:1"})
    EXPECT_EQ(p.log.find(other), std::string::npos) << other << "\n" << p.log;

  const Ran t = studies("filter --study tinymlp");
  ASSERT_EQ(t.code, 0) << t.log;
  for (const char* part : {"model\\.(mlp_tiny)/(cpu|cuda)/", "threads:(4|8)", "model\\.(mlp_tiny)/cuda/f32/train/batch:[0-9]+/graph:1"})
    EXPECT_NE(t.log.find(part), std::string::npos) << part << "\n" << t.log;
  for (const char* other : {"bert_layer", "^mm", "keras_cnn"}) EXPECT_EQ(t.log.find(other), std::string::npos) << other << "\n" << t.log;
}

TEST(Studies, DocRemakesEachBlockFromTheRunsItsMarkerNames) {
  const std::string page = temp("studies.md");
  std::ofstream(page) << "# page\n\nprose\n\n<!-- studies.sh tables --study tinymlp " + fx("h100_full_suite_models.json") +
                             " -->\nold table\n<!-- end studies.sh -->\n\nmore prose\n";
  const Ran r = studies("doc " + page);
  ASSERT_EQ(r.code, 0) << r.log;
  const std::string text = slurp(page);
  EXPECT_EQ(text.find("old table"), std::string::npos) << text;
  EXPECT_NE(text.find("##### model.mlp_tiny"), std::string::npos) << text;
  EXPECT_NE(text.find("more prose"), std::string::npos) << text;
  std::ofstream(page) << "no block\n";
  EXPECT_NE(studies("doc " + page).code, 0);
  std::remove(page.c_str());
}

// A stand-in for bench: writes two entries, op/a and op/b, at the given times (µs) to the path of
// --benchmark_out, or exits with `exit_code` without writing.
std::string fake_bench(const std::string& name, double a_us, double b_us, int exit_code = 0) {
  const std::string path = temp(name);
  std::ofstream f(path);
  f << "#!/usr/bin/env bash\n";
  if (exit_code) f << "echo 'hotops: bad value' >&2; exit " << exit_code << "\n";
  f << "for a in \"$@\"; do case $a in --benchmark_out=*) out=${a#--benchmark_out=};; esac; done\n"
    << "cat > \"$out\" <<'J'\n{\"context\": {}, \"benchmarks\": [\n"
    << "{\"name\": \"op/a\", \"run_name\": \"op/a\", \"run_type\": \"iteration\", \"real_time\": " << a_us
    << ", \"time_unit\": \"us\"},\n"
    << "{\"name\": \"op/b\", \"run_name\": \"op/b\", \"run_type\": \"iteration\", \"real_time\": " << b_us * 1000
    << ", \"time_unit\": \"ns\"}]}\nJ\n";
  f.close();
  std::filesystem::permissions(path, std::filesystem::perms::owner_all);
  return path;
}

TEST(AbScript, AlternatesTheBuildsAndTabulatesEachEntry) {
  const std::string base = fake_bench("base_bench", 100, 200), slow = fake_bench("new_bench", 110, 150);
  const std::string out = temp("ab");
  const Ran r = sh("bash " + tools_dir() + "/ab.sh " + base + " " + slow + " " + out + " 2 -- --benchmark_filter=op");
  ASSERT_EQ(r.code, 0) << r.log;
  for (const char* f : {"/base-1.json", "/new-1.json", "/base-2.json", "/new-2.json", "/ab.md"})
    EXPECT_TRUE(std::filesystem::exists(out + f)) << f;
  const std::string table = slurp(out + "/ab.md");
  EXPECT_NE(table.find("| `op/a` | 100 / 100 | 110 / 110 | 1.100 / 1.100 (slower by both) |"), std::string::npos) << table;
  EXPECT_NE(table.find("| `op/b` | 200 / 200 | 150 / 150 | 0.750 / 0.750 |"), std::string::npos) << table;
  EXPECT_NE(table.find("geometric mean of new/base 0.908 (fastest), 0.908 (median); 1 more than 5% slower by both"),
            std::string::npos)
      << table;
  const std::size_t order = r.log.find("base 1 of 2"), next = r.log.find("new 1 of 2"), last = r.log.find("new 2 of 2");
  EXPECT_TRUE(order < next && next < last && last != std::string::npos) << r.log;
  std::filesystem::remove_all(out);
}

TEST(AbScript, UsageAndFailedProcessesExitApart) {
  const std::string base = fake_bench("base_ok", 1, 1), out = temp("ab_fail");
  EXPECT_EQ(sh("bash " + tools_dir() + "/ab.sh " + base).code, 2);
  EXPECT_EQ(sh("bash " + tools_dir() + "/ab.sh " + base + " " + base + " " + out + " zero --").code, 2);
  EXPECT_EQ(sh("bash " + tools_dir() + "/ab.sh " + base + " /nonexistent/bench " + out + " 1 --").code, 2);
  const Ran bad_input = sh("bash " + tools_dir() + "/ab.sh " + base + " " + fake_bench("new_bad", 1, 1, 2) + " " + out + " 1 --");
  EXPECT_EQ(bad_input.code, 2) << bad_input.log;
  EXPECT_NE(bad_input.log.find("hotops: bad value"), std::string::npos) << bad_input.log;
  const Ran crashed = sh("bash " + tools_dir() + "/ab.sh " + base + " " + fake_bench("new_crash", 1, 1, 134) + " " + out + " 1 --");
  EXPECT_EQ(crashed.code, 1) << crashed.log;
  EXPECT_FALSE(std::filesystem::exists(out + "/ab.md"));
  std::filesystem::remove_all(out);
}

// A stand-in for bench as tools/fullrun.sh runs it: the set-up trace of two entries on stderr, their
// console lines on stdout (the second an error where `fail_one`), the JSON at --benchmark_out.
std::string fake_traced_bench(const std::string& name, bool fail_one) {
  const std::string path = temp(name);
  std::ofstream f(path);
  f << "#!/usr/bin/env bash\n"
    << "for a in \"$@\"; do case $a in --benchmark_out=*) out=${a#--benchmark_out=};; esac; done\n"
    << "[ -n \"$HOTOPS_TRACE_SETUP\" ] || exit 3\n"
    << "echo '{\"benchmarks\": []}' > \"$out\"\n"
    << "echo 'setup 0.500 s (case 0.200, verify 0.250, warm-up 0.050) op/cpu/f32/fwd/x:1' >&2\n"
    << "echo 'op/cpu/f32/fwd/x:1/real_time      12.5 us     12.4 us    100 FLOP/s=1G/s loops [BUSY CPU: its threads waited 9% of their time for a core]'\n"
    << "echo 'setup 0.100 s (case 0.100, verify 0.000, warm-up 0.000) model.m/cuda/f32/train/batch:2' >&2\n";
  if (fail_one) f << "echo \"model.m/cuda/f32/train/batch:2/manual_time ERROR OCCURRED: 'verification failed'\"\n";
  else f << "echo 'model.m/cuda/f32/train/batch:2/manual_time      3.25 ms     3.20 ms    10'\n";
  f.close();
  std::filesystem::permissions(path, std::filesystem::perms::owner_all);
  return path;
}

TEST(FullrunScript, TabulatesEachEntrysSetupAndTime) {
  const std::string out = temp("fullrun");
  const Ran r = sh("bash " + tools_dir() + "/fullrun.sh " + fake_traced_bench("traced_bench", false) + " " + out);
  ASSERT_EQ(r.code, 0) << r.log;
  EXPECT_TRUE(std::filesystem::exists(out + "/all.json"));
  const std::string tsv = slurp(out + "/entries.tsv");
  EXPECT_NE(tsv.find("\t0.500\t0.200\t0.250\t0.050\top/cpu/f32/fwd/x:1/real_time\t12.5 us\n"), std::string::npos) << tsv;
  EXPECT_NE(tsv.find("\t0.100\t0.100\t0.000\t0.000\tmodel.m/cuda/f32/train/batch:2/manual_time\t3.25 ms\n"), std::string::npos) << tsv;
  EXPECT_NE(r.log.find("| models, cuda | 1 |"), std::string::npos) << r.log;
  EXPECT_NE(r.log.find("| op families, cpu | 1 |"), std::string::npos) << r.log;
  EXPECT_NE(r.log.find("2 entries, 0 error entries"), std::string::npos) << r.log;
  EXPECT_NE(r.log.find("1 entries timed on a busy CPU"), std::string::npos) << r.log;
  std::filesystem::remove_all(out);
}

TEST(FullrunScript, AnErrorEntryOrAFailedRunFailsIt) {
  const std::string out = temp("fullrun_fail");
  const Ran failed = sh("bash " + tools_dir() + "/fullrun.sh " + fake_traced_bench("traced_fail", true) + " " + out);
  EXPECT_EQ(failed.code, 1) << failed.log;
  EXPECT_NE(failed.log.find("1 error entries"), std::string::npos) << failed.log;
  EXPECT_NE(failed.log.find("model.m/cuda/f32/train/batch:2/manual_time: ERROR 'verification failed'"), std::string::npos) << failed.log;
  EXPECT_EQ(sh("bash " + tools_dir() + "/fullrun.sh " + fake_bench("bad_exit", 1, 1, 2) + " " + out).code, 2);
  EXPECT_EQ(sh("bash " + tools_dir() + "/fullrun.sh").code, 2);
  std::filesystem::remove_all(out);
}

}  // namespace
