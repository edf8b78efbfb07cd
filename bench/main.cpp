// bench: hotops' benchmark executable. hotops flags first (removed from argv), then Google Benchmark.
#include <benchmark/benchmark.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "bench/roofline.h"
#include "bench/runner.h"
#include "hotops/buffer.h"
#include "hotops/cpu.h"

int main(int argc, char** argv) {
  hotops::Options options;
  try {
    options = hotops::parse_flags(argc, argv);
  } catch (const hotops::FlagError& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 2;
  }
  bool has_min_time = false, wants_help = options.help, listing = false;
  std::string filter = ".";
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    has_min_time |= a.rfind("--benchmark_min_time", 0) == 0;
    wants_help |= a == "--help";
    listing |= a.rfind("--benchmark_list_tests", 0) == 0 && a != "--benchmark_list_tests=false";
    if (a.rfind("--benchmark_filter=", 0) == 0) filter = a.substr(19);
  }
  if (wants_help) std::fputs(hotops::flags_help(), stdout);
  if (options.help) return 0;

  hotops::set_global_seed(options.seed);
  if (options.threads > 0) hotops::cpu::set_threads(options.threads);

  // hotops' default sample budget is 0.05 s per benchmark (Google Benchmark's is 0.5 s), so that a
  // whole op family runs in under a minute; --benchmark_min_time overrides it as usual.
  std::vector<char*> args(argv, argv + argc);
  static char default_min_time[] = "--benchmark_min_time=0.05";
  if (!has_min_time) args.push_back(default_min_time);
  args.push_back(nullptr);
  int n = static_cast<int>(args.size()) - 1;
  benchmark::Initialize(&n, args.data());
  if (benchmark::ReportUnrecognizedArguments(n, args.data())) return 2;

  const auto registered = hotops::bench::register_benchmarks(options);
  if (options.roofline && !listing) {
    // Only the backends whose benchmarks will run pay for measuring their ceilings.
    const auto backends = hotops::bench::backends_matching(registered, filter);
    hotops::bench::roofline() = hotops::bench::measure_roofline(options, backends);
    for (const std::string& note : hotops::bench::roofline().notes) std::fprintf(stderr, "hotops: %s\n", note.c_str());
  }
  hotops::bench::add_context(options);
  const std::size_t ran = benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return ran == 0 ? 2 : 0;
}
