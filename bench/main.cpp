// bench: hotops' benchmark executable. hotops flags first (removed from argv), then Google Benchmark.
// Exit codes: 0 the run completed; 2 bad input (a flag, a filter that selects nothing), found before
// anything runs; 1 a GPU fault lost the CUDA context (the CPU entries still ran and reported).
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <iterator>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "bench/roofline.h"
#include "bench/runner.h"
#include "hotops/buffer.h"
#include "hotops/gpu.h"
#include "hotops/cpu.h"

namespace {

// One warning line when the machine is visibly busy before anything runs: a 1-minute load average
// above the core count means other work competes with every timing.
void warn_if_busy() {
  std::FILE* f = std::fopen("/proc/loadavg", "r");
  if (!f) return;
  double load = 0;
  const bool read = std::fscanf(f, "%lf", &load) == 1;
  std::fclose(f);
  const unsigned cores = std::thread::hardware_concurrency();
  if (read && cores > 0 && load > cores)
    std::fprintf(stderr, "hotops: warning: this machine is busy (load average %.1f on %u cores): other work competes with "
                 "the timings, expect larger noise_pct\n", load, cores);
}

int refuse(const std::string& line) {
  std::fprintf(stderr, "%s\n", line.c_str());
  return 2;
}

// The display reporter Google Benchmark's flags choose, less the per-op breakdown counters of the
// model steps on the console (a dozen columns that belong in the JSON and in hotops-compare
// breakdown); JSON and CSV on stdout keep them.
class Display final : public benchmark::BenchmarkReporter {
 public:
  Display()
      : inner_(benchmark::CreateDefaultDisplayReporter()),
        console_(dynamic_cast<benchmark::ConsoleReporter*>(inner_.get()) != nullptr) {}
  bool ReportContext(const Context& context) override { return inner_->ReportContext(context); }
  void ReportRuns(const std::vector<Run>& runs) override {
    if (!console_) return inner_->ReportRuns(runs);
    std::vector<Run> shown = runs;
    for (Run& r : shown)
      for (auto it = r.counters.begin(); it != r.counters.end();)
        it = it->first.rfind("breakdown", 0) == 0 ? r.counters.erase(it) : std::next(it);
    inner_->ReportRuns(shown);
  }
  void Finalize() override { inner_->Finalize(); }

 private:
  std::unique_ptr<benchmark::BenchmarkReporter> inner_;
  bool console_;
};

}  // namespace

int main(int argc, char** argv) {
  hotops::Options options;
  hotops::BenchmarkFlags gb;
  try {
    options = hotops::parse_flags(argc, argv);
    gb = hotops::check_benchmark_flags(argc, argv);
  } catch (const hotops::FlagError& e) {
    return refuse(e.what());
  }
  if (gb.help || options.help) std::fputs(hotops::flags_help(), stdout);
  if (options.help) return 0;

  // Test only: HOTOPS_TEST_FAULT=<kind> adds a benchmark that fails that way (bench/test_fault.h).
  const char* fault_env = std::getenv("HOTOPS_TEST_FAULT");
  const std::string test_fault = fault_env ? fault_env : "";
  if (fault_env && !hotops::bench::is_test_fault_kind(test_fault))
    return refuse("hotops: unknown HOTOPS_TEST_FAULT='" + test_fault + "' (test only; one of " +
                  hotops::bench::test_fault_kinds() + ")");

  hotops::set_global_seed(options.seed);
  if (options.threads > 0) hotops::cpu::set_threads(options.threads);
  hotops::gpu::set_shuffle_layout(options.shuffle_layout);

  // hotops' default sample budget is 0.05 s per benchmark (Google Benchmark's is 0.5 s), so that a
  // whole op family runs in under a minute; --benchmark_min_time overrides it as usual.
  std::vector<char*> args(argv, argv + argc);
  static char default_min_time[] = "--benchmark_min_time=0.05";
  if (!gb.has_min_time) args.push_back(default_min_time);
  args.push_back(nullptr);
  int n = static_cast<int>(args.size()) - 1;
  benchmark::Initialize(&n, args.data());
  if (benchmark::ReportUnrecognizedArguments(n, args.data())) return 2;

  // What the filter selects is known before anything runs: a filter that selects nothing is an
  // error here, not an empty run after the roofline measurement.
  const auto registered = hotops::bench::register_benchmarks(options, test_fault);
  const std::string filter = benchmark::GetBenchmarkFilter();
  const auto selected = hotops::bench::select(registered.problems, filter);
  std::map<std::string, std::string> reason_of;  // name -> why, of the problems this machine cannot run
  std::vector<hotops::Problem> unsupported;
  for (const auto& [p, why] : registered.unsupported) unsupported.push_back(p), reason_of[p.name()] = why;
  std::map<std::string, int> cannot_run;  // reason -> count, of those the filter selects
  for (const hotops::Problem& p : hotops::bench::select(unsupported, filter)) ++cannot_run[reason_of[p.name()]];
  if (selected.empty()) {
    if (cannot_run.empty())
      return refuse("hotops: no benchmark matches --benchmark_filter=" + filter + " (--benchmark_list_tests=true lists them)");
    std::string reasons;
    int count = 0;
    for (const auto& [why, k] : cannot_run) reasons += (reasons.empty() ? "" : "; ") + why, count += k;
    return refuse("hotops: none of the " + std::to_string(count) + " benchmarks matching --benchmark_filter=" + filter +
                  " can run here: " + reasons);
  }
  for (const auto& [why, k] : cannot_run) std::fprintf(stderr, "hotops: %d benchmarks not run: %s\n", k, why.c_str());
  std::size_t cuda = 0;
  for (const hotops::Problem& p : selected) cuda += p.backend == hotops::Backend::cuda;
  hotops::bench::expect_cuda_benchmarks(cuda);

  if (options.roofline && !gb.list_tests) {
    // Only the backends whose benchmarks will run pay for measuring their ceilings.
    const auto backends = hotops::bench::backends_of(selected);
    hotops::bench::roofline() = hotops::bench::measure_roofline(options, backends);
    for (const std::string& note : hotops::bench::roofline().notes) std::fprintf(stderr, "hotops: %s\n", note.c_str());
    if (std::find(backends.begin(), backends.end(), hotops::Backend::cuda) != backends.end())
      hotops::bench::end_gpu_part_if_lost("the roofline measurement");
  }
  hotops::bench::add_context(options);
  if (!gb.list_tests) warn_if_busy();
  Display display;
  const std::size_t ran = benchmark::RunSpecifiedBenchmarks(&display);
  benchmark::Shutdown();
  if (ran == 0) return 2;  // cannot happen after the check above, unless the two regex engines disagree
  return hotops::bench::gpu_context_lost() ? 1 : 0;
}
