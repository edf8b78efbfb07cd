// gelu on the CPU, hand-written: one pass over the tensor in OpenMP chunks, each chunk a plain loop
// that GCC vectorises. The project builds for baseline x86-64, so the loops are compiled three times
// (target_clones: x86-64-v4 = AVX-512, x86-64-v3 = AVX2 + FMA + F16C, and baseline SSE2) and the
// loader picks the best clone for this CPU. The body is branch-free so that it vectorises: the
// conversions are integer bit operations with selects, and exp is our own (Cody-Waite reduction
// to [-1/2, 1/2] and a polynomial): a libm call would keep the loop scalar. Math in f32 on the
// formulas of the CUDA kernel (cuda_gelu.cu): one exp and one division per element.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "hotops/cpu.h"
#include "hotops/cpu_vector.h"
#include "kernels/gelu/cpu_constants.h"
#include "kernels/gelu/gelu.h"

namespace hotops::gelu {

#define GELU_INLINE HOTOPS_VECTOR_INLINE

namespace kernel {

using vec::bf16_to_f32;
using vec::bits;
using vec::f32_to_bf16;
using vec::from_bits;
using vec::if_set;

// f16 -> f32, exact for every f16. The exponent is rebiased in the integer bits; inf and NaN get the
// f32 maximum exponent; a subnormal (exponent 0) is m 2^-24, made as (2^-14 + m 2^-24) - 2^-14 in
// f32 arithmetic on normal numbers, so that no subnormal operand slows the FPU.
GELU_INLINE float f16_to_f32(std::uint16_t h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t body = static_cast<std::uint32_t>(h & 0x7fffu) << 13;  // exponent and mantissa
  const std::uint32_t exp = body & 0x0f800000u;
  std::uint32_t o = body + ((127u - 15u) << 23);
  o = if_set(exp == 0x0f800000u, o + ((128u - 16u) << 23), o);                      // inf, NaN
  const float subnormal = from_bits(o + (1u << 23)) - from_bits((127u - 14u) << 23);  // exp == 0
  return from_bits(if_set(exp == 0, bits(subnormal), o) | sign);
}

// f32 -> f16, rounding to nearest even (as hotops::float_to_f16): overflow to inf, NaN quiet, results
// below 2^-14 rounded by the FPU itself through an add that puts the f16 subnormal ulp at the f32
// ulp. Every case is computed and one is selected.
GELU_INLINE std::uint16_t f32_to_f16(float f) {
  constexpr std::uint32_t kF16Overflow = (127u + 16u) << 23;           // 65536: beyond any rounding
  constexpr std::uint32_t kF16MinNormal = (127u - 14u) << 23;          // 2^-14
  constexpr std::uint32_t kDenormMagic = ((127u - 15u) + (23u - 10u) + 1u) << 23;  // 0.5
  const std::uint32_t u_signed = bits(f);
  const std::uint32_t sign = (u_signed >> 16) & 0x8000u;
  const std::uint32_t u = u_signed & 0x7fffffffu;
  const std::uint32_t special = if_set(u > 0x7f800000u, 0x7e00u, 0x7c00u);  // NaN, or inf for overflow
  const std::uint32_t subnormal = bits(from_bits(u) + from_bits(kDenormMagic)) - kDenormMagic;
  const std::uint32_t normal = (u + ((15u - 127u) << 23) + 0xfffu + ((u >> 13) & 1u)) >> 13;
  const std::uint32_t o = if_set(u >= kF16Overflow, special, if_set(u < kF16MinNormal, subnormal, normal));
  return static_cast<std::uint16_t>(o | sign);
}

// 2^a for a <= 0 (every argument here is), 1.5e-7 relative: a = n + f with n an integer and
// |f| <= 1/2, 2^f from Cephes exp2f's polynomial, 2^n added to the exponent bits. Below 2^-125
// it returns 2^-125 times 2^f, which changes no result (the terms it scales are below 1e-37).
GELU_INLINE float exp2_neg(float a) {
  constexpr float kRound = 12582912.f;  // 1.5 * 2^23: adding it rounds to an integer, in the low bits
  a = from_bits(std::min(bits(a), bits(constants::kExp2Min)));  // a <= 0: the larger magnitude has the larger bits
  const float j = a + kRound;
  const float f = a - (j - kRound);
  float p = constants::kExp2Poly[0];
  for (int k = 1; k < 7; ++k) p = p * f + constants::kExp2Poly[k];
  const std::uint32_t n = bits(j) - bits(kRound);  // the integer, two's complement
  return from_bits(bits(p) + (n << 23));
}

using constants::kBeta;
using constants::kInvSqrt2Pi;
using constants::kKappa;
using constants::kLog2e;

// Phi(-|x|) from e = exp(-x^2 / 2): Abramowitz and Stegun 7.1.26, as in the CUDA kernel (there with
// an approximate reciprocal and a Newton step; here a division).
GELU_INLINE float phi_lower(float x, float e) {
  const float t = 1.f / (std::abs(x) * constants::kP + 1.f);
  float q = t * constants::kPhiPoly[0] + constants::kPhiPoly[1];
  for (int k = 2; k < 5; ++k) q = q * t + constants::kPhiPoly[k];
  return q * t * e;
}

// The tanh form through the logistic function, taken at -|u| (see cuda_gelu.cu): e = exp(-2|u|),
// r = 1 / (1 + e); 0.5 (1 + tanh u) is r for x >= 0 and e r below.
struct Logistic {
  float e, r;
};
GELU_INLINE Logistic logistic(float x, float x_sq) {
  const float e = exp2_neg(std::abs(x) * (x_sq * constants::kTanhC3 + constants::kTanhC1));
  return {e, 1.f / (1.f + e)};
}

template <Approx A>
GELU_INLINE float gelu_fwd(float x) {
  if constexpr (A == Approx::none) {
    const float q = phi_lower(x, exp2_neg(x * (x * (-0.5f * kLog2e))));
    return x * if_set(x >= 0.f, 1.f - q, q);
  } else {
    const Logistic l = logistic(x, x * x);
    const float w = x * l.e * l.r;
    return if_set(x >= 0.f, x - w, w);
  }
}

template <Approx A>
GELU_INLINE float gelu_bwd(float x, float dy) {
  if constexpr (A == Approx::none) {
    const float e = exp2_neg(x * (x * (-0.5f * kLog2e)));
    const float q = phi_lower(x, e);
    return dy * ((x * kInvSqrt2Pi) * e + if_set(x >= 0.f, 1.f - q, q));
  } else {
    const float x_sq = x * x;
    const Logistic l = logistic(x, x_sq);
    const float er = l.e * l.r;
    const float half_one_plus_t = if_set(x >= 0.f, l.r, er);
    const float g = x * (x_sq * (6.f * kBeta * kKappa) + 2.f * kBeta);
    return dy * (g * (er * l.r) + half_one_plus_t);
  }
}

// Storage of each dtype.
template <DType D>
struct Elem {
  using T = std::uint16_t;
  GELU_INLINE static float load(T v) { return D == DType::bf16 ? bf16_to_f32(v) : f16_to_f32(v); }
  GELU_INLINE static T store(float f) { return D == DType::bf16 ? f32_to_bf16(f) : f32_to_f16(f); }
};
template <>
struct Elem<DType::f32> {
  using T = float;
  GELU_INLINE static float load(T v) { return v; }
  GELU_INLINE static T store(float f) { return f; }
};

// One contiguous span: out[i] = gelu(x[i]) or dy[i] gelu'(x[i]), i in [0, n).
template <DType D, Direction Dir, Approx A>
GELU_INLINE void span(const void* x_v, const void* dy_v, void* out_v, std::int64_t n) {
  using T = typename Elem<D>::T;
  const T* __restrict x = static_cast<const T*>(x_v);
  const T* __restrict dy = static_cast<const T*>(dy_v);
  T* __restrict out = static_cast<T*>(out_v);
  for (std::int64_t i = 0; i < n; ++i) {
    const float xf = Elem<D>::load(x[i]);
    if constexpr (Dir == Direction::fwd)
      out[i] = Elem<D>::store(gelu_fwd<A>(xf));
    else
      out[i] = Elem<D>::store(gelu_bwd<A>(xf, Elem<D>::load(dy[i])));
  }
}

// The clones: one function per dtype x direction x approximation, each a copy of `span` compiled
// for each target. The names say which (they show in a profile).
// One clone set gelu_NAME per instantiation of the span template TMPL (span or table_span).
#define GELU_CLONES(TMPL, NAME, D, DIR, A)                                                                 \
  HOTOPS_CPU_CLONES void gelu_##NAME(const void* x, const void* dy, void* out, std::int64_t n) {           \
    TMPL<DType::D, Direction::DIR, Approx::A>(x, dy, out, n);                                              \
  }
#define GELU_SPAN(NAME, D, DIR, A) GELU_CLONES(span, NAME, D, DIR, A)
GELU_SPAN(f32_fwd_none, f32, fwd, none)
GELU_SPAN(f32_fwd_tanh, f32, fwd, tanh)
GELU_SPAN(f32_bwd_none, f32, bwd, none)
GELU_SPAN(f32_bwd_tanh, f32, bwd, tanh)
HOTOPS_GELU_16BIT_SPANS(GELU_SPAN)
#undef GELU_SPAN

gelu::SpanFn span_for(const Shape& s) {
  static constexpr gelu::SpanFn kSpans[3][2][2] = {
      {{gelu_f32_fwd_none, gelu_f32_fwd_tanh}, {gelu_f32_bwd_none, gelu_f32_bwd_tanh}},
      {{gelu_bf16_fwd_none, gelu_bf16_fwd_tanh}, {gelu_bf16_bwd_none, gelu_bf16_bwd_tanh}},
      {{gelu_f16_fwd_none, gelu_f16_fwd_tanh}, {gelu_f16_bwd_none, gelu_f16_bwd_tanh}},
  };
  const int t = s.dtype == DType::f32 ? 0 : s.dtype == DType::bf16 ? 1 : 2;
  return kSpans[t][s.dir == Direction::fwd ? 0 : 1][s.approx == Approx::none ? 0 : 1];
}

// The table version for bf16 and f16 (where the AVX-512 one in cpu_avx512.cpp is not available):
// a 16-bit input has 65536 values, so fwd looks the loop's own output up, and bwd multiplies dy by
// gelu'(x) as the loop computes it (the loop's dy * gelu'(x) is one f32 product), both tables built
// once per process by the clone that runs here. The results are the loop's (a test checks every
// code): bit for bit, except that a NaN result may differ in sign (the compiler picks other
// instructions for the table's build than for the loop, and not all of them keep a NaN's sign).
// On the 2-core AMD EPYC of the CI machine (AVX2) the loop computed bf16 fwd at 0.12 of the copy
// bandwidth; with the table, bf16 fwd at 64M elements took 16.1 ms instead of 51.7.
constexpr std::size_t kCodes = 1 << 16;

template <DType D, Approx A>
GELU_INLINE void derivatives(float* t) {  // t[code] = gelu'(x), as gelu_bwd computes it (dy = 1 is exact)
  for (std::size_t i = 0; i < kCodes; ++i) t[i] = gelu_bwd<A>(Elem<D>::load(static_cast<std::uint16_t>(i)), 1.f);
}
#define GELU_DERIVATIVES(NAME, D, A)                                                                       \
  HOTOPS_CPU_CLONES void NAME(float* t) {                                                                  \
    derivatives<DType::D, Approx::A>(t);                                                                   \
  }
GELU_DERIVATIVES(gelu_bf16_derivatives_none, bf16, none)
GELU_DERIVATIVES(gelu_bf16_derivatives_tanh, bf16, tanh)
GELU_DERIVATIVES(gelu_f16_derivatives_none, f16, none)
GELU_DERIVATIVES(gelu_f16_derivatives_tanh, f16, tanh)
#undef GELU_DERIVATIVES

template <DType D, Approx A>
const std::uint16_t* fwd_table() {
  static const std::vector<std::uint16_t> t = [] {
    std::vector<std::uint16_t> codes(kCodes), out(kCodes);
    for (std::size_t i = 0; i < kCodes; ++i) codes[i] = static_cast<std::uint16_t>(i);
    Shape s;
    s.dtype = D, s.dir = Direction::fwd, s.approx = A;
    span_for(s)(codes.data(), nullptr, out.data(), static_cast<std::int64_t>(kCodes));
    return out;
  }();
  return t.data();
}
template <DType D, Approx A>
const float* bwd_table() {
  static const std::vector<float> t = [] {
    std::vector<float> d(kCodes);
    if constexpr (D == DType::bf16) (A == Approx::none ? gelu_bf16_derivatives_none : gelu_bf16_derivatives_tanh)(d.data());
    else (A == Approx::none ? gelu_f16_derivatives_none : gelu_f16_derivatives_tanh)(d.data());
    return d;
  }();
  return t.data();
}

template <DType D, Direction Dir, Approx A>
GELU_INLINE void table_span(const void* x_v, const void* dy_v, void* out_v, std::int64_t n) {
  const auto* __restrict x = static_cast<const std::uint16_t*>(x_v);
  const auto* __restrict dy = static_cast<const std::uint16_t*>(dy_v);
  auto* __restrict out = static_cast<std::uint16_t*>(out_v);
  if constexpr (Dir == Direction::fwd) {
    const std::uint16_t* __restrict t = fwd_table<D, A>();
    for (std::int64_t i = 0; i < n; ++i) out[i] = t[x[i]];
  } else {
    const float* __restrict t = bwd_table<D, A>();
    for (std::int64_t i = 0; i < n; ++i) out[i] = Elem<D>::store(Elem<D>::load(dy[i]) * t[x[i]]);
  }
}
#define GELU_TABLE_SPAN(NAME, D, DIR, A) GELU_CLONES(table_span, NAME##_table, D, DIR, A)
HOTOPS_GELU_16BIT_SPANS(GELU_TABLE_SPAN)
#undef GELU_TABLE_SPAN
#undef GELU_CLONES

gelu::SpanFn table_span_for(const Shape& s) {
  if (s.dtype == DType::f32) return nullptr;
  static constexpr gelu::SpanFn kSpans[2][2][2] = {
      {{gelu_bf16_fwd_none_table, gelu_bf16_fwd_tanh_table}, {gelu_bf16_bwd_none_table, gelu_bf16_bwd_tanh_table}},
      {{gelu_f16_fwd_none_table, gelu_f16_fwd_tanh_table}, {gelu_f16_bwd_none_table, gelu_f16_bwd_tanh_table}},
  };
  const gelu::SpanFn f = kSpans[s.dtype == DType::bf16 ? 0 : 1][s.dir == Direction::fwd ? 0 : 1][s.approx == Approx::none ? 0 : 1];
  std::uint16_t code = 0, out = 0;
  f(&code, &code, &out, 1);  // its first call builds this kind's table: now, outside any timing
  return f;
}

}  // namespace kernel

