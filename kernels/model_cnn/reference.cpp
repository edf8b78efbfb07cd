// The model_cnn family's reference: the convnet's forward, softmax cross-entropy loss and backward in
// double, written as plainly as the math (direct convolution loops), over distinct samples each
// weighted by how often it occurs in the batch.
#include <algorithm>
#include <cmath>

#include <omp.h>

#include "kernels/model_cnn/model_cnn.h"

namespace hotops::model_cnn {
namespace {

using Vec = std::vector<double>;
using pointwise::DropoutKey;

// Below this many multiply-adds a loop runs on one thread (the tests' tiny models, many calls).
constexpr std::int64_t kParallelMacs = 1 << 20;

std::size_t idx(std::int64_t i) { return static_cast<std::size_t>(i); }

// The convolutions' row loops, compiled for AVX-512, AVX2 and the baseline (the loader picks): the
// reference's bulk of work, run by every verification of a CNN step.
#define REF_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))

// f(r, t, h, w) for each tap (r, t) of the 3x3 window at output pixel (p, o) whose input pixel (h, w)
// lies inside the image.
template <class F>
inline void for_taps(const ConvLayer& c, std::int64_t p, std::int64_t o, F&& f) {
  for (std::int64_t r = 0; r < 3; ++r) {
    const std::int64_t h = p + r - c.pad;
    if (h < 0 || h >= c.H) continue;
    for (std::int64_t t = 0; t < 3; ++t) {
      const std::int64_t w = o + t - c.pad;
      if (w >= 0 && w < c.W) f(r, t, h, w);
    }
  }
}

// Sums over rows [0, rows) into `width` accumulators: the rows are split among the threads (one when
// the work is small), each adding into its own zeroed copy through body(r0, r1, acc); the copies are
// then added in thread order, so a thread count always gives the same sums.
template <class Body>
Vec reduce_rows(std::int64_t rows, std::int64_t width, std::int64_t work, Body body) {
  const int T = work > kParallelMacs ? std::max(1, omp_get_max_threads()) : 1;
  std::vector<Vec> part(idx(T));
#pragma omp parallel for num_threads(T) schedule(static)
  for (int t = 0; t < T; ++t) {
    part[idx(t)].assign(idx(width), 0.0);
    body(rows * t / T, rows * (t + 1) / T, part[idx(t)].data());
  }
  Vec out(idx(width), 0.0);
  for (const Vec& p : part)
    for (std::int64_t c = 0; c < width; ++c) out[idx(c)] += p[idx(c)];
  return out;
}

// z[q, p, o, k] = b[k] + sum over r, t, c of a[q, p + r - pad, o + t - pad, c] W[k, r, t, c], with W
// transposed to [r, t, c, k] so that the innermost loop runs over a pixel's K outputs.
REF_CLONES void conv_fwd_row(const ConvLayer& c, std::int64_t q, std::int64_t p, const double* a, const double* Wt,
                             const double* b, double* z) {
  for (std::int64_t o = 0; o < c.Q; ++o) {
    double* __restrict zr = z + ((q * c.P + p) * c.Q + o) * c.K;
    for (std::int64_t k = 0; k < c.K; ++k) zr[k] = b[k];
    for_taps(c, p, o, [&](std::int64_t r, std::int64_t t, std::int64_t h, std::int64_t w) {
      const double* in = a + ((q * c.H + h) * c.W + w) * c.C;
      const double* wt = Wt + (r * 3 + t) * c.C * c.K;
      for (std::int64_t ci = 0; ci < c.C; ++ci) {
        const double v = in[ci];
        const double* __restrict wr = wt + ci * c.K;
        for (std::int64_t k = 0; k < c.K; ++k) zr[k] += v * wr[k];
      }
    });
  }
}
Vec conv_fwd(const ConvLayer& c, std::int64_t S, const Vec& a, const double* W, const double* b) {
  Vec Wt(idx(9 * c.C * c.K));
  for (std::int64_t k = 0; k < c.K; ++k)
    for (std::int64_t tc = 0; tc < 9 * c.C; ++tc) Wt[idx(tc * c.K + k)] = W[k * 9 * c.C + tc];
  Vec z(idx(S * c.out_count()));
#pragma omp parallel for collapse(2) schedule(static) if (S * c.out_count() * c.C > kParallelMacs)
  for (std::int64_t q = 0; q < S; ++q)
    for (std::int64_t p = 0; p < c.P; ++p) conv_fwd_row(c, q, p, a.data(), Wt.data(), b, z.data());
  return z;
}

// The 2-norm of each of the n channels of v [samples, rows_per_sample, n] over the batch (sample q
// counted count[q] times).
std::vector<double> channel_norms(const Vec& v, std::int64_t n, std::int64_t rows_per_sample, const std::vector<std::int64_t>& count) {
  const std::int64_t rows = static_cast<std::int64_t>(v.size()) / n;
  Vec sq = reduce_rows(rows, n, static_cast<std::int64_t>(v.size()), [&](std::int64_t r0, std::int64_t r1, double* acc) {
    for (std::int64_t r = r0; r < r1; ++r) {
      const double w = static_cast<double>(count[idx(r / rows_per_sample)]);
      for (std::int64_t c = 0; c < n; ++c) acc[c] += w * v[idx(r * n + c)] * v[idx(r * n + c)];
    }
  });
  for (double& x : sq) x = std::sqrt(x);
  return sq;
}
// The batch the periodic samples stand for: sample q counted count[q] times.
std::int64_t batch_of(const std::vector<std::int64_t>& count) {
  std::int64_t b = 0;
  for (std::int64_t c : count) b += c;
  return b;
}

// Reference::summed for conv layer c's gradients, each a sum over the batch's n = B P Q pixels:
// dW[k, r, t, ch] of a[.., ch] dz[.., k] (sum |terms| <= |a_ch| |dz_k|), db[k] of dz (<= sqrt(n) |dz_k|),
// and batch norm's dgamma and dbeta of dy xhat and dy (<= sqrt(n) |dy_k|, xhat's norm being sqrt(n)).
void sum_allowances(const ConvLayer& c, const Layer& ly, bool bn, const std::vector<double>& a_norm,
                    const std::vector<double>& dz_norm, const std::vector<double>& dy_norm, std::int64_t batch, double* summed) {
  const double n = static_cast<double>(batch * c.P * c.Q), rn = std::sqrt(n);
  for (std::int64_t k = 0; k < c.K; ++k) {
    for (std::int64_t tc = 0; tc < 9 * c.C; ++tc) summed[ly.w + idx(k * 9 * c.C + tc)] = rn * a_norm[idx(tc % c.C)] * dz_norm[idx(k)];
    summed[ly.b + idx(k)] = n * dz_norm[idx(k)];
    if (bn) summed[ly.gamma + idx(k)] = summed[ly.beta + idx(k)] = n * dy_norm[idx(k)];
  }
}

// dW[k, r, t, c] = sum over samples (weighted) and output pixels of dz[q, p, o, k] a[q, h, w, c];
// db[k] = the weighted sum of dz. Accumulated as [r, t, c, k] (innermost loop over k) per thread.
REF_CLONES void conv_bwd_weights_row(const ConvLayer& c, std::int64_t q, std::int64_t p, double wq, const double* a,
                                     const double* dz, double* acc) {
  double* __restrict dbk = acc + 9 * c.C * c.K;
  for (std::int64_t o = 0; o < c.Q; ++o) {
    const double* __restrict g = dz + ((q * c.P + p) * c.Q + o) * c.K;
    for (std::int64_t k = 0; k < c.K; ++k) dbk[k] += wq * g[k];
    for_taps(c, p, o, [&](std::int64_t r, std::int64_t t, std::int64_t h, std::int64_t w) {
      const double* in = a + ((q * c.H + h) * c.W + w) * c.C;
      double* d = acc + (r * 3 + t) * c.C * c.K;
      for (std::int64_t ci = 0; ci < c.C; ++ci) {
        const double v = wq * in[ci];
        double* __restrict dr = d + ci * c.K;
        for (std::int64_t k = 0; k < c.K; ++k) dr[k] += v * g[k];
      }
    });
  }
}
void conv_bwd_weights(const ConvLayer& c, std::int64_t S, const std::vector<std::int64_t>& count, const Vec& a,
                      const Vec& dz, double* dW, double* db) {
  const std::int64_t taps = 9 * c.C * c.K;
  const Vec sum = reduce_rows(S * c.P, taps + c.K, S * c.out_count() * c.C, [&](std::int64_t r0, std::int64_t r1, double* acc) {
    for (std::int64_t row = r0; row < r1; ++row)
      conv_bwd_weights_row(c, row / c.P, row % c.P, static_cast<double>(count[idx(row / c.P)]), a.data(), dz.data(), acc);
  });
  for (std::int64_t k = 0; k < c.K; ++k) {
    for (std::int64_t tc = 0; tc < 9 * c.C; ++tc) dW[k * 9 * c.C + tc] += sum[idx(tc * c.K + k)];
    db[k] += sum[idx(taps + k)];
  }
}

// da[q, h, w, c] = sum over r, t, k of dz[q, h - r + pad, w - t + pad, k] W[k, r, t, c] (per copy).
REF_CLONES void conv_bwd_data_row(const ConvLayer& c, std::int64_t q, std::int64_t h, const double* dz, const double* W,
                                  double* da) {
  for (std::int64_t w = 0; w < c.W; ++w) {
    double* __restrict d = da + ((q * c.H + h) * c.W + w) * c.C;
    for (std::int64_t r = 0; r < 3; ++r) {
      const std::int64_t p = h - r + c.pad;
      if (p < 0 || p >= c.P) continue;
      for (std::int64_t t = 0; t < 3; ++t) {
        const std::int64_t o = w - t + c.pad;
        if (o < 0 || o >= c.Q) continue;
        const double* g = dz + ((q * c.P + p) * c.Q + o) * c.K;
        for (std::int64_t k = 0; k < c.K; ++k) {
          const double* __restrict wk = W + ((k * 3 + r) * 3 + t) * c.C;
          for (std::int64_t ci = 0; ci < c.C; ++ci) d[ci] += g[k] * wk[ci];
        }
      }
    }
  }
}
Vec conv_bwd_data(const ConvLayer& c, std::int64_t S, const Vec& dz, const double* W) {
  Vec da(idx(S * c.in_count()), 0.0);
#pragma omp parallel for collapse(2) schedule(static) if (S * c.out_count() * c.C > kParallelMacs)
  for (std::int64_t q = 0; q < S; ++q)
    for (std::int64_t h = 0; h < c.H; ++h) conv_bwd_data_row(c, q, h, dz.data(), W, da.data());
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
  const std::int64_t work = static_cast<std::int64_t>(z.size());
  auto weight = [&](std::int64_t r) { return static_cast<double>(count[idx(r / per_sample_rows)]); };
  Norm nm;
  Vec var(idx(n), 0.0);
  if (train) {
    const double M = static_cast<double>(batch_of(count) * per_sample_rows);
    nm.mean = reduce_rows(rows, n, work, [&](std::int64_t r0, std::int64_t r1, double* acc) {
      for (std::int64_t r = r0; r < r1; ++r) {
        const double wgt = weight(r);
        for (std::int64_t c = 0; c < n; ++c) acc[c] += wgt * z[idx(r * n + c)];
      }
    });
    for (double& m : nm.mean) m /= M;
    var = reduce_rows(rows, n, work, [&](std::int64_t r0, std::int64_t r1, double* acc) {
      for (std::int64_t r = r0; r < r1; ++r) {
        const double wgt = weight(r);
        for (std::int64_t c = 0; c < n; ++c) {
          const double d = z[idx(r * n + c)] - nm.mean[idx(c)];
          acc[c] += wgt * d * d;
        }
      }
    });
    for (std::int64_t c = 0; c < n; ++c) {
      var[idx(c)] /= M;
      new_mean[c] = (1 - kBnMomentum) * run_mean[c] + kBnMomentum * nm.mean[idx(c)];
      new_var[c] = (1 - kBnMomentum) * run_var[c] + kBnMomentum * var[idx(c)] * M / (M - 1);
    }
  } else {
    nm.mean.assign(run_mean, run_mean + n);
    var.assign(run_var, run_var + n);
  }
  nm.rstd.resize(idx(n));
  for (std::int64_t c = 0; c < n; ++c) nm.rstd[idx(c)] = 1 / std::sqrt(var[idx(c)] + kBnEps);
  nm.xhat.resize(z.size());
#pragma omp parallel for schedule(static) if (work > kParallelMacs)
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t c = 0; c < n; ++c) nm.xhat[idx(r * n + c)] = (z[idx(r * n + c)] - nm.mean[idx(c)]) * nm.rstd[idx(c)];
  return nm;
}

// Training-mode batch norm backward (per copy): dz = gamma rstd (dy - mean_w(dy) - xhat mean_w(dy xhat)),
// dgamma = sum_w dy xhat, dbeta = sum_w dy.
Vec bn_bwd(const Norm& nm, const Vec& dy, std::int64_t n, std::int64_t per_sample_rows,
           const std::vector<std::int64_t>& count, const double* gamma, double* dgamma, double* dbeta) {
  const std::int64_t rows = static_cast<std::int64_t>(dy.size()) / n;
  const std::int64_t work = static_cast<std::int64_t>(dy.size());
  const double M = static_cast<double>(batch_of(count) * per_sample_rows);
  // s[0, n): sum_w dy; s[n, 2n): sum_w dy xhat.
  const Vec s = reduce_rows(rows, 2 * n, work, [&](std::int64_t r0, std::int64_t r1, double* acc) {
    for (std::int64_t r = r0; r < r1; ++r) {
      const double wgt = static_cast<double>(count[idx(r / per_sample_rows)]);
      for (std::int64_t c = 0; c < n; ++c) {
        acc[c] += wgt * dy[idx(r * n + c)];
        acc[n + c] += wgt * dy[idx(r * n + c)] * nm.xhat[idx(r * n + c)];
      }
    }
  });
  for (std::int64_t c = 0; c < n; ++c) dgamma[c] = s[idx(n + c)], dbeta[c] = s[idx(c)];
  Vec dz(dy.size());
#pragma omp parallel for schedule(static) if (work > kParallelMacs)
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t c = 0; c < n; ++c) {
      const std::size_t i = idx(r * n + c);
      dz[i] = gamma[c] * nm.rstd[idx(c)] * (dy[i] - s[idx(c)] / M - nm.xhat[i] * s[idx(n + c)] / M);
    }
  return dz;
}

