// The CPU AdamW step (cpu_step) and the adamw family's CPU plan. The flat arrays are cut into one
// contiguous part per OpenMP thread (the same parts every step, so each thread keeps touching the
// memory it first touched), each part a plain float loop that GCC vectorises. target_clones compiles
// the loop for AVX-512, AVX2 + FMA and baseline x86-64; the loader picks the best one for this CPU.
// The build compiles this file with -fno-math-errno, so that std::sqrt is the square-root
// instruction in the vector loop (with errno math GCC keeps a scalar libm call beside it and leaves
// the loop scalar), and with -ffp-contract=off, so that the AVX2 and AVX-512 clones round every
// product and sum as baseline x86-64 does: the step is the same to the bit on every CPU. The step is
// in place: every element is read once and written once, and the lines written were just read, so
// they cost no read-for-ownership.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "hotops/check.h"
#include "hotops/cpu.h"
#include "hotops/cpu_vector.h"
#include "kernels/adamw/adamw.h"

namespace hotops::adamw {
namespace kernel {

#define ADAMW_INLINE [[gnu::always_inline]] inline

ADAMW_INLINE float bf16_to_f32(std::uint16_t h) {
  const std::uint32_t u = static_cast<std::uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Round to nearest even, NaN kept quiet (dtype.h's rule), branch-free so that the loop vectorises.
ADAMW_INLINE std::uint16_t f32_to_bf16(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  const std::uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  const std::uint32_t nan = (u >> 16) | 0x40u;
  const std::uint32_t is_nan = 0u - static_cast<std::uint32_t>((u & 0x7fffffffu) > 0x7f800000u);
  return static_cast<std::uint16_t>((nan & is_nan) | (rounded & ~is_nan));
}

struct Sqrt {
  ADAMW_INLINE float operator()(float x) const { return std::sqrt(x); }
};

// One thread's part, f32.
HOTOPS_CPU_CLONES void adamw_f32(float* __restrict p, const float* __restrict g, float* __restrict m,
                                 float* __restrict v, std::int64_t n, const StepScalars& s_ref) {
  const StepScalars s = s_ref;
  for (std::int64_t i = 0; i < n; ++i) step_element(p[i], g[i], m[i], v[i], s, Sqrt());
}

// One thread's part with the bf16 copy: the f32 master and moments, the gradient G (f32, or bf16
// bits widened by bf16_to_f32); writes the updated parameters rounded to bf16 into p16.
ADAMW_INLINE float widened(float g) { return g; }
ADAMW_INLINE float widened(std::uint16_t g) { return bf16_to_f32(g); }
template <class G>
ADAMW_INLINE void adamw_p16(float* __restrict p, const G* __restrict g, float* __restrict m, float* __restrict v,
                            std::uint16_t* __restrict p16, std::int64_t n, const StepScalars& s_ref) {
  const StepScalars s = s_ref;
  for (std::int64_t i = 0; i < n; ++i) {
    float pi = p[i], mi = m[i], vi = v[i];
    step_element(pi, widened(g[i]), mi, vi, s, Sqrt());
    p[i] = pi, m[i] = mi, v[i] = vi;
    p16[i] = f32_to_bf16(pi);
  }
}
HOTOPS_CPU_CLONES void adamw_bf16(float* __restrict p, const std::uint16_t* __restrict g, float* __restrict m,
                                  float* __restrict v, std::uint16_t* __restrict p16, std::int64_t n,
                                  const StepScalars& s) {
  adamw_p16(p, g, m, v, p16, n, s);
}
HOTOPS_CPU_CLONES void adamw_f32_p16(float* __restrict p, const float* __restrict g, float* __restrict m,
                                     float* __restrict v, std::uint16_t* __restrict p16, std::int64_t n,
                                     const StepScalars& s) {
  adamw_p16(p, g, m, v, p16, n, s);
}

// Thread `me` of `team`'s part of n elements: cut at multiples of 16 elements (64-byte lines), so
// that no two threads write one line.
ADAMW_INLINE void part_of(std::int64_t n, std::int64_t team, std::int64_t me, std::int64_t& begin, std::int64_t& end) {
  auto cut = [&](std::int64_t k) { return k == team ? n : n * k / team / 16 * 16; };
  begin = cut(me), end = cut(me + 1);
}

// `part(begin, count)` on every thread of the team (see cpu_step in adamw.h for `threads`).
template <class Part>
void in_parallel(std::int64_t n, int threads, const Part& part) {
  auto body = [&] {
    std::int64_t begin, end;
    part_of(n, omp_get_num_threads(), omp_get_thread_num(), begin, end);
    if (end > begin) part(begin, end - begin);
  };
  if (threads <= 0) {
#pragma omp parallel
    body();
  } else {
#pragma omp parallel num_threads(threads) if (threads > 1)
    body();
  }
}

}  // namespace kernel

void cpu_step(float* p, const float* g, float* m, float* v, std::int64_t n, const StepScalars& s, int threads) {
  kernel::in_parallel(n, threads, [&](std::int64_t b, std::int64_t k) { kernel::adamw_f32(p + b, g + b, m + b, v + b, k, s); });
}

void cpu_step(float* p, const float* g, float* m, float* v, std::uint16_t* p16, std::int64_t n, const StepScalars& s,
              int threads) {
  if (p16 == nullptr) return cpu_step(p, g, m, v, n, s, threads);
  kernel::in_parallel(n, threads, [&](std::int64_t b, std::int64_t k) {
    kernel::adamw_f32_p16(p + b, g + b, m + b, v + b, p16 + b, k, s);
  });
}

void cpu_step(float* p, const std::uint16_t* g, float* m, float* v, std::uint16_t* p16, std::int64_t n,
              const StepScalars& s, int threads) {
  kernel::in_parallel(n, threads, [&](std::int64_t b, std::int64_t k) {
    kernel::adamw_bf16(p + b, g + b, m + b, v + b, p16 + b, k, s);
  });
}

const char* cpu_clone_name() { return vec::clone_name(); }

namespace {

// Elements below which another thread costs more than it saves (PyTorch's grain, 32768).
constexpr std::int64_t kGrain = 1 << 15;

class CpuAdamw final : public Plan {
 public:
  explicit CpuAdamw(const Shape& s) : s_(s), span_(static_cast<std::int64_t>(layout_of(s_.sizes).span)) {
    // All threads from two grains of work, else one: never a team in between (cpu.h says why).
    threads_ = s_.total() >= 2 * kGrain ? cpu::threads() : 1;
  }

  void run(const Args& a) override {
    const StepScalars sc = scalars_for(s_.hyper, ++a.step->step);
    if (s_.dtype == DType::f32)
      cpu_step(a.p, static_cast<const float*>(a.g), a.m, a.v, span_, sc, threads_);
    else
      cpu_step(a.p, static_cast<const std::uint16_t*>(a.g), a.m, a.v, a.p16, span_, sc, threads_);
  }

  std::string label() const override {
    return "hotops flat adamw, " + describe(s_) + ", " + std::to_string(threads_) + " OpenMP threads over " +
           std::to_string(span_) + " elements (padding included), " + cpu_clone_name();
  }

 private:
  Shape s_;
  std::int64_t span_;  // elements of the flat pass
  int threads_ = 1;
};

}  // namespace

std::unique_ptr<Plan> make_cpu_plan(const Shape& s) { return std::make_unique<CpuAdamw>(s); }

}  // namespace hotops::adamw
