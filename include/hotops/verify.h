// Output verification against the reference: sampled indices, a dtype-scaled error bound, NaN checks.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
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
// The same with ref[j] the reference at idx[j], computed before (e.g. one shared by a problem's entries).
Check compare(const HostBuffer& out, const std::vector<std::size_t>& idx, const std::vector<double>& ref, double tol,
              double rms_tol = 0);

// Compares out[i] with a reference of its own bound for i in idx: ref(i, bound) returns the reference
// and sets the bound on |out[i] - ref| (e.g. a column sum's, from the sizes of its terms). A failure
// names the first element `what`[i] beyond its bound (NaN included); max_err is the worst error over
// its bound, so tol is 1.
Check compare_each(const HostBuffer& out, const std::vector<std::size_t>& idx,
                   const std::function<double(std::size_t, double& bound)>& ref, const char* what);

// A value computed once per process and shared by the entries that need the same one: `make` runs
// only when `key` (what the value is a function of) is not the key of one of the last `keep` values
// of type R made, which are kept until newer ones take their places; each run counts in `made`.
template <class R, class Make>
std::shared_ptr<const R> shared_value(const std::string& key, Make make, std::size_t keep, std::size_t& made) {
  struct Entry {
    std::string key;
    std::shared_ptr<const R> value;
  };
  static std::vector<Entry> recent;  // newest last
  for (const Entry& e : recent)
    if (e.key == key) return e.value;
  ++made;
  while (!recent.empty() && recent.size() >= keep) recent.erase(recent.begin());  // before the new one is made
  const HugePageScope pages;  // what it makes is the verification's, never timed
  auto value = std::make_shared<const R>(make());
  recent.push_back({key, value});
  return value;
}

// How many references shared_reference has computed in this process (for the tests).
inline std::size_t& shared_reference_computations() {
  static std::size_t n = 0;
  return n;
}

// The reference of a problem, computed once per process and shared by the entries that verify the
// same numbers (a model step's CPU threads:T, CUDA plain, e2e:1 and graph:1 runs; an op's CPU and
// CUDA entries of one problem, whose seeded inputs are the same): shared_value with the last `keep`
// references kept (a model step keeps one at a time: BERT's at batch 32 is about 1 GB). A reference
// that depends on the implementation's own results (ReLU ties decided as it decided) must carry
// those results in its key.
template <class R, class Make>
std::shared_ptr<const R> shared_reference(const std::string& key, Make make, std::size_t keep = 1) {
  return shared_value<R>(key, make, keep, shared_reference_computations());
}

}  // namespace hotops
