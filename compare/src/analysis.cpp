// Diff, speed-up, cost and gate over runs read by run.h.
#include "compare/src/analysis.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <regex>
#include <set>
#include <sstream>
#include <tuple>

namespace hotops::compare {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

bool all_digits(const std::string& s) {
  return !s.empty() && s.size() <= 18 && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

// An arg value with the batch taken out, when it follows the batch: an integer that is a fixed
// multiple of it (M = batch x tokens), or an `x`-separated shape that holds it (dims:32x128x3072).
// nullopt when the value does not involve the batch.
std::optional<std::string> batch_relative(const std::string& value, long long batch) {
  if (batch <= 0) return std::nullopt;
  if (all_digits(value)) {
    const long long v = std::stoll(value);
    if (v % batch != 0) return std::nullopt;
    const long long k = v / batch;
    return k == 1 ? std::string("batch") : "batch*" + std::to_string(k);
  }
  const std::vector<std::string> tokens = split(value, 'x');
  if (tokens.size() < 2) return std::nullopt;
  bool found = false;
  std::string out;
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    const bool is_batch = tokens[i] == std::to_string(batch);
    found |= is_batch;
    out += (i ? "x" : "") + (is_batch ? std::string("batch") : tokens[i]);
  }
  if (!found) return std::nullopt;
  return out;
}

}  // namespace

Prices parse_prices(const std::string& spec) {
  Prices p;
  std::stringstream s(spec);
  std::string item;
  while (std::getline(s, item, ',')) {
    const std::size_t eq = item.find('=');
    const std::string backend = eq == std::string::npos ? "" : item.substr(0, eq);
    if (backend != "cpu" && backend != "cuda")
      throw InputError("--cost: expected cpu=USD_PER_HOUR,cuda=USD_PER_HOUR, got \"" + spec + "\"");
    const std::string value = item.substr(eq + 1);
    char* end = nullptr;
    const double v = std::strtod(value.c_str(), &end);
    if (value.empty() || *end != '\0' || !std::isfinite(v) || v < 0)
      throw InputError("--cost: \"" + value + "\" is not a price in USD per hour (for " + backend + ")");
    p[backend] = v;
  }
  if (p.empty()) throw InputError("--cost: expected cpu=USD_PER_HOUR,cuda=USD_PER_HOUR, got \"" + spec + "\"");
  return p;
}

std::optional<double> cost_per_million(const Entry& e, const Prices& prices) {
  if (!e.has_time()) return std::nullopt;
  const auto price = prices.find(e.name.backend);
  const auto items = e.counter("items_per_second");
  if (price == prices.end() || !items || *items <= 0) return std::nullopt;
  return price->second / 3600.0 / *items * 1e6;
}

const std::vector<std::string>& rate_counters() {
  static const std::vector<std::string> c{"FLOP/s", "bytes_per_second", "items_per_second", "samples/s"};
  return c;
}

const char* status_name(DiffStatus s) {
  switch (s) {
    case DiffStatus::both: return "compared";
    case DiffStatus::only_base: return "only in base";
    case DiffStatus::only_new: return "only in new";
    case DiffStatus::error_base: return "error in base";
    case DiffStatus::error_new: return "error in new";
    case DiffStatus::error_both: return "error in both";
  }
  return "?";
}

std::vector<std::string> machine_differences(const Run& a, const Run& b) {
  std::vector<std::string> out;
  for (const char* key : {"host_name", "cpu_model", "gpu_name", "num_cpus"}) {
    const auto x = a.context.find(key), y = b.context.find(key);
    if (x == a.context.end() && y == b.context.end()) continue;
    const std::string vx = x == a.context.end() ? "(none)" : x->second;
    const std::string vy = y == b.context.end() ? "(none)" : y->second;
    if (vx != vy) out.push_back(std::string(key) + " \"" + vx + "\" vs \"" + vy + "\"");
  }
  return out;
}

namespace {
// A setting's value in a run's context; a hotops run made before --hotops_cpu_ftz existed ran with
// IEEE subnormals, so it counts as 0 there.
std::optional<std::string> setting(const Run& run, const std::string& key) {
  if (const auto i = run.context.find(key); i != run.context.end()) return i->second;
  if (key == "hotops_cpu_ftz" && run.context.count("hotops_version")) return "0";
  return std::nullopt;
}
}  // namespace

