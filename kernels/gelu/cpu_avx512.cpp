// gelu on the CPU for bf16 and f16, written for AVX-512: the portable loop's formulas and constants
// (cpu_hotops.cpp), 16 elements a vector, with the instructions GCC does not reach from that loop
// (hardware bf16/f16 conversions, vrcp14ps and a Newton step for the division, vrndscaleps and
// vscalefps for 2^a); the tail is one masked vector. Its results also fill the 65536-entry tables
// that the default bf16 and f16 gelu reads (table_span_for). bf16 rounding is vcvtneps2bf16's (to
// nearest even, subnormals flushed to zero), f16's to nearest even. Why, and the measured rates:
// docs/ops.md, "gelu".
#include <immintrin.h>

#include <vector>

// GCC 12's AVX-512 intrinsics pass _mm512_undefined_ps() as the unused merge operand, which
// -Wmaybe-uninitialized reports once they are inlined here (GCC bug 105593); those lanes are never read.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#include "kernels/gelu/cpu_constants.h"
#include "kernels/gelu/gelu.h"

namespace hotops::gelu {
namespace {

namespace c = constants;

#define GELU_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,fma"), always_inline)) inline

// 2^a for a <= 0: a = n + f, n = round(a), |f| <= 1/2, 2^f by the polynomial, times 2^n by vscalefps.
GELU_AVX512 __m512 exp2_neg(__m512 a) {
  a = _mm512_max_ps(a, _mm512_set1_ps(c::kExp2Min));
  const __m512 n = _mm512_roundscale_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 f = _mm512_sub_ps(a, n);
  __m512 p = _mm512_set1_ps(c::kExp2Poly[0]);
  for (int k = 1; k < 7; ++k) p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(c::kExp2Poly[k]));
  return _mm512_scalef_ps(p, n);
}

// 1 / d for d >= 1: vrcp14ps (14 bits) and one Newton step (28 bits, beyond f32's 24).
GELU_AVX512 __m512 reciprocal(__m512 d) {
  const __m512 r = _mm512_rcp14_ps(d);
  return _mm512_fmadd_ps(r, _mm512_fnmadd_ps(d, r, _mm512_set1_ps(1.f)), r);
}

GELU_AVX512 __m512 magnitude(__m512 x) { return _mm512_abs_ps(x); }

// Phi(-|x|) from e = exp(-x^2 / 2).
GELU_AVX512 __m512 phi_lower(__m512 x, __m512 e) {
  const __m512 t = reciprocal(_mm512_fmadd_ps(magnitude(x), _mm512_set1_ps(c::kP), _mm512_set1_ps(1.f)));
  __m512 q = _mm512_set1_ps(c::kPhiPoly[0]);
  for (int k = 1; k < 5; ++k) q = _mm512_fmadd_ps(q, t, _mm512_set1_ps(c::kPhiPoly[k]));
  return _mm512_mul_ps(_mm512_mul_ps(q, t), e);
}

GELU_AVX512 __m512 gauss(__m512 x) {  // exp(-x^2 / 2)
  return exp2_neg(_mm512_mul_ps(x, _mm512_mul_ps(x, _mm512_set1_ps(-0.5f * c::kLog2e))));
}

GELU_AVX512 __mmask16 nonnegative(__m512 x) { return _mm512_cmp_ps_mask(x, _mm512_setzero_ps(), _CMP_GE_OQ); }

template <Approx A>
GELU_AVX512 __m512 fwd(__m512 x) {
  if constexpr (A == Approx::none) {
    const __m512 q = phi_lower(x, gauss(x));
    // x (1 - q) for x >= 0, x q below.
    return _mm512_mul_ps(x, _mm512_mask_sub_ps(q, nonnegative(x), _mm512_set1_ps(1.f), q));
  } else {
    const __m512 x_sq = _mm512_mul_ps(x, x);
    const __m512 e = exp2_neg(_mm512_mul_ps(magnitude(x), _mm512_fmadd_ps(x_sq, _mm512_set1_ps(c::kTanhC3), _mm512_set1_ps(c::kTanhC1))));
    const __m512 r = reciprocal(_mm512_add_ps(e, _mm512_set1_ps(1.f)));
    const __m512 w = _mm512_mul_ps(_mm512_mul_ps(x, e), r);
    return _mm512_mask_sub_ps(w, nonnegative(x), x, w);
  }
}

template <Approx A>
GELU_AVX512 __m512 bwd(__m512 x, __m512 dy) {
  if constexpr (A == Approx::none) {
    const __m512 e = gauss(x);
    const __m512 q = phi_lower(x, e);
    const __m512 cdf = _mm512_mask_sub_ps(q, nonnegative(x), _mm512_set1_ps(1.f), q);
    return _mm512_mul_ps(dy, _mm512_fmadd_ps(_mm512_mul_ps(x, _mm512_set1_ps(c::kInvSqrt2Pi)), e, cdf));
  } else {
    const __m512 x_sq = _mm512_mul_ps(x, x);
    const __m512 e = exp2_neg(_mm512_mul_ps(magnitude(x), _mm512_fmadd_ps(x_sq, _mm512_set1_ps(c::kTanhC3), _mm512_set1_ps(c::kTanhC1))));
    const __m512 r = reciprocal(_mm512_add_ps(e, _mm512_set1_ps(1.f)));
    const __m512 er = _mm512_mul_ps(e, r);
    const __m512 half_one_plus_t = _mm512_mask_mov_ps(er, nonnegative(x), r);
    const __m512 g = _mm512_mul_ps(x, _mm512_fmadd_ps(x_sq, _mm512_set1_ps(6.f * c::kBeta * c::kKappa), _mm512_set1_ps(2.f * c::kBeta)));
    return _mm512_mul_ps(dy, _mm512_fmadd_ps(g, _mm512_mul_ps(er, r), half_one_plus_t));
  }
}

// 16 stored elements <-> one f32 vector; `m` masks the tail.
template <DType D>
GELU_AVX512 __m512 load(const std::uint16_t* p, __mmask16 m) {
  const __m256i v = _mm256_maskz_loadu_epi16(m, p);
  if constexpr (D == DType::bf16) return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(v), 16));
  else return _mm512_maskz_cvtph_ps(m, v);
}
template <DType D>
GELU_AVX512 void store(std::uint16_t* p, __m512 f, __mmask16 m) {
  __m256i v;
  if constexpr (D == DType::bf16) v = (__m256i)_mm512_cvtneps_pbh(f);
  else v = _mm512_cvtps_ph(f, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  _mm256_mask_storeu_epi16(p, m, v);
}

template <DType D, Direction Dir, Approx A>
GELU_AVX512 void span(const void* x_v, const void* dy_v, void* out_v, std::int64_t n) {
  const auto* x = static_cast<const std::uint16_t*>(x_v);
  const auto* dy = static_cast<const std::uint16_t*>(dy_v);
  auto* out = static_cast<std::uint16_t*>(out_v);
  for (std::int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = n - i >= 16 ? __mmask16(0xffff) : static_cast<__mmask16>((1u << (n - i)) - 1);
    const __m512 xf = load<D>(x + i, m);
    if constexpr (Dir == Direction::fwd) store<D>(out + i, fwd<A>(xf), m);
    else store<D>(out + i, bwd<A>(xf, load<D>(dy + i, m)), m);
  }
}

// One AVX-512 function NAME per 16-bit instantiation of the span template TMPL (span or table_span).
#define GELU_AVX512_INSTANCE(TMPL, NAME, D, DIR, A)                                                        \
  __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,fma"))) void NAME(                \
      const void* x, const void* dy, void* out, std::int64_t n) {                                          \
    TMPL<DType::D, Direction::DIR, Approx::A>(x, dy, out, n);                                              \
  }
#define GELU_AVX512_SPAN(NAME, D, DIR, A) GELU_AVX512_INSTANCE(span, NAME, D, DIR, A)
HOTOPS_GELU_16BIT_SPANS(GELU_AVX512_SPAN)
#undef GELU_AVX512_SPAN

// The tables. Both are indexed by the 16-bit input code; the fwd one has one entry of padding,
// because a 32-bit gather at byte offset 2 * code reads the entry after the code too.
constexpr std::size_t kCodes = 1 << 16;

template <DType D, Approx A>
__attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,fma"))) std::vector<std::uint16_t> build_fwd_table() {
  std::vector<std::uint16_t> codes(kCodes), table(kCodes + 1, 0);
  for (std::size_t i = 0; i < kCodes; ++i) codes[i] = static_cast<std::uint16_t>(i);
  span<D, Direction::fwd, A>(codes.data(), nullptr, table.data(), static_cast<std::int64_t>(kCodes));
  return table;
}

