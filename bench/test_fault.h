// Test only: the benchmark that HOTOPS_TEST_FAULT=<kind> adds ahead of every family's, failing in
// that way, so that tests can check what the rest of a run does after a GPU fault or a case that
// does not fit in memory (or, `alternating`, taking times known in advance, so that tests can check
// what is reported of them). Without the variable nothing here is registered or listed.
#pragma once
#include <algorithm>
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "hotops/buffer.h"
#include "hotops/check.h"
#include "hotops/gpu.h"
#include "hotops/op.h"

namespace hotops::bench {

// Sticky GPU faults (the context is lost), a failed launch (the context survives), cases that do
// not fit in GPU or host memory (refused at setup), and a CPU entry of known timing (alternating).
inline const std::vector<std::string>& test_fault_names() {
  static const std::vector<std::string> names = {"illegal_address", "misaligned_address", "trap",     "assert",
                                                 "bad_launch",      "gpu_oom",            "host_oom", "alternating"};
  return names;
}

// Not a fault: a CPU case whose executions take 1 ms and 3 ms in turn, so that a test knows what its
// samples (one execution each: each fills a CPU sample) must give: a mean of 2 ms, a noise of 50%.
// The executions keep a schedule on the host's clock: each waits until the end of its slot, so that
// one that other work on the machine delays is made up by shorter ones after it and the mean stays
// 2 ms; but at least 0.5 ms (one execution still fills a sample). A pause longer than any
// execution's (setup, verification) starts the schedule anew.
class AlternatingCase final : public Case {
 public:
  void run() override {
    using std::chrono::milliseconds;
    const auto now = std::chrono::steady_clock::now();
    if (now - end_ > milliseconds(50)) end_ = now;
    end_ += milliseconds(long_ ? 3 : 1);
    long_ = !long_;
    const auto until = std::max(end_, now + std::chrono::microseconds(500));
    while (std::chrono::steady_clock::now() < until) {
    }
  }
  Check verify() override {
    run();
    Check c;
    c.checked = 1;
    return c;
  }
  std::string label() const override { return "test: 1 ms and 3 ms in turn"; }

 private:
  std::chrono::steady_clock::time_point end_;  // of the last execution's slot
  bool long_ = false;
};

class TestFaultCase final : public Case {
 public:
  explicit TestFaultCase(std::string kind) : kind_(std::move(kind)) {}
  void run() override { gpu::launch_test_fault(kind_); }
  Check verify() override {
    run();
    gpu::synchronize();  // a fault of the kernel surfaces here
    Check c;
    c.checked = 1;
    return c;
  }
  std::string label() const override { return "test fault: " + kind_; }

 private:
  std::string kind_;
};

class TestFaultFamily final : public Family {
 public:
  explicit TestFaultFamily(std::string kind) : kind_(std::move(kind)) {}
  std::string name() const override { return "test.fault"; }
  std::vector<Problem> benchmark_problems(const std::vector<std::int64_t>&) const override {
    const Backend b = kind_ == "host_oom" || kind_ == "alternating" ? Backend::cpu : Backend::cuda;
    return {Problem{"test.fault", b, DType::f32, Direction::fwd, {{"kind", kind_}}}};
  }
  std::vector<Problem> test_problems() const override { return {}; }
  Work work(const Problem&) const override { return {0, 4, 1}; }
  std::string unsupported_reason(const Problem& p) const override {
    return backend_unsupported_reason(p, [](const Problem&) { return std::string(); });
  }
  std::unique_ptr<Case> make(const Problem&) const override {
    if (kind_ == "host_oom") {
      const HostBuffer huge(DType::f32, std::size_t(1) << 48);  // 1 PiB: setup fails as a too-large case's does
      throw Error("test fault host_oom: allocating 1 PiB of host memory succeeded");
    }
    if (kind_ == "gpu_oom") {
      gpu::launch_test_fault("out_of_memory");
      throw Error("test fault gpu_oom: allocating 1 PiB of GPU memory succeeded");
    }
    if (kind_ == "alternating") return std::make_unique<AlternatingCase>();
    return std::make_unique<TestFaultCase>(kind_);
  }

 private:
  std::string kind_;
};

}  // namespace hotops::bench
