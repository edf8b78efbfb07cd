// The model_cnn family's reference: the convnet's forward, softmax cross-entropy loss and backward in
// double, written as plainly as the math (direct convolution loops), over distinct samples each
// weighted by how often it occurs in the batch.
#include <algorithm>
#include <cmath>

#include "kernels/model_cnn/model_cnn.h"

namespace hotops::model_cnn {
namespace {

using Vec = std::vector<double>;
using pointwise::DropoutKey;

// Below this many multiply-adds a loop runs on one thread (the tests' tiny models, many calls).
constexpr std::int64_t kParallelMacs = 1 << 20;

std::size_t idx(std::int64_t i) { return static_cast<std::size_t>(i); }

// z[q, p, o, k] = b[k] + sum over r, t, c of a[q, p + r - pad, o + t - pad, c] W[k, r, t, c]
Vec conv_fwd(const ConvLayer& c, std::int64_t S, const Vec& a, const double* W, const double* b) {
  Vec z(idx(S * c.out_count()));
#pragma omp parallel for collapse(2) schedule(static) if (S * c.out_count() * c.C > kParallelMacs)
  for (std::int64_t q = 0; q < S; ++q)
    for (std::int64_t p = 0; p < c.P; ++p)
      for (std::int64_t o = 0; o < c.Q; ++o)
        for (std::int64_t k = 0; k < c.K; ++k) {
          double acc = b[k];
          for (std::int64_t r = 0; r < 3; ++r) {
            const std::int64_t h = p + r - c.pad;
            if (h < 0 || h >= c.H) continue;
            for (std::int64_t t = 0; t < 3; ++t) {
              const std::int64_t w = o + t - c.pad;
              if (w < 0 || w >= c.W) continue;
              const double* in = &a[idx(((q * c.H + h) * c.W + w) * c.C)];
              const double* wk = W + ((k * 3 + r) * 3 + t) * c.C;
              for (std::int64_t ci = 0; ci < c.C; ++ci) acc += in[ci] * wk[ci];
            }
          }
          z[idx(((q * c.P + p) * c.Q + o) * c.K + k)] = acc;
        }
  return z;
}

// dW[k, r, t, c] = sum over samples (weighted) and output pixels of dz[q, p, o, k] a[q, h, w, c];
// db[k] = the weighted sum of dz.
void conv_bwd_weights(const ConvLayer& c, std::int64_t S, const std::vector<std::int64_t>& count, const Vec& a,
                      const Vec& dz, double* dW, double* db) {
#pragma omp parallel for schedule(static) if (S * c.out_count() * c.C > kParallelMacs)
  for (std::int64_t k = 0; k < c.K; ++k) {
    double* dwk = dW + k * 9 * c.C;
    double bsum = 0;
    for (std::int64_t q = 0; q < S; ++q)
      for (std::int64_t p = 0; p < c.P; ++p)
        for (std::int64_t o = 0; o < c.Q; ++o) {
          const double g = dz[idx(((q * c.P + p) * c.Q + o) * c.K + k)] * static_cast<double>(count[idx(q)]);
          bsum += g;
          for (std::int64_t r = 0; r < 3; ++r) {
            const std::int64_t h = p + r - c.pad;
            if (h < 0 || h >= c.H) continue;
            for (std::int64_t t = 0; t < 3; ++t) {
              const std::int64_t w = o + t - c.pad;
              if (w < 0 || w >= c.W) continue;
              const double* in = &a[idx(((q * c.H + h) * c.W + w) * c.C)];
              double* d = dwk + (r * 3 + t) * c.C;
              for (std::int64_t ci = 0; ci < c.C; ++ci) d[ci] += g * in[ci];
            }
          }
        }
    db[k] = bsum;
  }
}

// da[q, h, w, c] = sum over r, t, k of dz[q, h - r + pad, w - t + pad, k] W[k, r, t, c] (per copy).
Vec conv_bwd_data(const ConvLayer& c, std::int64_t S, const Vec& dz, const double* W) {
  Vec da(idx(S * c.in_count()), 0.0);
#pragma omp parallel for collapse(2) schedule(static) if (S * c.out_count() * c.C > kParallelMacs)
  for (std::int64_t q = 0; q < S; ++q)
    for (std::int64_t h = 0; h < c.H; ++h)
      for (std::int64_t w = 0; w < c.W; ++w) {
        double* d = &da[idx(((q * c.H + h) * c.W + w) * c.C)];
        for (std::int64_t r = 0; r < 3; ++r) {
          const std::int64_t p = h - r + c.pad;
          if (p < 0 || p >= c.P) continue;
          for (std::int64_t t = 0; t < 3; ++t) {
            const std::int64_t o = w - t + c.pad;
            if (o < 0 || o >= c.Q) continue;
            const double* g = &dz[idx(((q * c.P + p) * c.Q + o) * c.K)];
            for (std::int64_t k = 0; k < c.K; ++k) {
              const double* wk = W + ((k * 3 + r) * 3 + t) * c.C;
              for (std::int64_t ci = 0; ci < c.C; ++ci) d[ci] += g[k] * wk[ci];
            }
          }
        }
      }
  return da;
}

// Batch norm over the rows of z [rows, n] (rows = samples x pixels, sample q's rows weighted by count):
// statistics of the weighted batch (train) or the running ones (infer).
struct Norm {
  Vec mean, rstd, xhat;
};
Norm bn_fwd(const Vec& z, std::int64_t n, std::int64_t per_sample_rows, const std::vector<std::int64_t>& count,
            bool train, const double* run_mean, const double* run_var, double* new_mean, double* new_var) {
  const std::int64_t rows = static_cast<std::int64_t>(z.size()) / n;
  Norm nm;
  nm.mean.assign(idx(n), 0.0);
  nm.rstd.assign(idx(n), 0.0);
  Vec var(idx(n), 0.0);
  if (train) {
    double M = 0;
    for (std::int64_t r = 0; r < rows; ++r) {
      const double wgt = static_cast<double>(count[idx(r / per_sample_rows)]);
      M += wgt;
      for (std::int64_t c = 0; c < n; ++c) nm.mean[idx(c)] += wgt * z[idx(r * n + c)];
    }
    for (double& m : nm.mean) m /= M;
    for (std::int64_t r = 0; r < rows; ++r) {
      const double wgt = static_cast<double>(count[idx(r / per_sample_rows)]);
      for (std::int64_t c = 0; c < n; ++c) {
        const double d = z[idx(r * n + c)] - nm.mean[idx(c)];
        var[idx(c)] += wgt * d * d;
      }
    }
    for (std::int64_t c = 0; c < n; ++c) {
      var[idx(c)] /= M;
      new_mean[c] = (1 - kBnMomentum) * run_mean[c] + kBnMomentum * nm.mean[idx(c)];
      new_var[c] = (1 - kBnMomentum) * run_var[c] + kBnMomentum * var[idx(c)] * M / (M - 1);
    }
  } else {
    for (std::int64_t c = 0; c < n; ++c) nm.mean[idx(c)] = run_mean[c], var[idx(c)] = run_var[c];
  }
  for (std::int64_t c = 0; c < n; ++c) nm.rstd[idx(c)] = 1 / std::sqrt(var[idx(c)] + kBnEps);
  nm.xhat.resize(z.size());
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t c = 0; c < n; ++c) nm.xhat[idx(r * n + c)] = (z[idx(r * n + c)] - nm.mean[idx(c)]) * nm.rstd[idx(c)];
  return nm;
}

// Training-mode batch norm backward (per copy): dz = gamma rstd (dy - mean_w(dy) - xhat mean_w(dy xhat)),
// dgamma = sum_w dy xhat, dbeta = sum_w dy.
Vec bn_bwd(const Norm& nm, const Vec& dy, std::int64_t n, std::int64_t per_sample_rows,
           const std::vector<std::int64_t>& count, const double* gamma, double* dgamma, double* dbeta) {
  const std::int64_t rows = static_cast<std::int64_t>(dy.size()) / n;
  Vec s1(idx(n), 0.0), s2(idx(n), 0.0);
  double M = 0;
  for (std::int64_t r = 0; r < rows; ++r) {
    const double wgt = static_cast<double>(count[idx(r / per_sample_rows)]);
    M += wgt;
    for (std::int64_t c = 0; c < n; ++c) {
      s1[idx(c)] += wgt * dy[idx(r * n + c)];
      s2[idx(c)] += wgt * dy[idx(r * n + c)] * nm.xhat[idx(r * n + c)];
    }
  }
  for (std::int64_t c = 0; c < n; ++c) dgamma[c] = s2[idx(c)], dbeta[c] = s1[idx(c)];
  Vec dz(dy.size());
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t c = 0; c < n; ++c) {
      const std::size_t i = idx(r * n + c);
      dz[i] = gamma[c] * nm.rstd[idx(c)] * (dy[i] - s1[idx(c)] / M - nm.xhat[i] * s2[idx(c)] / M);
    }
  return dz;
}

