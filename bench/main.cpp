// bench: hotops' benchmark executable. hotops flags first (removed from argv), then Google Benchmark.
// Exit codes: 0 the run completed; 2 bad input (a flag, a filter that selects nothing), found before
// anything runs; 1 a GPU fault lost the CUDA context (the CPU entries still ran and reported).
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench/git_revision.h"
#include "bench/roofline.h"
#include "bench/runner.h"
#include "hotops/buffer.h"
#include "hotops/check.h"
#include "hotops/choices.h"
#include "hotops/comm.h"
#include "hotops/gpu.h"
#include "hotops/ranks.h"
#include "hotops/plan.h"
#include "hotops/cpu.h"

namespace {

// One warning line when the machine is visibly busy before anything runs: a 1-minute load average
// above the core count means other work competes with every timing.
void warn_if_busy() {
  std::FILE* f = std::fopen("/proc/loadavg", "r");
  if (!f) return;
  double load = 0;
  const bool read = std::fscanf(f, "%lf", &load) == 1;
  std::fclose(f);
  const unsigned cores = std::thread::hardware_concurrency();
  if (read && cores > 0 && load > cores)
    std::fprintf(stderr, "hotops: warning: this machine is busy (load average %.1f on %u cores): other work competes with "
                 "the timings, expect larger noise_pct\n", load, cores);
}

// Whether Google Benchmark's output file was written whole: it reports no failed write itself, so
// a full disk would leave a cut-off file and exit 0. JSON must end with its closing brace, the other
// formats with a newline; otherwise one line on stderr says so.
bool output_complete(const std::string& path, const std::string& format) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  long size = -1;
  int last = EOF;
  if (f && std::fseek(f, 0, SEEK_END) == 0 && (size = std::ftell(f)) > 0) {
    for (long at = size - 1; at >= 0; --at) {
      if (std::fseek(f, at, SEEK_SET) != 0) break;
      last = std::fgetc(f);
      if (format != "json" || !std::isspace(last)) break;
    }
  }
  if (f) std::fclose(f);
  const bool whole = size > 0 && (format == "json" ? last == '}' : last == '\n');
  if (!whole)
    std::fprintf(stderr, "hotops: the output file %s is incomplete (%ld bytes): writing it failed (is the disk full?)\n",
                 path.c_str(), size < 0 ? 0L : size);
  return whole;
}

int refuse(const std::string& line) {
  std::fprintf(stderr, "%s\n", line.c_str());
  return 2;
}

// The counters the console leaves to the JSON and CSV: bookkeeping a reader rarely scans for,
// samples/s, which repeats items_per_second for model steps, and cpu_wait_pct, whose label says
// "[BUSY CPU: ...]" when it matters.
bool console_hides(const std::string& counter, double value) {
  static const char* const hidden[] = {"cpu_threads", "runs_per_sample", "sm_clock_mhz", "samples/s", "bw_fraction",
                                       "flop_fraction", "samples", "noise_pct", "cpu_wait_pct"};
  for (const char* h : hidden)
    if (counter == h) return true;
  if (counter == "throttled_samples") return value == 0;  // shown when the GPU did throttle
  return counter.rfind("breakdown", 0) == 0;  // the per-op breakdown of model steps
}

// "0.725%": three significant digits down to 1%, then three decimals.
std::string percent(double fraction) {
  const double p = 100 * fraction;
  char text[32];
  std::snprintf(text, sizeof text, p >= 100 ? "%.0f%%" : p >= 10 ? "%.1f%%" : p >= 1 ? "%.2f%%" : "%.3f%%", p);
  return text;
}

// The unit that puts a time between 1 and 1000 of it.
benchmark::TimeUnit unit_for(double seconds) {
  return seconds < 1e-6 ? benchmark::kNanosecond
         : seconds < 1e-3 ? benchmark::kMicrosecond
         : seconds < 1    ? benchmark::kMillisecond
                          : benchmark::kSecond;
}

// The display reporter Google Benchmark's flags choose. On the console, a line a person can scan:
// the counters of console_hides() left to the JSON and CSV (which keep every counter), the roofline
// fractions as percentages before the label, and, unless --benchmark_time_unit chose one unit,
// each time in the unit that suits it. The JSON keeps its fixed unit (us unless chosen).
class Display final : public benchmark::BenchmarkReporter {
 public:
  explicit Display(bool scale_units)
      : inner_(benchmark::CreateDefaultDisplayReporter()),
        console_(dynamic_cast<benchmark::ConsoleReporter*>(inner_.get()) != nullptr),
        scale_units_(scale_units) {}
  bool ReportContext(const Context& context) override { return inner_->ReportContext(context); }
  void ReportRuns(const std::vector<Run>& runs) override {
    std::vector<Run> shown = runs;
    for (Run& r : shown) {
      hotops::bench::name_as_listed(r);
      if (console_) shorten(r);
    }
    inner_->ReportRuns(shown);
  }
  void Finalize() override { inner_->Finalize(); }