// The near-tie band of each of the n channels of a layer's pre-ReLU values y [rows, n]: `tie` times
// the error a correct implementation's y can carry there. That is the rounding of z (a few u |z|)
// carried through the normalization, |gamma| rstd |z| per channel (norm and gamma given: batch norm
// in training), and never less than tie x rms(y): a channel whose batch deviation is small against
// its mean carries its z's rounding magnified (with 4 to 16 distinct samples, a few of keras_cnn's
// 1024 hidden units have |z| rstd of 5 to 30 where most have about 1).
Vec tie_bands(const Vec& y, std::int64_t n, double tie, const Vec* z = nullptr, const Norm* norm = nullptr, const double* gamma = nullptr) {
  const std::int64_t rows = static_cast<std::int64_t>(y.size()) / n;
  const std::int64_t work = static_cast<std::int64_t>(y.size());
  // sq[0, n): sum of y^2; sq[n, 2n): sum of z^2, per channel.
  const Vec sq = reduce_rows(rows, 2 * n, work, [&](std::int64_t r0, std::int64_t r1, double* acc) {
    for (std::int64_t r = r0; r < r1; ++r)
      for (std::int64_t c = 0; c < n; ++c) {
        acc[c] += y[idx(r * n + c)] * y[idx(r * n + c)];
        if (z) acc[n + c] += (*z)[idx(r * n + c)] * (*z)[idx(r * n + c)];
      }
  });
  double y2 = 0;
  for (std::int64_t c = 0; c < n; ++c) y2 += sq[idx(c)];
  const double floor = tie * std::sqrt(y2 / static_cast<double>(std::max<std::size_t>(1, y.size())));
  Vec band(idx(n), floor);
  if (!z || !norm || !gamma) return band;
  for (std::int64_t c = 0; c < n; ++c)
    band[idx(c)] = std::max(floor, tie * std::fabs(gamma[c]) * norm->rstd[idx(c)] * std::sqrt(sq[idx(n + c)] / static_cast<double>(rows)));
  return band;
}

