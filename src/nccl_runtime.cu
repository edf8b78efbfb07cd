// The NCCL communicators of a run: the world's, one per GPU count (split from it), or one of this
// process alone; made once, destroyed together at the end.
#include <cuda_runtime.h>

#include <cstring>
#include <map>
#include <mutex>
#include <vector>

#include "hotops/nccl_util.h"

namespace hotops::comm {
namespace {

struct Communicators {
  std::mutex mutex;
  ncclComm_t world = nullptr;
  int rank = 0, size = 1;
  std::map<int, ncclComm_t> by_gpus;  // nullptr: this rank is outside ranks [0, gpus)
  std::vector<ncclComm_t> made;       // in the order made, each once
};

Communicators& state() {
  static Communicators c;
  return c;
}

}  // namespace

bool built(std::string* why) {
  if (why) why->clear();
  return true;
}

std::string nccl_version() {
  int v = 0;
  if (ncclGetVersion(&v) != ncclSuccess) return "";
  // NCCL_VERSION(X, Y, Z) = X * 10000 + Y * 100 + Z from 2.9 on.
  return std::to_string(v / 10000) + "." + std::to_string((v / 100) % 100) + "." + std::to_string(v % 100);
}

std::string unique_id() {
  ncclUniqueId id;
  HOTOPS_CHECK_NCCL(ncclGetUniqueId(&id));
  return std::string(id.internal, sizeof id.internal);
}

void init_world(const std::string& id, int rank, int world) {
  Communicators& c = state();
  std::lock_guard<std::mutex> lock(c.mutex);
  HOTOPS_CHECK(!c.world, "the NCCL world communicator is made once");
  HOTOPS_CHECK(id.size() == sizeof(ncclUniqueId::internal), "the rendezvous handed out an NCCL id of " +
                                                                 std::to_string(id.size()) + " bytes");
  ncclUniqueId u;
  std::memcpy(u.internal, id.data(), sizeof u.internal);
  HOTOPS_CHECK_NCCL(ncclCommInitRank(&c.world, world, u, rank));
  c.rank = rank, c.size = world;
  c.made.push_back(c.world);
  c.by_gpus[world] = c.world;
}

int world_size() { return state().size; }

void prepare(int gpus) {
  Communicators& c = state();
  std::lock_guard<std::mutex> lock(c.mutex);
  if (c.by_gpus.count(gpus)) return;
  ncclComm_t comm = nullptr;
  if (!c.world) {
    HOTOPS_CHECK(gpus == 1, "a communicator of " + std::to_string(gpus) +
                                " GPUs needs a run over as many (bench --hotops_gpus=" + std::to_string(gpus) + ")");
    ncclUniqueId u;
    HOTOPS_CHECK_NCCL(ncclGetUniqueId(&u));
    HOTOPS_CHECK_NCCL(ncclCommInitRank(&comm, 1, u, 0));
  } else {
    HOTOPS_CHECK(gpus >= 1 && gpus <= c.size, "a communicator of " + std::to_string(gpus) + " GPUs in a run of " +
                                                  std::to_string(c.size));
    // Its own resources (splitShare 0), as a communicator made for these ranks alone would have.
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    HOTOPS_CHECK_NCCL(ncclCommSplit(c.world, c.rank < gpus ? 0 : NCCL_SPLIT_NOCOLOR, c.rank, &comm, &config));
  }
  c.by_gpus[gpus] = comm;
  if (comm) c.made.push_back(comm);
}

ncclComm_t get(int gpus) {
  Communicators& c = state();
  std::lock_guard<std::mutex> lock(c.mutex);
  const auto it = c.by_gpus.find(gpus);
  HOTOPS_CHECK(it != c.by_gpus.end(), "no communicator of " + std::to_string(gpus) + " GPUs was prepared");
  return it->second;
}

void finish() {
  Communicators& c = state();
  std::lock_guard<std::mutex> lock(c.mutex);
  // The split ones first, the world last: each is finalized (its work completes) and destroyed.
  for (auto it = c.made.rbegin(); it != c.made.rend(); ++it) {
    HOTOPS_CHECK_NCCL(ncclCommFinalize(*it));
    HOTOPS_CHECK_NCCL(ncclCommDestroy(*it));
  }
  c.made.clear();
  c.by_gpus.clear();
  c.world = nullptr;
  c.rank = 0, c.size = 1;
}

ncclDataType_t nccl_type(DType t) {
  switch (t) {
    case DType::f32: return ncclFloat32;
    case DType::bf16: return ncclBfloat16;
    case DType::f16: return ncclFloat16;
    default: break;
  }
  throw Error(std::string("NCCL has no type for ") + dtype_name(t));
}

}  // namespace hotops::comm
