// Output verification against the reference: sampled indices, a dtype-scaled error bound, NaN checks.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "hotops/buffer.h"

namespace hotops {

// The outcome of one verification; a failed one carries the measured error in `message`.
struct Check {
  bool ok = true;
  double max_err = 0;      // max |out - ref| / rms(ref) over the checked elements
  double tol = 0;
  double rms_err = 0;      // rms(out - ref) / rms(ref) over the checked elements
  double rms_tol = 0;      // its bound; 0: not bounded
  std::size_t checked = 0;
  std::string message;

  // Combine the checks of several outputs: fails if either fails.
  void merge(const Check& other, const std::string& what);
};

// All indices when n <= limit; otherwise the first and last elements plus a seeded random sample.
std::vector<std::size_t> sample_indices(std::size_t n, std::size_t limit, std::uint64_t seed);

// Compares out[i] with ref(i) for i in idx; ref is computed in double by the caller's reference.
// Fails when max |out - ref| / rms(ref) > tol, or, with rms_tol > 0, when rms(out - ref) / rms(ref)
// > rms_tol: rounding errors spread with an rms well below their maximum, so a bound on the rms
// catches a wrong term whose every element stays under the per-element bound.
Check compare(const HostBuffer& out, const std::vector<std::size_t>& idx,
              const std::function<double(std::size_t)>& ref, double tol, double rms_tol = 0);

// Compares out[i] with a reference of its own bound for i in idx: ref(i, bound) returns the reference
// and sets the bound on |out[i] - ref| (e.g. a column sum's, from the sizes of its terms). A failure
// names the first element `what`[i] beyond its bound (NaN included); max_err is the worst error over
// its bound, so tol is 1.
Check compare_each(const HostBuffer& out, const std::vector<std::size_t>& idx,
                   const std::function<double(std::size_t, double& bound)>& ref, const char* what);

}  // namespace hotops
