// Rendering of diffs, speed-ups and gates as tables (console, Markdown, CSV) or JSON, and the
// tracker exports. Every figure comes from analysis.h; nothing is computed here but formatting.
#include "compare/src/report.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace hotops::compare {
namespace {

using nlohmann::json;

enum Colour { plain, green, red, yellow };

struct Table {
  std::vector<std::string> head;
  std::vector<bool> right;  // right-aligned columns (numbers)
  std::vector<std::vector<std::string>> rows;
  std::vector<std::vector<Colour>> colours;
  void add(std::vector<std::string> cells, std::vector<Colour> c = {}) {
    c.resize(cells.size(), plain);
    rows.push_back(std::move(cells));
    colours.push_back(std::move(c));
  }
};

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

std::string percent(double ratio) { return std::isfinite(ratio) ? fmt("%+.1f%%", (ratio - 1) * 100) : "inf"; }
std::string times(double ratio) { return std::isfinite(ratio) ? fmt("%.3gx", ratio) : "inf"; }
std::string ratio3(double ratio) { return std::isfinite(ratio) ? fmt("%.3fx", ratio) : "inf"; }
std::string usd(const std::optional<double>& v) { return v ? fmt("%.4g", *v) : "-"; }

const char* ansi(Colour c) {
  switch (c) {
    case green: return "\033[32m";
    case red: return "\033[31m";
    case yellow: return "\033[33m";
    case plain: break;
  }
  return "";
}

void render_console(std::ostream& out, const Table& t, bool colour) {
  std::vector<std::size_t> w(t.head.size(), 0);
  for (std::size_t i = 0; i < t.head.size(); ++i) w[i] = t.head[i].size();
  for (const auto& r : t.rows)
    for (std::size_t i = 0; i < r.size() && i < w.size(); ++i) w[i] = std::max(w[i], r[i].size());
  const auto line = [&](const std::vector<std::string>& cells, const std::vector<Colour>* cs) {
    for (std::size_t i = 0; i < cells.size(); ++i) {
      const std::string pad(w[i] - cells[i].size(), ' ');
      const bool right = i < t.right.size() && t.right[i];
      const Colour c = cs ? (*cs)[i] : plain;
      if (i) out << "  ";
      if (right) out << pad;
      if (colour && c != plain) out << ansi(c) << cells[i] << "\033[0m";
      else out << cells[i];
      if (!right && i + 1 < cells.size()) out << pad;
    }
    out << '\n';
  };
  line(t.head, nullptr);
  std::size_t total = 0;
  for (std::size_t x : w) total += x + 2;
  out << std::string(total > 2 ? total - 2 : 0, '-') << '\n';
  for (std::size_t r = 0; r < t.rows.size(); ++r) line(t.rows[r], &t.colours[r]);
}

std::string md_cell(const std::string& s) {
  std::string o;
  for (char c : s) {
    if (c == '|') o += "\\|";
    else if (c == '\n') o += ' ';
    else o += c;
  }
  return o;
}

void render_md(std::ostream& out, const Table& t) {
  out << '|';
  for (const auto& h : t.head) out << ' ' << md_cell(h) << " |";
  out << "\n|";
  for (std::size_t i = 0; i < t.head.size(); ++i) out << (i < t.right.size() && t.right[i] ? "---:|" : "---|");
  out << '\n';
  for (const auto& r : t.rows) {
    out << '|';
    for (const auto& c : r) out << ' ' << md_cell(c) << " |";
    out << '\n';
  }
}

std::string csv_cell(const std::string& s) {
  if (s.find_first_of(",\"\n\r") == std::string::npos) return s;
  std::string o = "\"";
  for (char c : s) o += c == '"' ? std::string("\"\"") : std::string(1, c);
  return o + "\"";
}

void render_csv_line(std::ostream& out, const std::vector<std::string>& cells) {
  for (std::size_t i = 0; i < cells.size(); ++i) out << (i ? "," : "") << csv_cell(cells[i]);
  out << '\n';
}

std::string num(double v) {
  if (!std::isfinite(v)) return "";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.9g", v);
  return buf;
}
std::string num(const std::optional<double>& v) { return v ? num(*v) : ""; }

json jnum(double v) { return std::isfinite(v) ? json(v) : json(nullptr); }
json jnum(const std::optional<double>& v) { return v ? jnum(*v) : json(nullptr); }

const char* counter_short(const std::string& c) {
  if (c == "bytes_per_second") return "bytes/s";
  if (c == "items_per_second") return "items/s";
  return c.c_str();
}

json entry_json(const Entry* e) {
  if (!e) return nullptr;
  json j;
  j["time_ns"] = jnum(e->time_ns());
  j["repetitions"] = e->samples_ns.size();
  if (e->error) j["error"] = e->message;
  if (e->skipped) j["skipped"] = e->message;
  if (!e->label.empty()) j["label"] = e->label;
  json c = json::object();
  for (const auto& [k, v] : e->counters) c[k] = jnum(v);
  j["counters"] = c;
  return j;
}

// The counters a diff shows: those present in at least one compared row, in a fixed order.
std::vector<std::string> shown_counters(const Diff& d) {
  std::vector<std::string> out;
  for (const std::string& c : rate_counters())
    if (std::any_of(d.rows.begin(), d.rows.end(), [&c](const DiffRow& r) { return r.counter_ratio.count(c) > 0; }))
      out.push_back(c);
  return out;
}

// A titled table after the main ones: a level-4 heading in markdown, a plain line on the console.
void render_section(std::ostream& out, const Style& s, const std::string& md_title, const std::string& title, const Table& t) {
  if (s.format == Format::md) {
    out << "\n#### " << md_title << "\n\n";
    render_md(out, t);
  } else {
    out << "\n" << title << "\n";
    render_console(out, t, s.colour);
  }
}

// Why an entry has no time: its error or skip message.
std::string no_time_message(const Entry& e) {
  return std::string(e.skipped ? "skipped: " : "") + (e.message.empty() ? "no message" : e.message);
}

std::string join(const std::vector<std::string>& v, const char* sep) {
  std::string s;
  for (const std::string& x : v) s += (s.empty() ? "" : sep) + x;
  return s;
}

// " [unverified, noisy]", or "" for a row without marks.
std::string marks_text(const std::vector<std::string>& marks) { return marks.empty() ? "" : " [" + join(marks, ", ") + "]"; }

// A figure's mark: "!" from an unverified entry, "~" from a noisy one, "^" from one timed on a busy
// CPU (all: "!~^").
std::string mark_symbols(const std::vector<std::string>& marks) {
  std::string m;
  for (const std::string& x : marks) m += x == "unverified" ? "!" : x == "noisy" ? "~" : x == "busy" ? "^" : "";
  return m;
}
std::string cell_mark(const SpeedupCell& c) { return mark_symbols(c.marks); }

// The legend of the marks, printed once above tables that hold a marked figure.
const char* kMarkLegend =
    "marked ratios, not to quote as they stand: ! from an entry whose output was not verified, ~ from an entry "
    "whose samples spread beyond --max-noise, ^ from an entry whose threads waited for a core more than 5% of the time\n";

// An entry's name in a tracker: an unverified time keeps its mark there, as a series of its own.
std::string export_name(const Entry& e) { return e.name.full + (e.unverified() ? " [NOT VERIFIED]" : ""); }

// Why a model entry has no breakdown: it has no time, or its run predates the breakdown counters.
std::string why_no_breakdown(const Entry& e) {
  return e.has_time() ? "no breakdown counters (a run of an older hotops)" : no_time_message(e);
}

// Entries without a time, as JSON: name and why.
json unmeasured_json(const std::vector<const Entry*>& entries) {
  json a = json::array();
  for (const Entry* e : entries) a.push_back({{"name", e->name.full}, {"message", no_time_message(*e)}});
  return a;
}

// The table of entries without a time that follows speedup's and threads' tables.
void render_unmeasured(std::ostream& out, const Style& s, const std::vector<const Entry*>& entries) {
  if (entries.empty()) return;
  Table t;
  t.head = {"entry", "why it has no time"};
  t.right = {false, false};
  for (const Entry* e : entries) t.add({e->name.full, no_time_message(*e)});
  render_section(out, s, "entries without a time (their cells are empty)", "entries without a time (their cells are empty)", t);
}

std::string row_message(const DiffRow& r) {
  const Entry* failed = r.status == DiffStatus::error_base ? r.base : r.next;
  if (r.status == DiffStatus::error_both) failed = r.next;
  if ((r.status == DiffStatus::error_base || r.status == DiffStatus::error_new || r.status == DiffStatus::error_both) && failed)
    return no_time_message(*failed);
  return "";
}

}  // namespace

