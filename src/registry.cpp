// The one registry of op families: bench/ registers its benchmarks from it, test/ its tests. Each
// family adds itself (HOTOPS_REGISTER_FAMILY in kernels/<family>/), so nothing here names one.
#include <algorithm>

#include "hotops/check.h"
#include "hotops/gpu.h"
#include "hotops/op.h"

namespace hotops {
namespace {

// The registered getters, filled during static initialisation (before main), in link order.
std::vector<const Family& (*)()>& registered() {
  static std::vector<const Family& (*)()> getters;
  return getters;
}

}  // namespace

void throw_no_cuda_backend(const Problem& p) {
  throw Error("this build of hotops has no CUDA backend: " + p.name(), ErrorKind::unsupported);
}

std::string backend_unsupported_reason(const Problem& p, std::string (*cpu_reason)(const Problem&)) {
  if (p.backend == Backend::cpu) return cpu_reason(p);
  std::string why;
  return gpu::available(&why) ? "" : why;
}

bool register_family(const Family& (*get)()) {
  registered().push_back(get);
  return true;
}

const std::vector<const Family*>& families() {
  static const std::vector<const Family*> all = [] {
    std::vector<const Family*> v;
    for (auto get : registered()) v.push_back(&get());
    // Link order is the build's business: the run order is fixed here, the op families first.
    std::sort(v.begin(), v.end(), [](const Family* a, const Family* b) {
      const bool ma = a->name().rfind("model", 0) == 0, mb = b->name().rfind("model", 0) == 0;
      return ma != mb ? mb : a->name() < b->name();
    });
    return v;
  }();
  return all;
}

}  // namespace hotops
