// Benchmark registration and the timed loops: CPU real time around a completed run, GPU device
// time from CUDA events (gpu::Timer). Setup and verification happen once per benchmark, outside
// timing; a failed verification or any error becomes an error entry, never a time.
#include "bench/runner.h"

#include <benchmark/benchmark.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>

#include "hotops/check.h"
#include "hotops/cpu.h"
#include "hotops/gpu.h"
#include "hotops/op.h"

namespace hotops::bench {
namespace {

// Google Benchmark calls a benchmark function several times while it sizes the iteration count;
// the case (and its verification) is kept between those calls and dropped when the next starts.
struct Live {
  std::string name;
  std::unique_ptr<Case> c;
  std::unique_ptr<gpu::Timer> timer;
  std::string error;  // setup or verification failure, reported on every call
};

Live& live_for(const Problem& p, const Family& f, const Options& o) {
  static Live live;
  const std::string name = p.name();
  if (live.name == name) return live;
  live.timer.reset();
  live.c.reset();
  live.error.clear();
  live.name = name;
  const auto t0 = std::chrono::steady_clock::now();
  try {
    live.c = f.make(p);
    if (o.verify) {
      const Check chk = live.c->verify();
      if (!chk.ok) live.error = "verification failed: " + chk.message;
    }
    if (live.error.empty() && p.backend == Backend::cuda) {
      gpu::TimerOptions to;
      to.cold_l2 = o.cold_l2;
      to.throttle_threshold = o.throttle_threshold;
      live.timer = std::make_unique<gpu::Timer>(*live.c, to);
    }
  } catch (const std::exception& e) {
    live.error = e.what();
  }
  if (!live.error.empty()) {
    live.timer.reset();
    live.c.reset();
  }
  if (std::getenv("HOTOPS_TRACE_SETUP"))
    std::fprintf(stderr, "setup %.3f s %s\n",
                 std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), name.c_str());
  return live;
}

void run_benchmark(benchmark::State& state, const Family& f, const Problem& p, const Options& o) {
  Live& live = live_for(p, f, o);
  if (!live.error.empty()) {
    state.SkipWithError(live.error.c_str());
    return;
  }
  try {
    if (p.backend == Backend::cpu) {
      for (auto _ : state) live.c->run();
      state.counters["threads"] = cpu::threads();
    } else {
      // One iteration is one execution, so Google Benchmark's iteration count and min_time mean
      // what they say; a sample of `runs` executions is timed every `runs` iterations.
      const int runs = live.timer->launches_per_sample();
      double per_run = 0;
      int left = 0;
      for (auto _ : state) {
        if (left == 0) per_run = live.timer->sample(), left = runs;
        --left;
        state.SetIterationTime(per_run);
      }
      state.counters["runs_per_sample"] = live.timer->launches_per_sample();
      state.counters["sm_clock_mhz"] = live.timer->mean_clock_mhz();
      state.counters["throttled_samples"] = static_cast<double>(live.timer->discarded_samples());
    }
  } catch (const std::exception& e) {
    live.error = e.what();
    state.SkipWithError(live.error.c_str());
    return;
  }
  const Work w = f.work(p);
  const auto iters = static_cast<double>(state.iterations());
  state.counters["FLOP/s"] = benchmark::Counter(w.flops * iters, benchmark::Counter::kIsRate);
  state.SetBytesProcessed(static_cast<std::int64_t>(w.bytes * iters));
  state.SetItemsProcessed(static_cast<std::int64_t>(w.items * iters));
  state.SetLabel(live.c->label() + (o.verify ? "" : " [NOT VERIFIED: --hotops_verify=0]"));
}

}  // namespace

void register_benchmarks(const Options& options) {
  static const Options o = options;  // outlives registration: the lambdas refer to it
  std::map<std::string, int> skipped;  // reason -> count
  for (const Family* f : families()) {
    for (const Problem& p : f->benchmark_problems(o.batches)) {
      const std::string why = f->unsupported_reason(p);
      if (!why.empty()) {
        ++skipped[why];
        continue;
      }
      auto* b = benchmark::RegisterBenchmark(p.name().c_str(), [f, p](benchmark::State& st) {
        run_benchmark(st, *f, p, o);
      });
      b->Unit(benchmark::kMicrosecond);
      if (p.backend == Backend::cuda) b->UseManualTime();
      else b->UseRealTime();
    }
  }
  for (const auto& [why, n] : skipped) std::fprintf(stderr, "hotops: %d benchmarks not run: %s\n", n, why.c_str());
}

}  // namespace hotops::bench
