// The plain C++ reference of layernorm, in double: per-row statistics, then y or dx; dgamma and
// dbeta as column sums.
#include <cmath>

#include "kernels/layernorm/layernorm.h"

namespace hotops::layernorm {

Reference::Reference(const Shape& s, const Inputs& in) : s_(s), in_(in) {
  const std::int64_t R = s.rows(), H = s.hidden;
  if (s.dir == Direction::fwd) {
    mean.assign(static_cast<std::size_t>(R), 0.0);
    rstd.assign(static_cast<std::size_t>(R), 0.0);
#pragma omp parallel for schedule(static) if (R * H > (1 << 16))
    for (std::int64_t r = 0; r < R; ++r) {
      const auto base = static_cast<std::size_t>(r * H);
      double sum = 0;
      for (std::int64_t j = 0; j < H; ++j) sum += in.x.get(base + static_cast<std::size_t>(j));
      const double m = sum / static_cast<double>(H);
      double sq = 0;
      for (std::int64_t j = 0; j < H; ++j) {
        const double d = in.x.get(base + static_cast<std::size_t>(j)) - m;
        sq += d * d;
      }
      mean[static_cast<std::size_t>(r)] = m;
      rstd[static_cast<std::size_t>(r)] = 1.0 / std::sqrt(sq / static_cast<double>(H) + s.eps);
    }
    return;
  }
  // bwd: the saved statistics are inputs, as in PyTorch's native_layer_norm_backward.
  c1_.assign(static_cast<std::size_t>(R), 0.0);
  c2_.assign(static_cast<std::size_t>(R), 0.0);
  dgamma.assign(static_cast<std::size_t>(H), 0.0);
  dbeta.assign(static_cast<std::size_t>(H), 0.0);
  for (std::int64_t r = 0; r < R; ++r) {
    const auto base = static_cast<std::size_t>(r * H);
    const double m = in.mean.get(static_cast<std::size_t>(r)), rs = in.rstd.get(static_cast<std::size_t>(r));
    double s1 = 0, s2 = 0;
    for (std::int64_t j = 0; j < H; ++j) {
      const auto k = base + static_cast<std::size_t>(j);
      const double dy = in.dy.get(k), xhat = (in.x.get(k) - m) * rs;
      const double g = in.gamma.get(static_cast<std::size_t>(j)) * dy;
      s1 += g;
      s2 += g * xhat;
      dgamma[static_cast<std::size_t>(j)] += dy * xhat;
      dbeta[static_cast<std::size_t>(j)] += dy;
    }
    c1_[static_cast<std::size_t>(r)] = s1 / static_cast<double>(H);
    c2_[static_cast<std::size_t>(r)] = s2 / static_cast<double>(H);
  }
}

double Reference::out(std::int64_t i) const {
  const std::int64_t H = s_.hidden;
  const auto r = static_cast<std::size_t>(i / H), j = static_cast<std::size_t>(i % H);
  const auto k = static_cast<std::size_t>(i);
  if (s_.dir == Direction::fwd)
    return (in_.x.get(k) - mean[r]) * rstd[r] * in_.gamma.get(j) + in_.beta.get(j);
  const double rs = in_.rstd.get(r), xhat = (in_.x.get(k) - in_.mean.get(r)) * rs;
  return rs * (in_.gamma.get(j) * in_.dy.get(k) - c1_[r] - xhat * c2_[r]);
}

}  // namespace hotops::layernorm
