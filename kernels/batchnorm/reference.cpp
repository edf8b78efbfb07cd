// The batchnorm reference: plain loops, double accumulation. The oracle every backend is checked against.
#include <cmath>

#include "kernels/batchnorm/batchnorm.h"

namespace hotops::batchnorm {
namespace {

// Per-channel sums over all elements of a tensor: sum f(i, c) for each channel c, in double.
// Each thread keeps its own per-channel accumulators, so that any layout is one flat pass.
template <class F>
std::vector<double> channel_sums(const Shape& s, F f) {
  const auto C = static_cast<std::size_t>(s.C);
  std::vector<double> total(C, 0.0);
  const std::int64_t n = s.count();
#pragma omp parallel if (n > (1 << 16))
  {
    std::vector<double> mine(C, 0.0);
#pragma omp for schedule(static) nowait
    for (std::int64_t i = 0; i < n; ++i) {
      const auto c = static_cast<std::size_t>(s.channel_of(i));
      mine[c] += f(static_cast<std::size_t>(i), c);
    }
#pragma omp critical
    for (std::size_t c = 0; c < C; ++c) total[c] += mine[c];
  }
  return total;
}

}  // namespace

Reference::Reference(const Shape& s, const Inputs& in) : s_(s), in_(in) {
  const auto C = static_cast<std::size_t>(s.C);
  const double n = static_cast<double>(s.per_channel());
  a_.assign(C, 0.0);
  b_.assign(C, 0.0);
  k_.assign(C, 0.0);
  switch (s.dir) {
    case Direction::infer:
      for (std::size_t c = 0; c < C; ++c) {
        a_[c] = in.gamma.get(c) / std::sqrt(in.running_var.get(c) + kEps);
        b_[c] = in.beta.get(c) - in.running_mean.get(c) * a_[c];
      }
      break;
    case Direction::bwd: {
      // The saved statistics are inputs (f32), used as they are, as PyTorch's backward does.
      dbeta = channel_sums(s, [&](std::size_t i, std::size_t) { return in.dy.get(i); });
      dgamma = channel_sums(s, [&](std::size_t i, std::size_t c) {
        return in.dy.get(i) * (in.x.get(i) - in.save_mean.get(c)) * in.save_invstd.get(c);
      });
      // dx = gamma*invstd*(dy - dbeta/n - (x - mean)*invstd*dgamma/n) = a*dy + b*x + k
      for (std::size_t c = 0; c < C; ++c) {
        const double invstd = in.save_invstd.get(c);
        a_[c] = in.gamma.get(c) * invstd;
        b_[c] = -a_[c] * invstd * dgamma[c] / n;
        k_[c] = -a_[c] * dbeta[c] / n - b_[c] * in.save_mean.get(c);
      }
      break;
    }
    default: {
      // Two passes: the mean, then the mean squared deviation (no cancellation).
      std::vector<double> mean = channel_sums(s, [&](std::size_t i, std::size_t) { return in.x.get(i); });
      for (double& m : mean) m /= n;
      std::vector<double> var = channel_sums(s, [&](std::size_t i, std::size_t c) {
        const double d = in.x.get(i) - mean[c];
        return d * d;
      });
      for (double& v : var) v /= n;
      save_mean = mean;
      save_invstd.resize(C);
      running_mean.resize(C);
      running_var.resize(C);
      for (std::size_t c = 0; c < C; ++c) {
        save_invstd[c] = 1.0 / std::sqrt(var[c] + kEps);
        running_mean[c] = (1 - kMomentum) * in.running_mean.get(c) + kMomentum * mean[c];
        running_var[c] = (1 - kMomentum) * in.running_var.get(c) + kMomentum * var[c] * n / (n - 1);
        a_[c] = in.gamma.get(c) * save_invstd[c];
        b_[c] = in.beta.get(c) - mean[c] * a_[c];
      }
    }
  }
}

double Reference::out(std::int64_t i) const {
  const auto k = static_cast<std::size_t>(i);
  const auto c = static_cast<std::size_t>(s_.channel_of(i));
  if (s_.dir == Direction::bwd) return a_[c] * in_.dy.get(k) + b_[c] * in_.x.get(k) + k_[c];
  return a_[c] * in_.x.get(k) + b_[c];
}

void reference(const Shape& s, const Inputs& in, Outputs& out) {
  const Reference r(s, in);
  for (std::int64_t i = 0; i < s.count(); ++i) out.out.set(static_cast<std::size_t>(i), r.out(i));
  auto fill = [](HostBuffer& b, const std::vector<double>& v) {
    for (std::size_t c = 0; c < b.count() && c < v.size(); ++c) b.set(c, v[c]);
  };
  fill(out.save_mean, r.save_mean);
  fill(out.save_invstd, r.save_invstd);
  fill(out.running_mean, r.running_mean);
  fill(out.running_var, r.running_var);
  fill(out.dgamma, r.dgamma);
  fill(out.dbeta, r.dbeta);
}

}  // namespace hotops::batchnorm