// ReLU with the implementation's decision inside the tie band of y's channel (|y| <= band[channel]):
// pass[i] says where the gradient passes.
std::vector<char> relu_pass(const Vec& y, const float* hint, const Vec& band) {
  const std::int64_t n = static_cast<std::int64_t>(band.size()), rows = static_cast<std::int64_t>(y.size()) / n;
  std::vector<char> pass(y.size());
#pragma omp parallel for schedule(static) if (static_cast<std::int64_t>(y.size()) > kParallelMacs)
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t c = 0; c < n; ++c) {
      const std::size_t i = idx(r * n + c);
      pass[i] = (hint && std::fabs(y[i]) <= band[idx(c)]) ? hint[i] > 0.f : y[i] > 0;
    }
  return pass;
}

bool keep(const DropoutKey& k, std::int64_t e, std::int64_t q) {
  return pointwise::dropout_keep(k, static_cast<std::uint32_t>(e), static_cast<std::uint32_t>(q));
}

// y = xhat gamma + beta per channel of the n channels.
Vec bn_affine(const Norm& nm, std::int64_t n, const double* gamma, const double* beta) {
  Vec y(nm.xhat.size());
  const std::int64_t rows = static_cast<std::int64_t>(y.size()) / n;
#pragma omp parallel for schedule(static) if (static_cast<std::int64_t>(y.size()) > kParallelMacs)
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t k = 0; k < n; ++k) y[idx(r * n + k)] = nm.xhat[idx(r * n + k)] * gamma[k] + beta[k];
  return y;
}