std::vector<std::string> setting_differences(const Run& a, const Run& b) {
  std::vector<std::string> out;
  for (const char* key : {"threads", "hotops_seed", "hotops_verify", "hotops_cold_l2", "hotops_runs_per_sample",
                          "hotops_throttle_threshold", "hotops_shuffle_layout", "hotops_cpu_ftz", "hotops_max_noise", "hotops_min_time",
                          "build_type"}) {
    const auto x = setting(a, key), y = setting(b, key);
    if (!x || !y || *x == *y) continue;
    out.push_back(std::string(key) + " " + *x + " vs " + *y);
  }
  return out;
}

std::vector<std::string> entry_marks(const Entry& e, double noisy_pct) {
  std::vector<std::string> m;
  if (e.unverified()) m.push_back("unverified");
  const auto noise = e.noise_pct();
  if (noise && !(*noise <= noisy_pct)) m.push_back("noisy");
  if (e.busy()) m.push_back("busy");
  return m;
}

namespace {

// The thread count of a CPU entry: its own counter, else its run's (hotops' context "threads").
std::optional<double> cpu_threads(const Run& run, const Entry& e) {
  if (e.name.backend != "cpu") return std::nullopt;
  if (const auto t = e.threads()) return *t;
  for (const auto& [k, v] : e.name.args)
    if (k == "threads") return std::strtod(v.c_str(), nullptr);
  const auto c = run.context.find("threads");
  if (c == run.context.end()) return std::nullopt;
  return std::strtod(c->second.c_str(), nullptr);
}

void add_mark(std::vector<std::string>& marks, const std::string& m) {
  if (std::find(marks.begin(), marks.end(), m) == marks.end()) marks.push_back(m);
}

// Differences for a warning: "a; b; c".
std::string listed(const std::vector<std::string>& v) {
  std::string s;
  for (const std::string& x : v) s += (s.empty() ? "" : "; ") + x;
  return s;
}

}  // namespace

Diff diff(const Run& base, const Run& next, const Prices& prices, double noisy_pct) {
  Diff d;
  const auto differences = machine_differences(base, next);
  if (!differences.empty())
    d.warnings.push_back("the runs come from different machines (" + listed(differences) + "): differences include the hardware");
  const auto settings = setting_differences(base, next);
  if (!settings.empty()) d.warnings.push_back("the runs differ in their settings (" + listed(settings) + "): differences include them");
  if (base.list_hash != next.list_hash)
    d.warnings.push_back(
        "the runs did not run the same entries (another --benchmark_filter, or a build with other entries): an "
        "entry's time also depends on what ran before it in its process (docs/timing.md); for a before/after, "
        "run both builds with one filter");
  for (const Run* r : {&base, &next}) {
    const auto v = r->context.find("hotops_verify");
    if (v != r->context.end() && v->second == "0")
      d.warnings.push_back(r->source + " ran with --hotops_verify=0: its times were not checked (marked unverified)");
  }
  std::vector<double> ratios;
  const auto add = [&](const Entry* b, const Entry* n) {
    DiffRow r;
    r.name = (b ? b : n)->name.full;
    r.base = b;
    r.next = n;
    if (b) r.base_cost = cost_per_million(*b, prices);
    if (n) r.new_cost = cost_per_million(*n, prices);
    const bool bt = b && b->has_time(), nt = n && n->has_time();
    if (!b) r.status = nt ? DiffStatus::only_new : DiffStatus::error_new;
    else if (!n) r.status = bt ? DiffStatus::only_base : DiffStatus::error_base;
    else if (bt && nt) r.status = DiffStatus::both;
    else if (!bt && !nt) r.status = DiffStatus::error_both;
    else r.status = bt ? DiffStatus::error_new : DiffStatus::error_base;
    // An entry only in new that failed is listed as an error in new: it is not a time to compare.
    if (!b && !nt) r.status = DiffStatus::error_new;
    if (r.status == DiffStatus::both) {
      r.base_ns = b->time_ns();
      r.new_ns = n->time_ns();
      r.ratio = r.base_ns > 0 ? r.new_ns / r.base_ns : (r.new_ns > 0 ? std::numeric_limits<double>::infinity() : 1.0);
      if (b->samples_ns.size() >= 2 && n->samples_ns.size() >= 2) r.utest = mann_whitney_u(b->samples_ns, n->samples_ns);
      for (const std::string& c : rate_counters()) {
        const auto cb = b->counter(c), cn = n->counter(c);
        if (cb && cn && *cb > 0) r.counter_ratio[c] = *cn / *cb;
      }
      for (const Entry* e : {b, n})
        for (const std::string& m : entry_marks(*e, noisy_pct)) add_mark(r.marks, m);
      const auto tb = cpu_threads(base, *b), tn = cpu_threads(next, *n);
      if (tb && tn && *tb != *tn) add_mark(r.marks, "threads " + fmt("%g", *tb) + " vs " + fmt("%g", *tn));
      if (r.ratio > 0 && std::isfinite(r.ratio)) ratios.push_back(r.ratio);
      ++d.compared;
    } else if (n && nt) {
      r.marks = entry_marks(*n, noisy_pct);
    }
    d.rows.push_back(std::move(r));
  };
  for (const Entry& b : base.entries) add(&b, next.find(b.name.full));
  for (const Entry& n : next.entries)
    if (!base.find(n.name.full)) add(nullptr, &n);
  d.geomean_ratio = ratios.empty() ? kNaN : geometric_mean(ratios);
  return d;
}

