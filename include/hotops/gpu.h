// The GPU runtime seen from code that needs no CUDA headers: availability, device facts, timing.
#pragma once
#include <cstddef>
#include <string>
#include <vector>

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
Info info();  // requires available()

struct TimerOptions {
  bool cold_l2 = false;              // flush L2 before each execution (one execution per sample)
  double throttle_threshold = 0.9;   // discard samples taken below this fraction of the max SM clock
  double target_sample_seconds = 0.5e-3;
  int runs_per_sample = 0;           // 0: enough for target_sample_seconds; 1: each execution alone
};
constexpr int kMaxRunsPerSample = 200;
constexpr int kMaxThrottleRetries = 20;
constexpr int kThrottleRecoveryMs = 50;

// Device time of a CUDA case, per execution, one sample at a time (CUDA events; see docs/timing.md).
// Warm L2: the sample is a CUDA graph of `launches` back-to-back runs, queued behind a short hold
// kernel so that neither launch latency nor event-record latency enters the interval. The hold
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

// Block until all work queued on hotops' stream is done (and rethrow its errors).
void synchronize();

}  // namespace hotops::gpu