Vec relu(const Vec& y, const std::vector<char>& pass) {
  Vec act(y.size());
#pragma omp parallel for schedule(static) if (static_cast<std::int64_t>(act.size()) > kParallelMacs)
  for (std::size_t j = 0; j < act.size(); ++j) act[j] = pass[j] ? y[j] : 0.0;
  return act;
}

// What a layer's forward keeps for its backward.
struct Saved {
  Norm norm;                        // batch norm's statistics (train)
  std::vector<char> pass;           // where the ReLU passed its input
  std::vector<std::int64_t> arg;    // max-pool: pooled element -> pixel within the sample's output
};

// What every layer of one pass reads besides its own input.
struct Pass {
  const std::vector<std::int64_t>& count;  // sample q occurs count[q] times in the batch
  bool train, bn;
  const double* P;     // the parameters
  const Vec& stats;    // the running statistics before the step
  double* new_stats;   // and after it (train)
  double tie;          // the near-tie factor
};

// [Batch norm,] ReLU of the pre-activations z [rows, n] (n channels, per_sample_rows rows a sample)
// of layer ly, the depth-th layer that rounds (1: the first conv), the near-ties decided by `hint`
// within `band`. The band is the tie factor times the error this layer's own rounding leaves in y,
// times depth: every layer below adds its own, carried up (the triangle inequality: at most the sum
// of the layers' errors). Measured on keras_cnn bf16 (AVX-512 BF16, b32 and b64), the rms of a
// correct step's y error grows from 0.09 of one layer's band at conv 1 to 0.37 at the hidden layer,
// and its max from 0.87 to 2.3: between sqrt(depth) and depth, so a band of one layer's error let
// hidden units whose y lay 1-2.3 bands from zero flip against the reference (a whole column of
// dW1 off at 2-8 times its rms bound).
Vec bn_relu_fwd(const Pass& ps, const Vec& z, std::int64_t n, std::int64_t per_sample_rows, const Layer& ly,
                std::int64_t depth, const float* hint, Saved& sv, Vec& band) {
  const double tie = ps.tie * static_cast<double>(depth);
  const double* P = ps.P;
  if (ps.bn) {
    sv.norm = bn_fwd(z, n, per_sample_rows, ps.count, ps.train, &ps.stats[ly.mean], &ps.stats[ly.var],
                     ps.new_stats + ly.mean, ps.new_stats + ly.var);
    const Vec y = bn_affine(sv.norm, n, P + ly.gamma, P + ly.beta);
    band = tie_bands(y, n, tie, &z, ps.train ? &sv.norm : nullptr, P + ly.gamma);
    sv.pass = relu_pass(y, hint, band);
    return relu(y, sv.pass);
  }
  band = tie_bands(z, n, tie);
  sv.pass = relu_pass(z, hint, band);
  return relu(z, sv.pass);
}

