// The process's threads' time on a core and waiting for one, from /proc/self/task/*/schedstat, and the
// hypervisor's steal on the process's CPUs, from /proc/stat.
#include "hotops/core_time.h"

#include <dirent.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

namespace hotops {
namespace {

std::vector<int> allowed_cpus() {
  std::vector<int> cpus;
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) != 0) return cpus;
  for (int c = 0; c < CPU_SETSIZE; ++c)
    if (CPU_ISSET(c, &set)) cpus.push_back(c);
  return cpus;
}

}  // namespace

double stolen_seconds(const std::string& proc_stat, const std::vector<int>& cpus, double ticks_per_second) {
  std::istringstream in(proc_stat);
  std::string line;
  double ticks = 0;
  while (std::getline(in, line)) {
    // "cpuN user nice system idle iowait irq softirq steal ..."; the "cpu " line is the sum of them.
    int cpu = -1, used = 0;
    if (line.compare(0, 3, "cpu") != 0 || line.size() < 4 || line[3] < '0' || line[3] > '9') continue;
    if (std::sscanf(line.c_str() + 3, "%d %n", &cpu, &used) != 1 || used == 0) continue;
    if (std::find(cpus.begin(), cpus.end(), cpu) == cpus.end()) continue;
    std::istringstream fields(line.substr(3 + static_cast<std::size_t>(used)));
    unsigned long long v[8] = {};
    int n = 0;
    while (n < 8 && fields >> v[n]) ++n;
    if (n == 8) ticks += static_cast<double>(v[7]);
  }
  return ticks / ticks_per_second;
}

std::optional<CoreTime> core_time() {
  DIR* tasks = opendir("/proc/self/task");
  if (!tasks) return std::nullopt;
  CoreTime t;
  bool any = false;
  while (const dirent* d = readdir(tasks)) {
    if (d->d_name[0] == '.') continue;
    const std::string path = std::string("/proc/self/task/") + d->d_name + "/schedstat";
    std::FILE* f = std::fopen(path.c_str(), "r");
    if (!f) continue;  // a thread that ended since the listing
    unsigned long long ran = 0, waited = 0;
    if (std::fscanf(f, "%llu %llu", &ran, &waited) == 2) {
      t.ran += static_cast<double>(ran) * 1e-9, t.waited += static_cast<double>(waited) * 1e-9;
      any = true;
    }
    std::fclose(f);
  }
  closedir(tasks);
  if (!any) return std::nullopt;
  const std::vector<int> cpus = allowed_cpus();
  t.cpus = static_cast<int>(cpus.size());
  std::ifstream stat("/proc/stat");
  const long ticks = sysconf(_SC_CLK_TCK);
  if (stat && ticks > 0) {
    std::stringstream text;
    text << stat.rdbuf();
    t.stolen = stolen_seconds(text.str(), cpus, static_cast<double>(ticks));
  }
  t.wall = std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
  return t;
}

double waited_pct(const CoreTime& before, const CoreTime& after) {
  const double ran = after.ran - before.ran, waited = after.waited - before.waited;
  const double wall = after.wall - before.wall, stolen = after.stolen - before.stolen;
  double ours = 0;  // the steal that fell on the threads
  if (stolen > 0 && wall > 0 && after.cpus > 0) ours = stolen * std::min(1.0, (ran + waited) / wall / after.cpus);
  const double lost = std::max(waited, 0.0) + ours;
  return ran + lost > 0 && lost > 0 ? 100 * lost / (ran + lost) : 0;
}

}  // namespace hotops
