// The batchnorm_relu_maxpool reference: plain loops, double accumulation. The oracle every backend is
// checked against.
#include <algorithm>
#include <array>
#include <cmath>

#include <omp.h>

#include "kernels/batchnorm/relu_maxpool.h"

namespace hotops::batchnorm::relu_maxpool {
namespace {

// sum f(k, c, n, h, w) over z's elements (for_z_lines) into their channels, in double; each thread
// its own sums over its share of z's lines, added in thread order. f returns K terms, summed apart
// (the K sums of one pass: each element evaluated once).
template <std::size_t K, class F>
std::array<std::vector<double>, K> channel_sums(const Shape& s, F f) {
  const auto C = static_cast<std::size_t>(s.C);
  const std::int64_t lines = s.z_lines();
  const int T = s.count() > (1 << 16) ? std::max(1, omp_get_max_threads()) : 1;
  std::vector<std::vector<std::array<double, K>>> mine(static_cast<std::size_t>(T));
#pragma omp parallel for num_threads(T) schedule(static)
  for (int t = 0; t < T; ++t) {
    auto& m = mine[static_cast<std::size_t>(t)];
    m.assign(C, std::array<double, K>{});
    auto add = [&](std::int64_t k, std::int64_t c, std::int64_t n, std::int64_t h, std::int64_t w) {
      const std::array<double, K> v = f(k, c, n, h, w);
      auto& to = m[static_cast<std::size_t>(c)];
      for (std::size_t q = 0; q < K; ++q) to[q] += v[q];
    };
    for_z_lines(s, lines * t / T, lines * (t + 1) / T, add);
  }
  std::array<std::vector<double>, K> total;
  for (auto& t : total) t.assign(C, 0.0);
  for (const auto& m : mine)
    for (std::size_t c = 0; c < C; ++c)
      for (std::size_t q = 0; q < K; ++q) total[q][c] += m[c][q];
  return total;
}
template <class F>
std::vector<double> channel_sums(const Shape& s, F f) {
  return channel_sums<1>(s, [&](std::int64_t k, std::int64_t c, std::int64_t n, std::int64_t h, std::int64_t w) {
    return std::array<double, 1>{f(k, c, n, h, w)};
  })[0];
}

}  // namespace

Reference::Reference(const Shape& s, const Inputs& in) : s_(s), in_(in) {
  const auto C = static_cast<std::size_t>(s.C);
  const double M = static_cast<double>(s.N * s.H * s.W);
  if (s.dir == Direction::bwd) {
    // The saved statistics and the argmax bytes are inputs, used as they are. Both sums in one pass,
    // each element's dy computed once (and x-hat only where dy is not 0).
    auto sums = channel_sums<2>(s, [&](std::int64_t k, std::int64_t c, std::int64_t n, std::int64_t h, std::int64_t w) {
      const double d = dy(k, c, n, h, w);
      if (!s.bn || d == 0) return std::array<double, 2>{d, 0.0};
      const auto cc = static_cast<std::size_t>(c);
      return std::array<double, 2>{d, d * (in.z.get(static_cast<std::size_t>(k)) - in.mean.get(cc)) * in.rstd.get(cc)};
    });
    dbeta = std::move(sums[0]), dgamma = std::move(sums[1]);
    dbias.assign(C, 0.0);
    a_.assign(C, 1.0), b0_.assign(C, 0.0), c0_.assign(C, 0.0);
    for (std::size_t c = 0; c < C; ++c) {
      if (!s.bn) {
        dbias[c] = dbeta[c];
        continue;
      }
      a_[c] = in.gamma.get(c) * in.rstd.get(c);
      b0_[c] = -a_[c] * dbeta[c] / M;
      c0_[c] = -a_[c] * dgamma[c] / M;
    }
    return;
  }
  scale.assign(C, 1.0), shift.assign(C, 0.0);
  if (s.bn && s.dir == Direction::fwd) {
    // Two passes: the mean, then the mean squared deviation (no cancellation).
    auto z_at = [&](std::int64_t k) { return in.z.get(static_cast<std::size_t>(k)); };
    mean = channel_sums(s, [&](std::int64_t k, std::int64_t, std::int64_t, std::int64_t, std::int64_t) { return z_at(k); });
    for (double& m : mean) m /= M;
    std::vector<double> var = channel_sums(s, [&](std::int64_t k, std::int64_t c, std::int64_t, std::int64_t, std::int64_t) {
      const double d = z_at(k) - mean[static_cast<std::size_t>(c)];
      return d * d;
    });
    rstd.resize(C), running_mean.resize(C), running_var.resize(C);
    for (std::size_t c = 0; c < C; ++c) {
      var[c] /= M;
      rstd[c] = 1 / std::sqrt(var[c] + s.eps);
      scale[c] = in.gamma.get(c) * rstd[c];
      shift[c] = in.beta.get(c) - mean[c] * scale[c];
      // The conv ran without its bias: the batch mean of z + bias is mean + bias.
      running_mean[c] = (1 - s.momentum) * in.running_mean.get(c) + s.momentum * (mean[c] + in.bias.get(c));
      running_var[c] = (1 - s.momentum) * in.running_var.get(c) + s.momentum * var[c] * M / (M - 1);
    }
  } else if (s.bn) {  // infer: the running statistics, the bias folded into the shift
    for (std::size_t c = 0; c < C; ++c) {
      scale[c] = in.gamma.get(c) / std::sqrt(in.running_var.get(c) + s.eps);
      shift[c] = (in.bias.get(c) - in.running_mean.get(c)) * scale[c] + in.beta.get(c);
    }
  } else {
    for (std::size_t c = 0; c < C; ++c) shift[c] = in.bias.get(c);
  }
}

std::int64_t Reference::window_start(std::int64_t j) const {
  const std::int64_t c = j % s_.C, r = j / s_.C, pw = r % s_.PW(), ph = (r / s_.PW()) % s_.PH(), n = r / (s_.PW() * s_.PH());
  return ((n * s_.H + ph * s_.k) * s_.W + pw * s_.k) * s_.C + c;
}

double Reference::pre(std::int64_t i) const { return pre_at(s_.z_index(i), i % s_.C); }

double Reference::pooled(std::int64_t j) const {
  const std::int64_t at = window_start(j);
  double best = 0;
  for (std::int64_t r = 0; r < s_.k; ++r)
    for (std::int64_t t = 0; t < s_.k; ++t) best = std::max(best, pre(at + (r * s_.W + t) * s_.C));
  return best;
}

double Reference::keep(std::int64_t j) const {
  if (!s_.drops()) return 1;
  const std::int64_t per = s_.PH() * s_.PW() * s_.C, period = *in_.period.as<int>();
  return pointwise::dropout_keep(s_.key, static_cast<std::uint32_t>(j % per), static_cast<std::uint32_t>((j / per) % period)) ? s_.key.scale : 0.0;
}

double Reference::out(std::int64_t j) const { return pooled(j) * keep(j); }

double Reference::dy(std::int64_t i) const {
  const std::int64_t c = i % s_.C, r = i / s_.C, w = r % s_.W, h = (r / s_.W) % s_.H, n = r / (s_.W * s_.H);
  return dy(s_.z_index(i), c, n, h, w);
}

double Reference::dy(std::int64_t k, std::int64_t c, std::int64_t n, std::int64_t h, std::int64_t w) const {
  const std::int64_t ph = h / s_.k, pw = w / s_.k;
  if (ph >= s_.PH() || pw >= s_.PW()) return 0;
  const std::int64_t j = ((n * s_.PH() + ph) * s_.PW() + pw) * s_.C + c;
  const auto js = static_cast<std::size_t>(s_.pooled_index(j));
  if (s_.pool && in_.arg.as<std::uint8_t>()[js] != (h % s_.k) * s_.k + w % s_.k) return 0;
  const auto cc = static_cast<std::size_t>(c);
  if (!(in_.z.get(static_cast<std::size_t>(k)) * in_.scale.get(cc) + in_.shift.get(cc) > 0)) return 0;
  return in_.dout.get(js) * keep(j);
}

double Reference::dz(std::int64_t i) const {
  const auto c = static_cast<std::size_t>(i % s_.C);
  const double g = a_[c] * dy(i);
  if (!s_.bn) return g;
  return g + b0_[c] + c0_[c] * (z(i) - in_.mean.get(c)) * in_.rstd.get(c);
}

double Reference::z(std::int64_t i) const { return in_.z.get(static_cast<std::size_t>(s_.z_index(i))); }

}  // namespace hotops::batchnorm::relu_maxpool
