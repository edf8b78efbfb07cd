// Benchmark registration and the timed loops: CPU real time around a completed run, GPU device
// time from CUDA events (gpu::Timer). Setup and verification happen once per benchmark, outside
// timing; a failed verification or any error becomes an error entry, never a time.
#include "bench/runner.h"

#include "bench/roofline.h"

#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <new>
#include <optional>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include "bench/test_fault.h"
#include "hotops/buffer.h"
#include "hotops/check.h"
#include "hotops/comm.h"
#include "hotops/core_time.h"
#include "hotops/cpu.h"
#include "hotops/gpu.h"
#include "hotops/op.h"
#include "hotops/ranks.h"
#include "hotops/trace.h"

namespace hotops::bench {
namespace {

// Google Benchmark calls a benchmark function several times while it sizes the iteration count;
// the case (and its verification) is kept between those calls and dropped when the next starts.
struct Live {
  std::string name;
  std::unique_ptr<Case> c;
  std::unique_ptr<gpu::Timer> timer;
  std::string error;  // setup or verification failure, reported on every call
  std::unique_ptr<trace::Breakdown> breakdown;  // model steps: the instrumented pass, once
};

bool is_model_step(const Problem& p) { return p.op.rfind("model.", 0) == 0; }

// The time of each timed sample (seconds per execution), for the entry's noise: how much its own
// samples spread. A CPU sample is a batch of back-to-back executions of at least kCpuSampleSeconds
// (one clock read per batch, so that the clock costs nothing measurable even for the shortest ops);
// a device-timed CUDA sample is one of gpu::Timer's; a host-timed one is one execution.
constexpr double kCpuSampleSeconds = 200e-6;
// The executions of a CPU sample, from one execution's seconds.
std::int64_t cpu_batch(double seconds) {
  return std::max<std::int64_t>(1, static_cast<std::int64_t>(std::ceil(kCpuSampleSeconds / std::max(seconds, 1e-9))));
}

struct Samples {
  std::vector<double> seconds;
  // Welford's running mean and squared deviations: the noise after each sample at O(1) a sample.
  double running_mean = 0, running_m2 = 0;
  void add(double s) {
    seconds.push_back(s);
    const double d = s - running_mean;
    running_mean += d / static_cast<double>(seconds.size());
    running_m2 += d * (s - running_mean);
  }
  // The relative standard deviation so far, in percent (0 below two samples).
  double noise_pct() const {
    const std::size_t n = seconds.size();
    return n < 2 || running_mean <= 0 ? 0 : 100 * std::sqrt(running_m2 / static_cast<double>(n - 1)) / running_mean;
  }
  void report(benchmark::State& state) const {
    state.counters["samples"] = static_cast<double>(seconds.size());
    // The relative standard deviation, in percent; it needs two samples.
    if (seconds.size() < 2) return;
    double mean = 0, sq = 0;
    for (double s : seconds) mean += s;
    mean /= static_cast<double>(seconds.size());
    for (double s : seconds) sq += (s - mean) * (s - mean);
    if (mean > 0) state.counters["noise_pct"] = 100 * std::sqrt(sq / static_cast<double>(seconds.size() - 1)) / mean;
  }
};

// The instrumented pass of a model step (after its timed runs, so that they are untouched): each
// op's time per step, their sum's share of the instrumented step (coverage) and the instrumented
// step over the headline time (what the events between ops, or the wall-clock reads, cost it). It
// takes kBreakdownSeconds of steps, at least one on the CPU and three on the GPU. An entry on several
// ranks (gpus:G) takes a fixed number of instrumented steps, the same on every rank: each step's
// collectives need all of them (a pass of a fixed time would end after a different count on each).
// A CPU model step of kRecordedSampleSeconds or more needs no pass: its timed samples are recorded
// (take_samples), a clock read a mark being some 1e-4 of such a step.
constexpr double kBreakdownSeconds = 0.02;
constexpr int kBreakdownStepsOnRanks = 10;
constexpr double kRecordedSampleSeconds = 0.01;
trace::Breakdown instrumented_pass(Case& c, const Problem& p) {
  if (p.backend == Backend::cpu) return trace::measure_on_cpu([&] { c.run(); }, kBreakdownSeconds, 1);
  if (p.has("gpus")) return gpu::measure_breakdown(c, 0, kBreakdownStepsOnRanks);
  return gpu::measure_breakdown(c, kBreakdownSeconds, 3);
}

void report_breakdown(benchmark::State& state, Live& live, const Problem& p, double headline_seconds) {
  if (!live.breakdown) live.breakdown = std::make_unique<trace::Breakdown>(instrumented_pass(*live.c, p));
  const trace::Breakdown& b = *live.breakdown;
  for (const trace::Part& part : b.parts) state.counters[kBreakdownPrefix + part.op] = part.us;
  state.counters["breakdown_step_us"] = b.step_us;
  state.counters["breakdown_steps"] = b.steps;
  state.counters["breakdown_coverage"] = b.step_us > 0 ? b.covered_us() / b.step_us : 0;
  if (headline_seconds > 0) state.counters["breakdown_ratio"] = b.step_us * 1e-6 / headline_seconds;
}

// The GPU part of the run ends at the first fault that loses the CUDA context: every later CUDA
// entry is skipped with this message, naming the entry that faulted. CPU entries still run.
struct GpuState {
  std::size_t expected = 0;         // CUDA benchmarks the filter selected
  std::set<std::string> started;    // CUDA benchmarks that have started (repetitions count once)
  std::string lost;                 // empty while the context is healthy
};
GpuState& gpu_state() {
  static GpuState s;
  return s;
}

double gib(std::size_t bytes) { return static_cast<double>(bytes) / 1073741824.0; }

// The message of an entry that threw: the error itself, with what the user needs to act on it.
std::string describe(const std::exception& e, Backend backend) {
  std::string what = e.what();
  char buf[160];
  if (dynamic_cast<const std::bad_alloc*>(&e)) {
    const HostMemory m = host_memory();
    std::snprintf(buf, sizeof buf, "out of host memory (%s) with %.2f GiB available of %.2f GiB", e.what(),
                  gib(m.available), gib(m.total));
    return buf;
  }
  const auto* err = dynamic_cast<const Error*>(&e);
  if (!err || err->kind() != ErrorKind::out_of_memory) return what;
  // A library's allocation failure (oneDNN, cuBLAS, cuDNN, pinned memory) does not say what is free.
  if (backend == Backend::cuda && what.find(" free of ") == std::string::npos) {
    const gpu::Memory m = gpu::memory();
    std::snprintf(buf, sizeof buf, " (GPU: %.2f GiB free of %.2f GiB, %.2f GiB held by hotops)", gib(m.free),
                  gib(m.total), gib(m.held));
    what += buf;
  }
  if (backend == Backend::cpu && what.find(" available of ") == std::string::npos) {
    const HostMemory m = host_memory();
    std::snprintf(buf, sizeof buf, " (host: %.2f GiB available of %.2f GiB)", gib(m.available), gib(m.total));
    what += buf;
  }
  return what;
}

// After a CUDA entry threw: if the context is lost, ends the GPU part and adds that to the error.
void check_gpu_context(const std::string& name, std::string& error) {
  const std::string lost = end_gpu_part_if_lost(name);
  if (!lost.empty()) error += " [" + lost + "]";
}

// The one live case of this process.
Live& the_live() {
  static Live live;
  return live;
}

// --hotops_shuffle_layout: a setup's device buffers are placed by draws from the problem's seed
// (--hotops_seed and the entry's name) and how many times this process set the entry up before, so
// that every process places an entry alike and each setup (an interleaved repetition's) anew.
void seed_placement(const Problem& p) {
  static std::map<std::string, std::uint64_t> setups;
  gpu::seed_layout(p.seed() ^ (0x9e3779b97f4a7c15ull * ++setups[p.name()]));
}

void reset(Live& live, const std::string& name) {
  live.timer.reset();
  live.c.reset();
  live.breakdown.reset();
  live.error.clear();
  live.name = name;
}

gpu::TimerOptions timer_options(const Options& o) {
  gpu::TimerOptions to;
  to.cold_l2 = o.cold_l2;
  to.throttle_threshold = o.throttle_threshold;
  to.runs_per_sample = o.runs_per_sample;
  return to;
}

Live& live_for(const Problem& p, const Family& f, const Options& o) {
  Live& live = the_live();
  const std::string name = p.name();
  if (live.name == name) return live;
  reset(live, name);
  using clock = std::chrono::steady_clock;
  const auto t0 = clock::now();
  auto t1 = t0, t2 = t0;
  try {
    begin_case_memory();  // the case's host buffers are accounted together from here
    seed_placement(p);
    live.c = f.make(p);
    t1 = t2 = clock::now();
    if (o.verify) {
      const Check chk = live.c->verify();
      if (!chk.ok) live.error = "verification failed: " + chk.message;
    }
    t2 = clock::now();
    if (live.error.empty() && p.backend == Backend::cuda && !live.c->host_timed())
      live.timer = std::make_unique<gpu::Timer>(*live.c, timer_options(o));
    // Without verification, a CPU or host-timed entry's first timed execution would be the case's
    // first ever (page faults on its fresh buffers, a library's first-call work): one untimed
    // execution in place of the verification's (the CUDA timer warms up on its own).
    else if (live.error.empty() && !o.verify) live.c->run();
  } catch (const std::exception& e) {
    live.error = describe(e, p.backend);
    if (p.backend == Backend::cuda) check_gpu_context(name, live.error);
  }
  if (!live.error.empty()) {
    live.timer.reset();
    live.c.reset();
  }
  // A diagnostic of where a run's time goes outside the timing: the case's set-up (buffers, inputs,
  // plan), its verification, and the CUDA timer's warm-up and sizing (or, unverified, the untimed
  // execution), in seconds.
  if (std::getenv("HOTOPS_TRACE_SETUP")) {
    auto sec = [](clock::time_point a, clock::time_point b) { return std::chrono::duration<double>(b - a).count(); };
    const auto t3 = clock::now();
    std::fprintf(stderr, "setup %.3f s (case %.3f, verify %.3f, warm-up %.3f) %s\n", sec(t0, t3), sec(t0, t1), sec(t1, t2),
                 sec(t2, t3), name.c_str());
  }
  return live;
}

// ---- entries run by several ranks together (gpus:G) ------------------------------------------
// Rank 0 runs Google Benchmark; before each of its calls of such an entry it sends the other ranks
// one command: the entry, whether to set it up afresh (rank 0's decision, so that every rank sets
// up exactly when rank 0 does) and the iteration count Google Benchmark chose. Every rank then
// goes through the same steps: the communicator, the case (an error here is the entry's, agreed
// by all), the verification (one collective; a failure on any rank is the entry's error), the
// timer and the samples (collectives; an exception there ends the run, as the other ranks would
// wait for this one forever). Ranks G and above take part in the communicator and the first
// agreement only.

ranks::Group* g_group = nullptr;

bool on_ranks(const Problem& p) { return p.has("gpus"); }

std::string encode_command(bool fresh, std::int64_t iterations, const std::string& name) {
  return std::string("run ") + (fresh ? "1 " : "0 ") + std::to_string(iterations) + " " + name;
}

// A step with collectives in it: an exception ends the run on every rank (with a group), or is
// the entry's error (a process alone).
template <class Body>
void collective_step(const Problem& p, const char* step, Body body) {
  try {
    body();
  } catch (const std::exception& e) {
    const std::string why = std::string(step) + " of " + p.name() + " failed: " + describe(e, Backend::cuda);
    if (g_group) {
      g_group->fatal(why + " (the other ranks cannot go on without this one)");
      std::_Exit(1);  // fatal returns only under a test hook
    }
    throw Error(why);
  }
}

// Sets `live` up for `p` on this rank, every rank of the world together (see above).
void setup_on_ranks(Live& live, const Family& f, const Problem& p, const Options& o) {
  reset(live, p.name());
  const int gpus = static_cast<int>(p.get_int("gpus"));
  const int rank = ranks::layout().rank, world = g_group ? g_group->world() : 1;
  auto agree = [&](const std::string& mine, int members) { return g_group ? g_group->agree(mine, members) : mine; };
  try {
    collective_step(p, "making the communicator", [&] { comm::prepare(gpus); });
    std::string error;
    if (rank < gpus) {
      try {
        begin_case_memory();
        seed_placement(p);
        live.c = f.make(p);
      } catch (const std::exception& e) {
        error = describe(e, Backend::cuda);
      }
    }
    live.error = agree(error, world);
    if (!live.error.empty() || rank >= gpus) {
      live.c.reset();
      return;
    }
    if (o.verify) {
      Check chk;
      collective_step(p, "the verification", [&] { chk = live.c->verify(); });
      if (g_group) g_group->progress();
      const std::string failed = agree(chk.ok ? "" : chk.message, gpus);  // "rank r: ..." of the first rank that failed
      live.error = failed.empty() ? "" : "verification failed: " + failed;
      if (!live.error.empty()) {
        live.c.reset();
        return;
      }
    }
    gpu::TimerOptions to = timer_options(o);
    if (g_group) to.agree_max = [gpus](double x) { return g_group->agree_max(x, gpus); };
    collective_step(p, "the warm-up", [&] { live.timer = std::make_unique<gpu::Timer>(*live.c, to); });
  } catch (const std::exception& e) {
    if (g_group) {  // an agreement failed: a rank is gone
      g_group->fatal(std::string("setting up ") + p.name() + ": " + e.what());
      std::_Exit(1);
    }
    live.error = e.what();  // a process alone
    live.timer.reset();
    live.c.reset();
  }
}

// The samples the timed loop takes for `iterations` iterations of `runs` executions per sample, on
// the ranks other than 0 (rank 0's loop is Google Benchmark's); then, for a model step, the
// instrumented pass the first time rank 0 takes it (report_breakdown).
void follow_samples(Live& live, const Problem& p, std::int64_t iterations) {
  collective_step(p, "timing", [&] {
    const int runs = live.timer->launches_per_sample();
    for (std::int64_t i = 0; i < iterations; i += runs) {
      live.timer->sample();
      g_group->progress();
    }
  });
  if (!is_model_step(p) || live.breakdown) return;
  collective_step(p, "the per-op breakdown", [&] {
    live.breakdown = std::make_unique<trace::Breakdown>(instrumented_pass(*live.c, p));
  });
}

// ---- hotops' own sampling loop, and the stopping rule (--hotops_max_noise; docs/timing.md) ----
// The entries hotops samples in its own loop, with their backend: registered with one Google
// Benchmark iteration that stands for all their samples, reported under the names they have in
// Google Benchmark's loop. Every entry is, except those of several ranks (gpus:G), whose ranks
// follow rank 0's iteration count, and all under --benchmark_min_time=<N>x (a fixed count).
std::map<std::string, Backend>& own_loop_entries() {
  static std::map<std::string, Backend> m;
  return m;
}
bool own_loop(const Problem& p, const Options& o) { return o.own_loop && !on_ranks(p); }

// The noise has settled when its last kSettledWindow estimates (one after each sample) lie within
// kSettledBand of their mean, relative: more samples would not bring it down.
constexpr std::size_t kSettledWindow = 16;
constexpr double kSettledBand = 0.02;
bool settled(const std::vector<double>& history) {
  if (history.size() < kSettledWindow) return false;
  const auto first = history.end() - static_cast<std::ptrdiff_t>(kSettledWindow);
  const auto [lo, hi] = std::minmax_element(first, history.end());
  double mean = 0;
  for (auto it = first; it != history.end(); ++it) mean += *it;
  mean /= static_cast<double>(kSettledWindow);
  return mean > 0 && (*hi - *lo) <= kSettledBand * mean;
}

// Takes samples of the entry, each as its mode takes them (a CPU batch of at least
// kCpuSampleSeconds of back-to-back executions, one host-timed execution, one device-timed sample of
// the timer's executions), until o.min_seconds of sampling and: without the stopping rule, two
// samples (so that every entry has a noise); with it, at least o.min_samples samples and the noise
// at most o.max_noise percent (or settled), or o.timeout seconds of sampling, whichever comes first.
// Unlike Google Benchmark's loop, no round of executions is spent sizing the next: the first CPU
// execution sizes the batches and is the first sample when it fills one on its own (it follows the
// verification's execution, or the untimed one, so its caches are as warm as any later one's). The
// samples after it of a CPU model step of kRecordedSampleSeconds or more are recorded by op: they
// are the step's breakdown.
// Returns the mean time of an execution over the samples; `executions` counts them, `why` says
// what ended the sampling under the rule.
double take_samples(Live& live, const Problem& p, const Options& o, Samples& samples, std::int64_t& executions,
                    std::string& why) {
  using clock = std::chrono::steady_clock;
  auto seconds_since = [](clock::time_point t) { return std::chrono::duration<double>(clock::now() - t).count(); };
  const auto start = clock::now();
  std::int64_t batch = 1;  // executions a sample
  bool recorded = false;   // each sample a step under the breakdown's recorder
  if (p.backend == Backend::cpu) {
    const auto t0 = clock::now();
    live.c->run();
    const double first = seconds_since(t0);
    batch = cpu_batch(first);
    if (batch == 1) samples.add(first), executions = 1;
    recorded = is_model_step(p) && first >= kRecordedSampleSeconds;
    if (recorded && !live.breakdown) live.breakdown = std::make_unique<trace::Breakdown>();
  } else if (!live.c->host_timed()) {
    batch = live.timer->launches_per_sample();
  }
  const bool rule = o.max_noise > 0;
  const std::size_t least = rule ? static_cast<std::size_t>(o.min_samples) : 2;
  std::vector<double> history;  // the noise after each sample
  char text[96] = "";
  for (;;) {
    if (recorded) {
      samples.add(trace::record_cpu_step([&] { live.c->run(); }, *live.breakdown));
    } else if (p.backend == Backend::cpu) {
      const auto t0 = clock::now();
      for (std::int64_t i = 0; i < batch; ++i) live.c->run();
      samples.add(seconds_since(t0) / static_cast<double>(batch));
    } else if (live.c->host_timed()) {
      const auto t0 = clock::now();
      live.c->run();
      samples.add(seconds_since(t0));
    } else {
      samples.add(live.timer->sample());
    }
    executions += batch;
    const double spent = seconds_since(start), noise = samples.noise_pct();
    if (rule && samples.seconds.size() >= 2) history.push_back(noise);
    if (rule && spent >= o.timeout) {
      std::snprintf(text, sizeof text, "timeout (%g s) at noise %.3g%%", o.timeout, noise);
      break;
    }
    if (samples.seconds.size() < least || spent < o.min_seconds) continue;
    if (!rule) break;
    if (noise <= o.max_noise) {
      std::snprintf(text, sizeof text, "noise %.3g%% <= %g%%", noise, o.max_noise);
      break;
    }
    if (settled(history)) {
      std::snprintf(text, sizeof text, "noise settled at %.3g%%", noise);
      break;
    }
  }
  why = text;
  return samples.running_mean;
}

void run_benchmark(benchmark::State& state, const Family& f, const Problem& p, const Options& o) {
  if (p.backend == Backend::cuda) {
    GpuState& g = gpu_state();
    if (!g.lost.empty()) {
      state.SkipWithError(("not run: " + g.lost).c_str());
      return;
    }
    g.started.insert(p.name());
  }
  struct Idle {  // the run is busy with this entry until the function returns
    ~Idle() {
      if (g_group) g_group->idle();
    }
  } idle_at_return;
  Live* chosen = nullptr;
  if (on_ranks(p)) {
    Live& live = the_live();
    const bool fresh = live.name != p.name();
    if (g_group) {
      g_group->busy(p.name());
      try {
        g_group->send_command(encode_command(fresh, static_cast<std::int64_t>(state.max_iterations), p.name()));
      } catch (const std::exception& e) {
        g_group->fatal(std::string("telling the other ranks to run ") + p.name() + ": " + e.what());
        std::_Exit(1);
      }
    }
    if (fresh) setup_on_ranks(live, f, p, o);
    chosen = &live;
  } else {
    chosen = &live_for(p, f, o);
  }
  Live& live = *chosen;
  if (!live.error.empty()) {
    state.SkipWithError(live.error.c_str());
    return;
  }
  double elapsed = 0;  // the time the iterations were credited with, for the roofline fractions
  Samples samples;
  std::string stopped;  // the stopping rule: what ended the sampling
  // A time the host's clock takes (a CPU entry, an end-to-end one) depends on the host's cores: how
  // long the threads waited for one while the entry was timed.
  const bool host_clock = p.backend == Backend::cpu || live.c->host_timed();
  const std::optional<CoreTime> cores_before = host_clock ? core_time() : std::nullopt;
  double wait_pct = -1;  // cpu_wait_pct, where it was read
  try {
    if (own_loop(p, o)) {
      // The one iteration stands for every sample taken (registered with Iterations(1)).
      std::int64_t executions = 0;
      for (auto _ : state) {
        elapsed = take_samples(live, p, o, samples, executions, stopped);
        state.SetIterationTime(elapsed);
      }
      state.counters["executions"] = static_cast<double>(executions);
    } else if (p.backend == Backend::cpu) {
      using clock = std::chrono::steady_clock;
      const auto t0 = clock::now();
      auto last = t0;
      // The first execution alone sizes the batches (and is a sample only when it is the only one:
      // it pays for cold caches as the rest do not).
      std::int64_t batch = 0, in_batch = 0;
      double first = 0;
      for (auto _ : state) {
        live.c->run();
        if (++in_batch < batch) continue;
        const auto now = clock::now();
        const double t = std::chrono::duration<double>(now - last).count();
        if (batch == 0) {
          first = t;
          batch = cpu_batch(t);
        } else {
          samples.seconds.push_back(t / static_cast<double>(in_batch));
        }
        last = now, in_batch = 0;
      }
      if (samples.seconds.empty() && batch > 0) samples.seconds.push_back(first);
      elapsed = std::chrono::duration<double>(clock::now() - t0).count();
    } else if (live.c->host_timed()) {
      // End to end: the host's clock around each complete run (which synchronises itself).
      for (auto _ : state) {
        const auto t0 = std::chrono::steady_clock::now();
        live.c->run();
        const double t = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        state.SetIterationTime(t);
        elapsed += t;
        samples.seconds.push_back(t);
      }
    } else {
      // One iteration is one execution, so Google Benchmark's iteration count and min_time mean
      // what they say; a sample of `runs` executions is timed every `runs` iterations.
      const int runs = live.timer->launches_per_sample();
      double per_run = 0;
      int left = 0;
      for (auto _ : state) {
        if (left == 0) {
          per_run = live.timer->sample(), left = runs, samples.seconds.push_back(per_run);
          if (g_group) g_group->progress();
        }
        --left;
        state.SetIterationTime(per_run);
        elapsed += per_run;
      }
    }
    if (cores_before) {
      if (const std::optional<CoreTime> after = core_time()) state.counters["cpu_wait_pct"] = wait_pct = waited_pct(*cores_before, *after);
    }
    if (p.backend == Backend::cpu) {
      // A thread-sweep entry (`threads:T`) runs on T threads; every other CPU entry on all of them.
      state.counters["cpu_threads"] = p.has("threads") ? static_cast<double>(p.get_int("threads")) : cpu::threads();
    } else if (!live.c->host_timed()) {
      state.counters["runs_per_sample"] = live.timer->launches_per_sample();
      state.counters["sm_clock_mhz"] = live.timer->mean_clock_mhz();
      state.counters["throttled_samples"] = static_cast<double>(live.timer->discarded_samples());
    }
  } catch (const std::exception& e) {
    live.error = describe(e, p.backend);
    if (on_ranks(p) && g_group) {
      g_group->fatal("timing " + p.name() + " failed: " + live.error + " (the other ranks cannot go on without this one)");
      std::_Exit(1);
    }
    if (p.backend == Backend::cuda) check_gpu_context(p.name(), live.error);
    state.SkipWithError(live.error.c_str());
    return;
  }
  samples.report(state);
  const Work w = f.work(p);
  const auto iters = static_cast<double>(state.iterations());
  if (is_model_step(p) && iters > 0) {
    try {
      report_breakdown(state, live, p, elapsed / iters);
    } catch (const std::exception& e) {
      live.error = "the per-op breakdown failed: " + describe(e, p.backend);
      if (on_ranks(p) && g_group) {
        g_group->fatal(p.name() + ": " + live.error + " (the other ranks cannot go on without this one)");
        std::_Exit(1);
      }
      if (p.backend == Backend::cuda) check_gpu_context(p.name(), live.error);
      state.SkipWithError(live.error.c_str());
      return;
    }
  }
  if (w.flops > 0) state.counters["FLOP/s"] = benchmark::Counter(w.flops * iters, benchmark::Counter::kIsRate);
  if (w.bus_bytes > 0) {  // collectives: nccl-tests' algorithm and bus bandwidths, in bytes per second
    state.counters["algbw"] = benchmark::Counter(w.bytes * iters, benchmark::Counter::kIsRate);
    state.counters["busbw"] = benchmark::Counter(w.bus_bytes * iters, benchmark::Counter::kIsRate);
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(w.bytes * iters));
  state.SetItemsProcessed(static_cast<std::int64_t>(w.items * iters));
  // Model steps also report samples/s (DESIGN.md): their items are the samples of the batch.
  if (is_model_step(p)) state.counters["samples/s"] = benchmark::Counter(w.items * iters, benchmark::Counter::kIsRate);
  // Fractions of the roofline measured at start-up: of the copy bandwidth, and of the GEMM rate of
  // this dtype for ops that compute.
  // (A collective moves its bytes over the links between GPUs: the copy bandwidth is not its ceiling.
  // An entry over G GPUs does G GPUs' work: one GPU's ceilings are not its own.)
  const auto ceiling = roofline().ceilings.find(p.backend);
  if (ceiling != roofline().ceilings.end() && elapsed > 0 && w.bus_bytes == 0 && !on_ranks(p)) {
    const Ceilings& c = ceiling->second;
    if (c.bytes_per_second > 0) state.counters["bw_fraction"] = w.bytes * iters / elapsed / c.bytes_per_second;
    const auto peak = c.flops.find(p.dtype);
    if (w.flops > 0 && peak != c.flops.end()) state.counters["flop_fraction"] = w.flops * iters / elapsed / peak->second;
  }
  std::string busy;
  if (wait_pct > kBusyWaitPct) {
    char text[128];
    std::snprintf(text, sizeof text, " [BUSY CPU: its threads waited %.0f%% of their time for a core]", wait_pct);
    busy = text;
  }
  state.SetLabel(live.c->label() + (stopped.empty() ? "" : " [stopped: " + stopped + "]") + busy +
                 (o.verify ? "" : " [NOT VERIFIED: --hotops_verify=0]"));
}

}  // namespace

std::string end_gpu_part_if_lost(const std::string& where) {
  GpuState& g = gpu_state();
  std::string why;
  if (!g.lost.empty() || !gpu::context_lost(&why)) return "";
  g.lost = "GPU context lost in " + where + ": " + why;
  const std::size_t left = g.expected > g.started.size() ? g.expected - g.started.size() : 0;
  const std::string line = g.lost + "; the remaining " + std::to_string(left) + " CUDA benchmarks are skipped";
  std::fprintf(stderr, "hotops: %s\n", line.c_str());
  return line;
}

std::vector<Problem> select(const std::vector<Problem>& problems, const std::string& filter) {
  // Google Benchmark's conventions (benchmark_register.cc): empty and "all" mean every benchmark.
  const std::string spec = filter.empty() || filter == "all" ? "." : filter;
  const bool negate = spec[0] == '-';
  const std::regex re(negate ? spec.substr(1) : spec, std::regex::extended);
  std::vector<Problem> out;
  for (const Problem& p : problems) {
    const std::string name = p.name() + (p.backend == Backend::cuda ? "/manual_time" : "/real_time");
    if (std::regex_search(name, re) != negate) out.push_back(p);
  }
  return out;
}

std::vector<Backend> backends_of(const std::vector<Problem>& problems) {
  std::vector<Backend> out;
  for (const Problem& p : problems)
    if (std::find(out.begin(), out.end(), p.backend) == out.end()) out.push_back(p.backend);
  return out;
}

void set_group(ranks::Group* g) { g_group = g; }

void end_workers() {
  if (!g_group) return;
  g_group->ending();
  g_group->send_command("exit");
  g_group->busy("the end of the run (destroying the communicators)");
  reset(the_live(), "");
  comm::finish();
  g_group->idle();
}

int run_worker(const Options& o) {
  ranks::Group& g = *g_group;
  std::map<std::string, std::pair<const Family*, Problem>> by_name;
  for (const Family* f : families())
    for (const Problem& p : f->benchmark_problems(o.batches))
      if (on_ranks(p)) by_name.emplace(p.name(), std::make_pair(f, p));
  Live& live = the_live();
  for (;;) {
    std::string command;
    try {
      command = g.next_command();
    } catch (const ranks::ChannelError& e) {
      g.fatal(e.what());
      return 1;
    }
    if (command == "exit") break;
    // "run <fresh> <iterations> <name>"
    char fresh = 0;
    long long iterations = 0;
    int consumed = 0;
    if (std::sscanf(command.c_str(), "run %c %lld %n", &fresh, &iterations, &consumed) != 2 || consumed == 0) {
      g.fatal("rank 0 sent a command this rank does not understand: '" + command + "'");
      return 1;
    }
    const std::string name = command.substr(static_cast<std::size_t>(consumed));
    const auto it = by_name.find(name);
    if (it == by_name.end()) {
      g.fatal("rank 0 asked for " + name + ", which this rank does not have (another build or other flags?)");
      return 1;
    }
    g.busy(name);
    const auto& [family, problem] = it->second;
    if (fresh == '1') setup_on_ranks(live, *family, problem, o);
    if (live.error.empty() && live.timer) follow_samples(live, problem, iterations);
    g.idle();
  }
  g.ending();
  g.busy("the end of the run (destroying the communicators)");
  reset(live, "");
  try {
    comm::finish();
  } catch (const std::exception& e) {
    g.fatal(std::string("destroying the communicators failed: ") + e.what());
    return 1;
  }
  g.idle();
  return 0;
}

void expect_cuda_benchmarks(std::size_t n) { gpu_state().expected = n; }
bool gpu_context_lost() { return !gpu_state().lost.empty(); }

std::string test_fault_kinds() {
  std::string s;
  for (const std::string& k : test_fault_names()) s += (s.empty() ? "" : ", ") + k;
  return s;
}

bool is_test_fault_kind(const std::string& kind) {
  const auto& names = test_fault_names();
  return std::find(names.begin(), names.end(), kind) != names.end();
}

Registered register_benchmarks(const Options& options, const std::string& test_fault, std::int64_t iterations,
                               const std::string& filter) {
  Registered out;
  static const Options o = options;  // outlives registration: the lambdas refer to it
  static std::vector<std::unique_ptr<Family>> test_only;
  std::vector<const Family*> all;
  if (!test_fault.empty()) {
    test_only.push_back(std::make_unique<TestFaultFamily>(test_fault));
    all.push_back(test_only.back().get());
  }
  all.insert(all.end(), families().begin(), families().end());
  std::vector<const Family*> family_of;  // of each of out.problems
  for (const Family* f : all) {
    for (const Problem& p : f->benchmark_problems(o.batches)) {
      const std::string why = f->unsupported_reason(p);
      if (!why.empty()) {
        out.unsupported.emplace_back(p, why);
        continue;
      }
      out.problems.push_back(p);
      family_of.push_back(f);
    }
  }
  // With hotops' own loop only what the filter selects is registered (the run then selects all):
  // Google Benchmark would match the filter against names that carry the loop's iterations:1.
  std::set<std::string> selected;
  if (o.own_loop)
    for (const Problem& p : select(out.problems, filter)) selected.insert(p.name());
  for (std::size_t i = 0; i < out.problems.size(); ++i) {
    const Problem& p = out.problems[i];
    if (o.own_loop && !selected.count(p.name())) continue;
    const Family* f = family_of[i];
    auto* b = benchmark::RegisterBenchmark(p.name().c_str(), [f, p](benchmark::State& st) {
      run_benchmark(st, *f, p, o);
    });
    if (own_loop(p, o)) {
      b->Iterations(1)->UseManualTime();
      own_loop_entries()[p.name()] = p.backend;
      continue;
    }
    if (iterations > 0) b->Iterations(iterations);
    if (p.backend == Backend::cuda) b->UseManualTime();
    else b->UseRealTime();
  }
  return out;
}

void name_as_listed(benchmark::BenchmarkReporter::Run& run) {
  const auto it = own_loop_entries().find(run.run_name.function_name);
  if (it == own_loop_entries().end()) return;
  run.run_name.iterations.clear();
  run.run_name.time_type = it->second == Backend::cpu ? "real_time" : "manual_time";
  // The one iteration stands for the executions the loop took: reported as Google Benchmark's loop
  // reports a run, their count as its iterations, its real time as their mean and the CPU time of
  // the whole sampling over them. A repetitions aggregate keeps the repetitions as its iterations
  // and its real time (already the statistic of the means); its CPU time is over the repetitions'
  // mean count of executions (cv is a ratio).
  const auto e = run.counters.find("executions");
  if (e == run.counters.end() || !(e->second.value > 0) || run.aggregate_unit == benchmark::kPercentage) return;
  if (run.run_type == benchmark::BenchmarkReporter::Run::RT_Aggregate) {
    run.cpu_accumulated_time /= e->second.value;
    return;
  }
  const auto executions = static_cast<benchmark::IterationCount>(std::llround(e->second.value));
  run.real_accumulated_time *= static_cast<double>(executions) / static_cast<double>(run.iterations);
  run.iterations = executions;
}

}  // namespace hotops::bench
