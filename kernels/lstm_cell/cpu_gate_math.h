// The LSTM gates' nonlinearities in f32 on the CPU, branch-free and with their own exp, forced
// inline so that GCC vectorises the loops that call them: the lstm_cell family's pointwise loops and
// the lstm family's own bf16 layer (kernels/lstm/cpu_hotops.cpp).
#pragma once
#include <algorithm>

#include "hotops/cpu_vector.h"

namespace hotops::lstm_cell::math {

// e^x, 2 ulp: x = n ln2 + r with |r| <= ln2 / 2 (Cody-Waite), e^r by its Taylor polynomial to
// degree 7, 2^n added to the exponent bits. x is clamped to [-86, 88], where 2^n stays a normal
// number: e^-86 = 4e-38 and e^88 = 1.7e38 change no sigmoid or tanh here.
HOTOPS_VECTOR_INLINE float exp_f32(float x) {
  constexpr float kRound = 12582912.f;  // 1.5 * 2^23: adding it rounds to an integer, in the low bits
  x = std::min(std::max(x, -86.f), 88.f);
  const float j = x * 1.44269504088896341f + kRound;
  const float n = j - kRound;
  const float r = (x - n * 0.693145751953125f) - n * 1.428606765330187e-06f;
  float p = 1.f / 5040;
  p = p * r + 1.f / 720;
  p = p * r + 1.f / 120;
  p = p * r + 1.f / 24;
  p = p * r + 1.f / 6;
  p = p * r + 0.5f;
  p = p * r + 1.f;
  p = p * r + 1.f;
  return vec::from_bits(vec::bits(p) + ((vec::bits(j) - vec::bits(kRound)) << 23));
}
HOTOPS_VECTOR_INLINE float sigmoid(float x) { return 1.f / (1.f + exp_f32(-x)); }
HOTOPS_VECTOR_INLINE float tanh_f32(float x) { return 2.f / (1.f + exp_f32(-2.f * x)) - 1.f; }

}  // namespace hotops::lstm_cell::math
