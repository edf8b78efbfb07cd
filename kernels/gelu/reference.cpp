// The gelu reference in double: PyTorch's formulas (gelu and gelu_backward, both approximations).
#include <cmath>

#include "kernels/gelu/gelu.h"

namespace hotops::gelu {
namespace {

constexpr double kPi = 3.14159265358979323846;
const double kSqrtHalf = std::sqrt(0.5);
const double kInvSqrt2Pi = 1.0 / std::sqrt(2 * kPi);  // the normal density at 0
const double kTanhBeta = std::sqrt(2 / kPi);           // tanh form: t = tanh(beta * (x + kappa * x^3))
constexpr double kTanhKappa = 0.044715;

}  // namespace

double reference(Approx a, Direction d, double x, double dy) {
  if (a == Approx::none) {
    const double cdf = 0.5 * (1 + std::erf(x * kSqrtHalf));  // Phi(x)
    if (d == Direction::fwd) return x * cdf;
    const double pdf = kInvSqrt2Pi * std::exp(-0.5 * x * x);  // Phi'(x)
    return dy * (cdf + x * pdf);
  }
  const double t = std::tanh(kTanhBeta * (x + kTanhKappa * x * x * x));
  if (d == Direction::fwd) return 0.5 * x * (1 + t);
  // d/dx [0.5 x (1 + t)] = 0.5 (1 + t) + 0.5 x (1 - t^2) beta (1 + 3 kappa x^2)
  return dy * (0.5 * (1 + t) + 0.5 * x * (1 - t * t) * kTanhBeta * (1 + 3 * kTanhKappa * x * x));
}

}  // namespace hotops::gelu
