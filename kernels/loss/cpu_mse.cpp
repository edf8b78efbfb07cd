// mse on the CPU: each thread a contiguous share of the elements, in a loop compiled per x86-64 level
// (HOTOPS_CPU_CLONES): f32 math on the stored values, dy stored in the dtype, the squares summed in
// double in kLanes interleaved partial sums (a single chain of dependent adds would bound the loop by
// the add's latency), then those in order, then the share's tail; the threads' sums are added in
// thread order (the same loss at a given thread count). Storage float, or bf16 as its bits.
#include <omp.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "hotops/cpu.h"
#include "hotops/cpu_vector.h"
#include "kernels/loss/mse.h"

namespace hotops::loss::mse {
namespace {

using bf16 = std::uint16_t;  // bf16's bits
using vec::load;
using vec::store;

constexpr std::int64_t kLanes = 8;

// dy[i] = k (y[i] - t[i]) over [0, n); returns the sum of (y[i] - t[i])^2 in double.
template <class T>
HOTOPS_VECTOR_INLINE double span(const T* y, const T* t, T* dy, std::int64_t n, float k) {
  double part[kLanes] = {};
  std::int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (std::int64_t j = 0; j < kLanes; ++j) {
      const float e = load(y[i + j]) - load(t[i + j]);
      dy[i + j] = store<T>(k * e);
      part[j] += static_cast<double>(e) * e;
    }
  double sum = 0;
  for (std::int64_t j = 0; j < kLanes; ++j) sum += part[j];
  for (; i < n; ++i) {
    const float e = load(y[i]) - load(t[i]);
    dy[i] = store<T>(k * e);
    sum += static_cast<double>(e) * e;
  }
  return sum;
}

#define HOTOPS_MSE_SPAN(T)                                                                          \
  HOTOPS_CPU_CLONES double span_loop(const T* y, const T* t, T* dy, std::int64_t n, float k) {     \
    return span<T>(y, t, dy, n, k);                                                                 \
  }
HOTOPS_MSE_SPAN(float)
HOTOPS_MSE_SPAN(bf16)
#undef HOTOPS_MSE_SPAN

template <class T>
class CpuMse final : public Plan {
 public:
  explicit CpuMse(const Shape& s) : n_(s.count()) {}

  void run(const Args& a) override {
    const std::int64_t n = n_;
    const T* y = static_cast<const T*>(a.y);
    const T* t = static_cast<const T*>(a.target);
    T* dy = static_cast<T*>(a.dy);
    const float k = 2.f / static_cast<float>(n);
    const int nt = cpu::threads();
    sums_.assign(static_cast<std::size_t>(nt), 0.0);
#pragma omp parallel num_threads(nt)
    {
      const int u = omp_get_thread_num(), team = omp_get_num_threads();
      const std::int64_t begin = n * u / team, end = n * (u + 1) / team;
      sums_[static_cast<std::size_t>(u)] = span_loop(y + begin, t + begin, dy + begin, end - begin, k);
    }
    double total = 0;
    for (const double s : sums_) total += s;
    *a.loss = static_cast<float>(total / static_cast<double>(n));
  }

  std::string label() const override {
    return cpu::with_threads(std::string("hotops MSE loss and gradient, ") + vec::clone_name() + ", the sum in double");
  }

 private:
  std::int64_t n_;             // elements
  std::vector<double> sums_;   // each thread's sum
};

}  // namespace

std::unique_ptr<Plan> make_cpu_plan(const Shape& s) {
  if (s.dtype == DType::bf16) return std::make_unique<CpuMse<bf16>>(s);
  return std::make_unique<CpuMse<float>>(s);
}

}  // namespace hotops::loss::mse