std::string format_time(double ns) {
  if (!std::isfinite(ns)) return "-";
  if (ns < 1e3) return fmt("%.3g ns", ns);
  if (ns < 1e6) return fmt("%.3g us", ns / 1e3);
  if (ns < 1e9) return fmt("%.3g ms", ns / 1e6);
  return fmt("%.3g s", ns / 1e9);
}

Format parse_format(const std::string& s) {
  if (s == "console") return Format::console;
  if (s == "md") return Format::md;
  if (s == "csv") return Format::csv;
  if (s == "json") return Format::json;
  throw InputError("--format: \"" + s + "\" is not one of console, md, csv, json");
}

Tracker parse_tracker(const std::string& s) {
  if (s == "github-action-benchmark") return Tracker::github_action_benchmark;
  if (s == "bencher") return Tracker::bencher;
  throw InputError("--format: \"" + s + "\" is not one of github-action-benchmark, bencher");
}

bool significant_change(const DiffRow& r, const Style& s) {
  const double t = s.noise_pct / 100;
  if (!r.marks.empty()) return false;  // not judged: unverified, noisy, busy, or across thread counts
  if (r.status != DiffStatus::both || !r.utest || !(r.utest->p < s.alpha) || std::fabs(r.ratio - 1) < t) return false;
  return t == 0 || utest_against_scaled_base(r, r.ratio > 1 ? 1 + t : 1 - t)->p < s.alpha;
}

