// Verification: the error metric, sampled indices and check merging.
#include "hotops/verify.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "hotops/check.h"

namespace hotops {

void Check::merge(const Check& other, const std::string& what) {
  checked += other.checked;
  if (other.max_err > max_err || std::isnan(other.max_err)) max_err = other.max_err;
  tol = std::max(tol, other.tol);
  if (other.rms_err > rms_err || std::isnan(other.rms_err)) rms_err = other.rms_err;
  rms_tol = std::max(rms_tol, other.rms_tol);
  if (!other.ok) {
    message += (ok ? "" : "; ") + what + ": " + other.message;
    ok = false;
  }
}

std::vector<std::size_t> sample_indices(std::size_t n, std::size_t limit, std::uint64_t seed) {
  std::vector<std::size_t> idx;
  if (n <= limit) {
    idx.resize(n);
    for (std::size_t i = 0; i < n; ++i) idx[i] = i;
    return idx;
  }
  idx = {0, 1, n / 2, n - 2, n - 1};
  std::uint64_t s = seed * 0x9e3779b97f4a7c15ull + 1;
  while (idx.size() < limit) {
    s ^= s << 13, s ^= s >> 7, s ^= s << 17;
    idx.push_back(static_cast<std::size_t>(s % n));
  }
  return idx;
}

namespace {

// The judgement of compare: the output got[j] against the reference r[j] at each idx[j].
Check judge(const std::vector<std::size_t>& idx, const std::vector<double>& r, const std::vector<double>& got, double tol,
            double rms_tol) {
  Check c;
  c.tol = tol;
  c.rms_tol = rms_tol;
  c.checked = idx.size();
  auto fail = [&](const char* what, double value, std::size_t j) {
    char buf[200];
    std::snprintf(buf, sizeof buf, "non-finite %s %g at index %zu (output %.6g, reference %.6g)", what, value, idx[j],
                  got[j], r[j]);
    c.ok = false;
    c.max_err = c.rms_err = std::nan("");
    c.message = buf;
    return c;
  };
  // Any NaN or Inf fails, whatever the tolerance: in the output (the op's fault, reported first),
  // and in the reference, which would otherwise make the scale and every error NaN, and NaN
  // compares false against the tolerance, so that a broken reference would pass anything.
  for (std::size_t j = 0; j < idx.size(); ++j)
    if (!std::isfinite(got[j])) return fail("output", got[j], j);
  for (std::size_t j = 0; j < idx.size(); ++j)
    if (!std::isfinite(r[j])) return fail("reference", r[j], j);
  // rms(ref), computed relative to max|ref| so that large finite references cannot overflow it.
  double amax = 0, sumsq = 0;
  for (double v : r) amax = std::max(amax, std::fabs(v));
  if (amax > 0)
    for (double v : r) sumsq += (v / amax) * (v / amax);
  const double rms = amax * std::sqrt(sumsq / static_cast<double>(std::max<std::size_t>(1, r.size())));
  const double scale = rms > 0 ? rms : 1.0;
  std::size_t worst = 0;
  double esq = 0;
  for (std::size_t j = 0; j < idx.size(); ++j) {
    const double e = std::fabs(got[j] - r[j]) / scale;
    esq += e * e;
    if (e > c.max_err) c.max_err = e, worst = j;
  }
  c.rms_err = std::sqrt(esq / static_cast<double>(std::max<std::size_t>(1, idx.size())));
  if (c.max_err > tol) {
    char buf[200];
    std::snprintf(buf, sizeof buf, "max|out-ref|/rms(ref) = %.3g > tol %.3g at index %zu (out %.6g, ref %.6g)",
                  c.max_err, tol, idx[worst], got[worst], r[worst]);
    c.ok = false;
    c.message = buf;
  } else if (rms_tol > 0 && c.rms_err > rms_tol) {
    char buf[200];
    std::snprintf(buf, sizeof buf, "rms(out-ref)/rms(ref) = %.3g > tol %.3g over %zu elements (the largest error %.3g is within %.3g)",
                  c.rms_err, rms_tol, idx.size(), c.max_err, tol);
    c.ok = false;
    c.message = buf;
  }
  return c;
}

}  // namespace

Check compare(const HostBuffer& out, const std::vector<std::size_t>& idx,
              const std::function<double(std::size_t)>& ref, double tol, double rms_tol) {
  // The reference and the output at each sampled index, gathered on every thread (the samples of a
  // large tensor are scattered over it: one thread would wait on a cache miss at each).
  std::vector<double> r(idx.size()), got(idx.size());
  const auto n = static_cast<std::int64_t>(idx.size());
#pragma omp parallel for schedule(dynamic, 16)
  for (std::int64_t j = 0; j < n; ++j) {
    const std::size_t i = idx[static_cast<std::size_t>(j)];
    r[static_cast<std::size_t>(j)] = ref(i);
    got[static_cast<std::size_t>(j)] = out.get(i);
  }
  return judge(idx, r, got, tol, rms_tol);
}

Check compare(const HostBuffer& out, const std::vector<std::size_t>& idx, const std::vector<double>& ref, double tol,
              double rms_tol) {
  HOTOPS_CHECK(ref.size() == idx.size(), "compare: one reference value per index");
  std::vector<double> got(idx.size());
  const auto n = static_cast<std::int64_t>(idx.size());
#pragma omp parallel for schedule(static) if (n > 4096)
  for (std::int64_t j = 0; j < n; ++j) got[static_cast<std::size_t>(j)] = out.get(idx[static_cast<std::size_t>(j)]);
  return judge(idx, ref, got, tol, rms_tol);
}

Check compare_each(const HostBuffer& out, const std::vector<std::size_t>& idx,
                   const std::function<double(std::size_t, double& bound)>& ref, const char* what) {
  // Each index's reference, bound and output on every thread (as compare's); then judged in order.
  const std::size_t n = idx.size();
  std::vector<double> want(n), bound(n, 0.0), got(n);
#pragma omp parallel for schedule(dynamic, 16)
  for (std::int64_t k = 0; k < static_cast<std::int64_t>(n); ++k) {
    const auto j = static_cast<std::size_t>(k);
    want[j] = ref(idx[j], bound[j]);
    got[j] = out.get(idx[j]);
  }
  Check c;
  for (std::size_t j = 0; j < n; ++j) {
    const double err = std::fabs(got[j] - want[j]);
    ++c.checked;
    c.max_err = std::max(c.max_err, err / bound[j]);
    if (!(err <= bound[j]) && c.ok) {  // NaN fails too
      char buf[200];
      std::snprintf(buf, sizeof buf, "%s[%zu] = %.9g, reference %.9g: off by %.3g, bound %.3g", what, idx[j], got[j], want[j], err,
                    bound[j]);
      c.ok = false, c.message = buf;
    }
  }
  c.tol = 1;
  return c;
}

}  // namespace hotops
