// Output of hotops-compare: console tables (colour only on a terminal), Markdown, CSV, JSON, and
// the exports for CI trackers (github-action-benchmark's customSmallerIsBetter, Bencher's BMF).
#pragma once
#include <ostream>
#include <string>

#include "compare/src/analysis.h"

namespace hotops::compare {

enum class Format { console, md, csv, json };
Format parse_format(const std::string& s);  // throws InputError

struct Style {
  Format format = Format::console;
  bool colour = false;  // ANSI colours in console tables
  double alpha = 0.05;     // diff: a change is significant when p < alpha ...
  double noise_pct = 1.0;  // ... and it is significantly beyond this many per cent
};

// Whether diff counts a row's change as significant: both runs have repetitions, the U test gives
// p < alpha, |new/base - 1| >= noise_pct / 100, and the new repetitions differ significantly from
// the base ones scaled by 1 +- noise_pct / 100 (utest_against_scaled_base): the ratio's confidence
// interval lies wholly beyond the noise threshold, as Criterion requires of its noise_threshold. A
// shift within the threshold is not a change worth reporting, however consistent.
bool significant_change(const DiffRow& r, const Style& s);

void print_diff(std::ostream& out, const Diff& d, const Run& base, const Run& next, const Style& s);
void print_speedup(std::ostream& out, const Speedup& sp, const Style& s);
void print_gate(std::ostream& out, const Gate& g, const GateOptions& o, const Style& s);
void print_breakdown(std::ostream& out, const Breakdown& b, const Style& s);
void print_scaling(std::ostream& out, const Scaling& sc, const Style& s);
void print_threads(std::ostream& out, const Threads& th, const Style& s);
void print_spread(std::ostream& out, const Spread& sp, const Style& s);

// "256 MiB": a byte count in the largest binary unit that divides it (B, KiB, MiB, GiB, TiB).
std::string format_bytes(long long bytes);

enum class Tracker { github_action_benchmark, bencher };
Tracker parse_tracker(const std::string& s);  // throws InputError
// Writes the run's entries with a time in the tracker's JSON; returns how many failed entries
// were left out (a tracker's value must be a time).
int export_run(std::ostream& out, const Run& run, Tracker t);

// "12.3 us": three significant digits in the largest unit that keeps the number >= 1.
std::string format_time(double ns);

}  // namespace hotops::compare
