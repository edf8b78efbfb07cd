// How much of its time the process's threads spent waiting for a core: Linux's scheduler statistics
// per thread (/proc/self/task/<tid>/schedstat: nanoseconds on a core, nanoseconds runnable but
// waiting on a run queue). A CPU entry runs one thread per core; when other work holds a core, the
// thread that lost it holds up every barrier of the team, and a step can take many times its time
// (docs/timing.md). The wait tells such an entry apart from a slow kernel.
#pragma once
#include <optional>

namespace hotops {

struct CoreTime {
  double ran = 0;     // seconds on a core, summed over the threads
  double waited = 0;  // seconds runnable but waiting for a core, summed over the threads
};

// The process's threads' totals now; nullopt where the kernel does not report them.
std::optional<CoreTime> core_time();

// Of the time the threads wanted a core between two readings, the share they waited for one, in
// percent (0 when they wanted none).
double waited_pct(const CoreTime& before, const CoreTime& after);

// A CPU or host-timed entry whose threads waited more than this share is marked busy: on a quiet
// machine they wait well under 1%.
constexpr double kBusyWaitPct = 5;

}  // namespace hotops