namespace {

// Elements per OpenMP chunk: 64 KiB of f32, 32 KiB of bf16/f16 per input; many chunks per thread.
// An output of at least cpu::kStreamMinBytes is computed kBlock elements at a time into a buffer
// in L1 and streamed out from there (see cpu.h): 8 KiB of f32.
constexpr std::int64_t kChunk = 1 << 14;
constexpr std::int64_t kBlock = 1 << 11;

class HotopsGelu final : public Plan {
 public:
  explicit HotopsGelu(const Shape& s)
      : s_(s),
        avx512_(avx512_table_span_for(s_)),
        table_(avx512_ ? nullptr : kernel::table_span_for(s_)),
        span_(avx512_ ? avx512_ : table_ ? table_ : kernel::span_for(s_)),
        stream_(static_cast<std::size_t>(s_.elements) * dtype_size(s_.dtype) >= cpu::kStreamMinBytes) {}

  void run(const Args& a) override {
    const std::size_t esize = dtype_size(s_.dtype), off = static_cast<std::size_t>(s_.offset) * esize;
    const auto* x = static_cast<const std::byte*>(a.x) + off;
    const auto* dy = s_.dir == Direction::bwd ? static_cast<const std::byte*>(a.dy) + off : nullptr;
    auto* out = static_cast<std::byte*>(a.out) + off;
    const std::int64_t n = s_.elements, chunks = (n + kChunk - 1) / kChunk;
    if (!stream_) {
#pragma omp parallel for schedule(static) if (chunks > 1)
      for (std::int64_t c = 0; c < chunks; ++c) {
        const std::int64_t begin = c * kChunk, count = std::min(kChunk, n - begin);
        const std::size_t at = static_cast<std::size_t>(begin) * esize;
        span_(x + at, dy ? dy + at : nullptr, out + at, count);
      }
      return;
    }
#pragma omp parallel
    {
      alignas(64) float block[kBlock];
#pragma omp for schedule(static)
      for (std::int64_t c = 0; c < chunks; ++c)
        for (std::int64_t begin = c * kChunk, end = std::min(begin + kChunk, n); begin < end; begin += kBlock) {
          const std::int64_t count = std::min(kBlock, end - begin);
          const std::size_t at = static_cast<std::size_t>(begin) * esize;
          span_(x + at, dy ? dy + at : nullptr, block, count);
          cpu::stream_copy(out + at, block, static_cast<std::size_t>(count) * esize);
        }
      cpu::stream_fence();
    }
  }

