// The NCCL communicators of a run, seen from code that needs no NCCL headers (bench, the tests).
// A multi-GPU run has one world communicator over all its ranks, and one for each GPU count its
// entries ask for (ranks 0 .. G-1), made once; a process alone can have one of itself (G = 1).
#pragma once
#include <string>

namespace hotops::comm {

// Whether this build has NCCL; otherwise *why says why not, as a user reads it.
bool built(std::string* why = nullptr);
std::string nccl_version();  // of the library loaded, e.g. "2.28.3"; "" without NCCL

std::string unique_id();  // rank 0: a new ncclUniqueId's bytes, for the rendezvous to hand out
// Every rank, together: the world communicator of `world` ranks (ncclCommInitRank), on the CUDA
// device this process uses (gpu::use_device first).
void init_world(const std::string& id, int rank, int world);
int world_size();  // 1 before init_world

// Every rank of the world, together, the first time a GPU count is needed: the communicator of ranks
// [0, gpus) (ncclCommSplit of the world; the world's own for gpus = world_size()). Without a world,
// gpus must be 1: a communicator of this process alone. Throws an Error.
void prepare(int gpus);

// Every rank, together, at the end: finalizes and destroys every communicator.
void finish();

}  // namespace hotops::comm
