// dropout on the CPU, hand-written: one pass over the tensor in OpenMP chunks, each chunk a plain
// loop that GCC vectorises, compiled three times (target_clones: x86-64-v4 = AVX-512, x86-64-v3 =
// AVX2, baseline SSE2; the loader picks the best clone for this CPU). The body is branch-free bit
// operations: the mask hash (pointwise.h, the same code as the CUDA kernel's) on 32-bit lanes, the
// keep decision as a select of the scale or 0, one f32 multiply, the bf16 rounding on integer bits.

#include <algorithm>

#include "hotops/cpu.h"
#include "hotops/cpu_vector.h"
#include "kernels/pointwise/pointwise.h"

namespace hotops::pointwise {
namespace kernel {

using vec::bf16_to_f32;
using vec::f32_to_bf16;
using vec::if_set;

using vec::Elem;

// One span of elements lo0 .. lo0 + n - 1 of the 2^32 ones whose index has high word `hi`.
//   fwd: out = x * (keep ? scale : 0), mask_out = keep
//   bwd: out = dy * (mask_in ? scale : 0)
template <DType D, bool kBwd>
HOTOPS_VECTOR_INLINE void span(const DropoutKey& key, std::uint32_t lo0, std::uint32_t hi, const void* in_v,
                               const std::uint8_t* __restrict mask_in, void* out_v, std::uint8_t* __restrict mask_out,
                               std::int64_t n) {
  using T = typename Elem<D>::T;
  const T* __restrict in = static_cast<const T*>(in_v);
  T* __restrict out = static_cast<T*>(out_v);
  const DropoutKey k = key;
  for (std::int64_t i = 0; i < n; ++i) {
    bool keep;
    if constexpr (kBwd) {
      keep = mask_in[i] != 0;
    } else {
      keep = dropout_keep(k, lo0 + static_cast<std::uint32_t>(i), hi);
      mask_out[i] = static_cast<std::uint8_t>(keep);
    }
    out[i] = Elem<D>::store(Elem<D>::load(in[i]) * if_set(keep, k.scale, 0.f));
  }
}

using SpanFn = void (*)(const DropoutKey&, std::uint32_t, std::uint32_t, const void*, const std::uint8_t*, void*,
                        std::uint8_t*, std::int64_t);

#define DROPOUT_SPAN(NAME, D, BWD)                                                                              \
  HOTOPS_CPU_CLONES void NAME(                                                                                  \
      const DropoutKey& k, std::uint32_t lo0, std::uint32_t hi, const void* in, const std::uint8_t* mask_in,   \
      void* out, std::uint8_t* mask_out, std::int64_t n) {                                                     \
    span<DType::D, BWD>(k, lo0, hi, in, mask_in, out, mask_out, n);                                             \
  }
DROPOUT_SPAN(dropout_f32_fwd, f32, false)
DROPOUT_SPAN(dropout_f32_bwd, f32, true)
DROPOUT_SPAN(dropout_bf16_fwd, bf16, false)
DROPOUT_SPAN(dropout_bf16_bwd, bf16, true)
#undef DROPOUT_SPAN

SpanFn span_for(const Shape& s) {
  const bool bwd = s.dir == Direction::bwd;
  if (s.dtype == DType::bf16) return bwd ? dropout_bf16_bwd : dropout_bf16_fwd;
  return bwd ? dropout_f32_bwd : dropout_f32_fwd;
}

}  // namespace kernel

namespace {

// Elements per OpenMP chunk (64 KiB of f32); a power of two, so no chunk crosses a multiple of 2^32
// (the hash's high index word is constant in a chunk). An output of at least cpu::kStreamMinBytes
// is computed kBlock elements at a time into buffers in L1 and streamed out from there (see cpu.h).
constexpr std::int64_t kChunk = 1 << 14;
constexpr std::int64_t kBlock = 1 << 11;

class CpuDropout final : public Plan {
 public:
  explicit CpuDropout(const Shape& s)
      : s_(s),
        span_(kernel::span_for(s_)),
        stream_(static_cast<std::size_t>(s_.elements) * dtype_size(s_.dtype) >= cpu::kStreamMinBytes) {}