void print_diff(std::ostream& out, const Diff& d, const Run& base, const Run& next, const Style& s) {
  const bool costs = std::any_of(d.rows.begin(), d.rows.end(), [](const DiffRow& r) { return r.base_cost || r.new_cost; });
  const auto counters = shown_counters(d);
  int tested = 0, slower = 0, faster = 0;
  for (const DiffRow& r : d.rows) {
    tested += r.utest.has_value();
    if (significant_change(r, s)) ++(r.ratio > 1 ? slower : faster);
  }
  const std::string changes =
      tested == 0 ? std::string("no entry has repetitions in both runs: no U test")
                  : "significant changes (p < " + fmt("%g", s.alpha) + " and significantly beyond +-" + fmt("%g", s.noise_pct) +
                        "%): " + std::to_string(slower + faster) + " of " + std::to_string(tested) +
                        " entries with repetitions in both runs (" + std::to_string(slower) + " slower, " +
                        std::to_string(faster) + " faster)";
  if (s.format == Format::json) {
    json j;
    j["base"] = {{"file", base.source}, {"context", base.context}};
    j["new"] = {{"file", next.source}, {"context", next.context}};
    j["alpha"] = s.alpha;
    j["noise_pct"] = s.noise_pct;
    j["tested"] = tested;
    j["significant_changes"] = {{"slower", slower}, {"faster", faster}};
    j["geomean_time_ratio"] = jnum(d.geomean_ratio);
    j["compared"] = d.compared;
    j["warnings"] = d.warnings;
    json rows = json::array();
    for (const DiffRow& r : d.rows) {
      json x;
      x["name"] = r.name;
      x["status"] = status_name(r.status);
      x["marks"] = r.marks;
      x["base"] = entry_json(r.base);
      x["new"] = entry_json(r.next);
      if (r.status == DiffStatus::both) {
        x["time_ratio"] = jnum(r.ratio);
        json cr = json::object();
        for (const auto& [k, v] : r.counter_ratio) cr[k] = jnum(v);
        x["counter_ratios"] = cr;
        if (r.utest) x["utest"] = {{"u", r.utest->u}, {"p_value", r.utest->p}, {"exact", r.utest->exact},
                                    {"significant", significant_change(r, s)}};
        else x["utest"] = nullptr;
      }
      if (costs) x["usd_per_million_items"] = {{"base", jnum(r.base_cost)}, {"new", jnum(r.new_cost)}};
      rows.push_back(x);
    }
    j["entries"] = rows;
    out << j.dump(2) << '\n';
    return;
  }

  Table t;
  t.head = {"benchmark", "base", "new", "change", "p"};
  for (const auto& c : counters) t.head.push_back(std::string(counter_short(c)) + " new/base");
  if (costs) {
    t.head.push_back("base USD/M items");
    t.head.push_back("new USD/M items");
  }
  t.head.push_back("status");
  t.right.assign(t.head.size(), true);
  t.right.front() = false;
  t.right.back() = false;
  for (const DiffRow& r : d.rows) {
    std::vector<std::string> c{r.name};
    std::vector<Colour> col{plain};
    if (r.status == DiffStatus::both) {
      c.push_back(format_time(r.base_ns));
      c.push_back(format_time(r.new_ns));
      c.push_back(percent(r.ratio));
      c.push_back(r.utest ? fmt("%.3g", r.utest->p) + (significant_change(r, s) ? " *" : "") : "-");
      const bool significant = !r.utest || significant_change(r, s);
      const Colour change = !significant ? plain : r.ratio > 1.05 ? red : r.ratio < 0.95 ? green : plain;
      col.insert(col.end(), {plain, plain, change, plain});
    } else {
      c.push_back(r.base && r.base->has_time() ? format_time(r.base->time_ns()) : "-");
      c.push_back(r.next && r.next->has_time() ? format_time(r.next->time_ns()) : "-");
      c.push_back("-");
      c.push_back("-");
      col.insert(col.end(), {plain, plain, plain, plain});
    }
    for (const auto& k : counters) {
      const auto it = r.counter_ratio.find(k);
      c.push_back(it == r.counter_ratio.end() ? "-" : ratio3(it->second));
      col.push_back(plain);
    }
    if (costs) {
      c.push_back(usd(r.base_cost));
      c.push_back(usd(r.new_cost));
      col.insert(col.end(), {plain, plain});
    }
    const std::string msg = row_message(r);
    c.push_back(std::string(status_name(r.status)) + marks_text(r.marks) + (msg.empty() ? "" : ": " + msg));
    col.push_back(r.status == DiffStatus::both && r.marks.empty() ? plain : yellow);
    t.add(c, col);
  }
  const std::string geo = std::isfinite(d.geomean_ratio)
                              ? "geometric mean of time ratios (new/base) over " + std::to_string(d.compared) +
                                    " entries: " + fmt("%.4f", d.geomean_ratio) + " (" + percent(d.geomean_ratio) + ")"
                              : "no entry has a time in both runs";
  if (s.format == Format::csv) {
    std::vector<std::string> head{"name", "status", "base_ns", "new_ns", "time_ratio", "p_value", "exact"};
    for (const auto& k : counters) head.push_back(k + " ratio");
    if (costs) head.insert(head.end(), {"base_usd_per_million_items", "new_usd_per_million_items"});
    head.insert(head.end(), {"marks", "message"});
    render_csv_line(out, head);
    for (const DiffRow& r : d.rows) {
      std::vector<std::string> c{r.name, status_name(r.status)};
      const bool both = r.status == DiffStatus::both;
      c.push_back(r.base && r.base->has_time() ? num(r.base->time_ns()) : "");
      c.push_back(r.next && r.next->has_time() ? num(r.next->time_ns()) : "");
      c.push_back(both ? num(r.ratio) : "");
      c.push_back(r.utest ? num(r.utest->p) : "");
      c.push_back(r.utest ? (r.utest->exact ? "1" : "0") : "");
      for (const auto& k : counters) {
        const auto it = r.counter_ratio.find(k);
        c.push_back(it == r.counter_ratio.end() ? "" : num(it->second));
      }
      if (costs) {
        c.push_back(num(r.base_cost));
        c.push_back(num(r.new_cost));
      }
      c.push_back(join(r.marks, "; "));
      c.push_back(row_message(r));
      render_csv_line(out, c);
    }
    render_csv_line(out, {"geomean", "", "", "", num(d.geomean_ratio), "", ""});
    return;
  }
  if (s.format == Format::md) {
    out << "### hotops-compare diff: `" << md_cell(base.source) << "` -> `" << md_cell(next.source) << "`\n\n";
    for (const auto& w : d.warnings) out << "> **warning:** " << md_cell(w) << "\n\n";
    render_md(out, t);
    out << "\n" << geo << "; p: two-sided Mann-Whitney U over repetitions, `*`: p below " << fmt("%g", s.alpha)
        << " and a change significantly beyond " << fmt("%g", s.noise_pct) << "%.\n\n" << changes << ".\n";
    return;
  }
  render_console(out, t, s.colour);
  out << geo << '\n' << changes << '\n';
}

