// The lstm reference: the whole recurrence and its backpropagation through time in double, written
// as row-by-row dot products (tiled, OpenMP) so that DeepBench-sized problems take seconds, not minutes,
// and with the batch split among the threads for small layers, so that verifying a large batch of the
// IMDb BiLSTM does too.
#include <algorithm>
#include <cmath>
#include <initializer_list>

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

// Below this many multiply-adds a loop runs on one thread (the tests' tiny shapes, called many times).
constexpr std::int64_t kParallelMacs = 1 << 20;

// The largest direction's weights (W_ih and W_hh in double) for which the recurrence splits the batch
// among the threads: each thread then runs every step over its own samples and reads all the weights
// each step, which is cheap while they stay in its cache (H = 128, the IMDb BiLSTM's and the character
// LSTM's: 1 MiB), and the threads meet once per direction rather than once per step. Larger layers
// (DeepBench's) split each step's products among the threads instead, so each weight is read once a step.
constexpr std::int64_t kSampleSplitWeightBytes = std::int64_t(2) << 20;

// The weight gradients' sums over T x B rows run in blocks of this many rows: a tile's operands for a
// block (2 x 32 rows of 2048 doubles, 1 MiB) stay in a core's cache however large the batch, and each
// row segment is long enough for the hardware prefetcher (blocks of 512 ran 10% slower at batch 64).
constexpr std::int64_t kWeightGradientBlock = 2048;

// sum over [k0, k1) of a[k] * b[k].
double dot(const double* a, const double* b, std::int64_t k0, std::int64_t k1) {
  double acc = 0;
#pragma omp simd reduction(+ : acc)
  for (std::int64_t k = k0; k < k1; ++k) acc += a[k] * b[k];
  return acc;
}

// c[j] = sums[j], or c[j] + sums[j] when `add`.
void put(double* c, std::initializer_list<double> sums, bool add) {
  for (const double v : sums) *c = add ? *c + v : v, ++c;
}

// C[m,n] (+)= sum_k A[m,k] * Bm[n,k]: both operands row-major with rows of length K. With `k_block`
// the sum over k runs in blocks of that many, each block's dot product added to C in turn; each element
// is summed by one thread in one fixed order, so the result is the same for any thread count.
// `parallel`: tiles are split among the threads (when the product is large enough).
void dot_rows(std::int64_t M, std::int64_t N, std::int64_t K, const double* A, const double* Bm, double* C,
              bool accumulate, bool parallel, std::int64_t k_block = 0) {
  constexpr std::int64_t tile = 32;
  const std::int64_t mt = (M + tile - 1) / tile, nt = (N + tile - 1) / tile;
  const std::int64_t kb = k_block > 0 ? std::min(k_block, K) : K;
#pragma omp parallel for collapse(2) schedule(dynamic) num_threads(cpu::threads()) if (parallel && M * N * K > (1 << 16))
  for (std::int64_t bm = 0; bm < mt; ++bm)
    for (std::int64_t bn = 0; bn < nt; ++bn)
      for (std::int64_t k0 = 0; k0 < K; k0 += kb) {
        const std::int64_t k1 = std::min(K, k0 + kb);
        const bool add = accumulate || k0 > 0;
        const std::int64_t m1 = std::min(M, (bm + 1) * tile), n1 = std::min(N, (bn + 1) * tile);
        // Blocks of two of A's rows by four of Bm's: eight dot products side by side, each load of a
        // row's element serving four or two of them, and eight independent chains of adds. Each
        // product is still one dot product over [k0, k1) of its own two rows.
        std::int64_t m = bm * tile;
        for (; m + 2 <= m1; m += 2) {
          const double *a0 = A + m * K, *a1 = a0 + K;
          std::int64_t n = bn * tile;
          for (; n + 4 <= n1; n += 4) {
            const double *b0 = Bm + n * K, *b1 = b0 + K, *b2 = b1 + K, *b3 = b2 + K;
            double s00 = 0, s01 = 0, s02 = 0, s03 = 0, s10 = 0, s11 = 0, s12 = 0, s13 = 0;
#pragma omp simd reduction(+ : s00, s01, s02, s03, s10, s11, s12, s13)
            for (std::int64_t k = k0; k < k1; ++k) {
              const double u = a0[k], v = a1[k];
              s00 += u * b0[k], s01 += u * b1[k], s02 += u * b2[k], s03 += u * b3[k];
              s10 += v * b0[k], s11 += v * b1[k], s12 += v * b2[k], s13 += v * b3[k];
            }
            put(C + m * N + n, {s00, s01, s02, s03}, add);
            put(C + (m + 1) * N + n, {s10, s11, s12, s13}, add);
          }
          for (; n < n1; ++n) {
            C[m * N + n] = dot(a0, Bm + n * K, k0, k1) + (add ? C[m * N + n] : 0);
            C[(m + 1) * N + n] = dot(a1, Bm + n * K, k0, k1) + (add ? C[(m + 1) * N + n] : 0);
          }
        }
        for (; m < m1; ++m)
          for (std::int64_t n = bn * tile; n < n1; ++n) C[m * N + n] = dot(A + m * K, Bm + n * K, k0, k1) + (add ? C[m * N + n] : 0);
      }
}