std::optional<UTest> utest_against_scaled_base(const DiffRow& r, double factor) {
  if (r.status != DiffStatus::both || !r.utest) return std::nullopt;
  std::vector<double> scaled = r.base->samples_ns;
  for (double& t : scaled) t *= factor;
  return mann_whitney_u(scaled, r.next->samples_ns);
}

Speedup speedup(const Run& cpu_run, const Run& cuda_run, const Prices& prices, double noisy_pct) {
  Speedup s;
  if (&cpu_run != &cuda_run) {
    // Two machines are the point here; say so only when the backend sources are mixed up.
    bool cpu_has_cpu = false, cuda_has_cuda = false;
    for (const Entry& e : cpu_run.entries) cpu_has_cpu |= e.name.backend == "cpu";
    for (const Entry& e : cuda_run.entries) cuda_has_cuda |= e.name.backend == "cuda";
    if (!cpu_has_cpu) s.warnings.push_back(cpu_run.source + " holds no cpu entries");
    if (!cuda_has_cuda) s.warnings.push_back(cuda_run.source + " holds no cuda entries");
  }
  std::map<std::string, const Entry*> cpu, cuda;  // problem -> entry with a time
  for (const auto& [run, backend, side] : {std::tuple{&cpu_run, "cpu", &cpu}, std::tuple{&cuda_run, "cuda", &cuda}})
    for (const Entry& e : run->entries) {
      if (!e.name.hotops || e.name.backend != backend) continue;
      if (e.has_time()) side->emplace(e.name.problem(), &e);
      else s.unmeasured.push_back(&e);
    }

  // Families: op/dtype/direction, the arg keys in order, and the values of the args before
  // `batch`. Within a family, an arg after `batch` follows the batch when its values differ but
  // all have the same batch-relative form (M = batch x 128 at every batch): such args leave the
  // row's key, so that one row spans the batches of one layer.
  struct Member {
    const Name* name;
    long long batch;
    std::size_t batch_at;
  };
  std::map<std::string, std::vector<Member>> families;
  std::set<std::string> problems;
  for (const auto* side : {&cpu, &cuda})
    for (const auto& [problem, e] : *side) {
      if (!problems.insert(problem).second) continue;
      const Name& n = e->name;
      const auto b = n.batch();
      std::string key = n.op + "/" + n.dtype + "/" + n.direction;
      std::size_t at = n.args.size();
      for (std::size_t i = 0; i < n.args.size(); ++i) {
        key += "/" + n.args[i].first;
        if (n.args[i].first == "batch") at = i;
        if (at == n.args.size()) key += ":" + n.args[i].second;  // values before batch
      }
      families[key].push_back({&n, b ? *b : 0, b ? at : n.args.size()});
    }
  std::map<std::string, std::string> row_of;  // problem -> row key (variant)
  for (const auto& [key, members] : families) {
    std::set<long long> batches;
    for (const Member& m : members) batches.insert(m.batch);
    const Name& first = *members.front().name;
    std::vector<bool> derived(first.args.size(), false);
    const std::size_t at = members.front().batch_at;
    if (at < first.args.size() && batches.size() >= 2) {
      for (std::size_t i = at + 1; i < first.args.size(); ++i) {
        std::set<std::string> raw, relative;
        bool follows = true;
        for (const Member& m : members) {
          raw.insert(m.name->args[i].second);
          const auto r = batch_relative(m.name->args[i].second, m.batch);
          if (!r) follows = false;
          else relative.insert(*r);
        }
        derived[i] = follows && raw.size() >= 2 && relative.size() == 1;
      }
    }
    for (const Member& m : members) {
      std::string variant = m.name->dtype + "/" + m.name->direction;
      for (std::size_t i = 0; i < m.name->args.size(); ++i) {
        if (i == m.batch_at) continue;
        const auto& [k, v] = m.name->args[i];
        variant += "/" + k + ":" + (derived[i] ? *batch_relative(v, m.batch) : v);
      }
      row_of[m.name->problem()] = variant;
    }
  }

  std::map<std::string, std::map<std::string, SpeedupRow>> grouped;  // op -> variant -> row
  for (const auto& [problem, c] : cpu) {
    const auto g = cuda.find(problem);
    if (g == cuda.end()) {
      ++s.cpu_only;
      continue;
    }
    ++s.pairs;
    SpeedupCell cell;
    cell.problem = problem;
    cell.batch = c->name.batch().value_or(0);
    cell.cpu = c;
    cell.cuda = g->second;
    const double gpu_ns = g->second->time_ns();
    cell.speedup = gpu_ns > 0 ? c->time_ns() / gpu_ns : std::numeric_limits<double>::infinity();
    cell.cpu_cost = cost_per_million(*c, prices);
    cell.cuda_cost = cost_per_million(*g->second, prices);
    for (const Entry* e : {c, g->second})
      for (const std::string& m : entry_marks(*e, noisy_pct)) add_mark(cell.marks, m);
    SpeedupRow& row = grouped[c->name.op][row_of[problem]];
    row.variant = row_of[problem];
    row.cells.push_back(cell);
  }
  for (const auto& [problem, g] : cuda)
    if (!cpu.count(problem)) ++s.cuda_only;

  for (auto& [op, rows] : grouped) {
    SpeedupGroup group;
    group.op = op;
    std::set<long long> batches;
    for (auto& [variant, row] : rows) {
      std::sort(row.cells.begin(), row.cells.end(), [](const SpeedupCell& a, const SpeedupCell& b) { return a.batch < b.batch; });
      // Crossover: walk down from the largest batch while the GPU keeps winning.
      for (std::size_t i = row.cells.size(); i-- > 0;) {
        if (!(row.cells[i].speedup > 1)) break;
        row.crossover = row.cells[i].batch;
        row.crossover_at_smallest = i == 0;
      }
      if (row.cells.size() == 1 && row.cells[0].batch == 0) row.crossover.reset();  // no batch axis
      for (const SpeedupCell& c : row.cells) batches.insert(c.batch);
      group.rows.push_back(row);
    }
    group.batches.assign(batches.begin(), batches.end());
    s.groups.push_back(std::move(group));
  }
  return s;
}

