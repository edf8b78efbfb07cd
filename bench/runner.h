// Turns every problem of every registered family into a Google Benchmark, and times it.
#pragma once
#include <string>
#include <vector>

#include "hotops/flags.h"
#include "hotops/problem.h"

namespace hotops::bench {

// Registers the benchmarks this machine can run and returns them; prints one line per reason a
// group cannot run.
std::vector<Problem> register_benchmarks(const Options& options);

// The backends of the registered problems whose names match a --benchmark_filter regex (with
// Google Benchmark's conventions: a leading '-' negates, and names carry the time suffix).
std::vector<Backend> backends_matching(const std::vector<Problem>& problems, const std::string& filter);

// Adds the JSON context keys of DESIGN.md (versions, CPU, GPU, flags).
void add_context(const Options& options);

}  // namespace hotops::bench