  void run(const Args& a) override {
    const std::size_t esize = dtype_size(s_.dtype), off = static_cast<std::size_t>(s_.offset);
    const bool bwd = s_.dir == Direction::bwd;
    const auto* in = static_cast<const std::byte*>(bwd ? a.dy : a.x) + off * esize;
    const std::uint8_t* mask_in = bwd ? a.mask_in + off : nullptr;
    auto* out = static_cast<std::byte*>(a.out) + off * esize;
    std::uint8_t* mask_out = bwd ? nullptr : a.mask_out + off;
    const std::int64_t n = s_.elements, chunks = (n + kChunk - 1) / kChunk;
    const DropoutKey key = dropout_key(a.seed, s_.p);
    const kernel::SpanFn span = span_;
    auto part = [&](std::int64_t begin, std::int64_t count, std::byte* o, std::uint8_t* m) {
      const auto i = static_cast<std::uint64_t>(begin);
      const std::size_t at = static_cast<std::size_t>(begin);
      span(key, static_cast<std::uint32_t>(i), static_cast<std::uint32_t>(i >> 32), in + at * esize,
           mask_in ? mask_in + at : nullptr, o, m, count);
    };
    if (!stream_) {
#pragma omp parallel for schedule(static) num_threads(cpu::threads()) if (chunks > 1)
      for (std::int64_t c = 0; c < chunks; ++c) {
        const std::int64_t begin = c * kChunk, count = std::min(kChunk, n - begin);
        const std::size_t at = static_cast<std::size_t>(begin);
        part(begin, count, out + at * esize, mask_out ? mask_out + at : nullptr);
      }
      return;
    }
#pragma omp parallel num_threads(cpu::threads())
    {
      alignas(64) float block[kBlock];
      alignas(64) std::uint8_t mask_block[kBlock];
#pragma omp for schedule(static)
      for (std::int64_t c = 0; c < chunks; ++c)
        for (std::int64_t begin = c * kChunk, end = std::min(begin + kChunk, n); begin < end; begin += kBlock) {
          const std::int64_t count = std::min(kBlock, end - begin);
          const std::size_t at = static_cast<std::size_t>(begin);
          part(begin, count, reinterpret_cast<std::byte*>(block), mask_out ? mask_block : nullptr);
          cpu::stream_copy(out + at * esize, block, static_cast<std::size_t>(count) * esize);
          if (mask_out) cpu::stream_copy(mask_out + at, mask_block, static_cast<std::size_t>(count));
        }
      cpu::stream_fence();
    }
  }

  std::string label() const override {
    const bool fwd = s_.dir == Direction::fwd;
    return std::string("hotops dropout ") + (fwd ? "fwd (mask from a lowbias32 x2 counter hash), " : "bwd (reads the uint8 mask), ") +
           vec::clone_name() + (stream_ ? ", streaming stores" : "") + ", " + std::to_string(cpu::threads()) +
           " threads";
  }

 private:
  Shape s_;
  kernel::SpanFn span_;
  bool stream_;  // the outputs are streamed out past the caches
};

}  // namespace

std::unique_ptr<Plan> make_cpu_dropout_plan(const Shape& s) { return std::make_unique<CpuDropout>(s); }

void cpu_dropout_span(const Shape& s, const DropoutKey& k, std::uint64_t first, const void* in,
                      const std::uint8_t* mask_in, void* out, std::uint8_t* mask_out, std::int64_t n) {
  const kernel::SpanFn span = kernel::span_for(s);
  const std::size_t esize = dtype_size(s.dtype);
  // Pieces that do not cross a multiple of 2^32, where the hash's high index word changes.
  for (std::int64_t done = 0; done < n;) {
    const std::uint64_t i = first + static_cast<std::uint64_t>(done);
    const std::uint64_t to_boundary = (std::uint64_t(1) << 32) - (i & 0xffffffffu);
    const auto count = static_cast<std::int64_t>(std::min<std::uint64_t>(to_boundary, static_cast<std::uint64_t>(n - done)));
    const std::size_t at = static_cast<std::size_t>(done);
    span(k, static_cast<std::uint32_t>(i), static_cast<std::uint32_t>(i >> 32),
         static_cast<const std::byte*>(in) + at * esize, mask_in ? mask_in + at : nullptr,
         static_cast<std::byte*>(out) + at * esize, mask_out ? mask_out + at : nullptr, count);
    done += count;
  }
}

}  // namespace hotops::pointwise
