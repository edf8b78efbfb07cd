// Reading Google Benchmark JSON. What is accepted: an object with a "benchmarks" array (and,
// as Google Benchmark always writes it, a "context" object); each entry an object with a string
// "name", and, unless it failed or was skipped, a number "real_time" with a "time_unit".
#include "compare/src/run.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <limits>
#include <regex>
#include <set>
#include <sstream>

namespace hotops::compare {
namespace {

using nlohmann::json;

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

double median(std::vector<double> v) {
  if (v.empty()) return kNaN;
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// Nanoseconds per unit of Google Benchmark's time_unit.
double unit_ns(const std::string& unit, const std::string& where) {
  if (unit == "ns") return 1;
  if (unit == "us") return 1e3;
  if (unit == "ms") return 1e6;
  if (unit == "s") return 1e9;
  throw InputError(where + ": unknown time_unit \"" + unit + "\"");
}

// Keys of an entry that are Google Benchmark's own fields, not user counters.
const std::set<std::string>& own_fields() {
  static const std::set<std::string> f{
      "name", "family_index", "per_family_instance_index", "run_name", "run_type", "repetitions",
      "repetition_index", "threads", "aggregate_name", "aggregate_unit", "error_occurred", "error_message",
      "skipped", "skip_message", "iterations", "real_time", "cpu_time", "time_unit", "cpu_coefficient",
      "real_coefficient", "big_o", "rms", "label", "allocs_per_iter", "max_bytes_used",
      "total_allocated_bytes", "net_heap_growth"};
  return f;
}

// One element of "benchmarks", as read.
struct Raw {
  std::string run_name;
  bool aggregate = false;
  std::string aggregate_name;
  bool error = false, skipped = false;
  std::string message, label;
  std::optional<double> time_ns;
  std::map<std::string, double> counters;
};

std::string text_of(const json& v) {
  if (v.is_string()) return v.get<std::string>();
  if (v.is_boolean()) return v.get<bool>() ? "true" : "false";
  if (v.is_number_integer()) return std::to_string(v.get<long long>());
  if (v.is_number_unsigned()) return std::to_string(v.get<unsigned long long>());
  if (v.is_number_float()) {
    std::ostringstream s;
    s << v.get<double>();
    return s.str();
  }
  return v.dump();
}

// Google Benchmark before 1.x wrote no run_name: the aggregate's name is the run name + _<aggregate>.
std::string run_name_of(const json& e, const std::string& name, const std::string& aggregate_name) {
  if (e.contains("run_name") && e["run_name"].is_string()) return e["run_name"].get<std::string>();
  const std::string tail = "_" + aggregate_name;
  if (!aggregate_name.empty() && name.size() > tail.size() && name.compare(name.size() - tail.size(), tail.size(), tail) == 0)
    return name.substr(0, name.size() - tail.size());
  return name;
}

Raw read_entry(const json& e, const std::string& where) {
  if (!e.is_object()) throw InputError(where + " is not an object: not Google Benchmark output");
  if (!e.contains("name") || !e["name"].is_string())
    throw InputError(where + " has no \"name\": not Google Benchmark output");
  Raw r;
  const std::string name = e["name"].get<std::string>();
  if (name.empty()) throw InputError(where + " has an empty \"name\"");
  const std::string at = where + " (" + name + ")";
  if (e.contains("run_type") && e["run_type"].is_string()) r.aggregate = e["run_type"].get<std::string>() == "aggregate";
  if (e.contains("aggregate_name") && e["aggregate_name"].is_string()) {
    r.aggregate_name = e["aggregate_name"].get<std::string>();
    r.aggregate = true;
  }
  r.run_name = run_name_of(e, name, r.aggregate_name);
  const auto flag = [&e](const char* key) { return e.contains(key) && e[key].is_boolean() && e[key].get<bool>(); };
  const auto text = [&e](const char* key) { return e.contains(key) && e[key].is_string() ? e[key].get<std::string>() : std::string(); };
  r.error = flag("error_occurred");
  r.skipped = flag("skipped");
  r.message = r.error ? text("error_message") : text("skip_message");
  r.label = text("label");
  // Complexity fits (BigO, RMS) and percentage aggregates (cv) carry no time per execution.
  const bool timeless = e.contains("big_o") || e.contains("rms") ||
                        (e.contains("aggregate_unit") && e["aggregate_unit"] == "percentage");
  if (!r.error && !r.skipped && !timeless) {
    if (!e.contains("real_time")) throw InputError(at + " has no \"real_time\": not Google Benchmark output");
    const json& t = e["real_time"];
    if (!t.is_number()) throw InputError(at + ": \"real_time\" is not a number");
    const double v = t.get<double>();
    // A measured execution takes some time: zero, a negative time or one that overflows a double in
    // nanoseconds cannot be a measurement, and a ratio against it would be meaningless.
    if (!std::isfinite(v) || v <= 0) throw InputError(at + ": \"real_time\" is " + text_of(t) + ", not a time");
    const std::string unit = e.contains("time_unit") && e["time_unit"].is_string() ? e["time_unit"].get<std::string>() : "ns";
    r.time_ns = v * unit_ns(unit, at);
    if (!std::isfinite(*r.time_ns)) throw InputError(at + ": \"real_time\" is " + text_of(t) + " " + unit + ", too large a time");
  }
  for (const auto& [key, value] : e.items()) {
    if (own_fields().count(key)) continue;
    if (value.is_number()) r.counters[key] = value.get<double>();
    else if (value.is_null()) r.counters[key] = kNaN;  // NaN or Infinity in Google Benchmark's text
  }
  return r;
}

}  // namespace

std::optional<long long> Name::batch() const {
  for (const auto& [k, v] : args) {
    if (k != "batch") continue;
    if (v.empty() || v.size() > 18 || !std::all_of(v.begin(), v.end(), [](char c) { return c >= '0' && c <= '9'; }))
      return std::nullopt;
    return std::stoll(v);
  }
  return std::nullopt;
}

std::string Name::problem() const {
  if (!hotops) return full;
  std::string p = op + "/" + dtype + "/" + direction;
  for (const auto& [k, v] : args) p += "/" + k + ":" + v;
  return p;
}

std::vector<std::string> split(const std::string& text, char sep) {
  std::vector<std::string> parts;
  std::size_t start = 0;
  while (true) {
    const std::size_t at = text.find(sep, start);
    parts.push_back(text.substr(start, at == std::string::npos ? std::string::npos : at - start));
    if (at == std::string::npos) return parts;
    start = at + 1;
  }
}

Name parse_name(const std::string& run_name) {
  Name n;
  n.full = run_name;
  std::vector<std::string> seg = split(run_name, '/');
  if (!seg.empty() && (seg.back() == "manual_time" || seg.back() == "real_time" || seg.back() == "process_time")) {
    n.suffix = seg.back();
    seg.pop_back();
  }
  if (seg.size() < 4 || (seg[1] != "cpu" && seg[1] != "cuda") || seg[0].empty() || seg[2].empty() || seg[3].empty())
    return n;
  std::vector<std::pair<std::string, std::string>> args;
  for (std::size_t i = 4; i < seg.size(); ++i) {
    const std::size_t colon = seg[i].find(':');
    if (colon == std::string::npos || colon == 0) return n;  // not key:value: not a hotops name
    args.emplace_back(seg[i].substr(0, colon), seg[i].substr(colon + 1));
  }
  n.hotops = true;
  n.op = seg[0];
  n.backend = seg[1];
  n.dtype = seg[2];
  n.direction = seg[3];
  n.args = std::move(args);
  return n;
}

double Entry::time_ns() const {
  if (error || skipped) return kNaN;
  if (!samples_ns.empty()) return median(samples_ns);
  return aggregate_ns ? *aggregate_ns : kNaN;
}

std::optional<double> Entry::counter(const std::string& key) const {
  const auto it = counters.find(key);
  if (it == counters.end() || !std::isfinite(it->second)) return std::nullopt;
  return it->second;
}

bool Entry::unverified() const { return label.find("NOT VERIFIED") != std::string::npos; }
bool Entry::busy() const { return label.find("[BUSY CPU") != std::string::npos; }

std::optional<double> Entry::noise_pct() const {
  if (const auto n = counter("noise_pct")) return *n;
  if (samples_ns.size() < 3) return std::nullopt;
  double mean = 0, sq = 0;
  for (double t : samples_ns) mean += t;
  mean /= static_cast<double>(samples_ns.size());
  for (double t : samples_ns) sq += (t - mean) * (t - mean);
  const double stdev = std::sqrt(sq / static_cast<double>(samples_ns.size() - 1));
  return mean > 0 ? 100 * stdev / mean : kNaN;
}

std::optional<double> Entry::threads() const { return counter("cpu_threads"); }

const Entry* Run::find(const std::string& full_name) const {
  // The index is rebuilt whenever the entries changed under it (a filter, a test's own list), so
  // that a join of two large runs is linear, not quadratic.
  if (indexed_ != entries.size() || (!entries.empty() && indexed_front_ != &entries.front())) {
    by_name_.clear();
    by_name_.reserve(entries.size());
    for (std::size_t i = 0; i < entries.size(); ++i) by_name_.emplace(entries[i].name.full, i);
    indexed_ = entries.size();
    indexed_front_ = entries.empty() ? nullptr : &entries.front();
  }
  const auto it = by_name_.find(full_name);
  return it == by_name_.end() ? nullptr : &entries[it->second];
}

std::string sanitize_nonfinite(const std::string& text) {
  std::string out;
  out.reserve(text.size());
  bool in_string = false;
  for (std::size_t i = 0; i < text.size();) {
    const char c = text[i];
    if (in_string) {
      out += c;
      if (c == '\\' && i + 1 < text.size()) out += text[++i];
      else if (c == '"') in_string = false;
      ++i;
      continue;
    }
    if (c == '"') {
      in_string = true;
      out += c;
      ++i;
      continue;
    }
    bool replaced = false;
    for (const char* token : {"-Infinity", "Infinity", "-NaN", "NaN"}) {
      const std::string t(token);
      if (text.compare(i, t.size(), t) == 0) {
        out += "null";
        i += t.size();
        replaced = true;
        break;
      }
    }
    if (!replaced) out += text[i++];
  }
  return out;
}

// The document's structure, once it parsed as JSON.
static Run read_document(const nlohmann::json& doc, const std::string& source);

Run parse_run(const std::string& text, const std::string& source) {
  json doc;
  try {
    doc = json::parse(sanitize_nonfinite(text));
  } catch (const json::exception& e) {
    // A syntax error (parse_error) or a number too large for a double (out_of_range.406, found
    // by fuzzing). nlohmann's message starts with "[json.exception.<kind>.<id>] ": drop that.
    std::string what = e.what();
    const std::size_t at = what.find("] ");
    throw InputError(source + ": not JSON: " + (at == std::string::npos ? what : what.substr(at + 2)));
  }
  try {
    return read_document(doc, source);
  } catch (const json::exception& e) {
    // Every access in read_document checks the type first; this is the net under that rule.
    throw InputError(source + ": not Google Benchmark output: " + e.what());
  }
}

static Run read_document(const nlohmann::json& doc, const std::string& source) {
  if (!doc.is_object() || !doc.contains("benchmarks"))
    throw InputError(source + ": not Google Benchmark output (no \"benchmarks\" array)");
  if (!doc["benchmarks"].is_array()) throw InputError(source + ": not Google Benchmark output (\"benchmarks\" is not an array)");
  if (doc.contains("context") && !doc["context"].is_object())
    throw InputError(source + ": not Google Benchmark output (\"context\" is not an object)");

  Run run;
  run.source = source;
  if (doc.contains("context"))
    for (const auto& [key, value] : doc["context"].items())
      if (!value.is_object() && !value.is_array()) run.context[key] = text_of(value);

  // Gather repetitions (iteration entries) and aggregates per run name, in order of appearance.
  std::map<std::string, std::size_t> index;
  std::map<std::string, std::vector<std::map<std::string, double>>> rep_counters;
  std::map<std::string, std::map<std::string, Raw>> aggregates;
  const json& list = doc["benchmarks"];
  for (std::size_t i = 0; i < list.size(); ++i) {
    Raw r = read_entry(list[i], source + ": benchmarks[" + std::to_string(i) + "]");
    auto [it, fresh] = index.emplace(r.run_name, run.entries.size());
    if (fresh) {
      run.entries.emplace_back();
      run.entries.back().name = parse_name(r.run_name);
    }
    Entry& e = run.entries[it->second];
    if (r.error || r.skipped) {
      // One failed repetition fails the entry: its other times are not comparable.
      e.error |= r.error;
      e.skipped |= r.skipped && !r.error;
      if (e.message.empty() || r.error) e.message = r.message;
      continue;
    }
    if (e.label.empty()) e.label = r.label;
    if (r.aggregate) {
      aggregates[r.run_name][r.aggregate_name] = std::move(r);
      continue;
    }
    if (r.time_ns) e.samples_ns.push_back(*r.time_ns);
    rep_counters[r.run_name].push_back(std::move(r.counters));
  }
  for (Entry& e : run.entries) {
    const auto reps = rep_counters.find(e.name.full);
    if (reps != rep_counters.end() && !reps->second.empty()) {
      std::map<std::string, std::vector<double>> values;
      for (const auto& c : reps->second)
        for (const auto& [k, v] : c) values[k].push_back(v);
      for (auto& [k, v] : values) {
        const bool all_finite = std::all_of(v.begin(), v.end(), [](double x) { return std::isfinite(x); });
        e.counters[k] = all_finite ? median(v) : kNaN;
      }
      continue;
    }
    // Only aggregates (--benchmark_report_aggregates_only): the median, else the mean.
    const auto agg = aggregates.find(e.name.full);
    if (agg == aggregates.end()) continue;
    for (const char* which : {"median", "mean"}) {
      const auto a = agg->second.find(which);
      if (a == agg->second.end() || !a->second.time_ns) continue;
      e.aggregate_ns = a->second.time_ns;
      e.counters = a->second.counters;
      break;
    }
  }
  // Run names that only had timeless aggregates (BigO, RMS, cv) are not entries to compare.
  run.entries.erase(std::remove_if(run.entries.begin(), run.entries.end(),
                                   [](const Entry& e) { return !e.error && !e.skipped && !e.has_time(); }),
                    run.entries.end());
  // FNV-1a over the names in sorted order, each closed by a 0 byte: the same for two runs of one list
  // whatever order --benchmark_enable_random_interleaving ran them in.
  std::vector<const std::string*> names;
  for (const Entry& e : run.entries) names.push_back(&e.name.full);
  std::sort(names.begin(), names.end(), [](const std::string* a, const std::string* b) { return *a < *b; });
  run.list_hash = 14695981039346656037ull;
  for (const std::string* n : names) {
    for (const char ch : *n) run.list_hash = (run.list_hash ^ static_cast<unsigned char>(ch)) * 1099511628211ull;
    run.list_hash = run.list_hash * 1099511628211ull;
  }
  return run;
}

void keep_matching(Run& run, const std::string& pattern) {
  if (pattern.empty()) return;
  std::regex re;
  try {
    re = std::regex(pattern, std::regex::ECMAScript);
  } catch (const std::regex_error& e) {
    throw InputError("--filter '" + pattern + "' is not a valid regular expression (" + e.what() + ")");
  }
  run.entries.erase(std::remove_if(run.entries.begin(), run.entries.end(),
                                   [&](const Entry& e) { return !std::regex_search(e.name.full, re); }),
                    run.entries.end());
}

void keep_variant(Run& run, const std::string& backend, const std::string& variant) {
  if (variant.empty()) return;
  const std::size_t colon = variant.find(':');
  if (colon == std::string::npos || colon == 0 || variant.find('/') != std::string::npos)
    throw InputError("--" + backend + "-variant '" + variant + "' is not one key:value arg (e.g. e2e:1, threads:1)");
  const std::pair<std::string, std::string> arg{variant.substr(0, colon), variant.substr(colon + 1)};
  run.entries.erase(std::remove_if(run.entries.begin(), run.entries.end(),
                                   [&](Entry& e) {
                                     if (e.name.backend != backend) return false;
                                     auto& args = e.name.args;
                                     const auto it = std::find(args.begin(), args.end(), arg);
                                     if (it == args.end()) return true;
                                     args.erase(it);
                                     return false;
                                   }),
                    run.entries.end());
}

Run read_run(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw InputError(path + ": cannot open (missing or unreadable)");
  std::ostringstream s;
  s << f.rdbuf();
  if (f.bad()) throw InputError(path + ": read error");
  return parse_run(s.str(), path);
}

}  // namespace hotops::compare
