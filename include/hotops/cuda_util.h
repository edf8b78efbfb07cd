// CUDA-side helpers for the kernels: the process-wide stream and library handles, device buffers.
#pragma once
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <type_traits>
#include <utility>

#include "hotops/buffer.h"
#include "hotops/check.h"
#include "hotops/choices.h"
#include "hotops/gpu.h"

namespace hotops::gpu {

cudaStream_t stream();              // every CUDA case enqueues here
cublasLtHandle_t cublaslt();
void* cublas_workspace();           // 64 MiB, shared by all cuBLAS calls on stream()
constexpr std::size_t kCublasWorkspaceBytes = std::size_t(64) << 20;

// The current device's limits that launch configurations are sized by, queried once a device per
// process: its SMs, the threads one SM holds, the largest grid x.
struct Limits {
  int sms = 0, threads_per_sm = 0, max_grid_x = 0;
};
const Limits& limits();

// Whether a CUDA error is sticky: one that corrupts the context, so that every later CUDA call in
// the process returns it (CUDA's documentation: "the process must be terminated and relaunched").
bool is_sticky(cudaError_t e);

// A copy in either direction, on stream() and waited for. A plain cudaMemcpy runs on the legacy
// stream, which stream() (non-blocking) does not synchronize with: it may read a buffer before the
// kernels queued on stream() have written it, and a pageable upload may return before the data
// reaches the device.
void copy(void* dst, const void* src, std::size_t bytes, cudaMemcpyKind kind);

// A CUDA graph of the work a step queues on stream(), captured once at setup and replayed (the
// models' `graph:1` variants), or only tried (whether a case can go into the harness's graphs).
class StepGraph {
 public:
  StepGraph() = default;
  StepGraph(const StepGraph&) = delete;
  StepGraph& operator=(const StepGraph&) = delete;
  ~StepGraph() { reset(); }

  // Captures what body() queues on stream() (thread-local capture mode) and instantiates it.
  // Returns false, with the reason in *why, when the stream cannot be captured through body (a
  // call that refuses capture, an Error thrown by body); nothing of a failed capture is kept and
  // no error is left pending. Any other exception ends the capture and is rethrown. Lazily created
  // resources (handles, workspaces) must exist before.
  bool capture(const std::function<void()>& body, std::string* why);
  void launch() const;  // on stream(); the graph must have been captured
  void reset();         // back to no graph
  explicit operator bool() const { return exec_ != nullptr; }

 private:
  cudaGraph_t graph_ = nullptr;
  cudaGraphExec_t exec_ = nullptr;
};

// One float of device memory, read after the work queued on stream() before it (waits for it): a
// step's loss.
float read_float(const void* device);

// Milliseconds of the work `body` enqueues on stream(), between two CUDA events (waits for it).
template <class Body>
float time_ms(Body body) {
  struct Events {
    cudaEvent_t start = nullptr, stop = nullptr;
    Events() {
      HOTOPS_CHECK_CUDA(cudaEventCreate(&start));
      HOTOPS_CHECK_CUDA(cudaEventCreate(&stop));
    }
    ~Events() {
      cudaEventDestroy(start);
      cudaEventDestroy(stop);
    }
    Events(const Events&) = delete;
    Events& operator=(const Events&) = delete;
  } e;
  HOTOPS_CHECK_CUDA(cudaEventRecord(e.start, stream()));
  body();
  HOTOPS_CHECK_CUDA(cudaEventRecord(e.stop, stream()));
  HOTOPS_CHECK_CUDA(cudaEventSynchronize(e.stop));
  float ms = 0;
  HOTOPS_CHECK_CUDA(cudaEventElapsedTime(&ms, e.start, e.stop));
  return ms;
}

// The blocks of `threads` threads each (and `smem` bytes of dynamic shared memory) that the device
// keeps resident at once for `kernel` (its SMs times the blocks one SM holds), at most `cap` and at
// least 1: the grid of a kernel that strides over its work in one wave. Setup-time only (it queries
// the device).
template <class Kernel>
unsigned resident_blocks(Kernel kernel, unsigned threads, std::int64_t cap, std::size_t smem = 0) {
  int per_sm = 0;
  HOTOPS_CHECK_CUDA(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, static_cast<int>(threads), smem));
  const std::int64_t wave = static_cast<std::int64_t>(limits().sms) * std::max(per_sm, 1);
  return static_cast<unsigned>(std::max<std::int64_t>(1, std::min(wave, cap)));
}