// Max-pool (window = stride = c.pool) of act [S, P, Q, K]: the first maximum; within the band of it,
// the first of the implementation's maxima. arg records each pooled element's pixel.
Vec maxpool_fwd(const ConvLayer& c, std::int64_t S, const Vec& act, const float* hint, const Vec& band,
                std::vector<std::int64_t>& arg) {
  const std::int64_t k = c.pool;
  Vec out(idx(S * c.pooled_count()), 0.0);
  arg.assign(idx(S * c.pooled_count()), 0);
#pragma omp parallel for collapse(2) schedule(static) if (S * c.out_count() > kParallelMacs)
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
          arg[idx(q * c.pooled_count() + e)] = best - q * c.out_count();
          out[idx(q * c.pooled_count() + e)] = act[idx(best)];
        }
  return out;
}

// Dropout of v [S, n] in place: element e of sample q kept (and scaled) by the mask of key k. The same
// pass is its own backward on the gradient.
void dropout(Vec& v, std::int64_t S, std::int64_t n, const DropoutKey& k) {
#pragma omp parallel for collapse(2) schedule(static) if (S * n > kParallelMacs)
  for (std::int64_t q = 0; q < S; ++q)
    for (std::int64_t e = 0; e < n; ++e) {
      double& x = v[idx(q * n + e)];
      x = keep(k, e, q) ? x * static_cast<double>(k.scale) : 0.0;
    }
}

