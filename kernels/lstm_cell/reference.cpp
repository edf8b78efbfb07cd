// The lstm_cell reference: plain loops in double. The oracle every backend is checked against, and
// itself checked against finite differences of its forward in test/lstm_cell_test.cpp.
#include <cmath>

#include "hotops/check.h"
#include "kernels/lstm_cell/lstm_cell.h"

namespace hotops::lstm_cell {
namespace {

double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }

// Row r of an [rows, cols] view, in double.
void load_row(const View& v, std::size_t r, std::size_t cols, std::vector<double>& out) {
  out.resize(cols);
  for (std::size_t k = 0; k < cols; ++k) out[k] = v[r * cols + k];
}

}  // namespace

double View::operator[](std::size_t i) const {
  switch (kind) {
    case Kind::f32: return static_cast<const float*>(data)[i];
    case Kind::bf16: return bf16_to_float(static_cast<const std::uint16_t*>(data)[i]);
    default: return static_cast<const double*>(data)[i];
  }
}

View view(const HostBuffer& b) {
  HOTOPS_CHECK(b.dtype() == DType::f32 || b.dtype() == DType::bf16, "lstm_cell: f32 or bf16 storage only");
  return {b.data(), b.dtype() == DType::f32 ? View::Kind::f32 : View::Kind::bf16};
}

View view(const std::vector<double>& v) { return {v.data(), View::Kind::f64}; }

RefInputs ref_inputs(const Inputs& in) {
  RefInputs r{view(in.xh), view(in.W), view(in.b), view(in.c), {}, {}};
  if (in.dh.count()) r.dh = view(in.dh), r.dc = view(in.dc);
  return r;
}

RefForward reference_forward(const Shape& s, const RefInputs& in) {
  const auto B = static_cast<std::size_t>(s.B), H = static_cast<std::size_t>(s.H),
             K = static_cast<std::size_t>(s.K()), G = 4 * H;
  std::vector<double> xh(B * K);
  for (std::size_t i = 0; i < B * K; ++i) xh[i] = in.xh[i];
  // pre[b, r] = xh[b] . W[r] + b[r]: one W row at a time (converted once), every sample.
  std::vector<double> pre(B * G);
  const auto rows = static_cast<std::int64_t>(G);
#pragma omp parallel if (static_cast<double>(G) * static_cast<double>(B * K) > 1e6)
  {
    std::vector<double> w;
#pragma omp for schedule(static)
    for (std::int64_t r = 0; r < rows; ++r) {
      const auto ru = static_cast<std::size_t>(r);
      load_row(in.W, ru, K, w);
      for (std::size_t b = 0; b < B; ++b) {
        double acc = in.b[ru];
        for (std::size_t k = 0; k < K; ++k) acc += xh[b * K + k] * w[k];
        pre[b * G + ru] = acc;
      }
    }
  }
  RefForward f;
  f.act.resize(B * G);
  f.h.resize(B * H);
  f.c.resize(B * H);
  for (std::size_t b = 0; b < B; ++b) {
    for (std::size_t j = 0; j < H; ++j) {
      const double* p = &pre[b * G];
      const double i = sigmoid(p[j]), fg = sigmoid(p[H + j]), g = std::tanh(p[2 * H + j]), o = sigmoid(p[3 * H + j]);
      double* a = &f.act[b * G];
      a[j] = i, a[H + j] = fg, a[2 * H + j] = g, a[3 * H + j] = o;
      const double c_new = fg * in.c[b * H + j] + i * g;
      f.c[b * H + j] = c_new;
      f.h[b * H + j] = o * std::tanh(c_new);
    }
  }
  return f;
}

RefBackward reference_backward(const Shape& s, const RefInputs& in, const RefForward& fwd) {
  const auto B = static_cast<std::size_t>(s.B), H = static_cast<std::size_t>(s.H), G = 4 * H;
  RefBackward r;
  r.dgates.resize(B * G);
  r.dc.resize(B * H);
  r.db.assign(G, 0.0);
  for (std::size_t b = 0; b < B; ++b) {
    for (std::size_t j = 0; j < H; ++j) {
      const double* a = &fwd.act[b * G];
      const double i = a[j], f = a[H + j], g = a[2 * H + j], o = a[3 * H + j];
      const double t = std::tanh(fwd.c[b * H + j]);
      const double dh = in.dh[b * H + j];
      const double dct = in.dc[b * H + j] + dh * o * (1 - t * t);  // dL/dc' through both paths
      double* d = &r.dgates[b * G];
      d[j] = dct * g * i * (1 - i);
      d[H + j] = dct * in.c[b * H + j] * f * (1 - f);
      d[2 * H + j] = dct * i * (1 - g * g);
      d[3 * H + j] = dh * t * o * (1 - o);
      r.dc[b * H + j] = dct * f;
    }
    for (std::size_t q = 0; q < G; ++q) r.db[q] += r.dgates[b * G + q];
  }
  return r;
}

double reference_dxh(const Shape& s, const RefInputs& in, const RefBackward& bwd, std::size_t idx) {
  const auto K = static_cast<std::size_t>(s.K()), G = static_cast<std::size_t>(s.G());
  const std::size_t b = idx / K, k = idx % K;
  double acc = 0;
  for (std::size_t q = 0; q < G; ++q) acc += bwd.dgates[b * G + q] * in.W[q * K + k];
  return acc;
}

double reference_dW(const Shape& s, const RefInputs& in, const RefBackward& bwd, std::size_t idx) {
  const auto B = static_cast<std::size_t>(s.B), K = static_cast<std::size_t>(s.K()),
             G = static_cast<std::size_t>(s.G());
  const std::size_t q = idx / K, k = idx % K;
  double acc = 0;
  for (std::size_t b = 0; b < B; ++b) acc += bwd.dgates[b * G + q] * in.xh[b * K + k];
  return acc;
}

}  // namespace hotops::lstm_cell