const ScalingCell* ScalingRow::cell(int gpus) const {
  for (const ScalingCell& c : cells)
    if (c.gpus == gpus) return &c;
  return nullptr;
}

Scaling scaling(const Run& run, double min_speedup) {
  Scaling out;
  out.min_speedup = min_speedup;
  struct Found {
    std::string title;
    bool collective;
    long long at;
    int gpus;
  };
  // A name's place in the table: its group (the name less gpus and the size or batch), row, column.
  const auto place = [](const Name& n) -> std::optional<Found> {
    if (!n.hotops) return std::nullopt;
    Found f{n.op + "/" + n.backend + "/" + n.dtype + "/" + n.direction, false, 0, 0};
    for (const auto& [k, v] : n.args) f.collective |= k == "bytes";
    for (const auto& [k, v] : n.args) {
      const bool axis = f.collective ? k == "bytes" : k == "batch";
      if (k == "gpus" || axis) {
        if (!all_digits(v)) return std::nullopt;
        if (k == "gpus") f.gpus = static_cast<int>(std::min(std::stoll(v), 1LL << 20));
        else f.at = std::stoll(v);
        continue;
      }
      f.title += "/" + k + ":" + v;
    }
    return f;
  };
  std::vector<std::string> order;
  std::map<std::string, ScalingGroup> groups;
  std::map<std::string, std::map<long long, ScalingRow>> rows;
  const auto add = [&](const Found& f, const Entry& e) {
    if (!e.has_time()) {
      out.unmeasured.push_back(&e);
      return;
    }
    ScalingCell c;
    c.gpus = f.gpus;
    c.entry = &e;
    const auto v = f.collective ? e.counter("busbw") : e.counter("samples/s");
    c.value = v ? *v : e.counter("items_per_second").value_or(kNaN);
    if (!std::isfinite(c.value)) return;
    ScalingRow& r = rows[f.title][f.at];
    r.at = f.at;
    r.cells.push_back(c);
  };
  for (const Entry& e : run.entries) {
    const auto f = place(e.name);
    if (!f || f->gpus == 0) continue;
    if (!groups.count(f->title)) {
      order.push_back(f->title);
      groups[f->title].title = f->title;
      groups[f->title].collective = f->collective;
    }
    add(*f, e);
  }
  if (groups.empty())
    throw InputError(run.source + ": no entry runs over several GPUs (a gpus:G arg; bench --hotops_gpus=G writes them)");
  // One GPU without a gpus arg: the model step's own entry, the baseline of its data-parallel ones.
  for (const Entry& e : run.entries) {
    auto f = place(e.name);
    if (!f || f->gpus != 0 || f->collective || !groups.count(f->title) || !e.has_time()) continue;
    f->gpus = 1;
    add(*f, e);
  }
  for (const std::string& title : order) {
    ScalingGroup g = std::move(groups[title]);
    std::set<int> counts;
    for (auto& [at, r] : rows[title]) {
      std::sort(r.cells.begin(), r.cells.end(), [](const ScalingCell& a, const ScalingCell& b) { return a.gpus < b.gpus; });
      r.cells.erase(std::unique(r.cells.begin(), r.cells.end(), [](const ScalingCell& a, const ScalingCell& b) { return a.gpus == b.gpus; }),
                    r.cells.end());
      const ScalingCell* one = r.cell(1);
      for (ScalingCell& c : r.cells) {
        counts.insert(c.gpus);
        if (g.collective || !one || !(one->value > 0)) continue;
        c.speedup = c.value / one->value;
        c.efficiency = *c.speedup / c.gpus;
      }
      g.rows.push_back(r);
    }
    if (g.rows.empty()) continue;  // only failed entries: listed among the unmeasured
    g.gpus.assign(counts.begin(), counts.end());
    if (!g.collective)
      for (int n : g.gpus) {
        if (n <= 1) continue;
        std::optional<long long> from;
        bool seen = false;
        // Walk down from the largest batch while G GPUs keep their lead over one.
        for (std::size_t i = g.rows.size(); i-- > 0;) {
          const ScalingCell* c = g.rows[i].cell(n);
          if (!c || !c->speedup) continue;
          seen = true;
          if (!(*c->speedup >= min_speedup)) break;
          from = g.rows[i].at;
        }
        if (seen) g.crossover[n] = from;
      }
    out.groups.push_back(std::move(g));
  }
  return out;
}