// y [S, out] = a [S, in] . W [in, out] + b: each output the bias, then the products added in input order.
// Blocks of outputs, each reading its columns of W once for all the samples.
Vec dense_fwd(const Vec& a, std::int64_t S, std::int64_t in, std::int64_t out, const double* W, const double* b) {
  Vec y(idx(S * out));
  constexpr std::int64_t kBlock = 64;
#pragma omp parallel for schedule(static) if (S * in * out > kParallelMacs)
  for (std::int64_t o0 = 0; o0 < out; o0 += kBlock) {
    const std::int64_t o1 = std::min(out, o0 + kBlock);
    for (std::int64_t q = 0; q < S; ++q)
      for (std::int64_t o = o0; o < o1; ++o) y[idx(q * out + o)] = b[o];
    for (std::int64_t f = 0; f < in; ++f) {
      const double* __restrict wr = W + idx(f * out);
      for (std::int64_t q = 0; q < S; ++q) {
        const double v = a[idx(q * in + f)];
        double* __restrict yr = &y[idx(q * out)];
        for (std::int64_t o = o0; o < o1; ++o) yr[o] += v * wr[o];
      }
    }
  }
  return y;
}

// Softmax cross-entropy of the logits [S, C], mean over the batch (sample q counted count[q] times):
// adds the loss to `loss`, returns dlogits per copy.
Vec softmax_xent(const Vec& logits, const std::vector<std::int32_t>& labels, const std::vector<std::int64_t>& count,
                 std::int64_t C, double& loss) {
  const std::int64_t S = static_cast<std::int64_t>(count.size());
  const double B = static_cast<double>(batch_of(count));
  Vec dlog(idx(S * C));
  for (std::int64_t q = 0; q < S; ++q) {
    const double* z = &logits[idx(q * C)];
    const double mx = *std::max_element(z, z + C);
    double sum = 0;
    for (std::int64_t c = 0; c < C; ++c) sum += std::exp(z[c] - mx);
    const std::int32_t yq = labels[idx(q)];
    loss += static_cast<double>(count[idx(q)]) * (std::log(sum) - (z[yq] - mx)) / B;
    for (std::int64_t c = 0; c < C; ++c) dlog[idx(q * C + c)] = (std::exp(z[c] - mx) / sum - (c == yq ? 1 : 0)) / B;
  }
  return dlog;
}

