// The CPU runtime: one oneDNN engine and stream for the process, the oneDNN steps every CPU case
// shares (descriptors, reorders, the support probe, execution), and the thread count.
#pragma once
#include <omp.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <initializer_list>
#include <unordered_map>
#include <utility>
#include <vector>

#include <dnnl.hpp>

#include "hotops/dtype.h"
#include "hotops/problem.h"

namespace hotops::cpu {

dnnl::engine& engine();
dnnl::stream& stream();

// A primitive's arguments, by DNNL_ARG_*.
using Args = std::unordered_map<int, dnnl::memory>;
// Runs `p` on stream() and waits for it: the timed region of a CPU case that is one primitive.
void execute(const dnnl::primitive& p, const Args& args);

// A primitive bound to its arguments at setup; run() is the timed execute-and-wait.
struct Call {
  dnnl::primitive primitive;
  Args args;
  void run() const { execute(primitive, args); }
};

// A primitive that runs on memory its caller owns (a plan's oneDNN step): the argument memories are
// made once, at setup, and pointed at each run's buffers (set_data_handle where a pointer changed).
class Primitive {
 public:
  Primitive() = default;
  // `args`: each argument's DNNL_ARG_* and descriptor, in the order run() takes their buffers.
  Primitive(dnnl::primitive p, const std::vector<std::pair<int, dnnl::memory::desc>>& args);
  // Runs on stream() and waits, one buffer per argument (nullptr: an argument with no memory).
  void run(std::initializer_list<const void*> buffers);

 private:
  dnnl::primitive primitive_;
  Args args_;
  std::vector<int> order_;
  std::vector<const void*> bound_;
};

// oneDNN's type for a dtype's storage (tf32 is f32 storage).
dnnl::memory::data_type dnnl_type(DType t);
// A dense tensor: dims, dtype and layout (format_tag::any lets the primitive choose).
dnnl::memory::desc md(const dnnl::memory::dims& dims, DType t, dnnl::memory::format_tag tag);
// A memory over the caller's buffer `data`, which it neither copies nor owns.
dnnl::memory mem(const dnnl::memory::desc& d, void* data);
// `from` copied into `to`, whose layout may differ; complete on return.
void reorder(dnnl::memory from, dnnl::memory to);
// `from` copied into a new memory in the layout `want` (setup: the copy is complete on return).
dnnl::memory reordered(const dnnl::memory& from, const dnnl::memory::desc& want);

// Why oneDNN cannot run a case, "" when it can. `probe` creates the case's primitive descriptors
// (no memory touched); oneDNN answers `unimplemented` for what this CPU cannot do, which becomes
// "oneDNN has no <what> for this CPU (ISA <isa>)<suffix>". Any other error propagates.
std::string onednn_unsupported_reason(const std::function<void()>& probe, const std::string& what,
                                      const std::string& suffix = "");
// The same, <what> being "<dtype> <op> <direction>" of problem `p`.
std::string onednn_unsupported_reason(const std::function<void()>& probe, const Problem& p, const std::string& op,
                                      const std::string& suffix = "");

// An elementwise op through oneDNN's eltwise primitives over one tensor: forward_training, and for
// a backward eltwise_backward from the source x (not the destination), as PyTorch's backward of
// gelu and relu reads x.
struct Eltwise {
  dnnl::memory::desc tensor;
  dnnl::eltwise_forward::primitive_desc fwd;
  dnnl::eltwise_backward::primitive_desc bwd;  // backward only
  bool backward = false;

