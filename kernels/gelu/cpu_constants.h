// The constants of hotops' CPU gelu, shared by the portable loop (cpu_hotops.cpp) and its AVX-512
// version (cpu_avx512.cpp), so that both compute the same formulas.
#pragma once

namespace hotops::gelu::constants {

// 2^f for |f| <= 1/2: Cephes exp2f's polynomial, highest degree first.
constexpr float kExp2Poly[] = {1.535336188319500e-4f, 1.339887440266574e-3f, 9.618437357674640e-3f,
                               5.550332471162809e-2f, 2.402264791363012e-1f, 6.931472028550421e-1f, 1.f};
constexpr float kExp2Min = -125.f;  // exp2 arguments are clamped here (see exp2_neg)

constexpr float kLog2e = 1.44269504088896341f;
constexpr float kInvSqrt2Pi = 0.39894228040143268f;  // Phi'(0)
constexpr float kBeta = 0.79788456080286536f;        // tanh form: sqrt(2 / pi)
constexpr float kKappa = 0.044715f;

// Phi(-|x|) = q(t) t e with t = 1 / (1 + kP |x|), e = exp(-x^2 / 2): Abramowitz and Stegun 7.1.26,
// its coefficients halved (Phi = erfc / 2), highest degree first.
constexpr float kP = 0.3275911f * 0.70710678118654752f;
constexpr float kPhiPoly[] = {0.5f * 1.061405429f, 0.5f * -1.453152027f, 0.5f * 1.421413741f, 0.5f * -0.284496736f,
                              0.5f * 0.254829592f};

// The tanh form through the logistic function: e = 2^(|x| (c3 x^2 + c1)) = exp(-2|u|).
constexpr float kTanhC1 = -2.f * kBeta * kLog2e;
constexpr float kTanhC3 = -2.f * kBeta * kKappa * kLog2e;

}  // namespace hotops::gelu::constants

// The 16-bit instantiations both versions compile their spans for, X(name, dtype, direction,
// approximation) each: bf16 and f16, fwd and bwd, erf and tanh (f32 is the portable loop's alone).
#define HOTOPS_GELU_16BIT_SPANS(X)   \
  X(bf16_fwd_none, bf16, fwd, none) \
  X(bf16_fwd_tanh, bf16, fwd, tanh) \
  X(bf16_bwd_none, bf16, bwd, none) \
  X(bf16_bwd_tanh, bf16, bwd, tanh) \
  X(f16_fwd_none, f16, fwd, none)   \
  X(f16_fwd_tanh, f16, fwd, tanh)   \
  X(f16_bwd_none, f16, bwd, none)   \
  X(f16_bwd_tanh, f16, bwd, tanh)