Threads threads(const Run& run, double noisy_pct) {
  Threads out;
  // The run's own thread count, for an entry that says nothing of its threads.
  std::optional<int> run_threads;
  const auto ctx = run.context.find("threads");
  if (ctx != run.context.end() && all_digits(ctx->second)) run_threads = static_cast<int>(std::min(std::stoll(ctx->second), 1LL << 20));

  struct Sweep {
    std::string op;
    ThreadsRow row;
  };
  std::vector<std::string> order;          // problems (the name less threads, backend and suffix)
  std::map<std::string, Sweep> sweeps;
  std::map<std::string, std::vector<const Entry*>> failed;
  for (const Entry& e : run.entries) {
    const Name& n = e.name;
    if (!n.hotops || n.backend != "cpu") continue;
    std::string variant = n.dtype + "/" + n.direction;
    std::optional<int> t;
    bool swept = false;
    for (const auto& [k, v] : n.args) {
      if (k == "threads" && all_digits(v)) {
        t = static_cast<int>(std::min(std::stoll(v), 1LL << 20));
        swept = true;
        continue;
      }
      variant += "/" + k + ":" + v;
    }
    if (!t) {
      if (const auto c = e.threads(); c && *c >= 1 && *c < (1 << 20)) t = static_cast<int>(*c);
      else t = run_threads;
    }
    const std::string problem = n.op + "/" + variant;
    if (!sweeps.count(problem)) {
      order.push_back(problem);
      sweeps[problem].op = n.op;
      sweeps[problem].row.variant = variant;
    }
    if (!e.has_time()) {
      failed[problem].push_back(&e);
      continue;
    }
    if (!t || *t < 1) continue;
    auto& cells = sweeps[problem].row.cells;
    const auto same = std::find_if(cells.begin(), cells.end(), [&t](const ThreadsCell& c) { return c.threads == *t; });
    // A sweep entry and the all-threads entry at the same count: the sweep's entry names it.
    if (same != cells.end()) {
      if (swept) same->entry = &e;
      continue;
    }
    ThreadsCell c;
    c.threads = *t;
    c.entry = &e;
    cells.push_back(c);
  }

  std::map<std::string, ThreadsGroup> groups;
  for (const std::string& problem : order) {
    Sweep& sw = sweeps[problem];
    ThreadsRow& row = sw.row;
    const bool sweep = row.cells.size() + failed[problem].size() >= 2;
    if (!sweep) continue;
    for (const Entry* e : failed[problem]) out.unmeasured.push_back(e);
    if (row.cells.size() < 2) continue;
    std::sort(row.cells.begin(), row.cells.end(), [](const ThreadsCell& a, const ThreadsCell& b) { return a.threads < b.threads; });
    const ThreadsCell* one = row.cells.front().threads == 1 ? &row.cells.front() : nullptr;
    double best = std::numeric_limits<double>::infinity();
    for (ThreadsCell& c : row.cells) {
      c.marks = entry_marks(*c.entry, noisy_pct);
      const double ns = c.entry->time_ns();
      if (ns < best) best = ns, row.fastest = c.threads;
      if (!one || !(ns > 0)) continue;
      c.speedup = one->entry->time_ns() / ns;
      c.efficiency = *c.speedup / c.threads;
    }
    ThreadsGroup& g = groups[sw.op];
    g.op = sw.op;
    for (const ThreadsCell& c : row.cells)
      if (std::find(g.threads.begin(), g.threads.end(), c.threads) == g.threads.end()) g.threads.push_back(c.threads);
    std::sort(g.threads.begin(), g.threads.end());
    g.rows.push_back(row);
  }
  if (groups.empty())
    throw InputError(run.source + ": no CPU problem is measured at two or more thread counts (threads:T args; bench's model "
                                  "steps have them)");
  for (auto& [op, g] : groups) out.groups.push_back(std::move(g));
  return out;
}

