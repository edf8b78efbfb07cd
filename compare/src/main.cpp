// hotops-compare: diffs, CPU/GPU speed-ups, per-op breakdowns of model steps, CPU thread and multi-GPU scaling and a regression gate
// over Google Benchmark JSON.
// Exit codes: 0 done (gate passed), 1 gate failed, 2 bad input or usage.
#include <CLI/CLI.hpp>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <iostream>

#include "compare/src/analysis.h"
#include "compare/src/report.h"
#include "compare/src/run.h"

namespace {

using namespace hotops::compare;

constexpr int kUsage = 2;

bool terminal_colour() { return ::isatty(STDOUT_FILENO) && !std::getenv("NO_COLOR"); }

void warn(const std::string& w) { std::cerr << "hotops-compare: warning: " << w << '\n'; }

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"hotops-compare: compares hotops' Google Benchmark JSON runs.\n"
               "Exit codes: 0 done (gate: passed), 1 gate failed, 2 bad input or usage."};
  app.name("hotops-compare");
  app.require_subcommand(1);

  std::string base_path, new_path, run_path, other_path, format = "console", cost, tracker, filter;
  double alpha = 0.05, max_slowdown = -1, noise = 1.0, max_noise = kNoisyPct;
  const char* max_noise_help = "PCT: an entry whose samples spread beyond this is marked noisy (default 5)";

  auto* d = app.add_subcommand("diff", "join two runs on names: time ratio, counter ratios, U test, geometric mean");
  d->add_option("BASE", base_path, "baseline run (JSON)")->required();
  d->add_option("NEW", new_path, "new run (JSON)")->required();
  d->add_option("--format", format, "console, md, csv or json");
  d->add_option("--alpha", alpha, "p below this is marked significant (default 0.05)");
  d->add_option("--noise", noise, "PCT: a change not significantly beyond this is not marked, whatever p (default 1)");
  d->add_option("--cost", cost, "cpu=USD_PER_HOUR,cuda=USD_PER_HOUR: cost per million items");
  d->add_option("--filter", filter, "REGEX: only the entries whose names match (e.g. /cuda/), in both runs");
  d->add_option("--max-noise", max_noise, max_noise_help);

  auto* s = app.add_subcommand("speedup", "CPU time / GPU time per problem, batches as columns, crossover batch; entries without a time listed with why");
  s->add_option("RUN", run_path, "a run with both backends, or the CPU machine's run")->required();
  s->add_option("OTHER", other_path, "the GPU machine's run (its cuda entries are used)");
  s->add_option("--format", format, "console, md, csv or json");
  s->add_option("--cost", cost, "cpu=USD_PER_HOUR,cuda=USD_PER_HOUR: cost per million items");
  s->add_option("--max-noise", max_noise, max_noise_help);
  std::string cuda_variant, cpu_variant;
  s->add_option("--cuda-variant", cuda_variant, "KEY:VALUE: the GPU time of the CUDA entries with this arg (e.g. e2e:1, what a program pays) instead of those without it");
  s->add_option("--cpu-variant", cpu_variant, "KEY:VALUE: the CPU time of the CPU entries with this arg (e.g. threads:1) instead of those without it");
  s->add_option("--filter", filter, "REGEX: only the entries whose names match (e.g. ^model\\.mlp_tiny/), in both runs");

  auto* th = app.add_subcommand("threads", "CPU time by thread count (threads:T sweeps): speed-up over one thread and efficiency");
  th->add_option("RUN", run_path, "a run with CPU entries at several thread counts")->required();
  th->add_option("--format", format, "console, md, csv or json");
  th->add_option("--filter", filter, "REGEX: only the entries whose names match (e.g. ^model\\.mlp_mnist/)");
  th->add_option("--max-noise", max_noise, max_noise_help);

  auto* g = app.add_subcommand("gate", "exit 1 when an entry is significantly slower than the threshold allows, vanished or fails");
  g->add_option("BASE", base_path, "baseline run (JSON)")->required();
  g->add_option("NEW", new_path, "new run (JSON)")->required();
  g->add_option("--max-slowdown", max_slowdown, "PCT: the largest slowdown that passes, in percent")->required();
  g->add_option("--alpha", alpha, "significance level of the U test when both runs have repetitions (default 0.05)");
  g->add_option("--format", format, "console, md, csv or json");
  g->add_option("--filter", filter, "REGEX: gate only the entries whose names match (e.g. /cuda/), in both runs");

  auto* b = app.add_subcommand("breakdown", "each model step's time by op (bench's instrumented pass), CPU and GPU side by side");
  b->add_option("RUN", run_path, "a run with model.* entries, of one backend or both")->required();
  b->add_option("--format", format, "console, md, csv or json");
  b->add_option("--filter", filter, "REGEX: only the entries whose names match (e.g. bert_layer/.*/batch:32/)");

  double min_speedup = 1.5;
  auto* sc = app.add_subcommand("scaling", "entries over several GPUs by GPU count: collectives' busbw per size; model "
                                           "steps' samples/s, efficiency and multi-GPU crossover per per-GPU batch");
  sc->add_option("RUN", run_path, "a run with gpus:G entries (bench --hotops_gpus=G)")->required();
  sc->add_option("--format", format, "console, md, csv or json");
  sc->add_option("--filter", filter, "REGEX: only the entries whose names match (e.g. allreduce/.*/inplace:1)");
  sc->add_option("--min-speedup", min_speedup, "X: the crossover is where G GPUs give at least X times one GPU's samples/s (default 1.5)");

  std::vector<std::string> run_paths;
  double max_spread = 3;
  auto* sp = app.add_subcommand("spread", "the same entries in several runs (separate processes, one machine): each "
                                          "entry's spread, slowest / fastest - 1, and how many label sets (algorithms) it had");
  sp->add_option("RUNS", run_paths, "two runs (JSON) or more")->required();
  sp->add_option("--format", format, "console, md, csv or json");
  sp->add_option("--filter", filter, "REGEX: only the entries whose names match (e.g. /cuda/.*/train/)");
  sp->add_option("--max-spread", max_spread, "PCT: a spread beyond this is counted and shown in red (default 3)");
  sp->add_option("--max-noise", max_noise, max_noise_help);

  auto* e = app.add_subcommand("export", "write a run for a CI tracker");
  e->add_option("RUN", run_path, "run (JSON)")->required();
  e->add_option("--format", tracker, "github-action-benchmark (customSmallerIsBetter) or bencher (BMF)")->required();

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& h) {
    return app.exit(h);
  } catch (const CLI::CallForAllHelp& h) {
    return app.exit(h);
  } catch (const CLI::ParseError& err) {
    std::cerr << "hotops-compare: " << err.what() << " (see hotops-compare --help)\n";
    return kUsage;
  }

  try {
    if (!(alpha > 0 && alpha < 1)) throw InputError("--alpha must be in (0, 1)");
    if (!(noise >= 0 && noise < 100)) throw InputError("--noise must be a percentage in [0, 100)");
    if (!(max_noise >= 0 && max_noise < 1e6)) throw InputError("--max-noise must be a percentage >= 0");
    if (e->parsed()) {
      const Tracker t = parse_tracker(tracker);
      const Run run = read_run(run_path);
      const int left_out = export_run(std::cout, run, t);
      if (left_out) warn(std::to_string(left_out) + " failed entries left out of the export (no time)");
      return 0;
    }
    Style style;
    style.format = parse_format(format);
    style.colour = style.format == Format::console && terminal_colour();
    style.alpha = alpha;
    style.noise_pct = noise;
    const Prices prices = cost.empty() ? Prices{} : parse_prices(cost);

    if (d->parsed()) {
      Run base = read_run(base_path), next = read_run(new_path);
      keep_matching(base, filter);
      keep_matching(next, filter);
      if (base.entries.empty() && next.entries.empty()) throw InputError("--filter '" + filter + "' matches no entry of either run");
      const Diff result = diff(base, next, prices, max_noise);
      for (const auto& w : result.warnings) warn(w);
      print_diff(std::cout, result, base, next, style);
      return 0;
    }
    if (s->parsed()) {
      Run cpu_run = read_run(run_path);
      Run cuda_run = other_path.empty() ? Run{} : read_run(other_path);
      keep_matching(cpu_run, filter);
      keep_matching(cuda_run, filter);
      keep_variant(other_path.empty() ? cpu_run : cuda_run, "cuda", cuda_variant);
      keep_variant(cpu_run, "cpu", cpu_variant);
      if (!filter.empty() && cpu_run.entries.empty() && cuda_run.entries.empty())
        throw InputError("--filter '" + filter + "' matches no entry of " + (other_path.empty() ? "the run" : "either run"));
      const Speedup result = speedup(cpu_run, other_path.empty() ? cpu_run : cuda_run, prices, max_noise);
      for (const auto& w : result.warnings) warn(w);
      if (result.pairs == 0)
        throw InputError("no problem is measured on both backends (" + std::to_string(result.cpu_only) + " only on cpu, " +
                         std::to_string(result.cuda_only) + " only on cuda)");
      print_speedup(std::cout, result, style);
      return 0;
    }
    if (sc->parsed()) {
      if (!(min_speedup > 0 && min_speedup < 1e6)) throw InputError("--min-speedup must be a ratio > 0");
      Run run = read_run(run_path);
      keep_matching(run, filter);
      print_scaling(std::cout, scaling(run, min_speedup), style);
      return 0;
    }
    if (th->parsed()) {
      Run run = read_run(run_path);
      keep_matching(run, filter);
      if (!filter.empty() && run.entries.empty()) throw InputError("--filter '" + filter + "' matches no entry of " + run_path);
      print_threads(std::cout, threads(run, max_noise), style);
      return 0;
    }
    if (sp->parsed()) {
      if (!(max_spread >= 0 && max_spread < 1e6)) throw InputError("--max-spread must be a percentage >= 0");
      std::vector<Run> runs;
      for (const std::string& path : run_paths) {
        runs.push_back(read_run(path));
        keep_matching(runs.back(), filter);
      }
      const Spread result = spread(runs, max_spread, max_noise);
      for (const auto& w : result.warnings) warn(w);
      print_spread(std::cout, result, style);
      return 0;
    }
    if (b->parsed()) {
      Run run = read_run(run_path);
      keep_matching(run, filter);
      print_breakdown(std::cout, breakdown(run), style);
      return 0;
    }
    if (g->parsed()) {
      if (!(max_slowdown >= 0)) throw InputError("--max-slowdown must be a percentage >= 0");
      Run base = read_run(base_path), next = read_run(new_path);
      keep_matching(base, filter);
      keep_matching(next, filter);
      if (std::none_of(base.entries.begin(), base.entries.end(), [](const Entry& x) { return x.has_time(); }))
        throw InputError(base_path + ": no benchmark with a time" + (filter.empty() ? "" : " matches --filter '" + filter + "'") +
                         ": nothing to gate against");
      GateOptions o;
      o.max_slowdown_pct = max_slowdown;
      o.alpha = alpha;
      const Gate result = gate(base, next, o);
      for (const auto& w : result.diff.warnings) warn(w);
      print_gate(std::cout, result, o, style);
      return result.passed() ? 0 : 1;
    }
  } catch (const InputError& err) {
    std::cerr << "hotops-compare: " << err.what() << '\n';
    return kUsage;
  }
  return kUsage;
}
