// The communicators of a build without NCCL: none, and a clear reason why.
#include "hotops/check.h"
#include "hotops/comm.h"

namespace hotops::comm {
namespace {
const char kWhy[] =
    "this build of hotops has no NCCL (configured with HOTOPS_WITH_NCCL=OFF, without CUDA, or NCCL not found: "
    "tools/deps.sh installs it)";
}  // namespace

bool built(std::string* why) {
  if (why) *why = kWhy;
  return false;
}
std::string nccl_version() { return ""; }
std::string unique_id() { throw Error(kWhy, ErrorKind::unsupported); }
void init_world(const std::string&, int, int) { throw Error(kWhy, ErrorKind::unsupported); }
int world_size() { return 1; }
void prepare(int) { throw Error(kWhy, ErrorKind::unsupported); }
void finish() {}

}  // namespace hotops::comm