Gate gate(const Run& base, const Run& next, const GateOptions& o) {
  Gate g;
  g.diff = diff(base, next);
  for (const DiffRow& r : g.diff.rows) {
    // A time bench did not check passes no gate, new or not: it may be the time of a wrong result.
    if (r.next && r.next->has_time() && r.next->unverified()) {
      g.failures.push_back({r.name, "not verified (--hotops_verify=0): a time whose output was not checked cannot pass"});
      continue;
    }
    for (const std::string& m : r.marks)
      if (m.rfind("threads", 0) == 0) g.notes.push_back(r.name + ": compared across different thread counts (" + m + ")");
    switch (r.status) {
      case DiffStatus::only_base:
        g.failures.push_back({r.name, "vanished: in base, not in new"});
        continue;
      case DiffStatus::error_new:
        if (r.base) g.failures.push_back({r.name, "now fails: " + (r.next && !r.next->message.empty() ? r.next->message : "no time")});
        else g.notes.push_back(r.name + ": new entry that fails: " + (r.next->message.empty() ? "no time" : r.next->message));
        continue;
      case DiffStatus::error_both:
        g.notes.push_back(r.name + ": fails in both runs: " + r.next->message);
        continue;
      case DiffStatus::error_base:
        g.notes.push_back(r.name + ": failed in base, passes now");
        continue;
      case DiffStatus::only_new:
        continue;
      case DiffStatus::both:
        break;
    }
    const double pct = (r.ratio - 1) * 100;
    if (!(pct > o.max_slowdown_pct)) continue;
    const std::string slower = fmt("%+.1f%%", pct) + " slower than base (threshold " + fmt("%g%%", o.max_slowdown_pct) + ")";
    if (!r.utest) {
      g.failures.push_back({r.name, slower + "; single measurements, no significance test"});
      continue;
    }
    const int n1 = static_cast<int>(r.base->samples_ns.size()), n2 = static_cast<int>(r.next->samples_ns.size());
    if (min_two_sided_p(n1, n2) >= o.alpha) {
      g.failures.push_back({r.name, slower + "; " + std::to_string(n1) + " and " + std::to_string(n2) +
                                        " repetitions cannot reach p < " + fmt("%g", o.alpha) + ", failed on the threshold alone"});
      continue;
    }
    // Significantly slower than the threshold allows: the new repetitions against the base ones
    // scaled by 1 + threshold, so that an entry whose repetitions spread wider than the threshold
    // does not fail on a median that happened to land beyond it.
    const double factor = 1 + o.max_slowdown_pct / 100;
    const UTest beyond = *utest_against_scaled_base(r, factor);
    const std::string tested = "p = " + fmt("%.3g", beyond.p) + " for new against base x " + fmt("%g", factor);
    if (beyond.p < o.alpha) {
      g.failures.push_back({r.name, slower + ", significantly beyond it: " + tested + " < " + fmt("%g", o.alpha)});
    } else {
      g.notes.push_back(r.name + ": " + slower + " but not significantly beyond it (" + tested + " >= " + fmt("%g", o.alpha) +
                        "; p = " + fmt("%.3g", r.utest->p) + " against base)");
    }
  }
  return g;
}