  std::string label() const override {
    return std::string("hotops gelu_") + (s_.approx == Approx::none ? "erf " : "tanh ") +
           direction_name(s_.dir) + ", " +
           (avx512_ ? std::string("table of the AVX-512 version's results for every 16-bit input (vpgatherdd)")
                    : table_ ? std::string("table of the ") + vec::clone_name() + "'s results for every 16-bit input"
                             : std::string(vec::clone_name())) +
           (stream_ ? ", streaming stores" : "") + ", " +
           std::to_string(cpu::threads()) + " threads";
  }

 private:
  Shape s_;
  SpanFn avx512_;  // the table of the AVX-512 version for bf16 / f16, where this CPU has it
  SpanFn table_;   // else the table of the portable loop for bf16 / f16
  SpanFn span_;
  bool stream_;  // the output is streamed out past the caches
};

}  // namespace

std::unique_ptr<Plan> make_cpu_hotops_plan(const Shape& s) { return std::make_unique<HotopsGelu>(s); }

SpanFn portable_span_for(const Shape& s) { return kernel::span_for(s); }
SpanFn portable_table_span_for(const Shape& s) { return kernel::table_span_for(s); }

float hotops_f16_to_f32(std::uint16_t h) { return kernel::f16_to_f32(h); }
std::uint16_t hotops_f32_to_f16(float f) { return kernel::f32_to_f16(f); }
std::uint16_t hotops_f32_to_bf16(float f) { return kernel::f32_to_bf16(f); }

}  // namespace hotops::gelu