template <DType D, Approx A>
__attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,fma"))) std::vector<float> build_bwd_table() {
  std::vector<float> table(kCodes);
  for (std::size_t i = 0; i < kCodes; i += 16) {
    alignas(32) std::uint16_t codes[16];
    for (int k = 0; k < 16; ++k) codes[k] = static_cast<std::uint16_t>(i + k);
    // dy = 1 makes bwd's product dy * gelu'(x) exactly gelu'(x).
    _mm512_storeu_ps(table.data() + i, bwd<A>(load<D>(codes, 0xffff), _mm512_set1_ps(1.f)));
  }
  return table;
}

template <DType D, Approx A>
const std::uint16_t* fwd_table() {
  static const std::vector<std::uint16_t> t = build_fwd_table<D, A>();
  return t.data();
}
template <DType D, Approx A>
const float* bwd_table() {
  static const std::vector<float> t = build_bwd_table<D, A>();
  return t.data();
}

template <DType D, Direction Dir, Approx A>
GELU_AVX512 void table_span(const void* x_v, const void* dy_v, void* out_v, std::int64_t n) {
  const auto* x = static_cast<const std::uint16_t*>(x_v);
  const auto* dy = static_cast<const std::uint16_t*>(dy_v);
  auto* out = static_cast<std::uint16_t*>(out_v);
  const std::uint16_t* ft = Dir == Direction::fwd ? fwd_table<D, A>() : nullptr;
  const float* bt = Dir == Direction::bwd ? bwd_table<D, A>() : nullptr;
  for (std::int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = n - i >= 16 ? __mmask16(0xffff) : static_cast<__mmask16>((1u << (n - i)) - 1);
    const __m512i code = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, x + i));
    if constexpr (Dir == Direction::fwd) {
      const __m512i v = _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), m, code, ft, 2);
      _mm256_mask_storeu_epi16(out + i, m, _mm512_cvtepi32_epi16(v));
    } else {
      const __m512 d = _mm512_mask_i32gather_ps(_mm512_setzero_ps(), m, code, bt, 4);
      store<D>(out + i, _mm512_mul_ps(load<D>(dy + i, m), d), m);
    }
  }
}

