// hotops' own flags: parsed, removed from argv, and bad values refused with one clear message.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "hotops/flags.h"

namespace hotops {
namespace {

struct Argv {
  std::vector<std::string> store;
  std::vector<char*> ptrs;
  int argc = 0;
  explicit Argv(std::vector<std::string> a) : store(std::move(a)) {
    store.insert(store.begin(), "bench");
    for (auto& s : store) ptrs.push_back(s.data());
    ptrs.push_back(nullptr);
    argc = static_cast<int>(store.size());
  }
};

TEST(Flags, ParsesAndRemovesHotopsFlagsOnly) {
  Argv a({"--benchmark_filter=addmm", "--hotops_batch=1,8,32", "--hotops_verify=0", "--hotops_cold_l2",
          "--hotops_threads=4", "--hotops_seed=7", "--hotops_choices=h200.choices", "--benchmark_min_time=0.01"});
  const Options o = parse_flags(a.argc, a.ptrs.data());
  EXPECT_EQ(o.batches, (std::vector<std::int64_t>{1, 8, 32}));
  EXPECT_FALSE(o.verify);
  EXPECT_TRUE(o.cold_l2);
  EXPECT_EQ(o.threads, 4);
  EXPECT_EQ(o.seed, 7u);
  EXPECT_EQ(o.choices, "h200.choices");
  ASSERT_EQ(a.argc, 3);
  EXPECT_STREQ(a.ptrs[1], "--benchmark_filter=addmm");
  EXPECT_STREQ(a.ptrs[2], "--benchmark_min_time=0.01");
  EXPECT_EQ(a.ptrs[3], nullptr);
}

TEST(Flags, DefaultsWhenAbsent) {
  Argv a({});
  const Options o = parse_flags(a.argc, a.ptrs.data());
  EXPECT_TRUE(o.batches.empty());
  EXPECT_TRUE(o.verify);
  EXPECT_FALSE(o.cold_l2);
  EXPECT_TRUE(o.shuffle_layout);
  EXPECT_TRUE(o.cpu_ftz);
  EXPECT_EQ(o.threads, 0);
}

TEST(Flags, BadValuesThrowOneLineNamingTheFlag) {
  const std::vector<std::string> bad = {
      "--hotops_batch=0",       "--hotops_batch=-4",  "--hotops_batch=abc",    "--hotops_batch=1,,2",
      "--hotops_batch=",        "--hotops_batch",     "--hotops_batch=99999999999999999999",
      "--hotops_batch=2000000", "--hotops_verify=2",  "--hotops_verify=yes",   "--hotops_threads=0",
      "--hotops_threads=x",     "--hotops_cold_l2=7", "--hotops_nonsense=1",   "--hotops_seed=-1",
      "--hotops_throttle_threshold=2", "--hotops_throttle_threshold=x", "--hotops_throttle_threshold=",
      "--hotops_runs_per_sample=-1", "--hotops_runs_per_sample=100000",
      "--hotops_shuffle_layout",  "--hotops_shuffle_layout=2", "--hotops_shuffle_layout=",
      "--hotops_cpu_ftz",       "--hotops_cpu_ftz=2", "--hotops_cpu_ftz=",
      "--hotops_choices",       "--hotops_choices=",
      // more of what a tired user types
      "--hotops_batch=1,",      "--hotops_batch=,1",  "--hotops_batch=+3",     "--hotops_batch= 3",
      "--hotops_batch=3.5",     "--hotops_batch=1e3", "--hotops_batch=0x10",   "--hotops_batch=1048577",
      "--hotops_seed=abc",      "--hotops_seed=",     "--hotops_seed=99999999999999999999",
      "--hotops_threads=4097",  "--hotops_threads=-1", "--hotops_roofline=",   "--hotops_roofline=2",
      "--hotops_verify",        "--hotops_help=1",    "--hotops_runs_per_sample=1.5",
      "--hotops_throttle_threshold=nan", "--hotops_throttle_threshold=-0.1", "--hotops_throttle_threshold=inf",
      "--hotops_",              "--hotops_batch_size=8"};
  for (const std::string& flag : bad) {
    Argv a({flag});
    try {
      parse_flags(a.argc, a.ptrs.data());
      ADD_FAILURE() << flag << " was accepted";
    } catch (const FlagError& e) {
      const std::string msg = e.what();
      EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
      EXPECT_NE(msg.find("--hotops_"), std::string::npos) << msg;
    }
  }
}

TEST(Flags, MessageNamesTheValueAndWhatIsExpected) {
  const std::pair<const char*, const char*> cases[] = {
      {"--hotops_batch=0", "hotops: bad value '0' for --hotops_batch: expected a comma-separated list of batch sizes from 1 to 1048576"},
      {"--hotops_batch=8,-4", "hotops: bad value '-4' for --hotops_batch"},
      {"--hotops_threads=x", "hotops: bad value 'x' for --hotops_threads: expected a thread count from 1 to 4096"},
      {"--hotops_verify=yes", "hotops: bad value 'yes' for --hotops_verify: expected 0 or 1"},
      {"--hotops_batch", "hotops: --hotops_batch needs a value"},
      {"--hotops_bogus=1", "hotops: unknown flag --hotops_bogus (--hotops_help lists hotops' flags)"},
  };
  for (const auto& [flag, expected] : cases) {
    Argv a({flag});
    try {
      parse_flags(a.argc, a.ptrs.data());
      ADD_FAILURE() << flag << " was accepted";
    } catch (const FlagError& e) {
      EXPECT_EQ(std::string(e.what()).rfind(expected, 0), 0u) << e.what();
    }
  }
}

TEST(Flags, LimitsAreAccepted) {
  Argv a({"--hotops_batch=1,1048576", "--hotops_threads=4096", "--hotops_seed=9223372036854775807",
          "--hotops_throttle_threshold=0", "--hotops_runs_per_sample=10000", "--hotops_cold_l2=0", "--hotops_roofline=false",
          "--hotops_shuffle_layout=0", "--hotops_cpu_ftz=0"});
  const Options o = parse_flags(a.argc, a.ptrs.data());
  EXPECT_EQ(o.batches, (std::vector<std::int64_t>{1, 1048576}));
  EXPECT_EQ(o.threads, 4096);
  EXPECT_EQ(o.seed, 9223372036854775807u);
  EXPECT_EQ(o.throttle_threshold, 0);
  EXPECT_EQ(o.runs_per_sample, 10000);
  EXPECT_FALSE(o.cold_l2);
  EXPECT_FALSE(o.roofline);
  EXPECT_FALSE(o.shuffle_layout);
  EXPECT_FALSE(o.cpu_ftz);
  EXPECT_EQ(a.argc, 1);
}

// Google Benchmark's own flags, checked before it sees them.
TEST(BenchmarkFlags, GoodValuesPass) {
  Argv a({"--benchmark_format=json", "--benchmark_out_format=csv", "--benchmark_repetitions=3",
          "--benchmark_min_time=0", "--benchmark_min_warmup_time=0.5", "--benchmark_filter=-cuda|^mm/",
          "--benchmark_filter=", "--benchmark_enable_random_interleaving=true", "--benchmark_counters_tabular=0",
          "--benchmark_time_unit=ms", "--benchmark_out=" + testing::TempDir() + "/hotops_flags_out.json",
          "--benchmark_color=auto", "--v=1"});
  const BenchmarkFlags b = check_benchmark_flags(a.argc, a.ptrs.data());
  EXPECT_TRUE(b.has_min_time);
  EXPECT_FALSE(b.list_tests);
  EXPECT_FALSE(b.help);
}

// Every form of --benchmark_min_time a Google Benchmark release documents: seconds as a plain number
// (1.7 and before), "<float>s" and "<integer>x" (1.8 on).
TEST(BenchmarkFlags, MinTimeTakesEveryDocumentedForm) {
  const struct {
    const char* value;
    double seconds;
    std::int64_t iterations;
  } cases[] = {{"0.5", 0.5, 0}, {"0.5s", 0.5, 0}, {"2s", 2, 0}, {"0", 0, 0}, {"1e-3s", 1e-3, 0},
               {"100x", 0, 100}, {"1x", 0, 1}};
  for (const auto& c : cases) {
    Argv a({std::string("--benchmark_min_time=") + c.value});
    const BenchmarkFlags b = check_benchmark_flags(a.argc, a.ptrs.data());
    EXPECT_TRUE(b.has_min_time) << c.value;
    EXPECT_EQ(b.min_time.seconds, c.seconds) << c.value;
    EXPECT_EQ(b.min_time.iterations, c.iterations) << c.value;
  }
  Argv last({"--benchmark_min_time=3x", "--benchmark_min_time=0.25s"});
  EXPECT_EQ(check_benchmark_flags(last.argc, last.ptrs.data()).min_time.seconds, 0.25) << "the last one counts";
}

// Google Benchmark's own reading of the values above, which hotops must not contradict: before 1.8
// it takes only a plain number of seconds (a count of iterations has no flag form there), from 1.8
// on the suffixed forms (a plain number still works but is warned about).
TEST(BenchmarkFlags, MinTimeReachesEachReleaseInItsOwnForm) {
  MinTime seconds;
  seconds.seconds = 0.05;
  MinTime iterations;
  iterations.iterations = 100;
  EXPECT_EQ(min_time_arg(seconds, 107), "--benchmark_min_time=0.05");
  EXPECT_EQ(min_time_arg(seconds, 0), "--benchmark_min_time=0.05");  // release unknown: the form all read
  EXPECT_EQ(min_time_arg(seconds, 108), "--benchmark_min_time=0.05s");
  EXPECT_EQ(min_time_arg(seconds, 109), "--benchmark_min_time=0.05s");
  EXPECT_EQ(min_time_arg(iterations, 107), "");
  EXPECT_EQ(min_time_arg(iterations, 108), "--benchmark_min_time=100x");
  seconds.seconds = 1.0 / 3;
  const std::string third = min_time_arg(seconds, 107);
  EXPECT_EQ(std::stod(third.substr(third.find('=') + 1)), 1.0 / 3) << third;
}

TEST(BenchmarkFlags, TimeUnitIsNoted) {
  Argv a({"--benchmark_time_unit=s"});
  EXPECT_TRUE(check_benchmark_flags(a.argc, a.ptrs.data()).has_time_unit);
  Argv none({"--benchmark_min_time=1"});
  EXPECT_FALSE(check_benchmark_flags(none.argc, none.ptrs.data()).has_time_unit);
}

TEST(BenchmarkFlags, ListTestsReadsAsGoogleBenchmarkDoes) {
  const std::pair<std::vector<std::string>, bool> cases[] = {
      {{"--benchmark_list_tests"}, true},        {{"--benchmark_list_tests=true"}, true},
      {{"--benchmark_list_tests=1"}, true},      {{"--benchmark_list_tests=false"}, false},
      {{"--benchmark_list_tests=0"}, false},     {{"--benchmark_list_tests=no"}, false},
      {{"--benchmark_list_tests", "--benchmark_list_tests=false"}, false}, {{}, false}};
  for (const auto& [args, listing] : cases) {
    Argv a(args);
    EXPECT_EQ(check_benchmark_flags(a.argc, a.ptrs.data()).list_tests, listing) << (args.empty() ? "" : args.back());
  }
}

TEST(BenchmarkFlags, BadValuesThrowOneLineNamingTheFlag) {
  const std::vector<std::string> bad = {
      "--benchmark_format=xml",          "--benchmark_format=",           "--benchmark_out_format=JSON",
      "--benchmark_repetitions=0",       "--benchmark_repetitions=-1",    "--benchmark_repetitions=abc",
      "--benchmark_min_time=-1",         "--benchmark_min_time=abc",      "--benchmark_min_time=nan",
      "--benchmark_min_time=0.5x",       "--benchmark_min_time=0x",       "--benchmark_min_time=-3x",
      "--benchmark_min_time=x",          "--benchmark_min_time=s",        "--benchmark_min_time=-1s",
      "--benchmark_min_time=1ms",        "--benchmark_min_time=",         "--benchmark_min_warmup_time=0.5s",
      "--benchmark_min_warmup_time=-2",  "--benchmark_list_tests=maybe",  "--benchmark_report_aggregates_only=7",
      "--benchmark_time_unit=xs",        "--benchmark_filter=(",          "--benchmark_filter=-[a-",
      "--benchmark_out=/nonexistent_hotops_dir/x.json", "--benchmark_out=", "--benchmark_out=/"};
  for (const std::string& flag : bad) {
    Argv a({flag});
    try {
      check_benchmark_flags(a.argc, a.ptrs.data());
      ADD_FAILURE() << flag << " was accepted";
    } catch (const FlagError& e) {
      const std::string msg = e.what();
      EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
      EXPECT_EQ(msg.rfind("hotops: ", 0), 0u) << msg;
      EXPECT_NE(msg.find(flag.substr(0, flag.find('='))), std::string::npos) << msg;
    }
  }
}

}  // namespace
}  // namespace hotops