 private:
  void shorten(Run& r) const {
    std::string fractions;
    for (const auto& [name, label] : {std::pair<const char*, const char*>{"bw_fraction", "bw="},
                                      std::pair<const char*, const char*>{"flop_fraction", "flop="}}) {
      const auto it = r.counters.find(name);
      if (it != r.counters.end()) fractions += label + percent(it->second.value) + " ";
    }
    const auto noise = r.counters.find("noise_pct");  // in percent already
    if (noise != r.counters.end()) fractions += "noise=" + percent(noise->second.value / 100) + " ";
    for (auto it = r.counters.begin(); it != r.counters.end();)
      it = console_hides(it->first, it->second.value) ? r.counters.erase(it) : std::next(it);
    r.report_label = fractions + r.report_label;
    // Complexity fits and percentage aggregates (cv) carry no time per execution.
    if (!scale_units_ || r.report_big_o || r.report_rms || r.aggregate_unit == benchmark::kPercentage) return;
    const double seconds = r.GetAdjustedRealTime() / benchmark::GetTimeUnitMultiplier(r.time_unit);
    if (seconds > 0) r.time_unit = unit_for(seconds);
  }

  std::unique_ptr<benchmark::BenchmarkReporter> inner_;
  bool console_;
  bool scale_units_;
};

// The file reporter of a run sampled in hotops' own loop: Google Benchmark's own reporter of the
// chosen format, given each run under its listed name (bench::name_as_listed).
class ListedNames final : public benchmark::BenchmarkReporter {
 public:
  explicit ListedNames(const std::string& format) {
    if (format == "console") inner_ = std::make_unique<benchmark::ConsoleReporter>(benchmark::ConsoleReporter::OO_None);
    else if (format == "json") inner_ = std::make_unique<benchmark::JSONReporter>();
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"  // Google Benchmark's own CSV output, as --benchmark_out_format=csv gives
    if (format == "csv") inner_ = std::make_unique<benchmark::CSVReporter>();
#pragma GCC diagnostic pop
  }
  bool ReportContext(const Context& context) override {
    // Google Benchmark points this reporter at the output file before the context comes.
    inner_->SetOutputStream(&GetOutputStream());
    inner_->SetErrorStream(&GetErrorStream());
    return inner_->ReportContext(context);
  }
  void ReportRuns(const std::vector<Run>& runs) override {
    std::vector<Run> renamed = runs;
    for (Run& r : renamed) hotops::bench::name_as_listed(r);
    inner_->ReportRuns(renamed);
  }
  void Finalize() override { inner_->Finalize(); }

 private:
  std::unique_ptr<benchmark::BenchmarkReporter> inner_;
};

// What a run over several GPUs needs before anything runs: NCCL and the GPUs. "" when all is
// there, else the line that refuses the run.
std::string check_gpus_for(const hotops::ranks::Layout& l) {
  const std::string run = "hotops: a run over " + std::to_string(l.world) + " GPUs (" + l.source + ")";
  std::string why;
  if (!hotops::comm::built(&why)) return run + " needs NCCL, and " + why;
  if (!hotops::gpu::available(&why)) return run + " needs them, and here: " + why;
  const int here = hotops::gpu::device_count();
  if (l.spawn && here < l.local_world)
    return "hotops: --hotops_gpus=" + std::to_string(l.local_world) + " but this machine has " + std::to_string(here) +
           " CUDA device" + (here == 1 ? "" : "s");
  return "";
}

// Binds this process to its GPU (after spawning: the copies start from a process without a CUDA
// context). Throws with the line to print.
void use_own_device(const hotops::ranks::Layout& l) {
  try {
    hotops::gpu::use_device(l.local_rank, l.local_world);
  } catch (const hotops::Error& e) {
    throw hotops::ranks::LaunchError("hotops: rank " + std::to_string(l.rank) + ": " + e.what());
  }
}

