// The model_bilstm reference in double: the embedding gather, kernels/lstm's BiLSTM reference
// (forward and backpropagation through time), the dense head, softmax cross-entropy, and the
// embedding gradient as a scatter-add of dx over the tokens.
#include <algorithm>
#include <cmath>

#include "kernels/lstm/lstm.h"
#include "kernels/model_bilstm/model_bilstm.h"

namespace hotops::model_bilstm {
namespace {

void round_bf16(std::vector<double>& v) {
  for (double& x : v) x = bf16_to_float(float_to_bf16(static_cast<float>(x)));
}

}  // namespace

Reference reference(const Config& c, const Layout& l, const std::vector<double>& params_in,
                    const std::vector<std::int64_t>& tokens, const std::vector<std::int32_t>& labels, std::int64_t batch,
                    bool backward, bool bf16_rounding) {
  const std::int64_t B = batch, T = c.T, E = c.E, H = c.H, C = c.C, G = 4 * H;
  std::vector<double> rounded;
  if (bf16_rounding) rounded = params_in, round_bf16(rounded);
  const std::vector<double>& params = bf16_rounding ? rounded : params_in;
  const auto round = [bf16_rounding](std::vector<double>& v) {
    if (bf16_rounding) round_bf16(v);
  };
  lstm::Shape ls;
  ls.dir = Direction::bwd;
  ls.T = T, ls.B = B, ls.I = E, ls.H = H, ls.bidirectional = true;
  const auto part = [&](std::size_t at, std::int64_t n) {
    return std::vector<double>(params.begin() + static_cast<std::ptrdiff_t>(at),
                               params.begin() + static_cast<std::ptrdiff_t>(at + static_cast<std::size_t>(n)));
  };
  lstm::RefInputs in;
  in.x.assign(static_cast<std::size_t>(T * B * E), 0);  // [T, B, E]: row (t, b) is embed[tokens[b, t]]
  for (std::int64_t t = 0; t < T; ++t)
    for (std::int64_t b = 0; b < B; ++b) {
      const std::int64_t v = tokens[static_cast<std::size_t>(b * T + t)];
      std::copy_n(params.begin() + static_cast<std::ptrdiff_t>(l.embed + static_cast<std::size_t>(v * E)), E,
                  in.x.begin() + (t * B + b) * E);
    }
  in.h0.assign(static_cast<std::size_t>(2 * B * H), 0);
  in.c0 = in.h0;
  in.w_ih = part(l.w_ih, 2 * G * E);
  in.w_hh = part(l.w_hh, 2 * G * H);
  in.b_ih = part(l.b_ih, 2 * G);
  in.b_hh = part(l.b_hh, 2 * G);
  lstm::Forward f = lstm::reference_forward(ls, in);
  round(f.hT);

  // logits[b] = [hT[0, b], hT[1, b]] . W + bias
  Reference ref;
  ref.logits.assign(static_cast<std::size_t>(B * C), 0);
  const auto W = [&](std::int64_t row, std::int64_t col) { return params[l.dense_w + static_cast<std::size_t>(row * C + col)]; };
  const auto feat = [&](std::int64_t b, std::int64_t k) { return f.hT[static_cast<std::size_t>(((k / H) * B + b) * H + k % H)]; };
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t o = 0; o < C; ++o) {
      double z = params[l.dense_b + static_cast<std::size_t>(o)];
      for (std::int64_t k = 0; k < 2 * H; ++k) z += feat(b, k) * W(k, o);
      ref.logits[static_cast<std::size_t>(b * C + o)] = z;
    }
  round(ref.logits);
  if (!backward) return ref;

  // Loss and dlogits = (softmax - onehot) / B.
  std::vector<double> dz(static_cast<std::size_t>(B * C));
  double loss = 0;
  for (std::int64_t b = 0; b < B; ++b) {
    const double* z = &ref.logits[static_cast<std::size_t>(b * C)];
    const double mx = *std::max_element(z, z + C);
    double sum = 0;
    for (std::int64_t o = 0; o < C; ++o) sum += std::exp(z[o] - mx);
    const std::int32_t y = labels[static_cast<std::size_t>(b)];
    loss += std::log(sum) - (z[y] - mx);
    for (std::int64_t o = 0; o < C; ++o)
      dz[static_cast<std::size_t>(b * C + o)] = (std::exp(z[o] - mx) / sum - (o == y ? 1.0 : 0.0)) / static_cast<double>(B);
  }
  ref.loss = loss / static_cast<double>(B);
  round(dz);

  // The dense layer: dW = feat^T . dz, db = colsum(dz), dfeat = dz . W^T (into dhT [2, B, H]).
  ref.grad.assign(l.total, 0.0);
  in.dy.assign(static_cast<std::size_t>(T * B * 2 * H), 0);
  in.dhT.assign(static_cast<std::size_t>(2 * B * H), 0);
  in.dcT = in.dhT;
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t o = 0; o < C; ++o) {
      const double d = dz[static_cast<std::size_t>(b * C + o)];
      ref.grad[l.dense_b + static_cast<std::size_t>(o)] += d;
      for (std::int64_t k = 0; k < 2 * H; ++k) {
        ref.grad[l.dense_w + static_cast<std::size_t>(k * C + o)] += feat(b, k) * d;
        in.dhT[static_cast<std::size_t>(((k / H) * B + b) * H + k % H)] += d * W(k, o);
      }
    }

  // The BiLSTM through time, then the embedding: dE[tokens[b, t]] += dx[t, b].
  round(in.dhT);
  lstm::Backward r = lstm::reference_backward(ls, in, f);
  round(r.dx), round(r.dw_ih), round(r.dw_hh), round(r.db);
  std::copy(r.dw_ih.begin(), r.dw_ih.end(), ref.grad.begin() + static_cast<std::ptrdiff_t>(l.w_ih));
  std::copy(r.dw_hh.begin(), r.dw_hh.end(), ref.grad.begin() + static_cast<std::ptrdiff_t>(l.w_hh));
  std::copy(r.db.begin(), r.db.end(), ref.grad.begin() + static_cast<std::ptrdiff_t>(l.b_ih));
  std::copy(r.db.begin(), r.db.end(), ref.grad.begin() + static_cast<std::ptrdiff_t>(l.b_hh));
  for (std::int64_t t = 0; t < T; ++t)
    for (std::int64_t b = 0; b < B; ++b) {
      const std::int64_t v = tokens[static_cast<std::size_t>(b * T + t)];
      for (std::int64_t e = 0; e < E; ++e)
        ref.grad[l.embed + static_cast<std::size_t>(v * E + e)] += r.dx[static_cast<std::size_t>((t * B + b) * E + e)];
    }
  return ref;
}

}  // namespace hotops::model_bilstm
