// The instrumented pass's bookkeeping and its CPU recorder (wall clock between marks).
#include "hotops/trace.h"

#include <algorithm>
#include <chrono>

#include "hotops/check.h"

namespace hotops::trace {
namespace {

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// The clock is read first, and the op's name (a string literal) kept as a pointer in storage reused
// from step to step: a mark costs a clock read and two stores, so that steps of a microsecond still
// break down.
class WallRecorder final : public Recorder {
 public:
  void mark(const char* op) override {
    starts.push_back(now_seconds());
    ops.push_back(op);
  }
  void clear() { starts.clear(), ops.clear(); }
  std::vector<double> starts;
  std::vector<const char*> ops;
};

}  // namespace

Recorder*& active() {
  static Recorder* r = nullptr;
  return r;
}

double Breakdown::covered_us() const {
  double sum = 0;
  for (const Part& p : parts) sum += p.us;
  return sum;
}

void add_step(const std::vector<std::string>& marks, const std::vector<double>& starts, double begin, double end,
              Breakdown& into, double lead) {
  HOTOPS_CHECK(marks.size() == starts.size(), "trace: one start per mark");
  begin = std::min(begin + lead, starts.empty() ? end : starts.front());
  // Running means over the steps so far: parts are per step.
  const double n = into.steps + 1.0;
  auto add = [&](const std::string& op, double seconds) {
    for (Part& p : into.parts)
      if (p.op == op) return void(p.us += seconds * 1e6 / n);
    into.parts.push_back({op, seconds * 1e6 / n});
  };
  for (Part& p : into.parts) p.us *= into.steps / n;
  for (std::size_t k = 0; k < marks.size(); ++k) add(marks[k], (k + 1 < marks.size() ? starts[k + 1] : end) - starts[k]);
  into.step_us = (into.step_us * into.steps + (end - begin) * 1e6) / n;
  ++into.steps;
}

double record_cpu_step(const std::function<void()>& run, Breakdown& into) {
  thread_local WallRecorder r;  // its storage kept from step to step
  r.clear();
  double before, begin, end;
  {
    Scope on(&r);
    before = now_seconds();
    begin = now_seconds();
    run();
    end = now_seconds();
  }
  add_step(std::vector<std::string>(r.ops.begin(), r.ops.end()), r.starts, begin, end, into, begin - before);
  return end - begin;
}

Breakdown measure_on_cpu(const std::function<void()>& run, double min_seconds, int min_steps) {
  Breakdown b;
  const double t0 = now_seconds();
  while (b.steps < min_steps || now_seconds() - t0 < min_seconds) record_cpu_step(run, b);
  return b;
}

}  // namespace hotops::trace