void print_speedup(std::ostream& out, const Speedup& sp, const Style& s) {
  const auto batch_head = [](long long b) { return b ? "batch:" + std::to_string(b) : std::string("(no batch)"); };
  const auto crossover = [](const SpeedupRow& r) -> std::string {
    if (r.cells.size() == 1 && r.cells[0].batch == 0) return "-";
    if (!r.crossover) return "none";
    return (r.crossover_at_smallest ? "<=" : "") + std::to_string(*r.crossover);
  };
  bool costs = false;
  for (const auto& g : sp.groups)
    for (const auto& r : g.rows)
      for (const auto& c : r.cells) costs |= c.cpu_cost || c.cuda_cost;

  if (s.format == Format::json) {
    json j;
    j["pairs"] = sp.pairs;
    j["cpu_only"] = sp.cpu_only;
    j["cuda_only"] = sp.cuda_only;
    j["warnings"] = sp.warnings;
    j["unmeasured"] = unmeasured_json(sp.unmeasured);
    json groups = json::array();
    for (const auto& g : sp.groups) {
      json rows = json::array();
      for (const auto& r : g.rows) {
        json cells = json::array();
        for (const auto& c : r.cells) {
          json x{{"batch", c.batch ? json(c.batch) : json(nullptr)}, {"problem", c.problem},
                 {"cpu_name", c.cpu->name.full}, {"cuda_name", c.cuda->name.full},
                 {"cpu_time_ns", jnum(c.cpu->time_ns())}, {"cuda_time_ns", jnum(c.cuda->time_ns())},
                 {"speedup", jnum(c.speedup)}, {"marks", c.marks}};
          if (costs) x["usd_per_million_items"] = {{"cpu", jnum(c.cpu_cost)}, {"cuda", jnum(c.cuda_cost)}};
          cells.push_back(x);
        }
        rows.push_back({{"variant", r.variant}, {"cells", cells},
                        {"crossover_batch", r.crossover ? json(*r.crossover) : json(nullptr)},
                        {"crossover_at_smallest_batch", r.crossover_at_smallest}});
      }
      groups.push_back({{"op", g.op}, {"rows", rows}});
    }
    j["groups"] = groups;
    out << j.dump(2) << '\n';
    return;
  }
  if (s.format == Format::csv) {
    std::vector<std::string> head{"op", "variant", "batch", "problem", "cpu_ns", "cuda_ns", "speedup", "crossover_batch", "marks"};
    if (costs) head.insert(head.end(), {"cpu_usd_per_million_items", "cuda_usd_per_million_items"});
    render_csv_line(out, head);
    for (const auto& g : sp.groups)
      for (const auto& r : g.rows)
        for (const auto& c : r.cells) {
          std::vector<std::string> row{g.op, r.variant, c.batch ? std::to_string(c.batch) : "", c.problem,
                                       num(c.cpu->time_ns()), num(c.cuda->time_ns()), num(c.speedup),
                                       r.crossover ? std::to_string(*r.crossover) : "", join(c.marks, "; ")};
          if (costs) {
            row.push_back(num(c.cpu_cost));
            row.push_back(num(c.cuda_cost));
          }
          render_csv_line(out, row);
        }
    return;
  }
  if (s.format == Format::md)
    out << "### hotops-compare speedup: CPU time / GPU time (above 1: the GPU is faster)\n\n";
  else
    out << "speed-up = CPU time / GPU time (above 1: the GPU is faster); crossover = smallest batch from which the "
           "GPU stays faster\n";
  for (const auto& w : sp.warnings) out << (s.format == Format::md ? "> **warning:** " : "warning: ") << w << "\n";
  bool marked = false;
  for (const auto& g : sp.groups)
    for (const auto& r : g.rows)
      for (const auto& c : r.cells) marked |= !c.marks.empty();
  if (marked)
    out << (s.format == Format::md ? "\n" : "")
        << kMarkLegend;
  for (const auto& g : sp.groups) {
    Table t;
    t.head = {"variant"};
    for (long long b : g.batches) t.head.push_back(batch_head(b));
    t.head.push_back("crossover");
    t.right.assign(t.head.size(), true);
    t.right.front() = false;
    for (const auto& r : g.rows) {
      std::vector<std::string> c{r.variant};
      std::vector<Colour> col{plain};
      for (long long b : g.batches) {
        const auto it = std::find_if(r.cells.begin(), r.cells.end(), [b](const SpeedupCell& x) { return x.batch == b; });
        c.push_back(it == r.cells.end() ? "" : times(it->speedup) + cell_mark(*it));
        col.push_back(it == r.cells.end() ? plain : it->speedup > 1 ? green : red);
      }
      c.push_back(crossover(r));
      col.push_back(plain);
      t.add(c, col);
    }
    if (s.format == Format::md) {
      out << "\n#### " << g.op << "\n\n";
      render_md(out, t);
    } else {
      out << "\n" << g.op << "\n";
      render_console(out, t, s.colour);
    }
  }
  if (costs) {
    Table t;
    t.head = {"problem", "CPU USD/M items", "GPU USD/M items", "cheaper"};
    t.right = {false, true, true, false};
    for (const auto& g : sp.groups)
      for (const auto& r : g.rows)
        for (const auto& c : r.cells) {
          std::string cheaper = "-";
          if (c.cpu_cost && c.cuda_cost) cheaper = *c.cpu_cost < *c.cuda_cost ? "cpu" : *c.cuda_cost < *c.cpu_cost ? "cuda" : "same";
          t.add({c.problem, usd(c.cpu_cost), usd(c.cuda_cost), cheaper});
        }
    render_section(out, s, "cost per million items", "cost per million items (USD)", t);
  }
  render_unmeasured(out, s, sp.unmeasured);
  out << "\n" << sp.pairs << " problems on both backends; " << sp.cpu_only << " only on cpu, " << sp.cuda_only
      << " only on cuda; " << sp.unmeasured.size() << " entries without a time\n";
}

