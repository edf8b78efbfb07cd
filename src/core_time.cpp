// The process's threads' time on a core and waiting for one, from /proc/self/task/*/schedstat.
#include "hotops/core_time.h"

#include <dirent.h>

#include <cstdio>
#include <string>

namespace hotops {

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
  return t;
}

double waited_pct(const CoreTime& before, const CoreTime& after) {
  const double ran = after.ran - before.ran, waited = after.waited - before.waited;
  return ran + waited > 0 && waited > 0 ? 100 * waited / (ran + waited) : 0;
}

}  // namespace hotops
