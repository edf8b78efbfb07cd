// Statistics of hotops-compare: the two-sided Mann-Whitney U test and the geometric mean.
#pragma once
#include <vector>

namespace hotops::compare {

struct UTest {
  double u = 0;        // the statistic of the first sample: pairs (x, y) with x > y, ties counted 1/2
  double p = 1;        // two-sided p-value
  bool exact = false;  // exact null distribution (else the normal approximation)
};

// Two-sided Mann-Whitney U test of x against y (each at least 1 value). The method follows
// SciPy's mannwhitneyu(method="auto"): the exact distribution when either sample has at most 8
// values and there are no ties; otherwise the normal approximation with the tie correction of the
// variance and a continuity correction of 0.5. (Unlike SciPy, more than 10^6 pairs always take
// the approximation, to bound the exact table's size.)
UTest mann_whitney_u(const std::vector<double>& x, const std::vector<double>& y);

// The smallest two-sided p-value the exact test can give for samples of n1 and n2 values:
// 2 / C(n1 + n2, n1). Below alpha or not, it says whether significance is reachable at all.
double min_two_sided_p(int n1, int n2);

// Geometric mean of positive values (NaN when empty).
double geometric_mean(const std::vector<double>& v);

double median(std::vector<double> v);

}  // namespace hotops::compare