void print_gate(std::ostream& out, const Gate& g, const GateOptions& o, const Style& s) {
  if (s.format == Format::json) {
    json j;
    j["passed"] = g.passed();
    j["max_slowdown_pct"] = o.max_slowdown_pct;
    j["alpha"] = o.alpha;
    j["compared"] = g.diff.compared;
    j["geomean_time_ratio"] = jnum(g.diff.geomean_ratio);
    json f = json::array();
    for (const auto& x : g.failures) f.push_back({{"name", x.name}, {"reason", x.reason}});
    j["failures"] = f;
    j["notes"] = g.notes;
    j["warnings"] = g.diff.warnings;
    out << j.dump(2) << '\n';
    return;
  }
  if (s.format == Format::csv) {
    render_csv_line(out, {"name", "result", "reason"});
    for (const auto& x : g.failures) render_csv_line(out, {x.name, "fail", x.reason});
    return;
  }
  const bool md = s.format == Format::md;
  const std::string verdict = g.passed() ? "passed" : "FAILED";
  const std::string summary = "gate " + verdict + ": " + std::to_string(g.failures.size()) + " failing of " +
                              std::to_string(g.diff.rows.size()) + " entries (" + std::to_string(g.diff.compared) +
                              " compared; threshold " + fmt("%g", o.max_slowdown_pct) + "% slower, alpha " +
                              fmt("%g", o.alpha) + "; geometric mean of time ratios " + fmt("%.4f", g.diff.geomean_ratio) + ")";
  if (md) out << "### hotops-compare gate: " << (g.passed() ? "passed" : "**FAILED**") << "\n\n";
  for (const auto& x : g.failures) {
    if (md) out << "- :x: `" << md_cell(x.name) << "`: " << md_cell(x.reason) << '\n';
    else out << (s.colour ? "\033[31mFAIL\033[0m " : "FAIL ") << x.name << ": " << x.reason << '\n';
  }
  for (const auto& n : g.notes) out << (md ? "- note: " : "note: ") << (md ? md_cell(n) : n) << '\n';
  out << (md ? "\n" : "") << summary << '\n';
}