// out[c, r] = in[r, c] for an R x C matrix; each thread writes its own block of output rows.
Vec transpose(const double* in, std::int64_t R, std::int64_t C) {
  constexpr std::int64_t tile = 32;
  Vec out(static_cast<std::size_t>(R * C));
#pragma omp parallel for schedule(static) num_threads(cpu::threads()) if (R * C > kParallelMacs)
  for (std::int64_t c0 = 0; c0 < C; c0 += tile)
    for (std::int64_t r = 0; r < R; ++r)
      for (std::int64_t c = c0; c < std::min(C, c0 + tile); ++c) out[static_cast<std::size_t>(c * R + r)] = in[r * C + c];
  return out;
}

double sigmoid(double v) { return 1.0 / (1.0 + std::exp(-v)); }

// The time index of step s of direction d.
std::int64_t time_of(const Shape& s, std::int64_t d, std::int64_t step) { return d == 0 ? step : s.T - 1 - step; }

// How many ranges of samples the recurrence runs side by side: one a thread where the layer's weights
// fit in a thread's cache (kSampleSplitWeightBytes) and the work pays for the threads, else one range
// whose steps split their products among the threads. Samples are independent in the forward and in
// the backward's data gradients, so every range computes exactly what the whole batch would.
int sample_ranges(const Shape& s) {
  const std::int64_t G = 4 * s.H;
  const std::int64_t weight_bytes = G * (s.I + s.H) * static_cast<std::int64_t>(sizeof(double));
  if (s.T * s.B * G * (s.I + s.H) <= kParallelMacs || weight_bytes > kSampleSplitWeightBytes) return 1;
  return static_cast<int>(std::max<std::int64_t>(1, std::min<std::int64_t>(cpu::threads(), s.B)));
}

// Runs body(b0, b1, split_products) over the sample ranges of sample_ranges(s), each range on its own
// thread; a single range runs outside any parallel region with split_products set, so that its
// products' parallel regions reuse the process's threads (a nested region would start new ones).
template <class Body>
void for_sample_ranges(const Shape& s, Body body) {
  const int ranges = sample_ranges(s);
  if (ranges == 1) return body(0, s.B, true);
#pragma omp parallel for schedule(static) num_threads(ranges)
  for (int k = 0; k < ranges; ++k) body(s.B * k / ranges, s.B * (k + 1) / ranges, false);
}

