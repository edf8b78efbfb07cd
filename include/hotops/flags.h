// hotops' own command-line flags (--hotops_*), parsed and removed before Google Benchmark sees argv.
#pragma once
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace hotops {

struct Options {
  std::vector<std::int64_t> batches;  // --hotops_batch=1,8,32: replaces every batch axis
  bool verify = true;                 // --hotops_verify=0|1
  bool cold_l2 = false;               // --hotops_cold_l2[=0|1]: flush L2 before each GPU sample
  double throttle_threshold = 0.9;    // --hotops_throttle_threshold=F: discard GPU samples below F x max clock
  int runs_per_sample = 0;            // --hotops_runs_per_sample=N: GPU executions per timed sample (0: auto)
  int threads = 0;                    // --hotops_threads=N: CPU threads (0: all cores)
  std::uint64_t seed = 20261122;      // --hotops_seed=N: every random input derives from it
  bool roofline = true;               // --hotops_roofline=0|1: measure the ceilings, report fractions
  bool shuffle_layout = true;         // --hotops_shuffle_layout=0|1: device buffers at random offsets
  bool cpu_ftz = true;                // --hotops_cpu_ftz=0|1: CPU threads flush subnormal floats to zero
  int gpus = 0;                       // --hotops_gpus=G: one process per GPU on G GPUs (0: not given)
  std::string choices;                // --hotops_choices=FILE: the searches' choices kept across processes
  // Sampling (docs/timing.md): hotops' own loop takes samples for min_seconds, at least two; the
  // stopping rule (off while max_noise is 0) samples on until the noise is low, settled or timed out.
  double max_noise = 0;               // --hotops_max_noise=P: stop once the samples' noise is below P percent
  int min_samples = 10;               // --hotops_min_samples=N: at least N samples (with the rule)
  double timeout = 15;                // --hotops_timeout=S: at most S seconds of samples per entry (with the rule)
  double min_seconds = 0.025;         // the least sampling time: --benchmark_min_time (set by bench)
  bool own_loop = true;               // off: Google Benchmark's loop (bench: --benchmark_min_time=<N>x, listing)
  bool help = false;                  // --hotops_help
};

// A bad flag: what() is the one line the user sees.
struct FlagError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Parses every --hotops_* argument, removes it from argv (argc updated) and returns the options.
// Throws FlagError on an unknown hotops flag or a bad value.
Options parse_flags(int& argc, char** argv);

// --benchmark_min_time: how long (or, in Google Benchmark 1.8's `<integer>x` form, how many
// iterations) each benchmark runs.
struct MinTime {
  double seconds = 0;          // when iterations == 0
  std::int64_t iterations = 0;  // > 0: a fixed count of iterations instead
};

// Reads a --benchmark_min_time value in any form a Google Benchmark release documents: `0.5`
// (1.7 and before; still read as seconds later), `0.5s` and `100x` (1.8 on). `where` names the
// flag or variable in the error. Throws FlagError on anything else, or a negative time.
MinTime parse_min_time(const std::string& where, const std::string& v);

// The --benchmark_min_time argument with which Google Benchmark `version` (major * 100 + minor,
// e.g. 107 for 1.7.1) reads `t`: `0.5` before 1.8, `0.5s` or `100x` from 1.8 on. Empty where that
// version has no form for it (a count of iterations before 1.8: set on each benchmark instead).
std::string min_time_arg(const MinTime& t, int version);

// What hotops needs to know of Google Benchmark's own flags (argv after parse_flags).
struct BenchmarkFlags {
  bool list_tests = false;    // --benchmark_list_tests (the last one given)
  bool has_min_time = false;  // --benchmark_min_time given
  MinTime min_time;           // its value (the last one given), when given
  bool has_time_unit = false;  // --benchmark_time_unit given
  bool help = false;          // --help
  std::string out;            // --benchmark_out (or BENCHMARK_OUT): the file the run is written to
  std::string out_format = "json";  // --benchmark_out_format (or BENCHMARK_OUT_FORMAT)
};

// Checks the values of Google Benchmark's flags that Google Benchmark itself would accept silently
// (a negative min_time, --benchmark_list_tests=maybe), exit 0 on (--benchmark_format=xml prints
// the usage), crash on (--benchmark_repetitions=-1, --benchmark_min_time=0.5x) or refuse only
// after hotops has measured the roofline (a malformed --benchmark_filter regex, an unwritable
// --benchmark_out). Every value a Google Benchmark release documents passes. Throws FlagError.
BenchmarkFlags check_benchmark_flags(int argc, char** argv);

// The flag help, printed by --hotops_help.
const char* flags_help();

}  // namespace hotops