// The rendezvous of a run over several GPUs (rank 0 spawning this machine's other ranks where
// --hotops_gpus asks), then its NCCL world communicator. Throws with the line to print.
std::unique_ptr<hotops::ranks::Group> join_the_run(const hotops::ranks::Layout& l,
                                                   const std::vector<std::string>& command_line, double timeout_s,
                                                   double stall_s) {
  using namespace hotops::ranks;
  Group::Hello hello;
  hello.signature = std::string("hotops ") + HOTOPS_VERSION + " " + hotops::bench::git_revision();
  for (std::size_t i = 1; i < command_line.size(); ++i) hello.signature += " " + command_line[i];
  char host[256] = "";
  ::gethostname(host, sizeof host - 1);
  const auto describe = [&] { hello.about = std::string(host) + ": " + hotops::gpu::device_description(); };
  std::vector<pid_t> children;
  std::unique_ptr<Group> g;
  std::string id;
  try {
    if (l.rank == 0) {
      Listener listener(l.root);
      if (l.spawn) children = spawn_local(l, command_line, listener.address());
      use_own_device(l);
      describe();
      id = hotops::comm::unique_id();
      g = Group::accept(listener, l, hello, id, timeout_s, [&]() -> std::string {
        for (pid_t c : children) {
          int status = 0;
          if (::waitpid(c, &status, WNOHANG) == c)
            return "a rank this process started (pid " + std::to_string(c) + ") ended before joining (" +
                   (WIFEXITED(status) ? "exit code " + std::to_string(WEXITSTATUS(status)) : std::string("killed by a signal")) +
                   "; its message is above)";
        }
        return "";
      });
    } else {
      if (l.spawn) children = spawn_local(l, command_line, l.root);
      use_own_device(l);
      describe();
      g = Group::join(l, hello, timeout_s, &id);
    }
  } catch (...) {
    for (pid_t c : children) ::kill(c, SIGTERM);
    throw;
  }
  g->adopt(children);
  g->start_watchdog(stall_s);
  g->busy("making the NCCL communicator of the run's " + std::to_string(l.world) + " GPUs");
  try {
    hotops::comm::init_world(id, l.rank, l.world);
  } catch (const std::exception& e) {
    g->fatal(std::string("making the NCCL communicator failed: ") + e.what());
  }
  g->idle();
  return g;
}

}  // namespace