void print_breakdown(std::ostream& out, const Breakdown& b, const Style& s) {
  const auto pct = [](double share) { return std::isfinite(share) ? fmt("%.1f%%", share * 100) : std::string("-"); };
  const auto us = [](double v) { return format_time(v * 1e3); };
  const auto find = [](const std::optional<BreakdownStep>& st, const std::string& op) -> const BreakdownOp* {
    if (st)
      for (const BreakdownOp& o : st->ops)
        if (o.op == op) return &o;
    return nullptr;
  };
  // An op's rank on its side: its place in that side's ops, which are largest first.
  const auto rank = [](const std::optional<BreakdownStep>& st, const BreakdownOp* o) -> std::string {
    return o ? std::to_string(o - st->ops.data() + 1) : "";
  };
  if (s.format == Format::json) {
    json models = json::array();
    for (const BreakdownPair& pr : b.pairs)
      for (const auto* side : {&pr.cpu, &pr.cuda}) {
        if (!*side) continue;
        const BreakdownStep& st = **side;
        const Name& n = st.entry->name;
        std::string variant;
        for (const auto& [k, v] : n.args)
          if (k != "batch") variant += (variant.empty() ? "" : "/") + k + ":" + v;
        json ops = json::array();
        for (const BreakdownOp& o : st.ops) ops.push_back({{"op", o.op}, {"us", jnum(o.us)}, {"share", jnum(o.share)}});
        models.push_back({{"name", n.op.substr(std::string("model.").size())}, {"entry", n.full}, {"backend", n.backend},
                          {"dtype", n.dtype}, {"direction", n.direction},
                          {"batch", n.batch() ? json(*n.batch()) : json(nullptr)}, {"variant", variant},
                          {"step_us", jnum(st.step_us)}, {"headline_us", jnum(st.entry->time_ns() / 1e3)},
                          {"instrumented_ratio", jnum(st.ratio)}, {"coverage", jnum(st.coverage)}, {"ops", ops}});
      }
    json without = json::array();
    for (const Entry* e : b.without) without.push_back({{"name", e->name.full}, {"message", why_no_breakdown(*e)}});
    out << json{{"models", models}, {"without_breakdown", without}}.dump(2) << '\n';
    return;
  }
  if (s.format == Format::csv) {
    render_csv_line(out, {"problem", "backend", "op", "us_per_step", "share", "step_us", "coverage", "instrumented_ratio"});
    for (const BreakdownPair& pr : b.pairs)
      for (const auto* side : {&pr.cpu, &pr.cuda}) {
        if (!*side) continue;
        const BreakdownStep& st = **side;
        for (const BreakdownOp& o : st.ops)
          render_csv_line(out, {pr.problem, st.entry->name.backend, o.op, num(o.us), num(o.share), num(st.step_us),
                                num(st.coverage), num(st.ratio)});
      }
    return;
  }
  const bool md = s.format == Format::md;
  out << (md ? "### hotops-compare breakdown: where each model step's time goes, by op\n\n"
             : "where each model step's time goes, by op: time per step and share of the instrumented step; CPU/GPU "
               "above 1: the GPU is faster at that op\n");
  for (const BreakdownPair& pr : b.pairs) {
    out << (md ? "\n#### " : "\n") << pr.problem << "\n";
    for (const auto& [side, label] : {std::pair{&pr.cpu, "CPU"}, std::pair{&pr.cuda, "GPU"}}) {
      if (!*side) continue;
      const BreakdownStep& st = **side;
      out << (md ? "\n- " : "  ") << label << ": " << us(st.step_us) << " a step instrumented ("
          << (std::isfinite(st.ratio) ? fmt("%.2fx", st.ratio) : std::string("?")) << " the entry's "
          << format_time(st.entry->time_ns()) << "), the ops cover " << pct(st.coverage) << "\n";
    }
    if (md) out << '\n';
    Table t;
    const bool both = pr.cpu && pr.cuda;
    t.head = {"op"};
    if (pr.cpu) t.head.insert(t.head.end(), {"CPU time", "CPU share", "CPU #"});
    if (pr.cuda) t.head.insert(t.head.end(), {"GPU time", "GPU share", "GPU #"});
    if (both) t.head.push_back("CPU/GPU");
    t.right.assign(t.head.size(), true);
    t.right.front() = false;
    for (const std::string& op : pr.ops) {
      std::vector<std::string> c{op};
      std::vector<Colour> col{plain};
      const BreakdownOp* x = find(pr.cpu, op);
      const BreakdownOp* y = find(pr.cuda, op);
      if (pr.cpu) c.insert(c.end(), {x ? us(x->us) : "", x ? pct(x->share) : "", rank(pr.cpu, x)});
      if (pr.cuda) c.insert(c.end(), {y ? us(y->us) : "", y ? pct(y->share) : "", rank(pr.cuda, y)});
      col.resize(c.size(), plain);
      if (both) {
        const double r = x && y && y->us > 0 ? x->us / y->us : std::nan("");
        c.push_back(std::isfinite(r) ? times(r) : "-");
        col.push_back(!std::isfinite(r) ? plain : r > 1 ? green : red);
      }
      t.add(c, col);
    }
    if (md) render_md(out, t);
    else render_console(out, t, s.colour);
  }
  if (!b.without.empty()) {
    out << (md ? "\n#### Model entries without a breakdown\n\n" : "\nmodel entries without a breakdown\n");
    Table t;
    t.head = {"entry", "why"};
    t.right = {false, false};
    for (const Entry* e : b.without) t.add({e->name.full, why_no_breakdown(*e)});
    if (md) render_md(out, t);
    else render_console(out, t, s.colour);
  }
}

std::string format_bytes(long long bytes) {
  static const char* const units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (u < 4 && bytes >= 1024 && bytes % 1024 == 0) bytes /= 1024, ++u;
  return std::to_string(bytes) + " " + units[u];
}

