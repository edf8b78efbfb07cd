// The model_bert reference: the layer's forward and backward in double, sample by sample, written
// from the formulas (row-major [rows, cols] everywhere), independent of both implementations.
#include <omp.h>

#include <algorithm>
#include <cmath>

#include "hotops/check.h"
#include "hotops/dtype.h"
#include "kernels/model_bert/model_bert.h"

namespace hotops::model_bert {
namespace {

using Vec = std::vector<double>;

// C[n, m] (+)= sum_k A(i, k) B(k, j), with A(i, k) = A[i * ar + k * ac], B(k, j) = B[k * br + j * bc].
// Each element sums its products in k order from its start (0, or C's value with `accumulate`),
// whatever the blocking: rows of B (bc == 1) are streamed once for kRows rows of C at a time (a
// pass over all of B per row would read it from memory n times); a transposed B (br == 1, ac == 1)
// takes kDots dot products of contiguous rows at once, each its own chain of adds, side by side.
constexpr std::int64_t kRows = 8, kDots = 8;
void mm(std::int64_t n, std::int64_t m, std::int64_t K, const double* A, std::int64_t ar, std::int64_t ac, const double* B,
        std::int64_t br, std::int64_t bc, double* C, std::int64_t ldc, bool accumulate = false) {
  if (bc != 1 && br == 1 && ac == 1) {
#pragma omp parallel for schedule(static) if (n * m * K > (1 << 16))
    for (std::int64_t i = 0; i < n; ++i) {
      const double* a = A + i * ar;
      double* c = C + i * ldc;
      std::int64_t j = 0;
      for (; j + kDots <= m; j += kDots) {
        double s[kDots] = {};
        for (std::int64_t k = 0; k < K; ++k)
          for (std::int64_t t = 0; t < kDots; ++t) s[t] += a[k] * B[(j + t) * bc + k];
        for (std::int64_t t = 0; t < kDots; ++t) c[j + t] = (accumulate ? c[j + t] : 0.0) + s[t];
      }
      for (; j < m; ++j) {
        const double* b = B + j * bc;
        double s = 0;
        for (std::int64_t k = 0; k < K; ++k) s += a[k] * b[k];
        c[j] = (accumulate ? c[j] : 0.0) + s;
      }
    }
    return;
  }
  const std::int64_t groups = (n + kRows - 1) / kRows;
#pragma omp parallel for schedule(static) if (n * m * K > (1 << 16))
  for (std::int64_t g = 0; g < groups; ++g) {
    const std::int64_t i0 = g * kRows, rows = std::min(kRows, n - i0);
    if (!accumulate)
      for (std::int64_t r = 0; r < rows; ++r) std::fill_n(C + (i0 + r) * ldc, m, 0.0);
    for (std::int64_t k = 0; k < K; ++k) {
      const double* b = B + k * br;
      for (std::int64_t r = 0; r < rows; ++r) {
        const double a = A[(i0 + r) * ar + k * ac];
        double* __restrict c = C + (i0 + r) * ldc;
        if (bc == 1)
          for (std::int64_t j = 0; j < m; ++j) c[j] += a * b[j];
        else
          for (std::int64_t j = 0; j < m; ++j) c[j] += a * b[j * bc];
      }
    }
  }
}

// y = a . W + b, a [n, in], W [in, out]
Vec linear(const Vec& a, const double* W, const double* b, std::int64_t n, std::int64_t in, std::int64_t out) {
  Vec y(static_cast<std::size_t>(n * out));
  mm(n, out, in, a.data(), in, 1, W, out, 1, y.data(), out);
  for (std::int64_t i = 0; i < n; ++i)
    for (std::int64_t j = 0; j < out; ++j) y[static_cast<std::size_t>(i * out + j)] += b[j];
  return y;
}

// Backward of y = a . W + b: dW += a^T dy, db += colsum(dy), returns da = dy W^T.
Vec linear_back(const Vec& a, const Vec& dy, const double* W, double* dW, double* db, std::int64_t n, std::int64_t in,
                std::int64_t out) {
  mm(in, out, n, a.data(), 1, in, dy.data(), out, 1, dW, out, true);
  for (std::int64_t i = 0; i < n; ++i)
    for (std::int64_t j = 0; j < out; ++j) db[j] += dy[static_cast<std::size_t>(i * out + j)];
  Vec da(static_cast<std::size_t>(n * in));
  mm(n, in, out, dy.data(), out, 1, W, 1, out, da.data(), in);
  return da;
}

struct LnCache {
  Vec xhat, rstd;
};

Vec layernorm(const Vec& x, const double* g, const double* b, std::int64_t n, std::int64_t h, double eps, LnCache& c) {
  Vec y(x.size());
  c.xhat.assign(x.size(), 0);
  c.rstd.assign(static_cast<std::size_t>(n), 0);
  for (std::int64_t i = 0; i < n; ++i) {
    const double* r = x.data() + i * h;
    double mean = 0, var = 0;
    for (std::int64_t j = 0; j < h; ++j) mean += r[j];
    mean /= static_cast<double>(h);
    for (std::int64_t j = 0; j < h; ++j) var += (r[j] - mean) * (r[j] - mean);
    var /= static_cast<double>(h);
    const double rstd = 1 / std::sqrt(var + eps);
    c.rstd[static_cast<std::size_t>(i)] = rstd;
    for (std::int64_t j = 0; j < h; ++j) {
      const auto k = static_cast<std::size_t>(i * h + j);
      c.xhat[k] = (r[j] - mean) * rstd;
      y[k] = c.xhat[k] * g[j] + b[j];
    }
  }
  return y;
}

Vec layernorm_back(const Vec& dy, const double* g, double* dg, double* db, std::int64_t n, std::int64_t h, const LnCache& c) {
  Vec dx(dy.size());
  for (std::int64_t i = 0; i < n; ++i) {
    double m1 = 0, m2 = 0;
    for (std::int64_t j = 0; j < h; ++j) {
      const auto k = static_cast<std::size_t>(i * h + j);
      dg[j] += dy[k] * c.xhat[k];
      db[j] += dy[k];
      m1 += dy[k] * g[j];
      m2 += dy[k] * g[j] * c.xhat[k];
    }
    m1 /= static_cast<double>(h), m2 /= static_cast<double>(h);
    for (std::int64_t j = 0; j < h; ++j) {
      const auto k = static_cast<std::size_t>(i * h + j);
      dx[k] = c.rstd[static_cast<std::size_t>(i)] * (dy[k] * g[j] - m1 - c.xhat[k] * m2);
    }
  }
  return dx;
}

double gelu(double z) { return 0.5 * z * (1 + std::erf(z / std::sqrt(2.0))); }
double gelu_grad(double z) {
  const double pi = 3.14159265358979323846;
  return 0.5 * (1 + std::erf(z / std::sqrt(2.0))) + z * std::exp(-0.5 * z * z) / std::sqrt(2 * pi);
}

Vec add(const Vec& a, const Vec& b) {
  Vec c(a.size());
  for (std::size_t i = 0; i < a.size(); ++i) c[i] = a[i] + b[i];
  return c;
}

// What a bf16 implementation stores in bf16, rounded so (nothing for Rounding::none).
struct Store {
  bool bf16;
  Vec operator()(Vec v) const {
    if (bf16)
      for (double& e : v) e = bf16_to_float(float_to_bf16(static_cast<float>(e)));
    return v;
  }
};

// The attention heads on qkv [S, 3H] (Q, K and V side by side, head h's D columns in each):
// prob [NH, S, S] = softmax(Q K^T scale) per head, ctx [S, H] = prob V, the heads side by side.
void attention_fwd(const Vec& qkv, std::int64_t S, std::int64_t H, std::int64_t NH, std::int64_t D, double scale,
                   const Store& rd, Vec& prob, Vec& ctx) {
  prob.assign(static_cast<std::size_t>(NH * S * S), 0.0);
  ctx.assign(static_cast<std::size_t>(S * H), 0.0);
  for (std::int64_t h = 0; h < NH; ++h) {
    double* p = prob.data() + h * S * S;
    const double* q = qkv.data() + h * D;
    const double* k = qkv.data() + H + h * D;
    mm(S, S, D, q, 3 * H, 1, k, 1, 3 * H, p, S);  // q k^T
    for (std::int64_t i = 0; i < S; ++i) {
      double* row = p + i * S;
      for (std::int64_t j = 0; j < S; ++j) row[j] *= scale;
      if (rd.bf16) {
        const Vec stored = rd(Vec(row, row + S));
        std::copy(stored.begin(), stored.end(), row);
      }
      double mx = -1e300, sum = 0;
      for (std::int64_t j = 0; j < S; ++j) mx = std::max(mx, row[j]);
      for (std::int64_t j = 0; j < S; ++j) sum += (row[j] = std::exp(row[j] - mx));
      for (std::int64_t j = 0; j < S; ++j) row[j] /= sum;
    }
  }
  prob = rd(prob);
  for (std::int64_t h = 0; h < NH; ++h)
    mm(S, D, S, prob.data() + h * S * S, S, 1, qkv.data() + 2 * H + h * D, 3 * H, 1, ctx.data() + h * D, H);
  ctx = rd(ctx);
}

// Backward of attention_fwd: dqkv [S, 3H] from dctx [S, H].
Vec attention_bwd(const Vec& qkv, const Vec& prob, const Vec& dctx, std::int64_t S, std::int64_t H, std::int64_t NH,
                  std::int64_t D, double scale, const Store& rd) {
  Vec dqkv(static_cast<std::size_t>(S * 3 * H), 0.0), dp(static_cast<std::size_t>(S * S));
  for (std::int64_t h = 0; h < NH; ++h) {
    const double* p = prob.data() + h * S * S;
    const double* q = qkv.data() + h * D;
    const double* k = qkv.data() + H + h * D;
    const double* v = qkv.data() + 2 * H + h * D;
    const double* dc = dctx.data() + h * D;
    mm(S, S, D, dc, H, 1, v, 1, 3 * H, dp.data(), S);                          // dP = dctx v^T
    mm(S, D, S, p, 1, S, dc, H, 1, dqkv.data() + 2 * H + h * D, 3 * H);         // dv = P^T dctx
    dp = rd(dp);
    for (std::int64_t i = 0; i < S; ++i) {                                       // dscores
      double dot = 0;
      for (std::int64_t j = 0; j < S; ++j) dot += dp[static_cast<std::size_t>(i * S + j)] * p[i * S + j];
      for (std::int64_t j = 0; j < S; ++j) {
        double& d = dp[static_cast<std::size_t>(i * S + j)];
        d = p[i * S + j] * (d - dot);
      }
    }
    dp = rd(dp);
    for (double& d : dp) d *= scale;  // the scale, folded into dS here, is the GEMMs' alpha in the implementations
    mm(S, D, S, dp.data(), S, 1, k, 3 * H, 1, dqkv.data() + h * D, 3 * H);      // dq = dS k
    mm(S, D, S, dp.data(), 1, S, q, 3 * H, 1, dqkv.data() + H + h * D, 3 * H);  // dk = dS^T q
  }
  return dqkv;
}

// Mean squared error of y against target, N elements over the whole batch: adds y's share to loss,
// returns dloss/dy.
Vec mse(const Vec& y, const double* target, double N, double& loss) {
  Vec dy(y.size());
  for (std::size_t i = 0; i < y.size(); ++i) {
    const double e = y[i] - target[i];
    loss += e * e / N;
    dy[i] = 2 * e / N;
  }
  return dy;
}

}  // namespace

Reference reference(const Arch& a, const ParamLayout& l, const std::vector<double>& params, const std::vector<double>& x_all,
                    const std::vector<double>& target, std::int64_t batch, bool backward, Rounding rounding) {
  const std::int64_t S = a.seq, H = a.hidden, F = a.ffn, NH = a.heads, D = a.head_dim();
  HOTOPS_CHECK(D * NH == H, "model_bert: hidden must be heads x head_dim");
  const double scale = 1 / std::sqrt(static_cast<double>(D));
  const Store rd{rounding == Rounding::bf16};
  // P: the masters, read by LayerNorm; W: what the GEMMs read (the bf16 copy for Rounding::bf16).
  const double* P = params.data();
  const Vec rounded = rd.bf16 ? rd(params) : Vec();
  const double* W = rd.bf16 ? rounded.data() : P;
  const std::size_t per = static_cast<std::size_t>(S * H);
  const double N = static_cast<double>(batch) * static_cast<double>(per);
  Reference r;
  r.y.resize(per * static_cast<std::size_t>(batch));
  if (backward) r.grad.assign(l.total, 0.0);
  double* G = r.grad.data();
  for (std::int64_t b = 0; b < batch; ++b) {
    const Vec x(x_all.begin() + static_cast<std::ptrdiff_t>(per * b), x_all.begin() + static_cast<std::ptrdiff_t>(per * (b + 1)));
    // forward
    LnCache ln1, ln2;
    const Vec u1 = a.pre_ln ? rd(layernorm(x, P + l.ln1g, P + l.ln1b, S, H, a.ln_eps, ln1)) : x;
    const Vec qkv = rd(linear(u1, W + l.wqkv, W + l.bqkv, S, H, 3 * H));
    Vec prob, ctx;
    attention_fwd(qkv, S, H, NH, D, scale, rd, prob, ctx);
    const Vec attn = linear(ctx, W + l.wo, W + l.bo, S, H, H);
    const Vec s1 = rd(add(x, attn));
    const Vec h1 = a.pre_ln ? s1 : rd(layernorm(s1, P + l.ln1g, P + l.ln1b, S, H, a.ln_eps, ln1));  // the FFN block's residual
    const Vec u2 = a.pre_ln ? rd(layernorm(s1, P + l.ln2g, P + l.ln2b, S, H, a.ln_eps, ln2)) : h1;  // the FFN's input
    const Vec z = rd(linear(u2, W + l.w1, W + l.b1, S, H, F));
    Vec f(z.size());
    for (std::size_t i = 0; i < z.size(); ++i) f[i] = gelu(z[i]);
    f = rd(f);
    const Vec o = linear(f, W + l.w2, W + l.b2, S, F, H);
    const Vec s2 = rd(add(h1, o));
    const Vec y = a.pre_ln ? s2 : rd(layernorm(s2, P + l.ln2g, P + l.ln2b, S, H, a.ln_eps, ln2));
    std::copy(y.begin(), y.end(), r.y.begin() + static_cast<std::ptrdiff_t>(per * b));
    if (!backward) continue;
    // loss and backward
    const Vec dy = rd(mse(y, target.data() + per * static_cast<std::size_t>(b), N, r.loss));
    const Vec ds2 = a.pre_ln ? dy : rd(layernorm_back(dy, P + l.ln2g, G + l.ln2g, G + l.ln2b, S, H, ln2));
    Vec df = rd(linear_back(f, ds2, W + l.w2, G + l.w2, G + l.b2, S, F, H));
    for (std::size_t i = 0; i < df.size(); ++i) df[i] *= gelu_grad(z[i]);
    df = rd(df);
    const Vec du2 = rd(linear_back(u2, df, W + l.w1, G + l.w1, G + l.b1, S, H, F));
    Vec ds1;
    if (a.pre_ln) ds1 = rd(add(layernorm_back(du2, P + l.ln2g, G + l.ln2g, G + l.ln2b, S, H, ln2), ds2));
    else ds1 = rd(layernorm_back(add(du2, ds2), P + l.ln1g, G + l.ln1g, G + l.ln1b, S, H, ln1));
    const Vec dctx = rd(linear_back(ctx, ds1, W + l.wo, G + l.wo, G + l.bo, S, H, H));
    const Vec dqkv = rd(attention_bwd(qkv, prob, dctx, S, H, NH, D, scale, rd));
    const Vec du1 = rd(linear_back(u1, dqkv, W + l.wqkv, G + l.wqkv, G + l.bqkv, S, H, 3 * H));
    if (a.pre_ln) layernorm_back(du1, P + l.ln1g, G + l.ln1g, G + l.ln1b, S, H, ln1);
  }
  return r;
}

}  // namespace hotops::model_bert