double rms_of(const Vec& v) {
  double s = 0;
  for (double x : v) s += x * x;
  return std::sqrt(s / static_cast<double>(std::max<std::size_t>(1, v.size())));
}

// The near-tie band of each of the n channels of a layer's pre-ReLU values y [rows, n]: `tie` times
// the error a correct implementation's y can carry there. That is the rounding of z (a few u |z|)
// carried through the normalization, |gamma| rstd |z| per channel (norm and gamma given: batch norm
// in training), and never less than tie x rms(y): a channel whose batch deviation is small against
// its mean carries its z's rounding magnified (with 4 to 16 distinct samples, a few of keras_cnn's
// 1024 hidden units have |z| rstd of 5 to 30 where most have about 1).
Vec tie_bands(const Vec& y, std::int64_t n, double tie, const Vec* z = nullptr, const Norm* norm = nullptr, const double* gamma = nullptr) {
  const double floor = tie * rms_of(y);
  Vec band(idx(n), floor);
  if (!z || !norm || !gamma) return band;
  Vec z2(idx(n), 0.0);
  for (std::size_t j = 0; j < z->size(); ++j) z2[j % idx(n)] += (*z)[j] * (*z)[j];
  const double rows = static_cast<double>(z->size() / idx(n));
  for (std::int64_t c = 0; c < n; ++c)
    band[idx(c)] = std::max(floor, tie * std::fabs(gamma[c]) * norm->rstd[idx(c)] * std::sqrt(z2[idx(c)] / rows));
  return band;
}