// Direction d of the forward over samples [b0, b1), its gates already holding W_ih x_t: every step's
// gates, c and h, and y; then hT, cT.
void forward_samples(const Shape& s, const RefInputs& in, std::int64_t d, std::int64_t b0, std::int64_t b1,
                     bool split_products, Forward& f) {
  const std::int64_t T = s.T, B = s.B, H = s.H, D = s.D(), G = 4 * H, nb = b1 - b0;
  const double* wh = in.w_hh.data() + d * G * H;
  const double* bi = in.b_ih.data() + d * G;
  const double* bh = in.b_hh.data() + d * G;
  double* hs = f.h.data() + d * (T + 1) * B * H;
  double* cs = f.c.data() + d * (T + 1) * B * H;
  std::copy_n(in.h0.data() + (d * B + b0) * H, nb * H, hs + b0 * H);
  std::copy_n(in.c0.data() + (d * B + b0) * H, nb * H, cs + b0 * H);
  for (std::int64_t step = 0; step < T; ++step) {
    const std::int64_t t = time_of(s, d, step);
    double* g = f.gates.data() + ((d * T + step) * B + b0) * G;  // holds W_ih x_t (reference_forward)
    dot_rows(nb, G, H, hs + (step * B + b0) * H, wh, g, true, split_products);
    for (std::int64_t b = b0; b < b1; ++b) {
      double* gb = g + (b - b0) * G;
      for (std::int64_t r = 0; r < G; ++r) {
        const double v = gb[r] + bi[r] + bh[r];
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
  std::copy_n(hs + (T * B + b0) * H, nb * H, f.hT.data() + (d * B + b0) * H);
  std::copy_n(cs + (T * B + b0) * H, nb * H, f.cT.data() + (d * B + b0) * H);
}

// Direction d of the backpropagation through time over samples [b0, b1): the gradient of each step's
// pre-activations into dgates and the h it read into hprev (both by time, [T*B, .]), then dh0, dc0.
void backward_samples(const Shape& s, const RefInputs& in, const Forward& f, std::int64_t d, std::int64_t b0,
                      std::int64_t b1, const Vec& whhT, bool split_products, double* dgates, double* hprev, Backward& r) {
  const std::int64_t T = s.T, B = s.B, H = s.H, D = s.D(), G = 4 * H, nb = b1 - b0;
  const double* cs = f.c.data() + d * (T + 1) * B * H;
  const double* hs = f.h.data() + d * (T + 1) * B * H;
  Vec dh(static_cast<std::size_t>(nb * H)), dc(dh.size()), dh_prev(dh.size());  // samples b0.. only
  std::copy_n(in.dhT.data() + (d * B + b0) * H, nb * H, dh.data());
  std::copy_n(in.dcT.data() + (d * B + b0) * H, nb * H, dc.data());
  for (std::int64_t step = T - 1; step >= 0; --step) {
    const std::int64_t t = time_of(s, d, step);
    const double* g = f.gates.data() + ((d * T + step) * B) * G;
    double* dg = dgates + t * B * G;
    std::copy_n(hs + (step * B + b0) * H, nb * H, hprev + (t * B + b0) * H);
    for (std::int64_t b = b0; b < b1; ++b)
      for (std::int64_t j = 0; j < H; ++j) {
        const double* gb = g + b * G;
        const double ig = gb[j], fg = gb[H + j], gg = gb[2 * H + j], og = gb[3 * H + j];
        const double c_prev = cs[(step * B + b) * H + j], tc = std::tanh(cs[((step + 1) * B + b) * H + j]);
        const std::size_t k = static_cast<std::size_t>((b - b0) * H + j);
        const double dht = dh[k] + in.dy[static_cast<std::size_t>((t * B + b) * D * H + d * H + j)];
        const double dct = dc[k] + dht * og * (1 - tc * tc);
        double* dgb = dg + b * G;
        dgb[j] = dct * gg * ig * (1 - ig);
        dgb[H + j] = dct * c_prev * fg * (1 - fg);
        dgb[2 * H + j] = dct * ig * (1 - gg * gg);
        dgb[3 * H + j] = dht * tc * og * (1 - og);
        dc[k] = dct * fg;
      }
    dot_rows(nb, H, G, dg + b0 * G, whhT.data(), dh_prev.data(), false, split_products);
    dh.swap(dh_prev);
  }
  std::copy_n(dh.data(), nb * H, r.dh0.data() + (d * B + b0) * H);
  std::copy_n(dc.data(), nb * H, r.dc0.data() + (d * B + b0) * H);
}

}  // namespace

RefInputs to_double(const Inputs& in) {
  return RefInputs{to_vec(in.x),    to_vec(in.h0),    to_vec(in.c0), to_vec(in.w_ih), to_vec(in.w_hh),
                   to_vec(in.b_ih), to_vec(in.b_hh), to_vec(in.dy), to_vec(in.dhT),  to_vec(in.dcT)};
}

Forward reference_forward(const Shape& s, const RefInputs& in) {
  const std::int64_t T = s.T, B = s.B, I = s.I, H = s.H, D = s.D(), G = 4 * H;
  Forward f;
  f.y.assign(static_cast<std::size_t>(T * B * D * H), 0);
  f.hT.assign(static_cast<std::size_t>(D * B * H), 0);
  f.cT.assign(f.hT.size(), 0);
  f.gates.assign(static_cast<std::size_t>(D * T * B * G), 0);
  f.c.assign(static_cast<std::size_t>(D * (T + 1) * B * H), 0);
  f.h.assign(f.c.size(), 0);
  for (std::int64_t d = 0; d < D; ++d) {
    // W_ih x_t for every t at once, one product over all T x B rows, into the gates by time; the
    // backward direction steps through time in reverse, so its blocks are then put in step order.
    double* gd = f.gates.data() + d * T * B * G;
    dot_rows(T * B, G, I, in.x.data(), in.w_ih.data() + d * G * I, gd, false, true);
    if (d == 1) {
#pragma omp parallel for schedule(static) num_threads(cpu::threads()) if (T * B * G > kParallelMacs)
      for (std::int64_t step = 0; step < T / 2; ++step)
        std::swap_ranges(gd + step * B * G, gd + (step + 1) * B * G, gd + (T - 1 - step) * B * G);
    }
    for_sample_ranges(s, [&](std::int64_t b0, std::int64_t b1, bool split) { forward_samples(s, in, d, b0, b1, split, f); });
  }
  return f;
}

Backward reference_backward(const Shape& s, const RefInputs& in, const Forward& f) {
  const std::int64_t T = s.T, B = s.B, I = s.I, H = s.H, D = s.D(), G = 4 * H, N = T * B;
  const Vec xT = transpose(in.x.data(), N, I);  // [I, T*B]
  Backward r;
  r.dx.assign(static_cast<std::size_t>(N * I), 0);
  r.dh0.assign(static_cast<std::size_t>(D * B * H), 0);
  r.dc0.assign(r.dh0.size(), 0);
  r.dw_ih.assign(static_cast<std::size_t>(D * G * I), 0);
  r.dw_hh.assign(static_cast<std::size_t>(D * G * H), 0);
  r.db.assign(static_cast<std::size_t>(D * G), 0);
  Vec dgates(static_cast<std::size_t>(N * G));  // gradient of the pre-activations, by time: [T*B, 4H]
  Vec hprev(static_cast<std::size_t>(N * H));   // the h each step read, by time: [T*B, H]
  for (std::int64_t d = 0; d < D; ++d) {
    const Vec wihT = transpose(in.w_ih.data() + d * G * I, G, I);  // [I, 4H]
    const Vec whhT = transpose(in.w_hh.data() + d * G * H, G, H);  // [H, 4H]
    for_sample_ranges(s, [&](std::int64_t b0, std::int64_t b1, bool split) {
      backward_samples(s, in, f, d, b0, b1, whhT, split, dgates.data(), hprev.data(), r);
    });
    // Everything that sums over time: dx += dG W_ih, dW_ih = dG^T x, dW_hh = dG^T h_prev, db = sum dG.
    dot_rows(N, I, G, dgates.data(), wihT.data(), r.dx.data(), true, true);
    const Vec dgT = transpose(dgates.data(), N, G);  // [4H, T*B]
    const Vec hT = transpose(hprev.data(), N, H);    // [H, T*B]
    dot_rows(G, I, N, dgT.data(), xT.data(), r.dw_ih.data() + d * G * I, false, true, kWeightGradientBlock);
    dot_rows(G, H, N, dgT.data(), hT.data(), r.dw_hh.data() + d * G * H, false, true, kWeightGradientBlock);
#pragma omp parallel for schedule(static) num_threads(cpu::threads()) if (N * G > kParallelMacs)
    for (std::int64_t row = 0; row < G; ++row) {
      double acc = 0;
      for (std::int64_t n = 0; n < N; ++n) acc += dgT[static_cast<std::size_t>(row * N + n)];
      r.db[static_cast<std::size_t>(d * G + row)] = acc;
    }
  }
  return r;
}

}  // namespace hotops::lstm