// Backward of the classifier y = a . W + b (a [S, in], few outputs): dW += sum_w a^T dy, db += sum_w dy;
// returns da = dy W^T (per copy).
Vec classifier_bwd(const Vec& a, const Vec& dy, const std::vector<std::int64_t>& count, std::int64_t in,
                   std::int64_t out, const double* W, double* dW, double* db) {
  const std::int64_t S = static_cast<std::int64_t>(count.size());
  Vec da(idx(S * in), 0.0);
  for (std::int64_t q = 0; q < S; ++q) {
    const double wq = static_cast<double>(count[idx(q)]);
    for (std::int64_t c = 0; c < out; ++c) {
      const double g = dy[idx(q * out + c)];
      db[c] += wq * g;
      for (std::int64_t o = 0; o < in; ++o) {
        dW[o * out + c] += wq * a[idx(q * in + o)] * g;
        da[idx(q * in + o)] += g * W[o * out + c];
      }
    }
  }
  return da;
}

// Backward of the wide dense layer y = a . W + b (a [S, in]): by rows of W, dW += sum_w a^T dy and
// da = dy W^T together; then db += sum_w dy.
Vec dense_bwd(const Vec& a, const Vec& dy, const std::vector<std::int64_t>& count, std::int64_t in,
              std::int64_t out, const double* W, double* dW, double* db) {
  const std::int64_t S = static_cast<std::int64_t>(count.size());
  Vec da(idx(S * in), 0.0);
#pragma omp parallel for schedule(static) if (S * in * out > kParallelMacs)
  for (std::int64_t f = 0; f < in; ++f) {
    const double* __restrict wr = W + idx(f * out);
    double* __restrict gr = dW + idx(f * out);
    for (std::int64_t q = 0; q < S; ++q) {
      const double* __restrict dq = &dy[idx(q * out)];
      const double v = static_cast<double>(count[idx(q)]) * a[idx(q * in + f)];
      double acc = 0;
#pragma omp simd reduction(+ : acc)
      for (std::int64_t o = 0; o < out; ++o) {
        gr[o] += v * dq[o];
        acc += dq[o] * wr[o];
      }
      da[idx(q * in + f)] = acc;
    }
  }
  for (std::int64_t o = 0; o < out; ++o)
    for (std::int64_t q = 0; q < S; ++q) db[o] += static_cast<double>(count[idx(q)]) * dy[idx(q * out + o)];
  return da;
}

// Max-pool backward: each pooled gradient to the pixel that won its window (windows do not overlap).
Vec maxpool_bwd(const ConvLayer& c, std::int64_t S, const Vec& d, const std::vector<std::int64_t>& arg) {
  Vec dy(idx(S * c.out_count()), 0.0);
  const std::int64_t n = c.pooled_count();
#pragma omp parallel for schedule(static) if (S * n > kParallelMacs)
  for (std::int64_t q = 0; q < S; ++q)
    for (std::int64_t e = 0; e < n; ++e) dy[idx(q * c.out_count() + arg[idx(q * n + e)])] += d[idx(q * n + e)];
  return dy;
}

// ReLU backward in place: the gradient passes where the forward's input did.
void relu_bwd(Vec& dy, const std::vector<char>& pass) {
#pragma omp parallel for schedule(static) if (static_cast<std::int64_t>(dy.size()) > kParallelMacs)
  for (std::size_t j = 0; j < dy.size(); ++j)
    if (!pass[j]) dy[j] = 0.0;
}

}  // namespace

