// What hotops-compare computes: diffs of two runs, CPU/GPU speed-ups with crossover batches,
// cost per million items, and the regression gate. Formatting lives in report.h.
#pragma once
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "compare/src/run.h"
#include "compare/src/stats.h"

namespace hotops::compare {

// USD per hour of each backend's machine (`--cost cpu=0.50,cuda=3.00`); absent: no cost figures.
using Prices = std::map<std::string, double>;
Prices parse_prices(const std::string& spec);  // throws InputError on a malformed spec

// USD per million items of an entry (items_per_second and its backend's price); nullopt when
// either is unknown.
std::optional<double> cost_per_million(const Entry& e, const Prices& prices);

// The counters whose ratios a diff reports (new / base: above 1 is faster).
const std::vector<std::string>& rate_counters();

// ---- diff ----------------------------------------------------------------------------------
enum class DiffStatus { both, only_base, only_new, error_base, error_new, error_both };
const char* status_name(DiffStatus s);

struct DiffRow {
  std::string name;
  DiffStatus status = DiffStatus::both;
  const Entry* base = nullptr;
  const Entry* next = nullptr;
  double base_ns = 0, new_ns = 0;
  double ratio = 0;                          // new time / base time (below 1: faster)
  std::optional<UTest> utest;                // when both sides have >= 2 repetitions
  std::map<std::string, double> counter_ratio;  // new / base of each rate both sides report
  std::optional<double> base_cost, new_cost;    // USD per million items
  // Why this row's comparison is not to be trusted as it stands: "unverified" (either side's time
  // was not checked), "noisy" (either side spreads beyond the limit), "busy" (either side's threads
  // waited for a core), "threads 16 vs 8" (the CPU entries ran with different thread counts). A
  // marked row counts in no significance total.
  std::vector<std::string> marks;
};

struct Diff {
  std::vector<DiffRow> rows;           // base order, then entries only in new
  double geomean_ratio = 0;            // over the rows with a time on both sides (NaN when none)
  int compared = 0;                    // rows with a time on both sides
  std::vector<std::string> warnings;   // e.g. the runs come from different machines
};

// A time spread beyond this (noise_pct, percent) marks an entry noisy: the default of --max-noise.
constexpr double kNoisyPct = 5;

Diff diff(const Run& base, const Run& next, const Prices& prices = {}, double noisy_pct = kNoisyPct);

// The marks of an entry on its own: "unverified", "noisy" (beyond `noisy_pct`), "busy" (bench's
// label says its threads waited for a core more than 5% of the time).
std::vector<std::string> entry_marks(const Entry& e, double noisy_pct);

// Context keys whose difference means the two runs measured under different settings (thread
// count, seed, verification, cold L2, samples, layout shuffle, build type): "key a vs b" each.
std::vector<std::string> setting_differences(const Run& a, const Run& b);

// The U test of the new repetitions against the base repetitions each multiplied by `factor`.
// Inverting the test gives a confidence interval for the time ratio new/base; p < alpha with
// factor 1 + t and the new run slower means that interval lies wholly above 1 + t: slower by more
// than t, not merely different. (Criterion's rule for its noise threshold, with the U test's
// interval instead of a bootstrap one.) nullopt unless both runs have at least 2 repetitions.
std::optional<UTest> utest_against_scaled_base(const DiffRow& r, double factor);

// Context keys whose difference means the two runs come from different machines.
std::vector<std::string> machine_differences(const Run& a, const Run& b);

// ---- speedup --------------------------------------------------------------------------------
struct SpeedupCell {
  long long batch = 0;                 // 0 when the problem has no batch axis
  std::string problem;                 // the name less backend and suffix
  const Entry* cpu = nullptr;
  const Entry* cuda = nullptr;
  double speedup = 0;                  // CPU time / GPU time (above 1: the GPU is faster)
  std::optional<double> cpu_cost, cuda_cost;
  std::vector<std::string> marks;      // of either entry (entry_marks): a ratio not to quote as it stands
};

struct SpeedupRow {
  std::string variant;                 // dtype/direction/args, batch and batch-derived args left out
  std::vector<SpeedupCell> cells;      // by increasing batch
  // The smallest measured batch from which the GPU is faster at that batch and at every larger
  // measured batch of the row; nullopt when the GPU is not faster at the largest batch.
  std::optional<long long> crossover;
  bool crossover_at_smallest = false;  // the GPU already wins at the smallest batch measured
};

struct SpeedupGroup {
  std::string op;                      // op or model.<name>
  std::vector<long long> batches;      // every batch of the group's rows, increasing (0: none)
  std::vector<SpeedupRow> rows;
};

struct Speedup {
  std::vector<SpeedupGroup> groups;    // by op name
  int pairs = 0;                       // problems measured on both backends
  int cpu_only = 0, cuda_only = 0;     // problems measured on one backend only
  // Entries of either side that have no time (failed, e.g. verification, or skipped): their cells
  // stay empty, and the report lists them with their messages so that a gap is explained.
  std::vector<const Entry*> unmeasured;
  std::vector<std::string> warnings;
};

// CPU entries from `cpu_run`, CUDA entries from `cuda_run` (the same run for one that holds both).
Speedup speedup(const Run& cpu_run, const Run& cuda_run, const Prices& prices = {}, double noisy_pct = kNoisyPct);

// ---- breakdown -----------------------------------------------------------------------------
// A model step's time by op, from the counters of bench's instrumented pass: "breakdown:<op>"
// (us per step), breakdown_step_us, breakdown_coverage, breakdown_ratio.
struct BreakdownOp {
  std::string op;
  double us = 0;     // per step
  double share = 0;  // of the instrumented step
};

struct BreakdownStep {
  const Entry* entry = nullptr;
  double step_us = 0;       // the instrumented step
  double coverage = 0;      // the ops' sum over the instrumented step
  double ratio = 0;         // the instrumented step over the entry's own (headline) time; NaN if unknown
  std::vector<BreakdownOp> ops;  // largest first
};

// One model problem (the name less its backend) on the backends the run has it on.
struct BreakdownPair {
  std::string problem;
  std::optional<BreakdownStep> cpu, cuda;
  // The op rows of the table: every op of either side, the largest share on either side first.
  std::vector<std::string> ops;
};

struct Breakdown {
  std::vector<BreakdownPair> pairs;  // in the run's order of first appearance
  std::vector<const Entry*> without; // model entries that have no breakdown (failed, skipped, or an older run)
};

// Every model entry of the run with its breakdown, CPU and CUDA of one problem side by side.
// Throws InputError when the run has no model entry with a breakdown.
Breakdown breakdown(const Run& run);

// ---- scaling --------------------------------------------------------------------------------
// Entries over several GPUs (a `gpus:G` arg) by GPU count. Collectives (a `bytes` arg): busbw by
// GPU count at each size. Model steps (a `batch` arg, per GPU): samples/s of the whole run by GPU
// count at each per-GPU batch, against one GPU (the same name with gpus:1, or without a gpus arg):
// the speed-up, the efficiency speed-up / G, and the crossover.
struct ScalingCell {
  int gpus = 0;
  const Entry* entry = nullptr;
  double value = 0;                    // busbw (bytes/s) or samples/s
  std::optional<double> speedup;       // models: value / one GPU's value at this batch
  std::optional<double> efficiency;    // models: speedup / gpus
};

struct ScalingRow {
  long long at = 0;                    // bytes (collectives) or the per-GPU batch (models); 0: neither
  std::vector<ScalingCell> cells;      // by GPU count; only those measured
  const ScalingCell* cell(int gpus) const;
};

struct ScalingGroup {
  std::string title;                   // the name less its gpus arg and its size or batch
  bool collective = false;
  std::vector<int> gpus;               // every GPU count of the group, increasing
  std::vector<ScalingRow> rows;        // by increasing size or batch
  // Models: for each G > 1, the smallest per-GPU batch from which G GPUs are at least
  // min_speedup x one GPU at that batch and at every larger batch measured on both; nullopt when
  // they are not at the largest.
  std::map<int, std::optional<long long>> crossover;
};

struct Scaling {
  std::vector<ScalingGroup> groups;    // in the run's order of first appearance
  double min_speedup = 1.5;
  std::vector<const Entry*> unmeasured;  // gpus entries without a time (failed or skipped), with why
};

// Throws InputError when the run has no entry with a gpus arg.
Scaling scaling(const Run& run, double min_speedup = 1.5);

// ---- threads -------------------------------------------------------------------------------
// CPU entries by thread count: each problem measured with `threads:T` args (bench's thread sweep)
// and without one (all the run's threads, its cpu_threads counter or the context's `threads`),
// with the speed-up over one thread, time(1) / time(T), and the efficiency speed-up / T.
struct ThreadsCell {
  int threads = 0;
  const Entry* entry = nullptr;
  std::optional<double> speedup;       // time at 1 thread / time at T threads
  std::optional<double> efficiency;    // speedup / T
  std::vector<std::string> marks;      // entry_marks: a time not to quote as it stands
};

struct ThreadsRow {
  std::string variant;                 // dtype/direction/args, the threads arg left out
  std::vector<ThreadsCell> cells;      // by increasing thread count
  int fastest = 0;                     // the thread count with the shortest time
};

struct ThreadsGroup {
  std::string op;                      // op or model.<name>
  std::vector<int> threads;            // every thread count of the group's rows, increasing
  std::vector<ThreadsRow> rows;        // in the run's order of first appearance
};

struct Threads {
  std::vector<ThreadsGroup> groups;    // by op name
  std::vector<const Entry*> unmeasured;  // entries of a sweep without a time (failed or skipped), with why
};

// Throws InputError when no CPU problem of the run is measured at two or more thread counts.
Threads threads(const Run& run, double noisy_pct = kNoisyPct);

// ---- spread ---------------------------------------------------------------------------------
// The same entries in several runs of one build on one machine (separate processes): how far each
// entry's time moves from one process to the next, max / min - 1, and how many different labels
// it had, times in them left out (a CUDA entry's label names the algorithms it ran, so two label
// sets are two algorithm choices).
struct SpreadRow {
  const Entry* first = nullptr;        // the entry in the first run that has it
  std::vector<double> times_ns;        // one a run, NaN where that run has no time for it
  double fastest_ns = 0, slowest_ns = 0;
  double spread_pct = 0;               // 100 (slowest / fastest - 1), over the runs with a time
  int timed = 0;                       // runs with a time for it
  int label_sets = 0;                  // distinct labels over those runs
  std::vector<std::string> marks;      // entry_marks of any run's entry
};

struct Spread {
  std::vector<std::string> sources;    // the runs, in order
  std::vector<SpreadRow> rows;         // entries timed in two runs or more, in the first run's order
  double median_spread_pct = 0;
  int over = 0;                        // rows whose spread exceeds max_spread_pct
  double max_spread_pct = 3;
  std::vector<std::string> warnings;   // runs of other machines or settings than the first
};

// Throws InputError with fewer than two runs, or when no entry has a time in two of them.
Spread spread(const std::vector<Run>& runs, double max_spread_pct = 3, double noisy_pct = kNoisyPct);

// ---- gate -----------------------------------------------------------------------------------
struct GateOptions {
  double max_slowdown_pct = 5;
  double alpha = 0.05;
};

struct GateFailure {
  std::string name;
  std::string reason;
};

struct Gate {
  Diff diff;
  std::vector<GateFailure> failures;
  std::vector<std::string> notes;      // why a slower entry did not fail, and what could not be tested
  bool passed() const { return failures.empty(); }
};

Gate gate(const Run& base, const Run& next, const GateOptions& o);

}  // namespace hotops::compare
