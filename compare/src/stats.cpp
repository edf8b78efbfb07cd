// The Mann-Whitney U test: ranks with ties averaged, then either the exact null distribution of U
// (counted by a recurrence) or the normal approximation.
#include "compare/src/stats.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

namespace hotops::compare {
namespace {

// Upper tail P(U >= u) under the null hypothesis for samples of m and n values without ties.
// The number of arrangements with statistic k is the coefficient of q^k in the Gaussian binomial
// [m+n choose m]_q = prod_{i=1..m} (1 - q^{n+i}) / (1 - q^i), built here one factor at a time.
double exact_upper_tail(int m, int n, double u) {
  if (m > n) std::swap(m, n);  // the distribution is symmetric in (m, n)
  const int max_u = m * n;
  std::vector<long double> c(static_cast<std::size_t>(max_u) + 1, 0.0L);
  c[0] = 1;
  for (int i = 1; i <= m; ++i) {
    // multiply by (1 - q^{n+i}): subtract a shifted copy, from the top down
    for (int k = max_u; k >= n + i; --k) c[static_cast<std::size_t>(k)] -= c[static_cast<std::size_t>(k - n - i)];
    // divide by (1 - q^i): a running sum with stride i, from the bottom up
    for (int k = i; k <= max_u; ++k) c[static_cast<std::size_t>(k)] += c[static_cast<std::size_t>(k - i)];
  }
  long double total = 0, tail = 0;
  const int from = static_cast<int>(std::ceil(u - 1e-9));
  for (int k = 0; k <= max_u; ++k) {
    total += c[static_cast<std::size_t>(k)];
    if (k >= from) tail += c[static_cast<std::size_t>(k)];
  }
  return static_cast<double>(tail / total);
}

double normal_sf(double z) { return 0.5 * std::erfc(z / std::sqrt(2.0)); }

}  // namespace

UTest mann_whitney_u(const std::vector<double>& x, const std::vector<double>& y) {
  UTest r;
  const std::size_t n1 = x.size(), n2 = y.size();
  if (n1 == 0 || n2 == 0) return r;
  const std::size_t n = n1 + n2;
  std::vector<std::pair<double, int>> all;  // value, sample (0: x, 1: y)
  all.reserve(n);
  for (double v : x) all.emplace_back(v, 0);
  for (double v : y) all.emplace_back(v, 1);
  std::sort(all.begin(), all.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  double rank_sum_x = 0, tie_term = 0;  // tie_term: sum over groups of tied values of t^3 - t
  bool ties = false;
  for (std::size_t i = 0; i < n;) {
    std::size_t j = i;
    while (j < n && all[j].first == all[i].first) ++j;
    const double t = static_cast<double>(j - i);
    const double avg_rank = 0.5 * static_cast<double>(i + 1 + j);  // ranks i+1 .. j
    for (std::size_t k = i; k < j; ++k)
      if (all[k].second == 0) rank_sum_x += avg_rank;
    if (t > 1) {
      ties = true;
      tie_term += t * t * t - t;
    }
    i = j;
  }
  const double d1 = static_cast<double>(n1), d2 = static_cast<double>(n2), dn = static_cast<double>(n);
  r.u = rank_sum_x - d1 * (d1 + 1) / 2;
  const double u_big = std::max(r.u, d1 * d2 - r.u);  // two-sided: the larger of U1 and U2
  r.exact = (n1 <= 8 || n2 <= 8) && !ties && n1 * n2 <= 1000000;  // bound the table's size
  if (r.exact) {
    r.p = std::min(1.0, 2 * exact_upper_tail(static_cast<int>(n1), static_cast<int>(n2), u_big));
    return r;
  }
  const double mu = d1 * d2 / 2;
  const double var = d1 * d2 / 12 * ((dn + 1) - tie_term / (dn * (dn - 1)));
  if (!(var > 0)) {  // every value equal: no evidence of a difference
    r.p = 1;
    return r;
  }
  const double z = (u_big - mu - 0.5) / std::sqrt(var);
  r.p = std::min(1.0, 2 * normal_sf(z));
  return r;
}

double min_two_sided_p(int n1, int n2) {
  if (n1 <= 0 || n2 <= 0) return 1;
  // 1 / C(n1+n2, n1), in logs to stay finite for large samples
  const double log_c = std::lgamma(n1 + n2 + 1.0) - std::lgamma(n1 + 1.0) - std::lgamma(n2 + 1.0);
  return std::min(1.0, 2 * std::exp(-log_c));
}

double geometric_mean(const std::vector<double>& v) {
  if (v.empty()) return std::numeric_limits<double>::quiet_NaN();
  double s = 0;
  for (double x : v) s += std::log(x);
  return std::exp(s / static_cast<double>(v.size()));
}

double median(std::vector<double> v) {
  if (v.empty()) return std::numeric_limits<double>::quiet_NaN();
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

}  // namespace hotops::compare