Reference reference(const Shape& s, const ParamLayout& l, const std::vector<DropoutKey>& keys, const Vec& params,
                    const Vec& stats, const Vec& x, const std::vector<std::int32_t>& labels,
                    const std::vector<std::int64_t>& count, bool train, const Hints* hints, bool keep_acts) {
  const Arch& a = s.arch;
  const std::vector<ConvLayer>& convs = s.convs;
  const std::int64_t S = static_cast<std::int64_t>(count.size());
  const std::int64_t F = flat_width(a), Hd = a.hidden, C = a.classes;
  const double* P = params.data();
  Reference ref;
  ref.stats.assign(l.stats, 0.0);
  if (train) ref.grad.assign(l.total, 0.0), ref.summed.assign(l.total, 0.0);
  const Pass ps{count, train, a.bn, P, stats, ref.stats.data(), hints ? hints->band : 1e-4};
  const bool record = keep_acts && train;

  // ---- forward: [conv, (BN), ReLU] per layer, max-pool and dropout (train) closing each stage ----
  const std::size_t L = convs.size();
  std::vector<Vec> in(L + 1);  // in[i]: conv i's input; in[L]: the flattened features
  std::vector<Saved> saved(L);
  std::vector<std::size_t> stage_of(L, 0);  // the dropout key of each pooling layer
  for (std::size_t i = 1; i < L; ++i) stage_of[i] = stage_of[i - 1] + (convs[i - 1].pool ? 1 : 0);
  in[0] = x;
  for (std::size_t i = 0; i < L; ++i) {
    const ConvLayer& c = convs[i];
    const Layer& ly = l.conv[i];
    const float* hint = hints && i < hints->conv.size() ? hints->conv[i] : nullptr;
    const Vec z = conv_fwd(c, S, in[i], P + ly.w, P + ly.b);
    Vec band;
    Vec act = bn_relu_fwd(ps, z, c.K, c.P * c.Q, ly, static_cast<std::int64_t>(i) + 1, hint, saved[i], band);
    if (record) ref.relu.emplace_back(act.begin(), act.end());
    if (!c.pool) {
      in[i + 1] = std::move(act);
      continue;
    }
    in[i + 1] = maxpool_fwd(c, S, act, hint, band, saved[i].arg);
    if (train) dropout(in[i + 1], S, c.pooled_count(), keys[stage_of[i]]);
  }
  // Dense 1, (BN), ReLU, dropout (train); dense 2 -> logits.
  const Vec h = dense_fwd(in[L], S, F, Hd, P + l.dense1.w, P + l.dense1.b);
  Saved hidden;
  Vec band;
  Vec hd = bn_relu_fwd(ps, h, Hd, 1, l.dense1, static_cast<std::int64_t>(L) + 1, hints ? hints->hidden : nullptr, hidden, band);
  if (record) ref.hidden.assign(hd.begin(), hd.end());
  if (train) dropout(hd, S, Hd, keys.back());
  ref.logits = dense_fwd(hd, S, Hd, C, P + l.dense2.w, P + l.dense2.b);
  if (!train) return ref;

  // ---- loss and backward (per-copy gradients; sums over the batch weight sample q by count[q]) ----
  double* G = ref.grad.data();
  const Vec dlog = softmax_xent(ref.logits, labels, count, C, ref.loss);
  Vec dh = classifier_bwd(hd, dlog, count, Hd, C, P + l.dense2.w, G + l.dense2.w, G + l.dense2.b);
  dropout(dh, S, Hd, keys.back());
  relu_bwd(dh, hidden.pass);
  if (a.bn) dh = bn_bwd(hidden.norm, dh, Hd, 1, count, P + l.dense1.gamma, G + l.dense1.gamma, G + l.dense1.beta);
  Vec d = dense_bwd(in[L], dh, count, F, Hd, P + l.dense1.w, G + l.dense1.w, G + l.dense1.b);

  // Back through the conv layers; `d` is the gradient of in[i + 1] (per copy).
  for (std::size_t i = L; i-- > 0;) {
    const ConvLayer& c = convs[i];
    const Layer& ly = l.conv[i];
    Vec dy;
    if (c.pool) {
      dropout(d, S, c.pooled_count(), keys[stage_of[i]]);
      dy = maxpool_bwd(c, S, d, saved[i].arg);
    } else {
      dy = std::move(d);
    }
    relu_bwd(dy, saved[i].pass);
    const std::vector<double> dy_norm = channel_norms(dy, c.K, c.P * c.Q, count);
    const Vec dz = a.bn ? bn_bwd(saved[i].norm, dy, c.K, c.P * c.Q, count, P + ly.gamma, G + ly.gamma, G + ly.beta)
                        : std::move(dy);
    conv_bwd_weights(c, S, count, in[i], dz, G + ly.w, G + ly.b);
    sum_allowances(c, ly, a.bn, channel_norms(in[i], c.C, c.H * c.W, count), channel_norms(dz, c.K, c.P * c.Q, count), dy_norm,
                   batch_of(count), ref.summed.data());
    if (i > 0) d = conv_bwd_data(c, S, dz, P + ly.w);
  }
  return ref;
}

}  // namespace hotops::model_cnn
