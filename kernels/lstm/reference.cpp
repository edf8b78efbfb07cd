// The lstm reference: the whole recurrence and its backpropagation through time in double, written
// as row-by-row dot products (tiled, OpenMP) so that DeepBench-sized problems take seconds, not minutes.
#include <algorithm>
#include <cmath>

#include "hotops/cpu.h"
#include "kernels/lstm/lstm.h"

namespace hotops::lstm {
namespace {

using Vec = std::vector<double>;

// The inputs as doubles (every stored value is exact in double).
Vec to_vec(const HostBuffer& b) {
  Vec v(b.count());
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = b.get(i);
  return v;
}

// C[m,n] (+)= sum_k A[m,k] * Bm[n,k]: both operands row-major with rows of length K.
void dot_rows(std::int64_t M, std::int64_t N, std::int64_t K, const double* A, const double* Bm, double* C,
              bool accumulate) {
  constexpr std::int64_t tile = 32;
  const std::int64_t mt = (M + tile - 1) / tile, nt = (N + tile - 1) / tile;
#pragma omp parallel for collapse(2) schedule(dynamic) num_threads(cpu::threads()) if (M * N * K > (1 << 16))
  for (std::int64_t bm = 0; bm < mt; ++bm)
    for (std::int64_t bn = 0; bn < nt; ++bn)
      for (std::int64_t m = bm * tile; m < std::min(M, (bm + 1) * tile); ++m)
        for (std::int64_t n = bn * tile; n < std::min(N, (bn + 1) * tile); ++n) {
          const double* a = A + m * K;
          const double* b = Bm + n * K;
          double acc = 0;
#pragma omp simd reduction(+ : acc)
          for (std::int64_t k = 0; k < K; ++k) acc += a[k] * b[k];
          C[m * N + n] = accumulate ? C[m * N + n] + acc : acc;
        }
}

// out[c, r] = in[r, c] for an R x C matrix.
Vec transpose(const double* in, std::int64_t R, std::int64_t C) {
  Vec out(static_cast<std::size_t>(R * C));
  for (std::int64_t r = 0; r < R; ++r)
    for (std::int64_t c = 0; c < C; ++c) out[static_cast<std::size_t>(c * R + r)] = in[r * C + c];
  return out;
}

double sigmoid(double v) { return 1.0 / (1.0 + std::exp(-v)); }

// The time index of step s of direction d.
std::int64_t time_of(const Shape& s, std::int64_t d, std::int64_t step) { return d == 0 ? step : s.T - 1 - step; }

}  // namespace

RefInputs to_double(const Inputs& in) {
  return RefInputs{to_vec(in.x),    to_vec(in.h0),    to_vec(in.c0), to_vec(in.w_ih), to_vec(in.w_hh),
                   to_vec(in.b_ih), to_vec(in.b_hh), to_vec(in.dy), to_vec(in.dhT),  to_vec(in.dcT)};
}

Forward reference_forward(const Shape& s, const RefInputs& in) {
  const std::int64_t T = s.T, B = s.B, I = s.I, H = s.H, D = s.D(), G = 4 * H;
  const Vec &x = in.x, &h0 = in.h0, &c0 = in.c0, &w_ih = in.w_ih, &w_hh = in.w_hh, &b_ih = in.b_ih, &b_hh = in.b_hh;
  Forward f;
  f.y.assign(static_cast<std::size_t>(T * B * D * H), 0);
  f.hT.assign(static_cast<std::size_t>(D * B * H), 0);
  f.cT.assign(f.hT.size(), 0);
  f.gates.assign(static_cast<std::size_t>(D * T * B * G), 0);
  f.c.assign(static_cast<std::size_t>(D * (T + 1) * B * H), 0);
  f.h.assign(f.c.size(), 0);
  Vec xw(static_cast<std::size_t>(T * B * G));  // W_ih x_t for every t at once: [T*B, 4H]
  for (std::int64_t d = 0; d < D; ++d) {
    const double* wi = w_ih.data() + d * G * I;
    const double* wh = w_hh.data() + d * G * H;
    dot_rows(T * B, G, I, x.data(), wi, xw.data(), false);
    double* hs = f.h.data() + d * (T + 1) * B * H;
    double* cs = f.c.data() + d * (T + 1) * B * H;
    std::copy_n(h0.data() + d * B * H, B * H, hs);
    std::copy_n(c0.data() + d * B * H, B * H, cs);
    for (std::int64_t step = 0; step < T; ++step) {
      const std::int64_t t = time_of(s, d, step);
      double* g = f.gates.data() + ((d * T + step) * B) * G;
      std::copy_n(xw.data() + t * B * G, B * G, g);
      dot_rows(B, G, H, hs + step * B * H, wh, g, true);
      for (std::int64_t b = 0; b < B; ++b) {
        double* gb = g + b * G;
        for (std::int64_t r = 0; r < G; ++r) {
          const double v = gb[r] + b_ih[static_cast<std::size_t>(d * G + r)] + b_hh[static_cast<std::size_t>(d * G + r)];
          gb[r] = (r >= 2 * H && r < 3 * H) ? std::tanh(v) : sigmoid(v);
        }
        for (std::int64_t j = 0; j < H; ++j) {
          const double ig = gb[j], fg = gb[H + j], gg = gb[2 * H + j], og = gb[3 * H + j];
          const double c = fg * cs[(step * B + b) * H + j] + ig * gg;
          const double h = og * std::tanh(c);
          cs[((step + 1) * B + b) * H + j] = c;
          hs[((step + 1) * B + b) * H + j] = h;
          f.y[static_cast<std::size_t>((t * B + b) * D * H + d * H + j)] = h;
        }
      }
    }
    std::copy_n(hs + T * B * H, B * H, f.hT.data() + d * B * H);
    std::copy_n(cs + T * B * H, B * H, f.cT.data() + d * B * H);
  }
  return f;
}

Backward reference_backward(const Shape& s, const RefInputs& in, const Forward& f) {
  const std::int64_t T = s.T, B = s.B, I = s.I, H = s.H, D = s.D(), G = 4 * H, N = T * B;
  const Vec &x = in.x, &w_ih = in.w_ih, &w_hh = in.w_hh, &dy = in.dy, &dhT = in.dhT, &dcT = in.dcT;
  const Vec xT = transpose(x.data(), N, I);  // [I, T*B]
  Backward r;
  r.dx.assign(static_cast<std::size_t>(N * I), 0);
  r.dh0.assign(static_cast<std::size_t>(D * B * H), 0);
  r.dc0.assign(r.dh0.size(), 0);
  r.dw_ih.assign(static_cast<std::size_t>(D * G * I), 0);
  r.dw_hh.assign(static_cast<std::size_t>(D * G * H), 0);
  r.db.assign(static_cast<std::size_t>(D * G), 0);
  Vec dgates(static_cast<std::size_t>(N * G));  // gradient of the pre-activations, by time: [T*B, 4H]
  Vec hprev(static_cast<std::size_t>(N * H));   // the h each step read, by time: [T*B, H]
  Vec dh(static_cast<std::size_t>(B * H)), dc(dh.size()), dh_prev(dh.size());
  for (std::int64_t d = 0; d < D; ++d) {
    const Vec wihT = transpose(w_ih.data() + d * G * I, G, I);  // [I, 4H]
    const Vec whhT = transpose(w_hh.data() + d * G * H, G, H);  // [H, 4H]
    std::copy_n(dhT.data() + d * B * H, B * H, dh.data());
    std::copy_n(dcT.data() + d * B * H, B * H, dc.data());
    for (std::int64_t step = T - 1; step >= 0; --step) {
      const std::int64_t t = time_of(s, d, step);
      const double* g = f.gates.data() + ((d * T + step) * B) * G;
      const double* cs = f.c.data() + d * (T + 1) * B * H;
      const double* hs = f.h.data() + d * (T + 1) * B * H;
      double* dg = dgates.data() + t * B * G;
      std::copy_n(hs + step * B * H, B * H, hprev.data() + t * B * H);
      for (std::int64_t b = 0; b < B; ++b)
        for (std::int64_t j = 0; j < H; ++j) {
          const double* gb = g + b * G;
          const double ig = gb[j], fg = gb[H + j], gg = gb[2 * H + j], og = gb[3 * H + j];
          const double c_prev = cs[(step * B + b) * H + j], tc = std::tanh(cs[((step + 1) * B + b) * H + j]);
          const std::size_t k = static_cast<std::size_t>(b * H + j);
          const double dht = dh[k] + dy[static_cast<std::size_t>((t * B + b) * D * H + d * H + j)];
          const double dct = dc[k] + dht * og * (1 - tc * tc);
          double* dgb = dg + b * G;
          dgb[j] = dct * gg * ig * (1 - ig);
          dgb[H + j] = dct * c_prev * fg * (1 - fg);
          dgb[2 * H + j] = dct * ig * (1 - gg * gg);
          dgb[3 * H + j] = dht * tc * og * (1 - og);
          dc[k] = dct * fg;
        }
      dot_rows(B, H, G, dg, whhT.data(), dh_prev.data(), false);
      dh.swap(dh_prev);
    }
    std::copy_n(dh.data(), B * H, r.dh0.data() + d * B * H);
    std::copy_n(dc.data(), B * H, r.dc0.data() + d * B * H);
    // Everything that sums over time: dx += dG W_ih, dW_ih = dG^T x, dW_hh = dG^T h_prev, db = sum dG.
    dot_rows(N, I, G, dgates.data(), wihT.data(), r.dx.data(), true);
    const Vec dgT = transpose(dgates.data(), N, G);  // [4H, T*B]
    const Vec hT = transpose(hprev.data(), N, H);    // [H, T*B]
    dot_rows(G, I, N, dgT.data(), xT.data(), r.dw_ih.data() + d * G * I, false);
    dot_rows(G, H, N, dgT.data(), hT.data(), r.dw_hh.data() + d * G * H, false);
    for (std::int64_t row = 0; row < G; ++row) {
      double acc = 0;
      for (std::int64_t n = 0; n < N; ++n) acc += dgT[static_cast<std::size_t>(row * N + n)];
      r.db[static_cast<std::size_t>(d * G + row)] = acc;
    }
  }
  return r;
}

}  // namespace hotops::lstm
