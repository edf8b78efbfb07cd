// The softmax reference in double: torch.softmax over one row and its backward.
#include <algorithm>
#include <cmath>

#include "kernels/softmax/softmax.h"

namespace hotops::softmax {

void reference_fwd(const double* x, std::size_t n, double* y) {
  const double m = *std::max_element(x, x + n);
  double sum = 0;
  for (std::size_t i = 0; i < n; ++i) sum += (y[i] = std::exp(x[i] - m));
  for (std::size_t i = 0; i < n; ++i) y[i] /= sum;
}

void reference_bwd(const double* y, const double* dy, std::size_t n, double* dx) {
  double s = 0;
  for (std::size_t i = 0; i < n; ++i) s += dy[i] * y[i];
  for (std::size_t i = 0; i < n; ++i) dx[i] = y[i] * (dy[i] - s);
}

}  // namespace hotops::softmax
