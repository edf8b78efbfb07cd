// The collectives family: NCCL's all-reduce (sum), reduce-scatter (sum), all-gather and broadcast
// (from rank 0) over the GPUs of a run, one process per GPU. Inputs are small integers whose sums
// are exact in f32 and bf16, so every element of every rank's output is checked exactly (as
// nccl-tests' verifiable mode does). algbw and busbw follow nccl-tests' definitions.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "hotops/buffer.h"
#include "hotops/op.h"
#include "hotops/plan.h"
#include "hotops/ranks.h"
#include "hotops/verify.h"

namespace hotops::collectives {

enum class Kind { allreduce, reduce_scatter, allgather, broadcast };
const char* kind_name(Kind k);

// One collective as one rank runs it. `bytes` is nccl-tests' size: the buffer of an all-reduce or
// a broadcast, the whole input of a reduce-scatter (each rank keeps bytes / gpus of it), the whole
// output of an all-gather (each rank gives bytes / gpus).
struct Shape {
  Kind op = Kind::allreduce;
  DType dtype = DType::f32;
  std::size_t bytes = 0;
  int gpus = 1;
  bool inplace = false;
  int rank = 0;  // this process's rank among the collective's ranks
  std::size_t elements() const { return bytes / dtype_size(dtype); }  // of the whole buffer
  std::size_t send_count() const;    // elements this rank gives
  std::size_t recv_count() const;    // elements this rank gets
  std::size_t recv_offset() const;   // in place: where in the whole buffer this rank's result lies
};

// The shape a benchmark name asks for, for this process's rank (ranks::layout()).
Shape shape_of(const Problem& p);

// nccl-tests' bus bandwidth factor (busbw = algbw x factor): all-reduce 2(n-1)/n, reduce-scatter
// and all-gather (n-1)/n, broadcast 1.
double busbw_factor(Kind k, int gpus);

// Rank r's input element i: an integer in 1..4095 (f32) or 1..31 (bf16), a pure function of
// (seed, r, i), so that a sum over up to 8 ranks is exact in any order (at most 32760 < 2^24, and
// 248 < 2^8) and every rank computes every other rank's inputs for its check.
double input_value(DType t, std::uint64_t seed, int rank, std::size_t i);
// The exact result of this rank's output element i (i < recv_count()).
double expected(const Shape& s, std::uint64_t seed, std::size_t i);

// What this rank's plan reads: its input (out of place), or the whole buffer as the collective
// starts from (in place: this rank's input at its place, the rest poisoned where the collective
// must write it).
struct Inputs {
  HostBuffer data;
  std::uint64_t seed = 0;
};
Inputs make_inputs(const Shape& s, std::uint64_t seed);
HostBuffer make_output(const Shape& s);  // recv_count() elements, or the whole buffer in place

// Every element of this rank's result against expected(), exactly. A failure names the first
// wrong element, its value and the exact one, and how many are wrong.
Check verify(const Shape& s, const Inputs& in, const HostBuffer& out);

// The buffers of one collective: `send` and `recv` as NCCL takes them (in place: both inside one
// buffer, at NCCL's in-place offsets).
struct Args {
  const void* send = nullptr;
  void* recv = nullptr;
};
using Plan = ::hotops::Plan<Args>;
// NCCL's collective on the communicator of the shape's GPUs (comm::get), enqueued on gpu::stream().
// Defined only in a build with NCCL.
std::unique_ptr<Plan> make_nccl_plan(const Shape& s);

// Why an entry of `gpus` GPUs cannot run in a run laid out as `l` on a machine with `devices` GPUs
// ("" when it can): e.g. "needs 4 GPUs in the run; start bench with --hotops_gpus=4".
std::string gpus_unsupported_reason(int gpus, const ranks::Layout& l, int devices);

const Family& family();

}  // namespace hotops::collectives
