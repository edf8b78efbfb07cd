// The GPU runtime seen from code that needs no CUDA headers: availability, device facts, timing.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "hotops/buffer.h"

namespace hotops {
class Case;
}

namespace hotops::gpu {

// True when hotops was built with CUDA and a device answers; otherwise *why says why not.
bool available(std::string* why = nullptr);

struct Info {
  std::string name;
  int sm_count = 0;
  std::size_t memory_bytes = 0;
  std::size_t l2_bytes = 0;
  int sm_clock_mhz = 0;
  int mem_clock_mhz = 0;
  std::string driver_version, runtime_version, cublas_version, cudnn_version;
};
Info info();  // of the device in use; requires available()

// The CUDA devices this process sees (0 without a driver or a CUDA build).
int device_count();
// Binds this process to its GPU before any other CUDA work: in a multi-GPU run the process of local
// rank r (of local_world on its machine) uses device r, or device 0 where a launcher shows each
// process one device (CUDA_VISIBLE_DEVICES per rank). Throws an Error naming what is missing.
void use_device(int local_rank, int local_world);
// The device in use as a line for the output's context: "NVIDIA H100 80GB HBM3 (bus 0000:18:00.0)".
std::string device_description();

struct TimerOptions {
  bool cold_l2 = false;              // flush L2 before each execution (one execution per sample)
  // A case run by several ranks together (a collective): the largest of a value over the ranks,
  // so that every rank makes the same choices (runs per sample, discarding a throttled sample) and
  // a sample is the slowest rank's time. Empty for a case of one process.
  std::function<double(double)> agree_max;
  double throttle_threshold = 0.9;   // discard samples taken below this fraction of the max SM clock
  double target_sample_seconds = 0.5e-3;
  int runs_per_sample = 0;           // 0: enough for target_sample_seconds; 1: each execution alone
};
constexpr int kMaxRunsPerSample = 200;
constexpr int kMaxThrottleRetries = 20;
constexpr int kThrottleRecoveryMs = 50;

// Device time of a CUDA case, per execution, one sample at a time (CUDA events; see docs/timing.md).
// Warm L2: the sample is a CUDA graph of `launches` back-to-back runs, queued behind a short hold
// kernel so that neither launch latency nor event-record latency enters the interval; a case of
// several ranks then aligns them (Case::align) before the interval starts. The hold
// kernel also measures the SM clock; a sample taken below the throttle threshold is discarded.
// Cold L2 (--hotops_cold_l2): L2 is flushed before each run and each sample is one run.
class Timer {
 public:
  Timer(Case& c, const TimerOptions& options);
  ~Timer();
  Timer(const Timer&) = delete;
  Timer& operator=(const Timer&) = delete;
  double sample();  // seconds per execution, for one sample
  int launches_per_sample() const { return launches_; }
  double mean_clock_mhz() const;   // SM clock over the kept samples
  long discarded_samples() const;  // samples dropped because the GPU was throttled

 private:
  struct Impl;
  Impl* impl_;
  int launches_ = 1;
};

// --hotops_shuffle_layout: while on, each DeviceBuffer starts at a random offset into a larger
// allocation (0 to 16 MiB in 64 KiB steps, a fresh draw per buffer), so that every setup of a case
// places its data at other addresses and, mostly, on other physical pages. Off: each buffer is its
// own cudaMalloc. Off by default; bench turns it on (docs/timing.md says why).
void set_shuffle_layout(bool on);
// The calling thread's draws from here on come from `seed`: bench seeds them before each setup of a
// case from the case's seed and how many times the process set it up before, so that every process
// places an entry's buffers alike and each setup of it anew.
void seed_layout(std::uint64_t seed);

// Device memory, declared without the CUDA headers so that harness code in .cpp files can own it (in
// a build without CUDA, allocating one is an unsupported Error). Allocation failure is an
// out_of_memory Error that says how much was asked for and how much the device has free.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(std::size_t bytes);
  explicit DeviceBuffer(const HostBuffer& host);  // allocate and upload
  DeviceBuffer(DeviceBuffer&& o) noexcept : ptr_(std::exchange(o.ptr_, nullptr)), bytes_(o.bytes_), shift_(o.shift_) {}
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    std::swap(ptr_, o.ptr_);
    std::swap(bytes_, o.bytes_);
    std::swap(shift_, o.shift_);
    return *this;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer();

  void* get() const { return ptr_; }
  template <class T> T* as() const { return static_cast<T*>(ptr_); }
  std::size_t bytes() const { return bytes_; }
  void upload(const HostBuffer& host);
  void download(HostBuffer& host) const;  // synchronous
  void poison();                          // all bytes 0xFF: NaN in f32, bf16 and f16

 private:
  void* ptr_ = nullptr;
  std::size_t bytes_ = 0;
  std::size_t shift_ = 0;  // ptr_'s offset into its allocation (gpu::set_shuffle_layout)
};

// Block until all work queued on hotops' stream is done (and rethrow its errors).
void synchronize();

// Whether the CUDA context is lost: a kernel fault (illegal or misaligned address, device assert,
// trap, illegal instruction, ...) leaves a "sticky" error that every later CUDA call returns, so no
// later GPU result can be trusted. Call it after a CUDA case threw; when it returns true, *error
// holds the error's name and text and the process must not use the GPU again. A non-sticky error
// (a bad launch configuration, an allocation failure) is cleared and leaves the context usable.
bool context_lost(std::string* error = nullptr);

// Device memory now: free and total as the driver reports them (cudaMemGetInfo), and the bytes
// held by hotops' own DeviceBuffers. Zeros without a device.
struct Memory {
  std::size_t free = 0;
  std::size_t total = 0;
  std::size_t held = 0;
};
Memory memory();

// Test only (HOTOPS_TEST_FAULT): enqueues a kernel that fails in the named way on hotops' stream:
// "illegal_address", "misaligned_address", "trap", "assert" (sticky: the context is lost), or
// "bad_launch" (an invalid launch configuration: the launch fails, the context stays usable), or
// "out_of_memory" (allocates 1 PiB: throws hotops' out-of-memory Error).
// Throws an unsupported Error for another name or in a build without CUDA.
void launch_test_fault(const std::string& kind);

}  // namespace hotops::gpu
