// Measuring the roofline pair (copy bandwidth, GEMM rate per dtype) with hotops' own benchmarks.
#include "bench/roofline.h"

#include <algorithm>
#include <chrono>
#include <memory>

#include "hotops/gpu.h"
#include "hotops/op.h"

namespace hotops::bench {
namespace {

// The problems whose rates are the ceilings: the fastest device copy of at least 64 MiB (larger
// than any L2 or, at 1 GiB, any L3 of the CPU), and the GEMM. CPU GEMM at 2048: as fast as larger
// squares on oneDNN, and affordable on a 2-core CI machine.
const std::vector<std::string> kBandwidthProblems[] = {
    {"copy/cpu/f32/fwd/kind:memcpy/bytes:1073741824"},
    {"copy/cuda/f32/fwd/kind:memcpy/bytes:67108864", "copy/cuda/f32/fwd/kind:memcpy/bytes:268435456",
     "copy/cuda/f32/fwd/kind:memcpy/bytes:1073741824"}};
const char* kGemmShape[] = {"shape:square/M:2048/N:2048/K:2048", "shape:square/M:8192/N:8192/K:8192"};

struct Found {
  const Family* family = nullptr;
  Problem problem;
};

Found find(const std::string& name) {
  for (const Family* f : families())
    for (Problem& p : f->benchmark_problems({}))
      if (p.name() == name) return {f, std::move(p)};
  return {};
}

// The best seconds per execution over a few samples (a ceiling is what the machine can reach),
// after verification; 0 with a note on failure.
double best_seconds(const Found& f, const Options& o, std::vector<std::string>& notes) {
  const std::string name = f.problem.name();
  if (!f.family) {
    notes.push_back("roofline: no benchmark " + name);
    return 0;
  }
  const std::string why = f.family->unsupported_reason(f.problem);
  if (!why.empty()) {
    notes.push_back("roofline: " + name + " cannot run: " + why);
    return 0;
  }
  try {
    const auto c = f.family->make(f.problem);
    const Check chk = c->verify();
    if (!chk.ok) {
      notes.push_back("roofline: " + name + " failed verification: " + chk.message);
      return 0;
    }
    std::vector<double> t;
    if (f.problem.backend == Backend::cuda) {
      gpu::TimerOptions to;
      to.throttle_threshold = o.throttle_threshold;
      gpu::Timer timer(*c, to);
      for (int i = 0; i < 9; ++i) t.push_back(timer.sample());
    } else {
      c->run();
      for (int i = 0; i < 5; ++i) {
        const auto t0 = std::chrono::steady_clock::now();
        c->run();
        t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
      }
    }
    return *std::min_element(t.begin(), t.end());
  } catch (const std::exception& e) {
    notes.push_back("roofline: " + name + ": " + e.what());
    return 0;
  }
}

}  // namespace

Roofline& roofline() {
  static Roofline r;
  return r;
}

Roofline measure_roofline(const Options& o, const std::vector<Backend>& backends) {
  Roofline r;
  for (Backend b : backends) {
    const int i = b == Backend::cpu ? 0 : 1;
    Ceilings c;
    for (const std::string& name : kBandwidthProblems[i]) {
      const Found bw = find(name);
      if (const double s = best_seconds(bw, o, r.notes); s > 0)
        c.bytes_per_second = std::max(c.bytes_per_second, bw.family->work(bw.problem).bytes / s);
    }
    const std::vector<DType> types = b == Backend::cpu ? std::vector<DType>{DType::f32, DType::bf16}
                                                       : std::vector<DType>{DType::f32, DType::tf32, DType::bf16};
    for (DType t : types) {
      const Found g = find(std::string("mm/") + backend_name(b) + "/" + dtype_name(t) + "/fwd/" + kGemmShape[i]);
      if (const double s = best_seconds(g, o, r.notes); s > 0) c.flops[t] = g.family->work(g.problem).flops / s;
    }
    r.ceilings[b] = c;
  }
  return r;
}

}  // namespace hotops::bench
