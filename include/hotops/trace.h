// Where a model step's time goes: the step marks where each of its ops starts, and an instrumented
// pass times the spans between the marks: one separate from the timed samples, or for a CPU step of
// 10 ms or more the timed samples themselves (docs/models.md).
#pragma once
#include <functional>
#include <string>
#include <vector>

namespace hotops {
class Case;
}

namespace hotops::trace {

// Receives the marks of a running step; installed only for an instrumented pass.
class Recorder {
 public:
  virtual ~Recorder() = default;
  virtual void mark(const char* op) = 0;
};

// The recorder of the instrumented pass in progress, nullptr outside one (the timed runs).
Recorder*& active();

// Installs a recorder for its lifetime, so that an exception cannot leave one installed.
class Scope {
 public:
  explicit Scope(Recorder* r) { active() = r; }
  ~Scope() { active() = nullptr; }
  Scope(const Scope&) = delete;
  Scope& operator=(const Scope&) = delete;
};

// The step's next op starts here, and the one before it ends: `name` is the op as the op families
// name it ("addmm", "softmax", ...), with "_bwd" for its backward. Outside an instrumented pass
// this is one load and one branch on the host, and nothing on the device.
inline void op(const char* name) {
  if (Recorder* r = active()) r->mark(name);
}

// One op's part of a step: its time per step, every span it was marked for added up.
struct Part {
  std::string op;
  double us = 0;
};

// A step's time broken down by op, averaged over `steps` instrumented steps.
struct Breakdown {
  std::vector<Part> parts;  // in the order of each op's first mark
  double step_us = 0;       // the instrumented step, from its start to its end
  int steps = 0;
  double covered_us() const;  // the sum of the parts: the step less what ran before its first mark
};

// The spans of one instrumented step: `starts[k]` is where marks[k] began, `end` where the step
// ended, `begin` where it started (any clock, one unit). Adds them to the per-op sums of `into`.
// `lead`: what one mark costs the recorder, measured in this step (two back-to-back clock reads or
// events). The step's first mark comes that long after `begin` when nothing ran before it, so the
// step is taken to start `lead` after `begin`, but never after its first mark: a reading stretched
// by a preemption or a delayed event must not make the ops longer than the step.
void add_step(const std::vector<std::string>& marks, const std::vector<double>& starts, double begin, double end,
              Breakdown& into, double lead = 0);

// Runs `run` (one step, complete when it returns) once under a wall-clock recorder and adds its
// spans to `into`; returns the step's seconds, from its start to its end. A mark costs a clock read
// (some 25 ns), so a step of 10 ms or more with tens of marks takes some 1e-4 longer recorded than
// not: bench breaks such a CPU model step down from its timed samples (docs/models.md).
double record_cpu_step(const std::function<void()>& run, Breakdown& into);

// Runs `run` (one step, complete when it returns) under a wall-clock recorder until `min_seconds`
// have passed and at least `min_steps` steps ran: the CPU's instrumented pass.
Breakdown measure_on_cpu(const std::function<void()>& run, double min_seconds, int min_steps = 3);

}  // namespace hotops::trace

namespace hotops::gpu {
// The CUDA instrumented pass of a case: CUDA events recorded at each mark on hotops' stream. A
// device-timed case's steps run behind a hold kernel, as the timed samples do, so that launch
// latency stays out: a capturable one as a CUDA graph of the step with its events as nodes, another
// behind a hold sized from the host's enqueue time; a host-timed case's (e2e, graph) as its run()
// pays it, from the event before run() to the event after it returns.
trace::Breakdown measure_breakdown(Case& c, double min_seconds, int min_steps = 3);
}  // namespace hotops::gpu