void print_scaling(std::ostream& out, const Scaling& sc, const Style& s) {
  const auto gbps = [](double v) { return std::isfinite(v) ? fmt("%.1f", v / 1e9) : std::string("-"); };
  const auto rate = [](double v) { return std::isfinite(v) ? fmt("%.4g", v) : std::string("-"); };
  const auto crossover = [](const std::optional<long long>& c) { return c ? std::to_string(*c) : std::string("none"); };
  if (s.format == Format::json) {
    json groups = json::array();
    for (const ScalingGroup& g : sc.groups) {
      json rows = json::array();
      for (const ScalingRow& r : g.rows) {
        json cells = json::array();
        for (const ScalingCell& c : r.cells) {
          json x{{"gpus", c.gpus}, {"name", c.entry->name.full}};
          if (g.collective) {
            x["busbw_GBps"] = jnum(c.value / 1e9);
            x["algbw_GBps"] = jnum(c.entry->counter("algbw").value_or(NAN) / 1e9);
          } else {
            x["samples_per_second"] = jnum(c.value);
            x["speedup"] = jnum(c.speedup);
            x["efficiency"] = jnum(c.efficiency);
          }
          cells.push_back(x);
        }
        rows.push_back({{g.collective ? "bytes" : "batch_per_gpu", r.at}, {"cells", cells}});
      }
      json x{{"group", g.title}, {"kind", g.collective ? "collective" : "model"}, {"gpus", g.gpus}, {"rows", rows}};
      if (!g.collective) {
        json c = json::object();
        for (const auto& [n, b] : g.crossover) c[std::to_string(n)] = b ? json(*b) : json(nullptr);
        x["crossover_batch_per_gpu"] = c;
      }
      groups.push_back(x);
    }
    out << json{{"min_speedup", sc.min_speedup}, {"groups", groups}, {"unmeasured", unmeasured_json(sc.unmeasured)}}.dump(2) << '\n';
    return;
  }
  if (s.format == Format::csv) {
    render_csv_line(out, {"group", "kind", "bytes_or_batch_per_gpu", "gpus", "busbw_GBps", "samples_per_second", "speedup",
                          "efficiency", "name"});
    for (const ScalingGroup& g : sc.groups)
      for (const ScalingRow& r : g.rows)
        for (const ScalingCell& c : r.cells)
          render_csv_line(out, {g.title, g.collective ? "collective" : "model", std::to_string(r.at), std::to_string(c.gpus),
                                g.collective ? num(c.value / 1e9) : "", g.collective ? "" : num(c.value), num(c.speedup),
                                num(c.efficiency), c.entry->name.full});
    return;
  }
  const bool md = s.format == Format::md;
  out << (md ? "### hotops-compare scaling: what more GPUs buy\n"
             : "what more GPUs buy: collectives' bus bandwidth (GB/s, nccl-tests' busbw) by GPU count at each size; "
               "model steps' samples/s by GPU count at each per-GPU batch, with the efficiency samples/s(G) / "
               "(G x samples/s(1))\n");
  for (const ScalingGroup& g : sc.groups) {
    out << (md ? "\n#### " : "\n") << g.title << (g.collective ? " - busbw (GB/s)" : " - samples/s (efficiency)") << "\n";
    if (md) out << '\n';
    Table t;
    t.head = {g.collective ? "size" : "batch/GPU"};
    for (int n : g.gpus) t.head.push_back(std::to_string(n) + (n == 1 ? " GPU" : " GPUs"));
    t.right.assign(t.head.size(), true);
    for (const ScalingRow& r : g.rows) {
      std::vector<std::string> cells{g.collective ? format_bytes(r.at) : std::to_string(r.at)};
      std::vector<Colour> colours{plain};
      for (int n : g.gpus) {
        const ScalingCell* c = r.cell(n);
        if (!c) {
          cells.push_back(""), colours.push_back(plain);
        } else if (g.collective) {
          cells.push_back(gbps(c->value)), colours.push_back(plain);
        } else {
          const bool scaled = c->efficiency && n > 1;
          cells.push_back(rate(c->value) + (scaled ? fmt(" (%.2f)", *c->efficiency) : ""));
          colours.push_back(!scaled || !c->speedup ? plain : *c->speedup >= sc.min_speedup ? green : red);
        }
      }
      t.add(cells, colours);
    }
    if (md) render_md(out, t);
    else render_console(out, t, s.colour);
    if (!g.crossover.empty()) {
      std::string line;
      for (const auto& [n, b] : g.crossover) line += (line.empty() ? "" : "; ") + std::to_string(n) + " GPUs: " + crossover(b);
      out << (md ? "\n" : "") << "crossover (the smallest batch/GPU from which G GPUs give at least " << fmt("%.3g", sc.min_speedup)
          << "x one GPU's samples/s, at every larger batch too): " << line << "\n";
    }
  }
  if (!sc.unmeasured.empty()) {
    Table t;
    t.head = {"entry", "why"};
    t.right = {false, false};
    for (const Entry* e : sc.unmeasured) t.add({e->name.full, no_time_message(*e)});
    render_section(out, s, "Entries without a time", "entries without a time", t);
  }
}

void print_threads(std::ostream& out, const Threads& th, const Style& s) {
  const auto head = [](int t) { return std::to_string(t) + (t == 1 ? " thread" : " threads"); };
  if (s.format == Format::json) {
    json groups = json::array();
    for (const ThreadsGroup& g : th.groups) {
      json rows = json::array();
      for (const ThreadsRow& r : g.rows) {
        json cells = json::array();
        for (const ThreadsCell& c : r.cells)
          cells.push_back({{"threads", c.threads}, {"name", c.entry->name.full}, {"time_ns", jnum(c.entry->time_ns())},
                           {"speedup", jnum(c.speedup)}, {"efficiency", jnum(c.efficiency)}, {"marks", c.marks}});
        rows.push_back({{"variant", r.variant}, {"fastest_threads", r.fastest}, {"cells", cells}});
      }
      groups.push_back({{"op", g.op}, {"threads", g.threads}, {"rows", rows}});
    }
    out << json{{"groups", groups}, {"unmeasured", unmeasured_json(th.unmeasured)}}.dump(2) << '\n';
    return;
  }
  if (s.format == Format::csv) {
    render_csv_line(out, {"op", "variant", "threads", "time_ns", "speedup_vs_1_thread", "efficiency", "marks", "name"});
    for (const ThreadsGroup& g : th.groups)
      for (const ThreadsRow& r : g.rows)
        for (const ThreadsCell& c : r.cells)
          render_csv_line(out, {g.op, r.variant, std::to_string(c.threads), num(c.entry->time_ns()), num(c.speedup),
                                num(c.efficiency), join(c.marks, "; "), c.entry->name.full});
    return;
  }
  const bool md = s.format == Format::md;
  out << (md ? "### hotops-compare threads: CPU time by thread count\n"
             : "CPU time by thread count; in brackets the speed-up over one thread, time(1) / time(T), and the "
               "efficiency speed-up / T\n");
  if (md) out << "\nEach cell: time per execution (speed-up over one thread, efficiency = speed-up / threads).\n";
  bool marked = false;
  for (const ThreadsGroup& g : th.groups)
    for (const ThreadsRow& r : g.rows)
      for (const ThreadsCell& c : r.cells) marked |= !c.marks.empty();
  if (marked) out << (md ? "\n" : "") << kMarkLegend;
  for (const ThreadsGroup& g : th.groups) {
    Table t;
    t.head = {"variant"};
    for (int n : g.threads) t.head.push_back(head(n));
    t.head.push_back("fastest");
    t.right.assign(t.head.size(), true);
    t.right.front() = false;
    for (const ThreadsRow& r : g.rows) {
      std::vector<std::string> cells{r.variant};
      std::vector<Colour> colours{plain};
      for (int n : g.threads) {
        const auto it = std::find_if(r.cells.begin(), r.cells.end(), [n](const ThreadsCell& c) { return c.threads == n; });
        if (it == r.cells.end()) {
          cells.push_back(""), colours.push_back(plain);
          continue;
        }
        std::string text = format_time(it->entry->time_ns()) + mark_symbols(it->marks);
        if (it->speedup && n != 1) text += " (" + times(*it->speedup) + ", " + fmt("%.0f%%", *it->efficiency * 100) + ")";
        cells.push_back(text);
        colours.push_back(!it->speedup || n == 1 ? plain : *it->speedup > 1 ? green : red);
      }
      cells.push_back(head(r.fastest));
      colours.push_back(plain);
      t.add(cells, colours);
    }
    if (md) {
      out << "\n#### " << g.op << "\n\n";
      render_md(out, t);
    } else {
      out << "\n" << g.op << "\n";
      render_console(out, t, s.colour);
    }
  }
  render_unmeasured(out, s, th.unmeasured);
}