#define GELU_TABLE_SPAN(NAME, D, DIR, A) GELU_AVX512_INSTANCE(table_span, NAME##_table, D, DIR, A)
HOTOPS_GELU_16BIT_SPANS(GELU_TABLE_SPAN)
#undef GELU_TABLE_SPAN
#undef GELU_AVX512_INSTANCE

}  // namespace

namespace {
bool have_avx512_span() {
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
         __builtin_cpu_supports("avx512bf16");
}
}  // namespace

SpanFn avx512_span_for(const Shape& s) {
  if (s.dtype == DType::f32 || !have_avx512_span()) return nullptr;
  static constexpr SpanFn kSpans[2][2][2] = {
      {{bf16_fwd_none, bf16_fwd_tanh}, {bf16_bwd_none, bf16_bwd_tanh}},
      {{f16_fwd_none, f16_fwd_tanh}, {f16_bwd_none, f16_bwd_tanh}},
  };
  return kSpans[s.dtype == DType::bf16 ? 0 : 1][s.dir == Direction::fwd ? 0 : 1][s.approx == Approx::none ? 0 : 1];
}

SpanFn avx512_table_span_for(const Shape& s) {
  if (s.dtype == DType::f32 || !have_avx512_span()) return nullptr;
  static constexpr SpanFn kSpans[2][2][2] = {
      {{bf16_fwd_none_table, bf16_fwd_tanh_table}, {bf16_bwd_none_table, bf16_bwd_tanh_table}},
      {{f16_fwd_none_table, f16_fwd_tanh_table}, {f16_bwd_none_table, f16_bwd_tanh_table}},
  };
  const SpanFn f = kSpans[s.dtype == DType::bf16 ? 0 : 1][s.dir == Direction::fwd ? 0 : 1][s.approx == Approx::none ? 0 : 1];
  std::uint16_t code = 0, out = 0;
  f(&code, &code, &out, 1);  // its first call builds this kind's table: now, outside any timing
  return f;
}

}  // namespace hotops::gelu