  Eltwise(dnnl::algorithm alg, const dnnl::memory::desc& tensor, float alpha, bool backward);
  const char* impl_info_str() const;
};

// The arguments of a matmul primitive: dst = src . weights, each over the caller's buffer.
Args matmul_args(const dnnl::matmul::primitive_desc& pd, void* src, void* weights, void* dst);

// The tensors of oneDNN's batch or layer normalization with use_scale | use_shift, both of which
// take the same arguments; gamma, beta and their gradients are f32 vectors of `scale_shift`.
struct NormalizationTensors {
  void* x;
  void* mean;      // fwd training: written; inference and bwd: read
  void* variance;  // as mean
  void* gamma;
  void* beta;
  void* out;  // fwd y, bwd dx
  void* dy = nullptr;
  void* dgamma = nullptr;
  void* dbeta = nullptr;
};
template <class ForwardPd>
Args normalization_forward_args(const ForwardPd& pd, const dnnl::memory::desc& scale_shift,
                                const NormalizationTensors& t) {
  return {{DNNL_ARG_SRC, mem(pd.src_desc(), t.x)},
          {DNNL_ARG_DST, mem(pd.dst_desc(), t.out)},
          {DNNL_ARG_SCALE, mem(scale_shift, t.gamma)},
          {DNNL_ARG_SHIFT, mem(scale_shift, t.beta)},
          {DNNL_ARG_MEAN, mem(pd.mean_desc(), t.mean)},
          {DNNL_ARG_VARIANCE, mem(pd.variance_desc(), t.variance)}};
}
template <class BackwardPd>
Args normalization_backward_args(const BackwardPd& pd, const dnnl::memory::desc& scale_shift,
                                 const NormalizationTensors& t) {
  return {{DNNL_ARG_SRC, mem(pd.src_desc(), t.x)},
          {DNNL_ARG_DIFF_DST, mem(pd.diff_dst_desc(), t.dy)},
          {DNNL_ARG_MEAN, mem(pd.mean_desc(), t.mean)},
          {DNNL_ARG_VARIANCE, mem(pd.variance_desc(), t.variance)},
          {DNNL_ARG_SCALE, mem(scale_shift, t.gamma)},
          {DNNL_ARG_SHIFT, mem(scale_shift, t.beta)},
          {DNNL_ARG_DIFF_SRC, mem(pd.diff_src_desc(), t.out)},
          {DNNL_ARG_DIFF_SCALE, mem(scale_shift, t.dgamma)},
          {DNNL_ARG_DIFF_SHIFT, mem(scale_shift, t.dbeta)}};
}

// Threads used by oneDNN and by hotops' own OpenMP loops (--hotops_threads; default: all cores).
// An OpenMP region runs on threads() or on one thread, never on a count in between: libgomp ends
// the pool's threads beyond a smaller team, and the next full region starts them again (at 16
// threads, 14 thread creations each time: part of why a 16-thread mlp_tiny train step was up to 1.4x
// slower when its ReLU backward ran on 2; docs/timing.md).
void set_threads(int n);
int threads();
// `label` + ", <threads()> threads": how a CPU case's label ends.
std::string with_threads(const std::string& label);

// body(begin, end) on each thread of an OpenMP team of `team` threads, thread k of n taking the
// contiguous share [count k / n, count (k + 1) / n) of [0, count).
template <class Body>
void in_shares(int team, std::int64_t count, Body body) {
#pragma omp parallel num_threads(team)
  {
    const std::int64_t k = omp_get_thread_num(), n = omp_get_num_threads();
    body(count * k / n, count * (k + 1) / n);
  }
}

// --hotops_cpu_ftz: on, the calling thread and every thread of the OpenMP pool flush subnormal
// results to zero and read subnormal inputs as zero (x86's MXCSR FTZ and DAZ bits; threads the pool
// starts later copy the mode of the thread that starts them); off, IEEE subnormals, the default of
// C++ and of PyTorch.
void set_flush_subnormals(bool on);
bool flushes_subnormals();  // whether the calling thread flushes them

// Sets the thread count for a scope (a case's `threads:` arg) and restores the previous one at its
// end; threads <= 0 leaves it as it is.
class ThreadScope {
 public:
  explicit ThreadScope(int threads) : previous_(cpu::threads()), set_(threads > 0) {
    if (set_) set_threads(threads);
  }
  ~ThreadScope() {
    if (set_) set_threads(previous_);
  }
  ThreadScope(const ThreadScope&) = delete;
  ThreadScope& operator=(const ThreadScope&) = delete;

 private:
  int previous_;
  bool set_;
};

// Streaming (non-temporal) stores for outputs far larger than the caches. An ordinary store first
// reads its cache line from memory (read for ownership), so a loop that reads B bytes and writes B
// moves 3B; glibc's memcpy, which sets the host's copy bandwidth, streams large copies and moves
// 2B. hotops' own CPU loops do the same: they compute a block into an L1-resident buffer and
// stream_copy it out when the whole output is at least kStreamMinBytes.
// Measured on the 16-core Xeon of the H100 host (300 MiB of L3) at 64M elements: streaming took the
// f32 gelu loop from 0.61 to 0.94 of the copy bandwidth and bf16 -> f32 from 1.16 to 1.75.
constexpr std::size_t kStreamMinBytes = std::size_t(32) << 20;
// dst[0, bytes) = src[0, bytes) with non-temporal stores where dst is 16-byte aligned (ordinary ones
// for an unaligned head and the tail). Call stream_fence() once a thread has written its last.
void stream_copy(void* dst, const void* src, std::size_t bytes);
void stream_fence();

std::string isa_name();       // the ISA oneDNN dispatches to, e.g. "avx512_core_amx"
std::string onednn_version();
std::string cpu_model();

}  // namespace hotops::cpu
