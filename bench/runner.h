// Turns every problem of every registered family into a Google Benchmark, and times it.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <benchmark/benchmark.h>

#include "hotops/flags.h"
#include "hotops/problem.h"
#include "hotops/ranks.h"

namespace hotops::bench {

// The JSON counters of a model step's per-op breakdown: "breakdown:<op>" (us per step) and
// breakdown_step_us, breakdown_coverage, breakdown_ratio; the console leaves them out.
inline const std::string kBreakdownPrefix = "breakdown:";

struct Registered {
  std::vector<Problem> problems;                             // registered, in run order
  std::vector<std::pair<Problem, std::string>> unsupported;  // not registered, with the reason
};

// Registers the benchmarks this machine can run. With HOTOPS_TEST_FAULT=<kind> in the environment
// (`test_fault`, validated by the caller) a test-only benchmark that fails that way comes first.
// `iterations` > 0 fixes every benchmark's iteration count (--benchmark_min_time=<N>x where the
// linked Google Benchmark predates that form).
// With hotops' own sampling loop (options.own_loop) only the problems `filter` (--benchmark_filter)
// selects are registered, each entry the loop samples with one iteration that stands for all its
// samples and manual time; run Google Benchmark with the filter "all" then.
Registered register_benchmarks(const Options& options, const std::string& test_fault = "",
                               std::int64_t iterations = 0, const std::string& filter = "");

// A run of an entry hotops' own loop sampled, renamed as it is listed (no iterations:1; CPU
// entries' real_time), its CPU time per execution: the names users join runs on are the listed
// ones. Others as they are.
void name_as_listed(benchmark::BenchmarkReporter::Run& run);

// The test-only faults HOTOPS_TEST_FAULT may name (bench/test_fault.h), as one line.
std::string test_fault_kinds();
bool is_test_fault_kind(const std::string& kind);

// The problems whose benchmark names match a --benchmark_filter regex, with Google Benchmark's
// conventions: empty or "all" matches everything, a leading '-' negates, names carry the time
// suffix. Throws std::regex_error for a malformed regex.
std::vector<Problem> select(const std::vector<Problem>& problems, const std::string& filter);

// The backends of the problems, each once.
std::vector<Backend> backends_of(const std::vector<Problem>& problems);

// How many CUDA benchmarks the run will start, for the message that ends the GPU part on a fault.
void expect_cuda_benchmarks(std::size_t n);

// Call after CUDA work failed in `where`: if the CUDA context is lost (gpu::context_lost), ends the
// GPU part of the run, so that every later CUDA entry is skipped naming `where`, prints that on
// stderr and returns the line; otherwise returns "".
std::string end_gpu_part_if_lost(const std::string& where);

// Whether a GPU fault lost the CUDA context during the run (the remaining CUDA entries were skipped).
bool gpu_context_lost();

// Adds the JSON context keys of DESIGN.md (versions, CPU, GPU, flags); in a run over several GPUs
// also every rank's GPU (`rank_gpus`, by rank: the rendezvous' descriptions).
void add_context(const Options& options, const std::vector<std::string>& rank_gpus = {});

// ---- a run over several GPUs, one process each (docs/scaling.md) ----
// The ranks' group, once the rendezvous made it (nullptr: a process alone).
void set_group(ranks::Group* g);
// Every rank but 0: runs the multi-GPU entries as rank 0 commands until it ends the run; returns
// the exit code. Rank 0 runs Google Benchmark and, at the end, end_workers().
int run_worker(const Options& o);
void end_workers();

}  // namespace hotops::bench
