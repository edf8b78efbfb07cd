// global_avgpool on the CPU where oneDNN 2.6 offers only its simple implementation (the positions-
// last layout, ncl: `simple_nchw`, which on the 16-core Xeon of the GPU host took 8.1 ms for ResNet-50's
// f32 pool at batch 32, where its channels-last jit took 26 µs): hotops' loops, compiled per x86-64
// level (HOTOPS_CPU_CLONES). Each thread a contiguous share of the N x C rows of L positions; fwd: a
// row's L values summed in f32 in 8 interleaved partial sums (a single chain of dependent adds
// would bound the loop by the add's latency), those added in order, then the tail, y = sum / L stored
// in the dtype; bwd: dy / L written over the row. Deterministic. Storage float, or bf16 as its bits.
#include <cstdint>
#include <memory>
#include <string>

#include "hotops/cpu.h"
#include "hotops/cpu_vector.h"
#include "kernels/avgpool/avgpool.h"

namespace hotops::avgpool {
namespace {

// Rows [0, rows) of L positions each: y[r] = mean of x[r L, (r + 1) L), in kSums interleaved sums.
template <class T>
HOTOPS_VECTOR_INLINE void means(const T* x, T* y, std::int64_t rows, std::int64_t L) {
  constexpr std::int64_t kSums = 8;
  const float inv = 1.f / static_cast<float>(L);
  for (std::int64_t r = 0; r < rows; ++r) {
    const T* row = x + r * L;
    float part[kSums] = {};
    std::int64_t l = 0;
    for (; l + kSums <= L; l += kSums)
      for (std::int64_t j = 0; j < kSums; ++j) part[j] += vec::load(row[l + j]);
    float sum = 0.f;
    for (std::int64_t j = 0; j < kSums; ++j) sum += part[j];
    for (; l < L; ++l) sum += vec::load(row[l]);
    y[r] = vec::store<T>(sum * inv);
  }
}

// Rows [0, rows): dx[r L, (r + 1) L) = dy[r] / L.
template <class T>
HOTOPS_VECTOR_INLINE void spread(const T* dy, T* dx, std::int64_t rows, std::int64_t L) {
  const float inv = 1.f / static_cast<float>(L);
  for (std::int64_t r = 0; r < rows; ++r) {
    const T v = vec::store<T>(vec::load(dy[r]) * inv);
    T* row = dx + r * L;
    for (std::int64_t l = 0; l < L; ++l) row[l] = v;
  }
}

#define HOTOPS_AVGPOOL_LOOPS(T)                                                                          \
  HOTOPS_CPU_CLONES void means_loop(const T* x, T* y, std::int64_t rows, std::int64_t L) {             \
    means<T>(x, y, rows, L);                                                                              \
  }                                                                                                       \
  HOTOPS_CPU_CLONES void spread_loop(const T* dy, T* dx, std::int64_t rows, std::int64_t L) {          \
    spread<T>(dy, dx, rows, L);                                                                           \
  }
HOTOPS_AVGPOOL_LOOPS(float)
HOTOPS_AVGPOOL_LOOPS(std::uint16_t)  // bf16's bits
#undef HOTOPS_AVGPOOL_LOOPS

template <class T>
class CpuAvgpoolLoops final : public Plan {
 public:
  CpuAvgpoolLoops(const Shape& s, std::string onednn_impl) : s_(s), onednn_impl_(std::move(onednn_impl)) {
    HOTOPS_CHECK(s.layout == Layout::ncl, "global_avgpool: hotops' CPU loops take the ncl layout");
  }

  void run(const Args& a) override {
    const std::int64_t rows = s_.N * s_.C, L = s_.L;
    const bool fwd = s_.dir == Direction::fwd;
    const T* in = static_cast<const T*>(fwd ? a.x : a.dy);
    T* out = static_cast<T*>(a.out);
    cpu::in_shares(cpu::threads(), rows, [&](std::int64_t begin, std::int64_t end) {
      if (fwd) means_loop(in + begin * L, out + begin, end - begin, L);
      else spread_loop(in + begin, out + begin * L, end - begin, L);
    });
  }

  std::string label() const override {
    return cpu::with_threads(std::string("hotops ") + (s_.dir == Direction::fwd ? "mean" : "dy / L") + " loops over the " +
                             std::to_string(s_.L) + " positions of each (n, c), " + vec::clone_name() +
                             " (oneDNN 2.6 offers only " + onednn_impl_ + " for this layout)");
  }

 private:
  Shape s_;
  std::string onednn_impl_;
};

}  // namespace

std::unique_ptr<Plan> make_cpu_loops_plan(const Shape& s, const std::string& onednn_impl) {
  if (s.dtype == DType::bf16) return std::make_unique<CpuAvgpoolLoops<std::uint16_t>>(s, onednn_impl);
  return std::make_unique<CpuAvgpoolLoops<float>>(s, onednn_impl);
}

}  // namespace hotops::avgpool
