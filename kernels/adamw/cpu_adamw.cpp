// adamw on the CPU, hand-written: the tensors of the list cut into chunks of kChunk elements
// (chunks_of), the chunks dealt out to the OpenMP threads in contiguous runs of equal element counts
// (balanced by size, the same runs every step, so each thread keeps touching the memory it first
// touched), each chunk a plain float loop that GCC vectorises. target_clones compiles the loop for
// AVX-512, AVX2 + FMA and baseline x86-64; the loader picks the best one for this CPU. The step is
// in place: every element is read once and written once, and the lines written were just read, so
// they cost no read-for-ownership.
#include <omp.h>

#include <algorithm>
#include <cstring>

#include "hotops/check.h"
#include "hotops/cpu.h"
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

// sqrt(x) for x >= 0 in plain float arithmetic, within an ulp or two: std::sqrt may set errno, so
// GCC 12 keeps a scalar libm call beside the square-root instruction and leaves the loop scalar
// (the project builds with errno math, and GCC 12 ignores -fno-math-errno as a function attribute).
// 1/sqrt(x) from the exponent-halving guess and three Newton steps (3.4e-2, 1.8e-3, 4.6e-6, then
// rounding), then x * that with one Heron correction. x is taken at least FLT_MIN, so that y * y
// stays finite (below it sqrt(x) < 1.1e-19, far under any eps it is added to), as an integer max on
// the bits, which order like the values for x >= 0: a float max here becomes a branch (jump
// threading) and the loop scalar again.
struct NewtonSqrt {
  ADAMW_INLINE float operator()(float x) const {
    std::uint32_t u;
    std::memcpy(&u, &x, 4);
    u = std::max(u, 0x00800000u);  // FLT_MIN
    std::memcpy(&x, &u, 4);
    u = 0x5f375a86u - (u >> 1);
    float y;
    std::memcpy(&y, &u, 4);
    const float half_x = 0.5f * x;
    y = y * (1.5f - half_x * y * y);
    y = y * (1.5f - half_x * y * y);
    y = y * (1.5f - half_x * y * y);
    const float s = x * y;
    return s + 0.5f * y * (x - s * s);
  }
};

using SpanF32 = void (*)(float*, const float*, float*, float*, std::int64_t, const StepScalars&);
using SpanBf16 = void (*)(float*, const std::uint16_t*, float*, float*, std::uint16_t*, std::int64_t,
                          const StepScalars&);

#define ADAMW_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))

// One chunk of an f32 tensor.
ADAMW_CLONES void adamw_f32(float* __restrict p, const float* __restrict g, float* __restrict m,
                            float* __restrict v, std::int64_t n, const StepScalars& s_ref) {
  const StepScalars s = s_ref;
  for (std::int64_t i = 0; i < n; ++i) step_element(p[i], g[i], m[i], v[i], s, NewtonSqrt());
}

// One chunk of a bf16 tensor: the f32 master, bf16 gradient, f32 moments; writes the bf16 copy.
ADAMW_CLONES void adamw_bf16(float* __restrict p, const std::uint16_t* __restrict g, float* __restrict m,
                             float* __restrict v, std::uint16_t* __restrict p16, std::int64_t n,
                             const StepScalars& s_ref) {
  const StepScalars s = s_ref;
  for (std::int64_t i = 0; i < n; ++i) {
    float pi = p[i], mi = m[i], vi = v[i];
    step_element(pi, bf16_to_f32(g[i]), mi, vi, s, NewtonSqrt());
    p[i] = pi, m[i] = mi, v[i] = vi;
    p16[i] = f32_to_bf16(pi);
  }
}

const char* clone_name() {
  if (__builtin_cpu_supports("x86-64-v4")) return "x86-64-v4 (AVX-512) clone";
  if (__builtin_cpu_supports("x86-64-v3")) return "x86-64-v3 (AVX2) clone";
  return "baseline x86-64 clone";
}

}  // namespace kernel

namespace {

// Elements below which another thread costs more than it saves (PyTorch's grain, 32768).
constexpr std::int64_t kGrain = 1 << 15;

class CpuAdamw final : public Case {
 public:
  explicit CpuAdamw(const Problem& p)
      : s_(shape_of(p)), layout_(layout_of(s_.sizes)), chunks_(chunks_of(s_.sizes)), st_(make_state(s_, layout_)),
        seed_(p.seed()) {
    // Element count before each chunk: threads take runs of chunks of equal element counts.
    chunk_first_.reserve(chunks_.size() + 1);
    std::int64_t at = 0;
    for (const Chunk& c : chunks_) chunk_first_.push_back(at), at += c.count;
    chunk_first_.push_back(at);
    threads_ = static_cast<int>(std::clamp<std::int64_t>(s_.total() / kGrain, 1, cpu::threads()));
    restore(s_, st_, seed_);
  }

  void run() override {
    const StepScalars sc = scalars_for(s_.hyper, ++step_);
    const std::int64_t total = chunk_first_.back();
#pragma omp parallel num_threads(threads_) if (threads_ > 1)
    {
      const std::int64_t team = omp_get_num_threads(), me = omp_get_thread_num();
      const std::size_t begin = first_chunk_at(total * me / team), end = first_chunk_at(total * (me + 1) / team);
      for (std::size_t k = begin; k < end; ++k) span(chunks_[k], sc);
    }
  }

  Check verify() override {
    restore(s_, st_, seed_);
    step_ = 0;
    const Snapshot snap = snapshot(s_, layout_, st_, seed_);
    for (int i = 0; i < kVerifySteps; ++i) run();
    return check(s_, snap, st_, kVerifySteps);
  }

  std::string label() const override {
    return "hotops multi-tensor adamw, " + describe(s_) + ", " + std::to_string(threads_) + " OpenMP threads over " +
           std::to_string(chunks_.size()) + " chunks of <= " + std::to_string(kChunk) + ", " + kernel::clone_name();
  }

 private:
  // The first chunk that starts at or after element `e` of the concatenated list.
  std::size_t first_chunk_at(std::int64_t e) const {
    return static_cast<std::size_t>(std::lower_bound(chunk_first_.begin(), chunk_first_.end() - 1, e) -
                                    chunk_first_.begin());
  }

  void span(const Chunk& c, const StepScalars& sc) {
    const std::size_t at = layout_.offset[static_cast<std::size_t>(c.tensor)] + static_cast<std::size_t>(c.start);
    float* p = st_.p.as<float>() + at;
    float* m = st_.m.as<float>() + at;
    float* v = st_.v.as<float>() + at;
    if (s_.dtype == DType::f32)
      kernel::adamw_f32(p, st_.g.as<float>() + at, m, v, c.count, sc);
    else
      kernel::adamw_bf16(p, st_.g.as<std::uint16_t>() + at, m, v, st_.p16.as<std::uint16_t>() + at, c.count, sc);
  }

  Shape s_;
  Layout layout_;
  std::vector<Chunk> chunks_;
  std::vector<std::int64_t> chunk_first_;
  State st_;
  std::uint64_t seed_;
  int threads_ = 1;
  std::int64_t step_ = 0;  // steps taken; run() takes step step_ + 1
};

}  // namespace

std::unique_ptr<Case> make_cpu(const Problem& p) { return std::make_unique<CpuAdamw>(p); }

}  // namespace hotops::adamw
