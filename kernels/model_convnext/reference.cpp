// The model_convnext reference: the block's forward and backward in double, sample by sample, written
// from the formulas on NHWC tensors (rows of C channels), independent of both implementations.
#include <omp.h>

#include <cmath>

#include "hotops/check.h"
#include "hotops/dtype.h"
#include "kernels/model_convnext/model_convnext.h"

namespace hotops::model_convnext {
namespace {

using Vec = std::vector<double>;
using Index = std::int64_t;
std::size_t at(Index i) { return static_cast<std::size_t>(i); }

// What a bf16 implementation stores in bf16, rounded so (nothing for Rounding::none).
struct Round {
  bool on;
  void operator()(Vec& v) const {
    if (on)
      for (double& e : v) e = bf16_to_float(float_to_bf16(static_cast<float>(e)));
  }
  Vec operator()(Vec v, bool) const {
    (*this)(v);
    return v;
  }
};

// Depthwise 7x7 cross-correlation, padding 3, one sample [H, W, C]: u[p, q, c] = b[c] + sum over the
// taps of w[c, r, s] x[p + r - 3, q + s - 3, c] (w OHWI: [C, 7, 7, 1]); taps off the image read zero.
Vec depthwise(const Vec& x, const double* w, const double* b, Index H, Index W, Index C) {
  Vec u(x.size());
#pragma omp parallel for schedule(static)
  for (Index p = 0; p < H; ++p)
    for (Index q = 0; q < W; ++q)
      for (Index c = 0; c < C; ++c) {
        double acc = b[c];
        for (Index r = 0; r < kKernel; ++r) {
          const Index i = p + r - kPad;
          if (i < 0 || i >= H) continue;
          for (Index t = 0; t < kKernel; ++t) {
            const Index j = q + t - kPad;
            if (j >= 0 && j < W) acc += w[(c * kKernel + r) * kKernel + t] * x[at((i * W + j) * C + c)];
          }
        }
        u[at((p * W + q) * C + c)] = acc;
      }
  return u;
}

// Its weight and bias gradients from du: dw[c, r, s] += sum over (p, q) of du[p, q, c] x[p + r - 3, ...].
void depthwise_back(const Vec& x, const Vec& du, double* dw, double* db, Index H, Index W, Index C) {
#pragma omp parallel for schedule(static)
  for (Index c = 0; c < C; ++c) {
    for (Index k = 0; k < H * W; ++k) db[c] += du[at(k * C + c)];
    for (Index r = 0; r < kKernel; ++r)
      for (Index t = 0; t < kKernel; ++t) {
        double acc = 0;
        for (Index p = std::max<Index>(0, kPad - r); p < std::min(H, H + kPad - r); ++p)
          for (Index q = std::max<Index>(0, kPad - t); q < std::min(W, W + kPad - t); ++q)
            acc += du[at((p * W + q) * C + c)] * x[at(((p + r - kPad) * W + q + t - kPad) * C + c)];
        dw[(c * kKernel + r) * kKernel + t] += acc;
      }
  }
}

// Rows of `in` values times W [in, out] plus b.
Vec dense(const Vec& a, const double* Wt, const double* b, Index rows, Index in, Index out) {
  Vec y(at(rows * out));
#pragma omp parallel for schedule(static)
  for (Index i = 0; i < rows; ++i) {
    double* yi = y.data() + i * out;
    for (Index j = 0; j < out; ++j) yi[j] = b[j];
    for (Index k = 0; k < in; ++k) {
      const double aik = a[at(i * in + k)];
      const double* wk = Wt + k * out;
      for (Index j = 0; j < out; ++j) yi[j] += aik * wk[j];
    }
  }
  return y;
}

// Its backward: dW += a^T dy and db += the column sums of dy; returns da = dy W^T.
Vec dense_back(const Vec& a, const Vec& dy, const double* Wt, double* dW, double* db, Index rows, Index in, Index out) {
#pragma omp parallel for schedule(static)
  for (Index k = 0; k < in; ++k)
    for (Index i = 0; i < rows; ++i) {
      const double aik = a[at(i * in + k)];
      const double* dyi = dy.data() + i * out;
      for (Index j = 0; j < out; ++j) dW[k * out + j] += aik * dyi[j];
    }
  for (Index i = 0; i < rows; ++i)
    for (Index j = 0; j < out; ++j) db[j] += dy[at(i * out + j)];
  Vec da(at(rows * in));
#pragma omp parallel for schedule(static)
  for (Index i = 0; i < rows; ++i)
    for (Index k = 0; k < in; ++k) {
      double s = 0;
      for (Index j = 0; j < out; ++j) s += dy[at(i * out + j)] * Wt[k * out + j];
      da[at(i * in + k)] = s;
    }
  return da;
}

// LayerNorm over the C channels of each row; keeps xhat and rstd for the backward.
struct Norm {
  Vec xhat, rstd;
};
Vec normalize(const Vec& u, const double* g, const double* b, Index rows, Index C, Norm& n) {
  Vec h(u.size());
  n.xhat.resize(u.size());
  n.rstd.resize(at(rows));
  for (Index i = 0; i < rows; ++i) {
    double mean = 0, var = 0;
    for (Index c = 0; c < C; ++c) mean += u[at(i * C + c)];
    mean /= static_cast<double>(C);
    for (Index c = 0; c < C; ++c) var += (u[at(i * C + c)] - mean) * (u[at(i * C + c)] - mean);
    const double rstd = 1 / std::sqrt(var / static_cast<double>(C) + kLnEps);
    n.rstd[at(i)] = rstd;
    for (Index c = 0; c < C; ++c) {
      const double xh = (u[at(i * C + c)] - mean) * rstd;
      n.xhat[at(i * C + c)] = xh;
      h[at(i * C + c)] = xh * g[c] + b[c];
    }
  }
  return h;
}

// Its backward: dgamma += sum dh xhat, dbeta += sum dh; returns du.
Vec normalize_back(const Vec& dh, const double* g, double* dg, double* dbeta, Index rows, Index C, const Norm& n) {
  Vec du(dh.size());
  for (Index i = 0; i < rows; ++i) {
    double sum_g = 0, sum_gx = 0;
    for (Index c = 0; c < C; ++c) {
      const double d = dh[at(i * C + c)], xh = n.xhat[at(i * C + c)];
      dg[c] += d * xh;
      dbeta[c] += d;
      sum_g += d * g[c];
      sum_gx += d * g[c] * xh;
    }
    const double inv = 1 / static_cast<double>(C);
    for (Index c = 0; c < C; ++c)
      du[at(i * C + c)] = n.rstd[at(i)] * (dh[at(i * C + c)] * g[c] - sum_g * inv - n.xhat[at(i * C + c)] * sum_gx * inv);
  }
  return du;
}

constexpr double kSqrtHalf = 0.70710678118654752440;
constexpr double kInvSqrt2Pi = 0.39894228040143267794;
double gelu(double v) { return 0.5 * v * (1 + std::erf(v * kSqrtHalf)); }
double gelu_slope(double v) { return 0.5 * (1 + std::erf(v * kSqrtHalf)) + v * kInvSqrt2Pi * std::exp(-0.5 * v * v); }

}  // namespace

Reference reference(const Arch& a, const ParamLayout& l, const std::vector<double>& params, const std::vector<double>& x_all,
                    const std::vector<double>& target, std::int64_t batch, bool backward, Rounding rounding) {
  const Index C = a.C, F = a.hidden(), H = a.H, W = a.W, rows = a.positions();
  const Round rd{rounding == Rounding::bf16};
  // P: the f32 masters (the LayerNorm's and the layer scale's, read as they are); Q: what the
  // convolution and the Linear layers read (the bf16 copy for Rounding::bf16).
  const double* P = params.data();
  const Vec low = rd(params, true);
  const double* Q = rd.on ? low.data() : P;
  const std::size_t per = at(rows * C);
  HOTOPS_CHECK(x_all.size() >= per * at(batch) && target.size() >= per * at(batch), "model_convnext: reference inputs too short");
  const double N = static_cast<double>(batch) * static_cast<double>(per);  // the loss's mean
  Reference r;
  r.y.resize(per * at(batch));
  if (backward) r.grad.assign(l.total, 0.0);
  double* G = r.grad.data();
  for (Index b = 0; b < batch; ++b) {
    const Vec x(x_all.begin() + static_cast<std::ptrdiff_t>(per * at(b)), x_all.begin() + static_cast<std::ptrdiff_t>(per * at(b + 1)));
    // forward
    Vec u = depthwise(x, Q + l.dw_w, Q + l.dw_b, H, W, C);
    rd(u);
    Norm norm;
    Vec h = normalize(u, P + l.ln_g, P + l.ln_b, rows, C, norm);
    rd(h);
    Vec z = dense(h, Q + l.w1, Q + l.b1, rows, C, F);
    rd(z);
    Vec f(z.size());
    for (std::size_t i = 0; i < z.size(); ++i) f[i] = gelu(z[i]);
    rd(f);
    Vec o = dense(f, Q + l.w2, Q + l.b2, rows, F, C);
    rd(o);
    Vec y(per);
    for (std::size_t i = 0; i < per; ++i) y[i] = x[i] + P[l.ls + i % at(C)] * o[i];
    rd(y);
    std::copy(y.begin(), y.end(), r.y.begin() + static_cast<std::ptrdiff_t>(per * at(b)));
    if (!backward) continue;
    // the loss, mean over the batch's elements, and its gradient
    const double* t = target.data() + per * at(b);
    Vec dy(per);
    for (std::size_t i = 0; i < per; ++i) {
      const double e = y[i] - t[i];
      r.loss += e * e / N;
      dy[i] = 2 * e / N;
    }
    rd(dy);
    // the layer scale: do = gamma dy, dgamma = sum dy o
    Vec dout(per);
    for (std::size_t i = 0; i < per; ++i) {
      const std::size_t c = i % at(C);
      G[l.ls + c] += dy[i] * o[i];
      dout[i] = P[l.ls + c] * dy[i];
    }
    rd(dout);
    Vec df = dense_back(f, dout, Q + l.w2, G + l.w2, G + l.b2, rows, F, C);
    rd(df);
    for (std::size_t i = 0; i < df.size(); ++i) df[i] *= gelu_slope(z[i]);
    rd(df);
    Vec dh = dense_back(h, df, Q + l.w1, G + l.w1, G + l.b1, rows, C, F);
    rd(dh);
    Vec du = normalize_back(dh, P + l.ln_g, G + l.ln_g, G + l.ln_b, rows, C, norm);
    rd(du);
    depthwise_back(x, du, G + l.dw_w, G + l.dw_b, H, W, C);
  }
  return r;
}

}  // namespace hotops::model_convnext
