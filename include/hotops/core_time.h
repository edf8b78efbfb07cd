// How much of its time the process's threads spent waiting for a core: Linux's scheduler statistics
// per thread (/proc/self/task/<tid>/schedstat: nanoseconds on a core, nanoseconds runnable but
// waiting on a run queue), and, on a virtual machine, the time the hypervisor gave the process's
// cores to other work (the steal column of /proc/stat, for the CPUs the process may run on). A CPU
// entry runs one thread per core; when other work holds a core, the thread that lost it holds up
// every barrier of the team, and a step can take many times its time (docs/timing.md). The wait
// tells such an entry apart from a slow kernel.
#pragma once
#include <optional>
#include <string>
#include <vector>

namespace hotops {

struct CoreTime {
  double ran = 0;     // seconds on a core, summed over the threads
  double waited = 0;  // seconds runnable but waiting for a core, summed over the threads
  double stolen = 0;  // seconds the hypervisor ran something else on the process's CPUs, summed over them
  double wall = 0;    // seconds on a steady clock (the interval between two readings)
  int cpus = 0;       // the CPUs the process may run on
};

// The process's threads' totals now; nullopt where the kernel does not report them.
std::optional<CoreTime> core_time();

// Of the time the threads wanted a core between two readings, the share they waited for one, in
// percent (0 when they wanted none). The hypervisor's steal counts in the share that fell on the
// threads: the threads wanting a core on average over the interval, of the process's CPUs (a team
// as large as the machine takes all of it, one thread of 16 CPUs a sixteenth).
double waited_pct(const CoreTime& before, const CoreTime& after);

// The steal, in seconds, summed over `cpus` in the text of /proc/stat (its per-CPU lines' eighth
// value, in ticks of `ticks_per_second`); 0 for a CPU the text has no line for.
double stolen_seconds(const std::string& proc_stat, const std::vector<int>& cpus, double ticks_per_second);

// A CPU or host-timed entry whose threads waited more than this share is marked busy: on a quiet
// machine they wait well under 1%.
constexpr double kBusyWaitPct = 5;

}  // namespace hotops