// ---- breakdown -----------------------------------------------------------------------------

namespace {

constexpr char kPartPrefix[] = "breakdown:";

std::optional<BreakdownStep> breakdown_of(const Entry& e) {
  const auto step = e.counter("breakdown_step_us");
  if (!e.has_time() || !step || !(*step > 0)) return std::nullopt;
  BreakdownStep b;
  b.entry = &e;
  b.step_us = *step;
  b.coverage = e.counter("breakdown_coverage").value_or(std::nan(""));
  b.ratio = e.counter("breakdown_ratio").value_or(std::nan(""));
  const std::string prefix = kPartPrefix;
  for (const auto& [key, us] : e.counters)
    if (key.rfind(prefix, 0) == 0 && std::isfinite(us)) b.ops.push_back({key.substr(prefix.size()), us, us / b.step_us});
  std::stable_sort(b.ops.begin(), b.ops.end(), [](const BreakdownOp& x, const BreakdownOp& y) { return x.us > y.us; });
  return b;
}

double share_of(const std::optional<BreakdownStep>& b, const std::string& op) {
  if (b)
    for (const BreakdownOp& o : b->ops)
      if (o.op == op) return o.share;
  return 0;
}

}  // namespace

Breakdown breakdown(const Run& run) {
  Breakdown out;
  std::map<std::string, std::size_t> at;  // problem -> index in out.pairs
  for (const Entry& e : run.entries) {
    if (!e.name.hotops || e.name.op.rfind("model.", 0) != 0) continue;
    std::optional<BreakdownStep> b = breakdown_of(e);
    if (!b) {
      out.without.push_back(&e);
      continue;
    }
    const std::string problem = e.name.problem();
    auto it = at.find(problem);
    if (it == at.end()) {
      it = at.emplace(problem, out.pairs.size()).first;
      out.pairs.push_back(BreakdownPair{problem, std::nullopt, std::nullopt, {}});
    }
    BreakdownPair& pair = out.pairs[it->second];
    (e.name.backend == "cpu" ? pair.cpu : pair.cuda) = std::move(b);
  }
  if (out.pairs.empty())
    throw InputError(run.source + ": no model step entry with a per-op breakdown (model.* entries of a hotops run carry "
                     "breakdown counters)");
  for (BreakdownPair& pair : out.pairs) {
    for (const auto* side : {&pair.cpu, &pair.cuda})
      if (*side)
        for (const BreakdownOp& o : (*side)->ops)
          if (std::find(pair.ops.begin(), pair.ops.end(), o.op) == pair.ops.end()) pair.ops.push_back(o.op);
    std::stable_sort(pair.ops.begin(), pair.ops.end(), [&](const std::string& x, const std::string& y) {
      return std::max(share_of(pair.cpu, x), share_of(pair.cuda, x)) > std::max(share_of(pair.cpu, y), share_of(pair.cuda, y));
    });
  }
  return out;
}

}  // namespace hotops::compare

