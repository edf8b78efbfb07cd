// The roofline of each backend, measured by hotops itself before the benchmarks run: the copy
// bandwidth (the best of the `copy` family's memcpy benchmarks of 64 MiB and more) and the GEMM
// rate per dtype (an `mm` square). Every entry then reports the fraction of those ceilings it reached.
#pragma once
#include <map>
#include <string>
#include <vector>

#include "hotops/flags.h"
#include "hotops/problem.h"

namespace hotops::bench {

struct Ceilings {
  double bytes_per_second = 0;         // 0: not measured
  std::map<DType, double> flops;       // FLOP/s of the GEMM per dtype
};

struct Roofline {
  std::map<Backend, Ceilings> ceilings;
  std::vector<std::string> notes;      // what could not be measured, and why
};

// Measures the ceilings of the given backends, using the benchmarks named in docs/timing.md.
Roofline measure_roofline(const Options& o, const std::vector<Backend>& backends);

// The roofline measured at start-up (empty until measure_roofline's result is stored here).
Roofline& roofline();

}  // namespace hotops::bench
