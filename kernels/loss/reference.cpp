// The cross_entropy reference in double: log-sum-exp of a row, the mean loss, one row's gradient.
#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/loss/loss.h"

namespace hotops::loss {

double reference_lse(const double* x, std::size_t n) {
  const double m = *std::max_element(x, x + n);
  double sum = 0;
  for (std::size_t j = 0; j < n; ++j) sum += std::exp(x[j] - m);
  return m + std::log(sum);
}

double reference_fwd(const Shape& s, const Inputs& in, double* lse) {
  const auto classes = static_cast<std::size_t>(s.classes);
  std::vector<double> row_loss(static_cast<std::size_t>(s.rows));
#pragma omp parallel
  {
    std::vector<double> x(classes);
#pragma omp for schedule(static)
    for (std::int64_t r = 0; r < s.rows; ++r) {
      const std::size_t base = static_cast<std::size_t>(r) * classes;
      for (std::size_t j = 0; j < classes; ++j) x[j] = in.logits.get(base + j);
      const double l = reference_lse(x.data(), classes);
      if (lse) lse[r] = l;
      row_loss[static_cast<std::size_t>(r)] = l - x[static_cast<std::size_t>(in.target[static_cast<std::size_t>(r)])];
    }
  }
  double sum = 0;
  for (double v : row_loss) sum += v;
  return sum / static_cast<double>(s.rows);
}

void reference_bwd(const double* x, std::size_t n, std::int64_t target, double lse, double scale, double* dx) {
  for (std::size_t j = 0; j < n; ++j) dx[j] = (std::exp(x[j] - lse) - (static_cast<std::int64_t>(j) == target)) * scale;
}

}  // namespace hotops::loss
