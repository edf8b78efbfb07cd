// The Mann-Whitney U test against values known independently of this code.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "compare/src/stats.h"

namespace hotops::compare {
namespace {

// mann_whitney_u(x, y): whether it is exact, its U, and its p to 1e-12.
void expect_u_test(const std::vector<double>& x, const std::vector<double>& y, bool exact, double u, double p) {
  const UTest r = mann_whitney_u(x, y);
  EXPECT_EQ(r.exact, exact);
  EXPECT_DOUBLE_EQ(r.u, u);
  EXPECT_NEAR(r.p, p, 1e-12);
}

// Exact cases, counted by hand. With samples of 3 and 3 there are C(6,3) = 20 equally likely
// arrangements; U counts the pairs (x, y) with x > y. U = 0 happens in 1 arrangement and, by
// symmetry, U = 9 in 1: a complete separation has two-sided p = 2 x 1/20 = 0.1.
TEST(MannWhitney, ExactCompleteSeparationThreeByThree) {
  expect_u_test({1, 2, 3}, {4, 5, 6}, true, 0, 0.1);
}

// x = {1, 2, 4}, y = {3, 5, 6}: only (4, 3) has x > y, so U = 1. The frequencies of U for 3 and
// 3 are 1, 1, 2, 3, 3, 3, 3, 2, 1, 1 (U = 0..9), so P(U <= 1) = 2/20 and two-sided p = 0.2.
TEST(MannWhitney, ExactOneInversionThreeByThree) {
  expect_u_test({1, 2, 4}, {3, 5, 6}, true, 1, 0.2);
}

// Five against five repetitions, fully separated: 2 / C(10,5) = 2/252. This is the smallest
// p-value a gate over --benchmark_repetitions=5 can see.
TEST(MannWhitney, ExactFiveByFiveSeparated) {
  const UTest r = mann_whitney_u({1, 2, 3, 4, 5}, {6, 7, 8, 9, 10});
  EXPECT_TRUE(r.exact);
  EXPECT_NEAR(r.p, 2.0 / 252.0, 1e-12);
  EXPECT_NEAR(min_two_sided_p(5, 5), 2.0 / 252.0, 1e-12);
  EXPECT_NEAR(min_two_sided_p(2, 2), 2.0 / 6.0, 1e-12);
}

// The exact p-value is the permutation test's: enumerate every way of splitting the pooled
// values into groups of n1 and n2, and count the splits whose U is at least as extreme.
double permutation_p(const std::vector<double>& x, const std::vector<double>& y) {
  std::vector<double> all(x);
  all.insert(all.end(), y.begin(), y.end());
  const auto u_of = [](const std::vector<double>& a, const std::vector<double>& b) {
    double u = 0;
    for (double p : a)
      for (double q : b) u += p > q ? 1 : p == q ? 0.5 : 0;
    return u;
  };
  const double n1n2 = static_cast<double>(x.size() * y.size());
  const double observed = std::abs(u_of(x, y) - n1n2 / 2);
  std::vector<bool> pick(all.size(), false);
  std::fill(pick.begin(), pick.begin() + static_cast<long>(x.size()), true);
  int extreme = 0, total = 0;
  do {
    std::vector<double> a, b;
    for (std::size_t i = 0; i < all.size(); ++i) (pick[i] ? a : b).push_back(all[i]);
    extreme += std::abs(u_of(a, b) - n1n2 / 2) >= observed - 1e-9;
    ++total;
  } while (std::prev_permutation(pick.begin(), pick.end()));
  return static_cast<double>(extreme) / total;
}

TEST(MannWhitney, ExactMatchesPermutationEnumeration) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<double> u(0, 1);
  for (int trial = 0; trial < 40; ++trial) {
    const int n1 = 1 + trial % 6, n2 = 2 + (trial / 6) % 5;
    std::vector<double> x(static_cast<std::size_t>(n1)), y(static_cast<std::size_t>(n2));
    for (double& v : x) v = u(rng);
    for (double& v : y) v = u(rng) + 0.3 * (trial % 3);  // some shifted, some not
    const UTest r = mann_whitney_u(x, y);
    ASSERT_TRUE(r.exact);
    EXPECT_NEAR(r.p, std::min(1.0, permutation_p(x, y)), 1e-12) << "n1 = " << n1 << ", n2 = " << n2;
  }
}

// An exact case with one large sample (8 against 20, no ties). Expected value from SciPy 1.10.1:
// scipy.stats.mannwhitneyu(x, y, alternative="two-sided", method="exact") -> U = 33, p = 0.01569509395596352.
TEST(MannWhitney, ExactEightByTwenty) {
  const std::vector<double> x{0.5, 1.5, 2.5, 3.7, 5.1, 7.2, 8.8, 9.9};
  const std::vector<double> y{1.1, 2.2, 3.3, 4.4, 5.5, 6.6, 7.7, 8.1, 9.2, 10.3,
                              11.4, 12.5, 13.6, 14.7, 15.8, 16.9, 17.1, 18.2, 19.3, 20.4};
  const UTest r = mann_whitney_u(x, y);
  EXPECT_TRUE(r.exact);
  EXPECT_DOUBLE_EQ(r.u, 33);
  EXPECT_NEAR(r.p, 0.01569509395596352, 1e-12);
}

// Normal approximation, by hand: 10 against 10, separated. U = 100, mean 50, variance
// 10*10*21/12 = 175; z = (100 - 50 - 0.5) / sqrt(175) = 3.741848; p = erfc(z / sqrt 2) = 1.8267e-4.
// (SciPy 1.10.1 method="auto" gives 0.00018267179110955002.)
TEST(MannWhitney, AsymptoticSeparatedTenByTen) {
  std::vector<double> x, y;
  for (int i = 1; i <= 10; ++i) x.push_back(i), y.push_back(i + 10);
  const UTest r = mann_whitney_u(x, y);
  EXPECT_FALSE(r.exact);
  EXPECT_NEAR(r.p, std::erfc((50 - 0.5) / std::sqrt(175.0) / std::sqrt(2.0)), 1e-15);
  EXPECT_NEAR(r.p, 0.00018267179110955002, 1e-12);
}

// Ties: the variance's tie term. x = {1,2,2,3,3,3,4,4,4,4}, y = {3,4,4,5,5,5,6,6,6,7}.
// Tied groups (value: count) 2:2, 3:4, 4:6, 5:3, 6:3 give sum(t^3 - t) = 6+60+210+24+24 = 324;
// U1 = 9.5, U = 90.5, variance = 100/12 * (21 - 324/380) = 167.894737; z = 40 / 12.957420 = 3.087034;
// p = erfc(z / sqrt 2) = 0.0020216429. (SciPy 1.10.1: 0.002021642905442622.)
TEST(MannWhitney, AsymptoticWithTies) {
  expect_u_test({1, 2, 2, 3, 3, 3, 4, 4, 4, 4}, {3, 4, 4, 5, 5, 5, 6, 6, 6, 7}, false, 9.5, 0.002021642905442622);
}

// Small samples with ties take the approximation too (as SciPy's "auto" does).
// x = {1,1,2}, y = {2,3,3}: U1 = 0.5, tie term 3 x 6 = 18, variance = 9/12 * (7 - 18/30) = 4.8,
// z = (8.5 - 4.5 - 0.5) / sqrt(4.8) = 1.597524, p = 0.110148924. (SciPy 1.10.1: 0.11014892418594699.)
TEST(MannWhitney, SmallSamplesWithTiesUseTheApproximation) {
  expect_u_test({1, 1, 2}, {2, 3, 3}, false, 0.5, 0.11014892418594699);
}

TEST(MannWhitney, IdenticalSamplesGiveOne) {
  EXPECT_DOUBLE_EQ(mann_whitney_u({3, 3, 3}, {3, 3, 3}).p, 1);
  EXPECT_DOUBLE_EQ(mann_whitney_u({1, 2, 3, 4, 5}, {1, 2, 3, 4, 5}).p, 1);
}

TEST(MannWhitney, SymmetricInItsArguments) {
  const UTest a = mann_whitney_u({1.0, 2.5, 3.1, 7.0}, {2.0, 4.0, 5.0, 6.0, 8.0});
  const UTest b = mann_whitney_u({2.0, 4.0, 5.0, 6.0, 8.0}, {1.0, 2.5, 3.1, 7.0});
  EXPECT_NEAR(a.p, b.p, 1e-15);
  EXPECT_DOUBLE_EQ(a.u + b.u, 20);
}

TEST(GeometricMean, OfRatios) {
  EXPECT_NEAR(geometric_mean({2, 8}), 4, 1e-12);
  EXPECT_NEAR(geometric_mean({0.5, 2}), 1, 1e-12);
  EXPECT_TRUE(std::isnan(geometric_mean({})));
}

TEST(Median, OddAndEven) {
  EXPECT_DOUBLE_EQ(median({3, 1, 2}), 2);
  EXPECT_DOUBLE_EQ(median({4, 1, 3, 2}), 2.5);
}

}  // namespace
}  // namespace hotops::compare
