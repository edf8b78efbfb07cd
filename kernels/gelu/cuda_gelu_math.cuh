// GELU's element math on CUDA, shared by the gelu op's kernel and gelu_dbias's: PyTorch's formulas
// in f32, rewritten so that each element costs one ex2 and one rcp of the hardware (MUFU) and a
// dozen FMAs (libm's erff and tanhf left the kernels close to issue-bound). __host__ __device__ so
// that the tests can run the gelu kernel's code on the host (gelu.h), with exp2f and a division there.
#pragma once
#include <cmath>

#include "kernels/gelu/gelu.h"

namespace hotops::gelu::math {

constexpr float kLog2e = 1.44269504088896341f;
constexpr float kInvSqrt2Pi = 0.39894228040143268f;  // Phi'(0)
constexpr float kBeta = 0.79788456080286536f;        // tanh form: sqrt(2 / pi)
constexpr float kKappa = 0.044715f;

// 2^a and 1/a on the hardware's MUFU: at most 2 ulp and 1 ulp off. ftz: no operand here is
// subnormal, and an exp that underflows to 0 instead of a subnormal changes no result.
__host__ __device__ inline float fast_exp2(float a) {
#ifdef __CUDA_ARCH__
  float r;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(a));
  return r;
#else
  return exp2f(a);
#endif
}

__host__ __device__ inline float fast_rcp(float a) {
#ifdef __CUDA_ARCH__
  float r;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(a));
  return r;
#else
  return 1.f / a;
#endif
}

// Phi(-|x|) = erfc(z) / 2, z = |x| / sqrt 2, given e = exp(-x^2 / 2) = exp(-z^2): Abramowitz and
// Stegun 7.1.26, erfc(z) = t P(t) exp(-z^2) with t = 1 / (1 + p z) and P of degree 4, at most 1.4e-7
// off (absolute) for all z >= 0, one branch for every x. 1 / (1 + p z) takes one Newton step
// after the rcp: P(t) t amplifies the error of t 3.4 times near x = 0. The coefficients are halved.
__host__ __device__ inline float phi_lower(float x, float e) {
  constexpr float kP = 0.3275911f * 0.70710678118654752f;
  constexpr float a1 = 0.5f * 0.254829592f, a2 = 0.5f * -0.284496736f, a3 = 0.5f * 1.421413741f,
                  a4 = 0.5f * -1.453152027f, a5 = 0.5f * 1.061405429f;
  const float d = fmaf(fabsf(x), kP, 1.f);
  float t = fast_rcp(d);
  t = fmaf(t, fmaf(-d, t, 1.f), t);
  float q = fmaf(t, a5, a4);
  q = fmaf(q, t, a3);
  q = fmaf(q, t, a2);
  q = fmaf(q, t, a1);
  return q * t * e;
}

// The tanh form through the logistic function: 0.5 (1 + tanh(u)) = 1 / (1 + exp(-2u)), and
// 1 - tanh(u)^2 = 4 exp(-2|u|) / (1 + exp(-2|u|))^2, u = sqrt(2/pi) (x + 0.044715 x^3), whose sign
// is that of x. Taken at -|u| so that exp never overflows, and with 1 - s for x >= 0 as
// e r (e = exp(-2|u|), r = 1 / (1 + e)): no cancellation where PyTorch's 1 + t and 1 - t^2 have it.
struct Logistic {
  float e, r;  // exp(-2|u|), 1 / (1 + e)
};
__host__ __device__ inline Logistic logistic(float x, float x_sq) {
  constexpr float c1 = -2.f * kBeta * kLog2e, c3 = -2.f * kBeta * kKappa * kLog2e;
  const float e = fast_exp2(fabsf(x) * fmaf(x_sq, c3, c1));
  return {e, fast_rcp(1.f + e)};
}

template <Approx A>
__host__ __device__ inline float gelu_fwd(float x) {
  if constexpr (A == Approx::none) {  // x Phi(x)
    const float q = phi_lower(x, fast_exp2(x * (x * (-0.5f * kLog2e))));
    return x * (x >= 0.f ? 1.f - q : q);
  } else {  // 0.5 x (1 + tanh(u)) = x - x e r (x >= 0), x e r (x < 0)
    const Logistic l = logistic(x, x * x);
    const float w = x * l.e * l.r;
    return x >= 0.f ? x - w : w;
  }
}

template <Approx A>
__host__ __device__ inline float gelu_bwd(float x, float dy) {
  if constexpr (A == Approx::none) {  // dy (Phi(x) + x phi(x)), one exp for both
    const float e = fast_exp2(x * (x * (-0.5f * kLog2e)));
    const float q = phi_lower(x, e);
    return dy * fmaf(x * kInvSqrt2Pi, e, x >= 0.f ? 1.f - q : q);
  } else {  // dy (0.5 (1 + t) + 0.5 x (1 - t^2) sqrt(2/pi) (1 + 3 * 0.044715 x^2))
    const float x_sq = x * x;
    const Logistic l = logistic(x, x_sq);
    const float er = l.e * l.r;
    const float half_one_plus_t = x >= 0.f ? l.r : er;
    const float g = x * fmaf(x_sq, 6.f * kBeta * kKappa, 2.f * kBeta);  // 0.5 x 4 sqrt(2/pi) (1 + 3c x^2)
    return dy * fmaf(g, er * l.r, half_one_plus_t);
  }
}

}  // namespace hotops::gelu::math
