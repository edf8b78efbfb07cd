// Element-type names, tolerances and the IEEE half conversions.
#include "hotops/dtype.h"

#include <cmath>

namespace hotops {

const char* dtype_name(DType t) {
  switch (t) {
    case DType::f32: return "f32";
    case DType::tf32: return "tf32";
    case DType::bf16: return "bf16";
    case DType::f16: return "f16";
  }
  return "?";
}

std::optional<DType> parse_dtype(const std::string& s) {
  for (DType t : {DType::f32, DType::tf32, DType::bf16, DType::f16})
    if (s == dtype_name(t)) return t;
  return std::nullopt;
}

double tolerance(DType t) {
  switch (t) {
    case DType::f32: return 1e-4;   // f32 accumulation over K up to 16k: ~1e-6 seen
    case DType::tf32: return 1e-2;  // inputs rounded to 10 mantissa bits: ~1e-3 seen at the max
    case DType::bf16: return 4e-2;  // output rounded to 8 mantissa bits, relative to rms
    case DType::f16: return 1e-2;
  }
  return 0;
}

std::uint16_t float_to_f16(float f) {
  std::uint32_t x;
  std::memcpy(&x, &f, 4);
  const std::uint32_t sign = (x >> 16) & 0x8000u;
  std::uint32_t mag = x & 0x7fffffffu;
  if (mag > 0x7f800000u) return static_cast<std::uint16_t>(sign | 0x7e00u);  // NaN
  if (mag >= 0x477ff000u) return static_cast<std::uint16_t>(sign | 0x7c00u);  // overflow -> inf
  if (mag < 0x38800000u) {  // subnormal or zero in half
    const float a = std::fabs(f);
    const auto m = static_cast<std::uint32_t>(std::nearbyint(a * 16777216.0f));  // a / 2^-24
    return static_cast<std::uint16_t>(sign | m);
  }
  mag += 0xc8000fffu + ((mag >> 13) & 1u);  // rebias exponent (-112 << 23) and round to nearest even
  return static_cast<std::uint16_t>(sign | (mag >> 13));
}

float f16_to_float(std::uint16_t h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t exp = (h >> 10) & 0x1fu;
  const std::uint32_t man = h & 0x3ffu;
  float out;
  if (exp == 0) {
    out = std::ldexp(static_cast<float>(man), -24);
    return sign ? -out : out;
  }
  std::uint32_t u = exp == 31 ? (sign | 0x7f800000u | (man << 13)) : (sign | ((exp + 112) << 23) | (man << 13));
  std::memcpy(&out, &u, 4);
  return out;
}

}  // namespace hotops
