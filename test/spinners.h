// Threads that spin until they go out of scope: twice as many as the machine has cores, so that
// every core has more work than it can run (the tests of cpu_wait_pct and core_time).
#pragma once
#include <algorithm>
#include <atomic>
#include <thread>
#include <vector>

namespace hotops::test {

class Spinners {
 public:
  Spinners() : count_(2 * std::max(1u, std::thread::hardware_concurrency())) {
    for (unsigned i = 0; i < count_; ++i)
      threads_.emplace_back([this] {
        while (!stop_.load(std::memory_order_relaxed)) {
        }
      });
  }
  ~Spinners() { stop(); }
  Spinners(const Spinners&) = delete;
  Spinners& operator=(const Spinners&) = delete;
  void stop() {
    stop_ = true;
    for (std::thread& t : threads_)
      if (t.joinable()) t.join();
  }
  unsigned count() const { return count_; }

 private:
  const unsigned count_;
  std::atomic<bool> stop_{false};
  std::vector<std::thread> threads_;
};

}  // namespace hotops::test