int main(int argc, char** argv) {
  const std::vector<std::string> command_line(argv, argv + argc);  // as given: the spawned ranks get it too
  hotops::Options options;
  hotops::BenchmarkFlags gb;
  try {
    options = hotops::parse_flags(argc, argv);
    gb = hotops::check_benchmark_flags(argc, argv);
  } catch (const hotops::FlagError& e) {
    return refuse(e.what());
  }
  if (gb.help || options.help) std::fputs(hotops::flags_help(), stdout);
  if (options.help) return 0;

  // Where this process stands in a run over several GPUs (docs/scaling.md): alone by default.
  hotops::ranks::Layout layout;
  double rendezvous_timeout = 0, stall_timeout = 0;
  try {
    const auto env = [](const char* name) -> const char* { return std::getenv(name); };
    layout = hotops::ranks::layout_from(options.gpus, env);
    rendezvous_timeout = hotops::ranks::seconds_from_env("HOTOPS_RENDEZVOUS_TIMEOUT_S", 300, env);
    stall_timeout = hotops::ranks::seconds_from_env("HOTOPS_STALL_TIMEOUT_S", 300, env);
  } catch (const hotops::ranks::LaunchError& e) {
    return refuse(e.what());
  }
  if (layout.world > 1) {
    const std::string refused = check_gpus_for(layout);
    if (!refused.empty()) return refuse(refused);
  }
  hotops::ranks::set_layout(layout);
  // The searches' choices kept across processes: a file of another machine, or one that cannot be
  // read or written, is refused before anything runs. A run over several GPUs searches on each.
  std::string no_gpu;
  if (!options.choices.empty() && layout.world == 1 && hotops::gpu::available(&no_gpu)) {
    const hotops::gpu::Info g = hotops::gpu::info();
    const std::string refused = hotops::open_choices(
        options.choices, g.name + ", driver " + g.driver_version + ", cuBLAS " + g.cublas_version + ", cuDNN " + g.cudnn_version);
    if (!refused.empty()) return refuse(refused);
  }

  // Test only: HOTOPS_TEST_FAULT=<kind> adds a benchmark that fails that way (bench/test_fault.h).
  const char* fault_env = std::getenv("HOTOPS_TEST_FAULT");
  const std::string test_fault = fault_env ? fault_env : "";
  if (fault_env && !hotops::bench::is_test_fault_kind(test_fault))
    return refuse("hotops: unknown HOTOPS_TEST_FAULT='" + test_fault + "' (test only; one of " +
                  hotops::bench::test_fault_kinds() + ")");
  // Test only: HOTOPS_TEST_MUTATION=<name> plants a bug between every op case and its plan
  // (include/hotops/plan.h), which verification must catch.
  if (const char* mutation = std::getenv("HOTOPS_TEST_MUTATION")) {
    try {
      hotops::set_test_mutation(mutation);
    } catch (const hotops::Error&) {
      std::string known;
      for (const std::string& k : hotops::test_mutation_names()) known += (known.empty() ? "" : ", ") + k;
      return refuse(std::string("hotops: unknown HOTOPS_TEST_MUTATION='") + mutation + "' (test only; one of " + known +
                    ")");
    }
  }

  hotops::set_global_seed(options.seed);
  if (options.threads > 0) hotops::cpu::set_threads(options.threads);
  hotops::gpu::set_shuffle_layout(options.shuffle_layout);
  if (options.cpu_ftz) hotops::cpu::set_flush_subnormals(true);  // threads start with IEEE subnormals

  // hotops' default sample budget is 0.025 s per benchmark (Google Benchmark's is 0.5 s), so that
  // the whole list of some 4,400 entries runs in one process within minutes (on a GPU host one
  // entry's processes differ by some 0.3% at the median at this budget, 0.1% at twice it:
  // docs/timing.md); --benchmark_min_time (or Google Benchmark's BENCHMARK_MIN_TIME variable)
  // overrides it as usual, in any release's form: it reaches Google Benchmark in the form the linked
  // release reads, or, as a count of iterations for a release before 1.8, as each benchmark's
  // iteration count.
  hotops::MinTime min_time;
  min_time.seconds = 0.025;
  const char* min_time_env = std::getenv("BENCHMARK_MIN_TIME");
  try {
    if (gb.has_min_time) min_time = gb.min_time;
    else if (min_time_env) min_time = hotops::parse_min_time("BENCHMARK_MIN_TIME", min_time_env);
  } catch (const hotops::FlagError& e) {
    return refuse(e.what());
  }
  // A time is hotops' own loop's least sampling time; a count of iterations (<N>x) is Google
  // Benchmark's loop, which the stopping rule does not take.
  if (min_time.iterations > 0) {
    if (options.max_noise > 0)
      return refuse("hotops: --benchmark_min_time=" + std::to_string(min_time.iterations) +
                    "x and --hotops_max_noise: the stopping rule decides how many samples an entry takes; give "
                    "--benchmark_min_time as a time (the least sampling time), or --hotops_min_samples");
    options.own_loop = false;
  } else {
    options.min_seconds = min_time.seconds;
  }
  std::string min_time_arg = hotops::min_time_arg(min_time, HOTOPS_BENCHMARK_VERSION);
  const std::int64_t iterations = min_time_arg.empty() ? min_time.iterations : 0;
  std::vector<char*> args;
  for (int i = 0; i < argc; ++i)
    if (std::strncmp(argv[i], "--benchmark_min_time=", 21) != 0) args.push_back(argv[i]);
  if (!min_time_arg.empty()) args.push_back(min_time_arg.data());
  args.push_back(nullptr);
  int n = static_cast<int>(args.size()) - 1;
  // Microseconds unless --benchmark_time_unit (or BENCHMARK_TIME_UNIT) says otherwise: Initialize
  // replaces this default with theirs.
  benchmark::SetDefaultTimeUnit(benchmark::kMicrosecond);
  const bool unit_chosen = gb.has_time_unit || std::getenv("BENCHMARK_TIME_UNIT");
  benchmark::Initialize(&n, args.data());
  if (benchmark::ReportUnrecognizedArguments(n, args.data())) return 2;

  // What the filter selects is known before anything runs: a filter that selects nothing is an
  // error here, not an empty run after the roofline measurement.
  const std::string filter = benchmark::GetBenchmarkFilter();
  // Listing shows the names as they are: hotops' own loop changes how entries are timed, not which.
  hotops::Options registering = options;
  if (gb.list_tests) registering.own_loop = false;
  const auto registered = hotops::bench::register_benchmarks(registering, test_fault, iterations, filter);
  const auto selected = hotops::bench::select(registered.problems, filter);
  std::map<std::string, std::string> reason_of;  // name -> why, of the problems this machine cannot run
  std::vector<hotops::Problem> unsupported;
  for (const auto& [p, why] : registered.unsupported) unsupported.push_back(p), reason_of[p.name()] = why;
  std::map<std::string, int> cannot_run;  // reason -> count, of those the filter selects
  for (const hotops::Problem& p : hotops::bench::select(unsupported, filter)) ++cannot_run[reason_of[p.name()]];
  if (selected.empty()) {
    if (cannot_run.empty())
      return refuse("hotops: no benchmark matches --benchmark_filter=" + filter + " (--benchmark_list_tests=true lists them)");
    std::string reasons;
    int count = 0;
    for (const auto& [why, k] : cannot_run) reasons += (reasons.empty() ? "" : "; ") + why, count += k;
    return refuse("hotops: none of the " + std::to_string(count) + " benchmarks matching --benchmark_filter=" + filter +
                  " can run here: " + reasons);
  }
  // A run over several GPUs: every rank joins here; all but rank 0 then run what it commands.
  std::unique_ptr<hotops::ranks::Group> group;
  if (layout.world > 1 && gb.list_tests && layout.rank != 0) return 0;  // rank 0 lists them
  if (layout.world > 1 && !gb.list_tests) {
    try {
      group = join_the_run(layout, command_line, rendezvous_timeout, stall_timeout);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "%s\n", e.what());
      return 1;
    }
    hotops::bench::set_group(group.get());
    if (layout.rank != 0) {
      const int rc = hotops::bench::run_worker(options);
      const std::string problems = group->reap(120);
      if (!problems.empty()) std::fprintf(stderr, "hotops: rank %d: the ranks it started: %s\n", layout.rank, problems.c_str());
      return rc != 0 || !problems.empty() ? 1 : 0;
    }
  }

  // Why the GPU is unusable (no driver, no device, no CUDA build) is one line about the CUDA part.
  hotops::gpu::available(&no_gpu);
  for (const auto& [why, k] : cannot_run)
    if (why == no_gpu) std::fprintf(stderr, "hotops: %s: the CUDA benchmarks are not run (%d selected)\n", why.c_str(), k);
    else std::fprintf(stderr, "hotops: %d benchmarks not run: %s\n", k, why.c_str());
  std::size_t cuda = 0;
  for (const hotops::Problem& p : selected) cuda += p.backend == hotops::Backend::cuda;
  hotops::bench::expect_cuda_benchmarks(cuda);

  if (options.roofline && !gb.list_tests) {
    // Only the backends whose benchmarks will run pay for measuring their ceilings.
    const auto backends = hotops::bench::backends_of(selected);
    hotops::bench::roofline() = hotops::bench::measure_roofline(options, backends);
    for (const std::string& note : hotops::bench::roofline().notes) std::fprintf(stderr, "hotops: %s\n", note.c_str());
    if (std::find(backends.begin(), backends.end(), hotops::Backend::cuda) != backends.end())
      hotops::bench::end_gpu_part_if_lost("the roofline measurement");
  }
  hotops::bench::add_context(options, group ? group->about() : std::vector<std::string>{});
  if (!gb.list_tests) warn_if_busy();
  Display display(!unit_chosen);
  std::size_t ran = 0;
  if (registering.own_loop) {  // only the selected entries are registered: run them all
    std::unique_ptr<ListedNames> file;
    if (!gb.out.empty()) file = std::make_unique<ListedNames>(gb.out_format);
    ran = benchmark::RunSpecifiedBenchmarks(&display, file.get(), "all");
  } else {
    ran = benchmark::RunSpecifiedBenchmarks(&display);
  }
  benchmark::Shutdown();
  bool ranks_failed = false;
  if (group) {
    try {
      hotops::bench::end_workers();
    } catch (const std::exception& e) {
      group->fatal(std::string("destroying the communicators failed: ") + e.what());
    }
    const std::string problems = group->reap(120);
    if (!problems.empty()) std::fprintf(stderr, "hotops: the ranks this process started: %s\n", problems.c_str());
    ranks_failed = !problems.empty();
  }
  if (ran == 0) return 2;  // cannot happen after the check above, unless the two regex engines disagree
  if (!gb.list_tests && !gb.out.empty() && !output_complete(gb.out, gb.out_format)) return 1;
  return hotops::bench::gpu_context_lost() || ranks_failed ? 1 : 0;
}
