// The conv2d reference: direct convolution, double accumulation. The oracle every backend is checked
// against; each call computes one output element, so large problems are verified on a sample.
#include "kernels/conv2d/conv2d.h"

#include <algorithm>

namespace hotops::conv2d {
namespace {

// The logical coordinates (n, c, h, w) of user-layout offset i of a [N, C, H, W] tensor.
struct Coord {
  std::int64_t n, c, h, w;
};
Coord coord(Layout l, std::int64_t i, std::int64_t C, std::int64_t H, std::int64_t W) {
  if (l == Layout::nchw) return {i / (C * H * W), (i / (H * W)) % C, (i / W) % H, i % W};
  return {i / (H * W * C), i % C, (i / (W * C)) % H, (i / C) % W};
}

}  // namespace

std::size_t Shape::x_at(std::int64_t n, std::int64_t c, std::int64_t h, std::int64_t w) const {
  return static_cast<std::size_t>(layout == Layout::nchw ? ((n * C + c) * H + h) * W + w
                                                         : ((n * H + h) * W + w) * C + c);
}
std::size_t Shape::w_at(std::int64_t k, std::int64_t c, std::int64_t r, std::int64_t s) const {
  const std::int64_t cg = Cg();
  return static_cast<std::size_t>(layout == Layout::nchw ? ((k * cg + c) * R + r) * S + s
                                                         : ((k * R + r) * S + s) * cg + c);
}
std::size_t Shape::y_at(std::int64_t n, std::int64_t k, std::int64_t p, std::int64_t q) const {
  const std::int64_t P_ = P(), Q_ = Q();
  return static_cast<std::size_t>(layout == Layout::nchw ? ((n * K + k) * P_ + p) * Q_ + q
                                                         : ((n * P_ + p) * Q_ + q) * K + k);
}

RefData::RefData(const Inputs& in) {
  x = floats(in.x), w = floats(in.w), b = floats(in.b), dy = floats(in.dy);
}

const float* RefData::floats(const HostBuffer& h) {
  if (h.count() == 0) return nullptr;
  if (h.dtype() == DType::f32) return h.as<float>();
  std::vector<float>& v = converted_.emplace_back(h.count());
  const auto n = static_cast<std::int64_t>(v.size());
#pragma omp parallel for schedule(static) if (n > (1 << 16))
  for (std::int64_t i = 0; i < n; ++i) v[static_cast<std::size_t>(i)] = static_cast<float>(h.get(static_cast<std::size_t>(i)));
  return v.data();
}

double reference_primary(const Shape& s, const RefData& d, std::size_t idx) {
  const auto i = static_cast<std::int64_t>(idx);
  const std::int64_t P = s.P(), Q = s.Q();
  double acc = 0;
  switch (s.dir) {
    case Direction::bwd_data: {  // dx[n,c,h,w]: every (k of c's group, r, s) whose tap lands on (h, w)
      const Coord x = coord(s.layout, i, s.C, s.H, s.W);
      const std::int64_t g = x.c / s.Cg(), cg = x.c % s.Cg();
      for (std::int64_t r = 0; r < s.R; ++r) {
        const std::int64_t ph = x.h + s.pad_h - r * s.dil_h;  // = p * stride_h
        if (ph < 0 || ph % s.stride_h != 0 || ph / s.stride_h >= P) continue;
        for (std::int64_t t = 0; t < s.S; ++t) {
          const std::int64_t qw = x.w + s.pad_w - t * s.dil_w;
          if (qw < 0 || qw % s.stride_w != 0 || qw / s.stride_w >= Q) continue;
          for (std::int64_t k = g * s.Kg(); k < (g + 1) * s.Kg(); ++k)
            acc += static_cast<double>(d.dy[s.y_at(x.n, k, ph / s.stride_h, qw / s.stride_w)]) *
                   d.w[s.w_at(k, cg, r, t)];
        }
      }
      return acc;
    }
    case Direction::bwd_weight: {  // dw[k,c,r,s]: offset i in OIHW or OHWI, c within k's group
      const std::int64_t Cg = s.Cg();
      std::int64_t k, cg, r, t;
      if (s.layout == Layout::nchw) k = i / (Cg * s.R * s.S), cg = (i / (s.R * s.S)) % Cg, r = (i / s.S) % s.R, t = i % s.S;
      else k = i / (s.R * s.S * Cg), r = (i / (s.S * Cg)) % s.R, t = (i / Cg) % s.S, cg = i % Cg;
      const std::int64_t c = k / s.Kg() * Cg + cg;  // the input channel
      for (std::int64_t n = 0; n < s.N; ++n)
        for (std::int64_t p = 0; p < P; ++p) {
          const std::int64_t h = p * s.stride_h - s.pad_h + r * s.dil_h;
          if (h < 0 || h >= s.H) continue;
          for (std::int64_t q = 0; q < Q; ++q) {
            const std::int64_t w = q * s.stride_w - s.pad_w + t * s.dil_w;
            if (w < 0 || w >= s.W) continue;
            acc += static_cast<double>(d.x[s.x_at(n, c, h, w)]) * d.dy[s.y_at(n, k, p, q)];
          }
        }
      return acc;
    }
    default: {  // y[n,k,p,q]
      const Coord y = coord(s.layout, i, s.K, P, Q);  // (n, k, p, q)
      const std::int64_t c0 = y.c / s.Kg() * s.Cg();  // the first input channel of k's group
      for (std::int64_t r = 0; r < s.R; ++r) {
        const std::int64_t h = y.h * s.stride_h - s.pad_h + r * s.dil_h;
        if (h < 0 || h >= s.H) continue;
        for (std::int64_t t = 0; t < s.S; ++t) {
          const std::int64_t w = y.w * s.stride_w - s.pad_w + t * s.dil_w;
          if (w < 0 || w >= s.W) continue;
          for (std::int64_t c = 0; c < s.Cg(); ++c)
            acc += static_cast<double>(d.x[s.x_at(y.n, c0 + c, h, w)]) * d.w[s.w_at(y.c, c, r, t)];
        }
      }
      acc += s.bias ? d.b[static_cast<std::size_t>(y.c)] : 0.0;
      return s.relu ? std::max(acc, 0.0) : acc;
    }
  }
}

double reference_db(const Shape& s, const RefData& d, std::int64_t k) {
  double acc = 0;
  for (std::int64_t n = 0; n < s.N; ++n)
    for (std::int64_t p = 0; p < s.P(); ++p)
      for (std::int64_t q = 0; q < s.Q(); ++q) acc += d.dy[s.y_at(n, k, p, q)];
  return acc;
}

WeightGrads reference_weight_grads(const Shape& s, const RefData& d) {
  const std::int64_t N = s.N, K = s.K, Cg = s.Cg(), Kg = s.Kg(), R = s.R, S = s.S, P = s.P(), Q = s.Q();
  const std::int64_t per = R * S * Cg * K;  // one image's sums, [r][t][c within the group][k]
  const bool nchw = s.layout == Layout::nchw;
  const std::int64_t xs = nchw ? s.H * s.W : 1, ys = nchw ? P * Q : 1;  // a channel's stride in x, dy
  std::vector<double> dw_n(static_cast<std::size_t>(N * per), 0.0), db_n(static_cast<std::size_t>(N * K), 0.0);
#pragma omp parallel for schedule(dynamic)
  for (std::int64_t n = 0; n < N; ++n) {
    double* dbn = db_n.data() + n * K;
    std::vector<double> g(static_cast<std::size_t>(K));  // this pixel's dy, by k
    for (std::int64_t p = 0; p < P; ++p)
      for (std::int64_t q = 0; q < Q; ++q) {
        const float* dy = d.dy + s.y_at(n, 0, p, q);
        for (std::int64_t k = 0; k < K; ++k) g[static_cast<std::size_t>(k)] = dy[k * ys];
        if (s.bias)
          for (std::int64_t k = 0; k < K; ++k) dbn[k] += g[static_cast<std::size_t>(k)];
        for (std::int64_t r = 0; r < R; ++r) {
          const std::int64_t h = p * s.stride_h - s.pad_h + r * s.dil_h;
          if (h < 0 || h >= s.H) continue;
          for (std::int64_t t = 0; t < S; ++t) {
            const std::int64_t w = q * s.stride_w - s.pad_w + t * s.dil_w;
            if (w < 0 || w >= s.W) continue;
            const float* x = d.x + s.x_at(n, 0, h, w);
            double* acc = dw_n.data() + n * per + (r * S + t) * Cg * K;
            if (Cg == 1 && Kg == 1) {  // depthwise: output k reads input channel k alone
#pragma omp simd
              for (std::int64_t k = 0; k < K; ++k) acc[k] += static_cast<double>(x[k * xs]) * g[static_cast<std::size_t>(k)];
              continue;
            }
            for (std::int64_t k0 = 0; k0 < K; k0 += Kg)  // each group: its Kg outputs read its Cg inputs
              for (std::int64_t c = 0; c < Cg; ++c) {
                const double v = x[(k0 / Kg * Cg + c) * xs];
                double* a = acc + c * K;
#pragma omp simd
                for (std::int64_t k = k0; k < k0 + Kg; ++k) a[k] += v * g[static_cast<std::size_t>(k)];
              }
          }
        }
      }
  }
  WeightGrads out;
  out.dw.assign(static_cast<std::size_t>(per), 0.0);
  out.db.assign(s.bias ? static_cast<std::size_t>(K) : 0, 0.0);
  for (std::int64_t n = 0; n < N; ++n) {
    const double* acc = dw_n.data() + n * per;
    for (std::int64_t r = 0; r < R; ++r)
      for (std::int64_t t = 0; t < S; ++t)
        for (std::int64_t c = 0; c < Cg; ++c)
          for (std::int64_t k = 0; k < K; ++k) out.dw[s.w_at(k, c, r, t)] += acc[((r * S + t) * Cg + c) * K + k];
    for (std::size_t k = 0; k < out.db.size(); ++k) out.db[k] += db_n[static_cast<std::size_t>(n * K) + k];
  }
  return out;
}

void reference(const Shape& s, const Inputs& in, Outputs& out) {
  const RefData d(in);
  for (std::size_t i = 0; i < out.primary.count(); ++i) out.primary.set(i, reference_primary(s, d, i));
  for (std::size_t k = 0; k < out.db.count(); ++k) out.db.set(k, reference_db(s, d, static_cast<std::int64_t>(k)));
}

}  // namespace hotops::conv2d
