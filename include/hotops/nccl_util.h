// NCCL-side helpers for the collectives' code: the error check and the communicators by GPU count.
#pragma once
#include <nccl.h>

#include <string>

#include "hotops/check.h"
#include "hotops/comm.h"
#include "hotops/dtype.h"

// HOTOPS_CHECK_NCCL(call): throws hotops::Error with the call, file:line, NCCL's error string and
// its last message (what NCCL says went wrong, e.g. which peer).
#define HOTOPS_CHECK_NCCL(call)                                                                  \
  do {                                                                                           \
    const ncclResult_t hotops_nr_ = (call);                                                      \
    if (hotops_nr_ != ncclSuccess && hotops_nr_ != ncclInProgress)                               \
      ::hotops::detail::throw_call_error("NCCL", #call, __FILE__, __LINE__,                      \
                                         std::string(ncclGetErrorString(hotops_nr_)) + ": " +    \
                                             ncclGetLastError(nullptr));                         \
  } while (0)

namespace hotops::comm {

// The communicator of ranks [0, gpus) after prepare(gpus); nullptr on a rank outside it.
ncclComm_t get(int gpus);

// NCCL's type of a hotops dtype (f32, bf16, f16); throws an Error for another.
ncclDataType_t nccl_type(DType t);

}  // namespace hotops::comm
