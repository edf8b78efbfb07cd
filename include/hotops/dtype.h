// Element types, their storage, host-side conversions and the verification tolerance of each.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>

namespace hotops {

// tf32 is f32 storage with tensor-core math: it exists as a benchmark dtype, never as storage.
enum class DType { f32, tf32, bf16, f16 };

const char* dtype_name(DType t);
std::optional<DType> parse_dtype(const std::string& s);

// Bytes of one stored element.
inline std::size_t dtype_size(DType t) { return (t == DType::f32 || t == DType::tf32) ? 4 : 2; }

// The storage type: tf32 data lives in f32 buffers.
inline DType storage_of(DType t) { return t == DType::tf32 ? DType::f32 : t; }

// Verification bound on max|out - ref| / rms(ref): rounding of the dtype's inputs and output plus
// f32 accumulation. Measured errors are an order of magnitude below these; a wrong index is O(1).
double tolerance(DType t);

// Round-to-nearest-even conversions (NaN kept quiet).
inline std::uint16_t float_to_bf16(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<std::uint16_t>(u >> 16);
}
inline float bf16_to_float(std::uint16_t h) {
  const std::uint32_t u = static_cast<std::uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
std::uint16_t float_to_f16(float f);
float f16_to_float(std::uint16_t h);

}  // namespace hotops
