// Reading Google Benchmark JSON (1.7 and 1.8 shapes) into runs that hotops-compare joins on names.
#pragma once
#include <cstdint>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <vector>

namespace hotops::compare {

// Bad input: a missing file, text that is not JSON, JSON that is not Google Benchmark output.
// The message is one line that names the file and what is wrong; the tool exits 2 on it.
class InputError : public std::runtime_error {
 public:
  // Control characters (a newline inside a quoted name or echoed input) become spaces.
  explicit InputError(const std::string& message) : std::runtime_error(one_line(message)) {}

 private:
  static std::string one_line(std::string s) {
    for (char& c : s)
      if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) c = ' ';
    return s;
  }
};

// A benchmark name split the hotops way: op/backend/dtype/direction/key:value/... then Google
// Benchmark's suffix. Names that do not follow the scheme keep only `full` and `suffix`.
struct Name {
  std::string full;     // the run name as written (joins entries of two runs)
  std::string suffix;   // "manual_time", "real_time", "process_time" or ""
  bool hotops = false;  // op/backend/dtype/direction parsed
  std::string op, backend, dtype, direction;
  std::vector<std::pair<std::string, std::string>> args;  // in name order

  std::optional<long long> batch() const;  // the `batch` arg, when present and an integer
  // The name less the backend segment and the suffix: equal for the same problem on any backend.
  std::string problem() const;
};

// The parts of `text` between its `sep`s, empty ones too ("a//b": a, "", b); one part without a sep.
std::vector<std::string> split(const std::string& text, char sep);

Name parse_name(const std::string& run_name);

// One benchmark of a run, its repetitions gathered.
struct Entry {
  Name name;
  std::vector<double> samples_ns;     // real_time of each repetition, in nanoseconds
  std::optional<double> aggregate_ns; // the median (else mean) aggregate, when only aggregates were written
  std::map<std::string, double> counters;  // medians over repetitions (NaN where Google Benchmark wrote NaN)
  std::string label;
  bool error = false;                 // error_occurred (SkipWithError)
  bool skipped = false;               // skipped (SkipWithMessage, Google Benchmark 1.8)
  std::string message;                // error_message or skip_message

  bool has_time() const { return !error && !skipped && (!samples_ns.empty() || aggregate_ns.has_value()); }
  double time_ns() const;             // median of the samples, else the aggregate; NaN without a time
  std::optional<double> counter(const std::string& key) const;
  // bench's mark of a time whose output it did not check (--hotops_verify=0), in the label.
  bool unverified() const;
  // bench's mark of a time its threads spent much of waiting for a core (other work held them), in
  // the label.
  bool busy() const;
  // How much the entry's own timed samples spread, in percent: bench's noise_pct counter where the
  // run has one, else the relative standard deviation of its repetitions (3 or more); nullopt when
  // neither says.
  std::optional<double> noise_pct() const;
  // The CPU thread count the entry ran with, where its counters say (cpu_threads, hotops' CPU entries).
  std::optional<double> threads() const;
};

struct Run {
  std::string source;                              // the file name (for messages)
  std::map<std::string, std::string> context;      // scalars of "context", as text
  std::vector<Entry> entries;                      // in first-appearance order
  std::uint64_t list_hash = 0;  // of the set of its entries' names, taken before any filter keeps some
  const Entry* find(const std::string& full_name) const;  // by name, through an index

 private:
  mutable std::unordered_map<std::string, std::size_t> by_name_;
  mutable std::size_t indexed_ = 0;
  mutable const Entry* indexed_front_ = nullptr;
};

// Parses Google Benchmark JSON text; `source` names it in error messages. Throws InputError.
// Accepts the bare NaN / Infinity tokens Google Benchmark writes for non-finite counters.
Run parse_run(const std::string& text, const std::string& source);
// Reads and parses a file. Throws InputError (missing, unreadable, not JSON, not Google Benchmark).
Run read_run(const std::string& path);

// Keeps the entries whose name (as written, suffix included) matches `pattern` anywhere (ECMAScript
// regex, as --benchmark_filter matches); "" keeps all. Throws InputError on a bad pattern.
void keep_matching(Run& run, const std::string& pattern);

// Keeps, of the `backend` entries, those whose name carries the arg `variant` ("e2e:1", "threads:1"), with that
// arg taken out of their args so that they join the other backend's entries of the same problem
// (their full names stay as written); the backend's entries without it are dropped, other
// backends' entries stay. "" keeps all. Throws InputError when `variant` is not key:value.
void keep_variant(Run& run, const std::string& backend, const std::string& variant);

// Replaces the non-JSON tokens NaN, -NaN, Infinity and -Infinity outside strings with null.
std::string sanitize_nonfinite(const std::string& text);

}  // namespace hotops::compare