void print_spread(std::ostream& out, const Spread& sp, const Style& s) {
  const auto pct = [](double p) { return fmt(p < 10 ? "%.2f%%" : "%.1f%%", p); };
  if (s.format == Format::json) {
    json rows = json::array();
    for (const SpreadRow& r : sp.rows) {
      json t = json::array();
      for (double x : r.times_ns) t.push_back(jnum(x));
      rows.push_back({{"name", r.first->name.full}, {"times_ns", t}, {"fastest_ns", jnum(r.fastest_ns)},
                      {"slowest_ns", jnum(r.slowest_ns)}, {"spread_pct", jnum(r.spread_pct)}, {"runs_timed", r.timed},
                      {"label_sets", r.label_sets}, {"marks", r.marks}});
    }
    out << json{{"runs", sp.sources}, {"max_spread_pct", sp.max_spread_pct}, {"median_spread_pct", jnum(sp.median_spread_pct)},
                {"over", sp.over}, {"rows", rows}}
               .dump(2)
        << '\n';
    return;
  }
  if (s.format == Format::csv) {
    render_csv_line(out, {"name", "runs_timed", "fastest_ns", "slowest_ns", "spread_pct", "label_sets", "marks"});
    for (const SpreadRow& r : sp.rows)
      render_csv_line(out, {r.first->name.full, std::to_string(r.timed), num(r.fastest_ns), num(r.slowest_ns),
                            num(r.spread_pct), std::to_string(r.label_sets), join(r.marks, "; ")});
    return;
  }
  const bool md = s.format == Format::md;
  const std::string summary = std::to_string(sp.rows.size()) + " entries over " + std::to_string(sp.sources.size()) +
                              " runs: median spread " + pct(sp.median_spread_pct) + ", " + std::to_string(sp.over) +
                              " over " + pct(sp.max_spread_pct);
  out << (md ? "### hotops-compare spread: the same entries in separate runs\n\n" + summary + ".\n"
             : "The same entries in separate runs: spread = slowest / fastest - 1; sets = different labels (algorithms)\n" +
                   summary + "\n");
  bool marked = false;
  for (const SpreadRow& r : sp.rows) marked |= !r.marks.empty();
  if (marked) out << (md ? "\n" : "") << kMarkLegend;
  Table t;
  t.head = {"entry", "runs", "fastest", "slowest", "spread", "sets"};
  t.right = {false, true, true, true, true, true};
  for (const SpreadRow& r : sp.rows) {
    const bool over = r.spread_pct > sp.max_spread_pct;
    t.add({r.first->name.full + mark_symbols(r.marks), std::to_string(r.timed), format_time(r.fastest_ns),
           format_time(r.slowest_ns), pct(r.spread_pct), std::to_string(r.label_sets)},
          {plain, plain, plain, plain, over ? red : plain, r.label_sets > 1 ? yellow : plain});
  }
  out << '\n';
  if (md) render_md(out, t);
  else render_console(out, t, s.colour);
}

int export_run(std::ostream& out, const Run& run, Tracker t) {
  int left_out = 0;
  if (t == Tracker::github_action_benchmark) {
    json list = json::array();
    for (const Entry& e : run.entries) {
      if (!e.has_time()) {
        ++left_out;
        continue;
      }
      json x{{"name", export_name(e)}, {"unit", "ns"}, {"value", e.time_ns()}};
      if (e.samples_ns.size() >= 2) {
        const auto [lo, hi] = std::minmax_element(e.samples_ns.begin(), e.samples_ns.end());
        x["range"] = fmt("%.6g", *lo) + " .. " + fmt("%.6g", *hi) + " ns";
      }
      std::string extra = std::to_string(std::max<std::size_t>(1, e.samples_ns.size())) + " repetitions (median)";
      for (const std::string& c : rate_counters())
        if (const auto v = e.counter(c)) extra += "\n" + c + ": " + fmt("%.6g", *v);
      if (!e.label.empty()) extra += "\n" + e.label;
      x["extra"] = extra;
      list.push_back(x);
    }
    out << list.dump(2) << '\n';
    return left_out;
  }
  json bmf = json::object();
  for (const Entry& e : run.entries) {
    if (!e.has_time()) {
      ++left_out;
      continue;
    }
    json latency{{"value", e.time_ns()}};
    if (e.samples_ns.size() >= 2) {
      const auto [lo, hi] = std::minmax_element(e.samples_ns.begin(), e.samples_ns.end());
      latency["lower_value"] = *lo;
      latency["upper_value"] = *hi;
    }
    json measures{{"latency", latency}};
    if (const auto items = e.counter("items_per_second")) measures["throughput"] = {{"value", *items}};
    bmf[export_name(e)] = measures;
  }
  out << bmf.dump(2) << '\n';
  return left_out;
}

}  // namespace hotops::compare
