// The CPU runtime: one oneDNN engine and stream for the process, and the thread count.
#pragma once
#include <cstddef>
#include <string>
#include <unordered_map>

#include <dnnl.hpp>

namespace hotops::cpu {

dnnl::engine& engine();
dnnl::stream& stream();

// A primitive's arguments, by DNNL_ARG_*.
using Args = std::unordered_map<int, dnnl::memory>;
// Runs `p` on stream() and waits for it: the timed region of a CPU case that is one primitive.
void execute(const dnnl::primitive& p, const Args& args);

// Threads used by oneDNN and by hotops' own OpenMP loops (--hotops_threads; default: all cores).
void set_threads(int n);
int threads();

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