// Whether every pointer (a null one counts) is a multiple of `bytes`: the condition of a kernel's
// vector path, whose accesses of `bytes` need it.
inline bool all_aligned(std::size_t bytes, std::initializer_list<const void*> ptrs) {
  for (const void* p : ptrs)
    if (reinterpret_cast<std::uintptr_t>(p) % bytes != 0) return false;
  return true;
}

// Queues a kernel on stream() that spins for `seconds` of device time: work the host enqueues
// behind it while it spins then runs back to back, without waiting for the host's launches. `probe`
// (2 words of device memory), where given, receives the SM cycles and nanoseconds it spun.
void hold(double seconds, unsigned long long* probe = nullptr);

// How fast one call is, as setup-time autotuners measure it (conv2d's re-timing of cuDNN Find's
// candidates, LtGemm::tune): 3 batches of back-to-back `launch()` calls, each batch between CUDA
// events behind a hold that outlasts the host's enqueueing of the batch (a tiny GEMM's launch
// takes longer on the host than on the GPU, and cuDNN's legacy calls choose their engine on the
// host at each call: without the hold the timing would compare host costs); the best batch's
// mean, in ms per call. A first batch of 3 calls, timed as it comes, measures the host's enqueueing
// and sizes the batches: 3 calls each, or 1 where a call takes kLongCallMs or more, long enough to
// be timed alone (an f32 8192^3 GEMM's 20 ms calls then cost 7 a candidate instead of 13). The
// caller makes the warm-up call.
constexpr float kLongCallMs = 1.0f;
// Setup-time timings within this fraction of the fastest are a near tie, which a rule other than
// the times settles (pick_retimed: the least workspace; matmul's bias gradient: the fused epilogue).
constexpr float kRetimeTie = 0.03f;
template <class Launch>
float best_batch_ms(Launch launch) {
  double enqueue = 0;  // seconds the host took to enqueue a call
  const float first = time_ms([&] {
    const auto t0 = std::chrono::steady_clock::now();
    for (int k = 0; k < 3; ++k) launch();
    enqueue = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / 3;
  }) / 3;
  const int calls = first >= kLongCallMs ? 1 : 3;
  const double held = 20e-6 + std::min(1.5 * enqueue * calls, 20e-3);
  float best = -1;
  for (int batch = 0; batch < 3; ++batch) {
    hold(held);
    const float t = time_ms([&] {
      for (int k = 0; k < calls; ++k) launch();
    });
    if (best < 0 || t < best) best = t;
  }
  return best / static_cast<float>(calls);
}

// What a setup-time search chose for each problem, once per process (find_conv_algo, LtGemm::tune):
// a later setup of the same problem takes the first one's choice, so that the variants of a step
// run the same algorithms and compute the same outputs. Keyed by a text of everything that can
// change the choice; an empty key is never stored. With --hotops_choices=FILE (hotops/choices.h)
// a choice comes from the file where it holds one, and each new one is written there, under
// `kind`, so that processes sharing the file run the same algorithms too.
template <class Choice>
class ChoiceCache {
  static_assert(std::is_trivially_copyable_v<Choice>, "a choice is kept in the choices file as its bytes");

 public:
  explicit ChoiceCache(const char* kind) : kind_(kind) {}
  // The choice under `key`, from this process's searches or the choices file; *from_file says which.
  bool find(const std::string& key, Choice* choice, bool* from_file = nullptr) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (key.empty()) return false;
    const auto hit = map_.find(key);
    if (hit != map_.end()) {
      *choice = hit->second;
      if (from_file) *from_file = read_.count(key) > 0;
      return true;
    }
    Choice stored{};
    if (!stored_choice(kind_, key, &stored, sizeof stored)) return false;
    *choice = map_[key] = stored;
    read_.insert(key);
    if (from_file) *from_file = true;
    return true;
  }
  // A search made: counted, kept under `key`, and written to the choices file.
  void add(const std::string& key, const Choice& choice) {
    std::lock_guard<std::mutex> lock(mutex_);
    ++searches_;
    if (key.empty()) return;
    map_[key] = choice;
    read_.erase(key);
    store_choice(kind_, key, &choice, sizeof choice);
  }
  int searches() {
    std::lock_guard<std::mutex> lock(mutex_);
    return searches_;
  }

 private:
  const char* kind_;
  std::mutex mutex_;
  std::map<std::string, Choice> map_;
  std::set<std::string> read_;  // the keys whose choice came from the choices file
  int searches_ = 0;
};

// The part of such a key that a problem's sizes do not hold: where each operand starts (mod 256
// bytes: an algorithm may need an alignment) and the current device.
std::string placement_key(std::initializer_list<const void*> operands);

}  // namespace hotops::gpu
