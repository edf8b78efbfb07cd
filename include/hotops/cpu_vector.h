// Building blocks for hotops' own CPU loops that GCC vectorises: the one multi-ISA dispatch (the
// x86-64 level of this CPU, and target_clones over the same levels), bit casts, branch-free selects
// and the bf16 <-> f32 conversions, the last forced inline so that they vectorise inside the
// target_clones loops that call them (kernels/gelu/cpu_hotops.cpp, kernels/copy/cpu_copy.cpp).
#pragma once
#include <cstdint>
#include <cstring>

#include "hotops/dtype.h"

#define HOTOPS_VECTOR_INLINE [[gnu::always_inline]] inline
// The same for a lambda inside such a loop (after its parameter list): GCC otherwise may compile it
// once, outside the target_clones, for the baseline ISA.
#define HOTOPS_LAMBDA_INLINE __attribute__((always_inline))

// A function compiled once per x86-64 level (x86-64-v4 = AVX-512, x86-64-v3 = AVX2 + FMA + F16C,
// baseline SSE2); the loader runs the best this CPU has, by the same test as vec::isa().
#define HOTOPS_CPU_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))

namespace hotops::vec {

// The x86-64 level this CPU runs, for loops that pick their version by hand (and what
// HOTOPS_CPU_CLONES' resolver picks): tested once.
enum class Isa { avx512, avx2, baseline };
inline Isa isa() {
  static const Isa level = [] {
    __builtin_cpu_init();  // the test may run before the library's own constructors
    if (__builtin_cpu_supports("x86-64-v4")) return Isa::avx512;
    if (__builtin_cpu_supports("x86-64-v3")) return Isa::avx2;
    return Isa::baseline;
  }();
  return level;
}

// The HOTOPS_CPU_CLONES version this CPU runs, for labels.
inline const char* clone_name() {
  switch (isa()) {
    case Isa::avx512: return "x86-64-v4 (AVX-512) clone";
    case Isa::avx2: return "x86-64-v3 (AVX2) clone";
    case Isa::baseline: break;
  }
  return "baseline x86-64 clone";
}

HOTOPS_VECTOR_INLINE std::uint32_t bits(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
HOTOPS_VECTOR_INLINE float from_bits(std::uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Branch-free choices: `if_set(c, a, b)` is c ? a : b with both sides computed, as bit operations.
// With ?: on float arithmetic GCC may leave a branch (jump threading makes one out of a clamp) and
// then, under -ftrapping-math, will not compute the float side unconditionally: the loop stays
// scalar on every target but AVX-512, whose masked operations predicate it.
HOTOPS_VECTOR_INLINE std::uint32_t mask_of(bool c) { return 0u - static_cast<std::uint32_t>(c); }
HOTOPS_VECTOR_INLINE std::uint32_t if_set(bool c, std::uint32_t a, std::uint32_t b) {
  const std::uint32_t m = mask_of(c);
  return (a & m) | (b & ~m);
}
HOTOPS_VECTOR_INLINE float if_set(bool c, float a, float b) { return from_bits(if_set(c, bits(a), bits(b))); }

// bf16 <-> f32: the high half of an f32; rounding to nearest even, NaN kept quiet (dtype.h's rule).
HOTOPS_VECTOR_INLINE float bf16_to_f32(std::uint16_t h) { return from_bits(static_cast<std::uint32_t>(h) << 16); }
HOTOPS_VECTOR_INLINE std::uint16_t f32_to_bf16(float f) {
  const std::uint32_t u = bits(f);
  const std::uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  const std::uint32_t nan = (u >> 16) | 0x40u;
  return static_cast<std::uint16_t>(if_set((u & 0x7fffffffu) > 0x7f800000u, nan, rounded));
}

// The same for loops templated on the storage type itself (float, or bf16 as its bits,
// std::uint16_t): load gives an element's f32 value, store<T> rounds an f32 to T.
HOTOPS_VECTOR_INLINE float load(float v) { return v; }
HOTOPS_VECTOR_INLINE float load(std::uint16_t v) { return bf16_to_f32(v); }
template <class T> HOTOPS_VECTOR_INLINE T store(float f);
template <> HOTOPS_VECTOR_INLINE float store<float>(float f) { return f; }
template <> HOTOPS_VECTOR_INLINE std::uint16_t store<std::uint16_t>(float f) { return f32_to_bf16(f); }

// An element stored as D: f32, or bf16 as its bits (any D but f32); load gives its f32 value, store
// rounds an f32 to it.
template <DType D>
struct Elem {
  using T = std::uint16_t;
  HOTOPS_VECTOR_INLINE static float load(T v) { return bf16_to_f32(v); }
  HOTOPS_VECTOR_INLINE static T store(float f) { return f32_to_bf16(f); }
};
template <>
struct Elem<DType::f32> {
  using T = float;
  HOTOPS_VECTOR_INLINE static float load(T v) { return v; }
  HOTOPS_VECTOR_INLINE static T store(float f) { return f; }
};

}  // namespace hotops::vec
