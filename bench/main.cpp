// bench: hotops' benchmark executable. hotops flags first (removed from argv), then Google Benchmark.
#include <benchmark/benchmark.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

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
  bool has_min_time = false, wants_help = options.help;
  for (int i = 1; i < argc; ++i) {
    has_min_time |= std::strncmp(argv[i], "--benchmark_min_time", 20) == 0;
    wants_help |= std::strcmp(argv[i], "--help") == 0;
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

  hotops::bench::add_context(options);
  hotops::bench::register_benchmarks(options);
  const std::size_t ran = benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return ran == 0 ? 2 : 0;
}