// ReLU with the implementation's decision inside the tie band of y's channel (|y| <= band[channel]):
// pass[i] says where the gradient passes.
std::vector<char> relu_pass(const Vec& y, const float* hint, const Vec& band) {
  std::vector<char> pass(y.size());
  for (std::size_t i = 0; i < y.size(); ++i)
    pass[i] = (hint && std::fabs(y[i]) <= band[i % band.size()]) ? hint[i] > 0.f : y[i] > 0;
  return pass;
}

bool keep(const DropoutKey& k, std::int64_t e, std::int64_t q) {
  return pointwise::dropout_keep(k, static_cast<std::uint32_t>(e), static_cast<std::uint32_t>(q));
}

}  // namespace

Reference reference(const Shape& s, const ParamLayout& l, const std::vector<DropoutKey>& keys, const Vec& params,
                    const Vec& stats, const Vec& x, const std::vector<std::int32_t>& labels,
                    const std::vector<std::int64_t>& count, bool train, const Hints* hints, bool keep_acts) {
  const Arch& a = s.arch;
  const std::vector<ConvLayer>& convs = s.convs;
  const std::int64_t S = static_cast<std::int64_t>(count.size());
  double B = 0;
  for (std::int64_t c : count) B += static_cast<double>(c);
  const double* P = params.data();
  Reference ref;
  ref.stats.assign(l.stats, 0.0);
  if (train) ref.grad.assign(l.total, 0.0);

  // ---- forward ----
  const std::size_t L = convs.size();
  std::vector<Vec> in(L + 1);             // in[i]: conv i's input; in[L]: the flattened features
  std::vector<Vec> y(L);                  // pre-ReLU (after batch norm when there is one)
  std::vector<Norm> norm(L);
  std::vector<std::vector<char>> pass(L);
  std::vector<std::vector<std::int64_t>> arg(L);  // pooled element -> pixel index within the sample's output
  // Dropout after each pool (train), keyed by stage.
  std::vector<std::size_t> stage_of(L, 0);
  for (std::size_t i = 1; i < L; ++i) stage_of[i] = stage_of[i - 1] + (convs[i - 1].pool ? 1 : 0);
  in[0] = x;
  for (std::size_t i = 0; i < L; ++i) {
    const ConvLayer& c = convs[i];
    const Layer& ly = l.conv[i];
    Vec z = conv_fwd(c, S, in[i], P + ly.w, P + ly.b);
    const double tie = hints ? hints->band : 1e-4;
    Vec band;
    if (a.bn) {
      norm[i] = bn_fwd(z, c.K, c.P * c.Q, count, train, &stats[ly.mean], &stats[ly.var], &ref.stats[ly.mean],
                       &ref.stats[ly.var]);
      y[i].resize(z.size());
      for (std::size_t j = 0; j < z.size(); ++j)
        y[i][j] = norm[i].xhat[j] * P[ly.gamma + j % idx(c.K)] + P[ly.beta + j % idx(c.K)];
      band = tie_bands(y[i], c.K, tie, &z, train ? &norm[i] : nullptr, P + ly.gamma);
    } else {
      y[i] = std::move(z);
      band = tie_bands(y[i], c.K, tie);
    }
    const float* hint = hints && i < hints->conv.size() ? hints->conv[i] : nullptr;
    pass[i] = relu_pass(y[i], hint, band);
    Vec act(y[i].size());
    for (std::size_t j = 0; j < act.size(); ++j) act[j] = pass[i][j] ? y[i][j] : 0.0;
    if (keep_acts && train) ref.relu.emplace_back(act.begin(), act.end());
    if (!c.pool) {
      in[i + 1] = std::move(act);
      continue;
    }
    // Max-pool: the first maximum; within the band of it, the first of the implementation's maxima.
    const std::int64_t k = c.pool;
    in[i + 1].assign(idx(S * c.pooled_count()), 0.0);
    arg[i].assign(idx(S * c.pooled_count()), 0);
    for (std::int64_t q = 0; q < S; ++q)
      for (std::int64_t ph = 0; ph < c.PH; ++ph)
        for (std::int64_t pw = 0; pw < c.PW; ++pw)
          for (std::int64_t ch = 0; ch < c.K; ++ch) {
            auto at = [&](std::int64_t r, std::int64_t t) { return ((q * c.P + ph * k + r) * c.Q + pw * k + t) * c.K + ch; };
            std::int64_t best = at(0, 0);
            for (std::int64_t r = 0; r < k; ++r)
              for (std::int64_t t = 0; t < k; ++t)
                if (act[idx(at(r, t))] > act[idx(best)]) best = at(r, t);
            if (hint) {
              std::int64_t mine = at(0, 0);
              for (std::int64_t r = 0; r < k; ++r)
                for (std::int64_t t = 0; t < k; ++t)
                  if (hint[at(r, t)] > hint[mine]) mine = at(r, t);
              if (act[idx(mine)] >= act[idx(best)] - band[idx(ch)]) best = mine;
            }
            const std::int64_t e = (ph * c.PW + pw) * c.K + ch;
            const double v = act[idx(best)];
            arg[i][idx(q * c.pooled_count() + e)] = best - q * c.out_count();
            in[i + 1][idx(q * c.pooled_count() + e)] = v;
          }
    if (!train) continue;
    const DropoutKey& dk = keys[stage_of[i]];
    for (std::int64_t q = 0; q < S; ++q)
      for (std::int64_t e = 0; e < c.pooled_count(); ++e) {
        double& v = in[i + 1][idx(q * c.pooled_count() + e)];
        v = keep(dk, e, q) ? v * static_cast<double>(dk.scale) : 0.0;
      }
  }
  // Dense 1 [S, F] x [F, hidden] + b, [BN], ReLU, dropout; dense 2 -> logits.
  const std::int64_t F = flat_width(a), Hd = a.hidden, C = a.classes;
  const Vec& flat = in[L];
  Vec h(idx(S * Hd));
#pragma omp parallel for schedule(static) if (S * F * Hd > kParallelMacs)
  for (std::int64_t o = 0; o < Hd; ++o)
    for (std::int64_t q = 0; q < S; ++q) {
      double acc = P[l.dense1.b + idx(o)];
      for (std::int64_t f = 0; f < F; ++f) acc += flat[idx(q * F + f)] * P[l.dense1.w + idx(f * Hd + o)];
      h[idx(q * Hd + o)] = acc;
    }
  Norm hn;
  Vec hy = h;
  if (a.bn) {
    hn = bn_fwd(h, Hd, 1, count, train, &stats[l.dense1.mean], &stats[l.dense1.var], &ref.stats[l.dense1.mean],
                &ref.stats[l.dense1.var]);
    for (std::size_t j = 0; j < hy.size(); ++j) hy[j] = hn.xhat[j] * P[l.dense1.gamma + j % idx(Hd)] + P[l.dense1.beta + j % idx(Hd)];
  }
  const Vec hband = tie_bands(hy, Hd, hints ? hints->band : 1e-4, &h, a.bn && train ? &hn : nullptr, a.bn ? P + l.dense1.gamma : nullptr);
  const std::vector<char> hpass = relu_pass(hy, hints ? hints->hidden : nullptr, hband);
  const DropoutKey& hk = keys.back();
  Vec hd(hy.size());
  for (std::int64_t q = 0; q < S; ++q)
    for (std::int64_t o = 0; o < Hd; ++o) {
      const std::size_t j = idx(q * Hd + o);
      const double v = hpass[j] ? hy[j] : 0.0;
      if (keep_acts && train) ref.hidden.push_back(static_cast<float>(v));
      hd[j] = !train ? v : keep(hk, o, q) ? v * static_cast<double>(hk.scale) : 0.0;
    }
  ref.logits.assign(idx(S * C), 0.0);
  for (std::int64_t q = 0; q < S; ++q)
    for (std::int64_t c = 0; c < C; ++c) {
      double acc = P[l.dense2.b + idx(c)];
      for (std::int64_t o = 0; o < Hd; ++o) acc += hd[idx(q * Hd + o)] * P[l.dense2.w + idx(o * C + c)];
      ref.logits[idx(q * C + c)] = acc;
    }
  if (!train) return ref;

  // ---- loss and backward (per-copy gradients; sums over the batch weight sample q by count[q]) ----
  Vec dlog(idx(S * C));
  for (std::int64_t q = 0; q < S; ++q) {
    const double* z = &ref.logits[idx(q * C)];
    const double mx = *std::max_element(z, z + C);
    double sum = 0;
    for (std::int64_t c = 0; c < C; ++c) sum += std::exp(z[c] - mx);
    const std::int32_t yq = labels[idx(q)];
    ref.loss += static_cast<double>(count[idx(q)]) * (std::log(sum) - (z[yq] - mx)) / B;
    for (std::int64_t c = 0; c < C; ++c) dlog[idx(q * C + c)] = (std::exp(z[c] - mx) / sum - (c == yq ? 1 : 0)) / B;
  }
  double* G = ref.grad.data();
  Vec dhd(idx(S * Hd), 0.0);
  for (std::int64_t q = 0; q < S; ++q) {
    const double wq = static_cast<double>(count[idx(q)]);
    for (std::int64_t c = 0; c < C; ++c) {
      const double g = dlog[idx(q * C + c)];
      G[l.dense2.b + idx(c)] += wq * g;
      for (std::int64_t o = 0; o < Hd; ++o) {
        G[l.dense2.w + idx(o * C + c)] += wq * hd[idx(q * Hd + o)] * g;
        dhd[idx(q * Hd + o)] += g * P[l.dense2.w + idx(o * C + c)];
      }
    }
  }
  Vec dh(dhd.size());
  for (std::int64_t q = 0; q < S; ++q)
    for (std::int64_t o = 0; o < Hd; ++o) {
      const std::size_t j = idx(q * Hd + o);
      const double d = keep(hk, o, q) ? dhd[j] * static_cast<double>(hk.scale) : 0.0;
      dh[j] = hpass[j] ? d : 0.0;
    }
  if (a.bn) dh = bn_bwd(hn, dh, Hd, 1, count, P + l.dense1.gamma, G + l.dense1.gamma, G + l.dense1.beta);
  Vec dflat(idx(S * F), 0.0);
#pragma omp parallel for schedule(static) if (S * F * Hd > kParallelMacs)
  for (std::int64_t f = 0; f < F; ++f)
    for (std::int64_t o = 0; o < Hd; ++o) {
      double acc = 0;
      for (std::int64_t q = 0; q < S; ++q) {
        acc += static_cast<double>(count[idx(q)]) * flat[idx(q * F + f)] * dh[idx(q * Hd + o)];
        dflat[idx(q * F + f)] += dh[idx(q * Hd + o)] * P[l.dense1.w + idx(f * Hd + o)];
      }
      G[l.dense1.w + idx(f * Hd + o)] = acc;
    }
  for (std::int64_t o = 0; o < Hd; ++o)
    for (std::int64_t q = 0; q < S; ++q) G[l.dense1.b + idx(o)] += static_cast<double>(count[idx(q)]) * dh[idx(q * Hd + o)];

  // Back through the conv layers; `d` is the gradient of in[i + 1] (per copy).
  Vec d = std::move(dflat);
  for (std::size_t i = L; i-- > 0;) {
    const ConvLayer& c = convs[i];
    const Layer& ly = l.conv[i];
    Vec dy(idx(S * c.out_count()), 0.0);
    if (c.pool) {
      const DropoutKey& dk = keys[stage_of[i]];
      const std::int64_t n = c.pooled_count();
      for (std::int64_t q = 0; q < S; ++q)
        for (std::int64_t e = 0; e < n; ++e) {
          const double g = keep(dk, e, q) ? d[idx(q * n + e)] * static_cast<double>(dk.scale) : 0.0;
          dy[idx(q * c.out_count() + arg[i][idx(q * n + e)])] += g;
        }
    } else {
      dy = std::move(d);
    }
    for (std::size_t j = 0; j < dy.size(); ++j)
      if (!pass[i][j]) dy[j] = 0.0;
    Vec dz = a.bn ? bn_bwd(norm[i], dy, c.K, c.P * c.Q, count, P + ly.gamma, G + ly.gamma, G + ly.beta) : std::move(dy);
    conv_bwd_weights(c, S, count, in[i], dz, G + ly.w, G + ly.b);
    if (i > 0) d = conv_bwd_data(c, S, dz, P + ly.w);
  }
  return ref;
}

}  // namespace hotops::model_cnn