namespace hotops::compare {

namespace {
// A label with what differs from run to run whatever algorithms ran taken out: its times ("0.0123
// ms", "12 us"), bench's per-run marks (a busy CPU, what stopped the sampling) and whether a choice
// was searched or read from --hotops_choices (the writing run's label and the reading runs' name
// the same algorithm).
std::string label_without_times(const std::string& label) {
  static const std::regex times(R"(\d+(\.\d+)?(e[-+]?\d+)? ?(ms|us|µs|ns|s)\b)");
  // bench's marks of how the run went (the stopping rule, a busy CPU, verification off): not the
  // algorithms; the entry's own marks say them.
  static const std::regex marks(R"( ?\[(BUSY CPU|stopped|NOT VERIFIED)[^\]]*\]|from --hotops_choices, as a search found it: )");
  return std::regex_replace(std::regex_replace(label, marks, ""), times, "T");
}
}  // namespace

Spread spread(const std::vector<Run>& runs, double max_spread_pct, double noisy_pct) {
  if (runs.size() < 2) throw InputError("spread needs two runs or more of the same entries");
  Spread sp;
  sp.max_spread_pct = max_spread_pct;
  for (const Run& r : runs) sp.sources.push_back(r.source);
  for (std::size_t i = 1; i < runs.size(); ++i) {
    const auto m = machine_differences(runs[0], runs[i]), st = setting_differences(runs[0], runs[i]);
    if (!m.empty()) sp.warnings.push_back(runs[i].source + " comes from another machine than " + runs[0].source + " (" + listed(m) + ")");
    if (!st.empty()) sp.warnings.push_back(runs[i].source + " ran with other settings than " + runs[0].source + " (" + listed(st) + ")");
  }
  std::vector<std::string> order;
  std::set<std::string> seen;
  for (const Run& r : runs)
    for (const Entry& e : r.entries)
      if (seen.insert(e.name.full).second) order.push_back(e.name.full);
  std::vector<double> spreads;
  for (const std::string& name : order) {
    SpreadRow row;
    std::set<std::string> labels;
    std::vector<double> timed;
    for (const Run& r : runs) {
      const Entry* e = r.find(name);
      if (e && !row.first) row.first = e;
      if (!e || !e->has_time()) {
        row.times_ns.push_back(std::numeric_limits<double>::quiet_NaN());
        continue;
      }
      row.times_ns.push_back(e->time_ns());
      timed.push_back(row.times_ns.back());
      labels.insert(label_without_times(e->label));
      for (const std::string& m : entry_marks(*e, noisy_pct)) add_mark(row.marks, m);
    }
    if (timed.size() < 2) continue;
    const auto [fastest, slowest] = std::minmax_element(timed.begin(), timed.end());
    row.fastest_ns = *fastest, row.slowest_ns = *slowest;
    if (!(row.fastest_ns > 0)) continue;
    row.timed = static_cast<int>(timed.size());
    row.label_sets = static_cast<int>(labels.size());
    row.spread_pct = 100 * (row.slowest_ns / row.fastest_ns - 1);
    spreads.push_back(row.spread_pct);
    sp.over += row.spread_pct > max_spread_pct;
    sp.rows.push_back(std::move(row));
  }
  if (sp.rows.empty()) throw InputError("no entry has a time in two of the runs");
  sp.median_spread_pct = median(std::move(spreads));
  return sp;
}

}  // namespace hotops::compare
