// Test only: the benchmark that HOTOPS_TEST_FAULT=<kind> adds ahead of every family's, failing in
// that way, so that tests can check what the rest of a run does after a GPU fault or a case that
// does not fit in memory. Without the variable nothing here is registered or listed.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "hotops/buffer.h"
#include "hotops/check.h"
#include "hotops/gpu.h"
#include "hotops/op.h"

namespace hotops::bench {

// Sticky GPU faults (the context is lost), a failed launch (the context survives), and cases that
// do not fit in GPU or host memory (refused at setup).
inline const std::vector<std::string>& test_fault_names() {
  static const std::vector<std::string> names = {"illegal_address", "misaligned_address", "trap",    "assert",
                                                 "bad_launch",      "gpu_oom",            "host_oom"};
  return names;
}

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
    const Backend b = kind_ == "host_oom" ? Backend::cpu : Backend::cuda;
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
    return std::make_unique<TestFaultCase>(kind_);
  }

 private:
  std::string kind_;
};

}  // namespace hotops::bench
