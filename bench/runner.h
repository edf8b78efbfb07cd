// Turns every problem of every registered family into a Google Benchmark, and times it.
#pragma once
#include "hotops/flags.h"

namespace hotops::bench {

// Registers the benchmarks this machine can run; prints one line per reason a group cannot run.
void register_benchmarks(const Options& options);

// Adds the JSON context keys of DESIGN.md (versions, CPU, GPU, flags).
void add_context(const Options& options);

}  // namespace hotops::bench
