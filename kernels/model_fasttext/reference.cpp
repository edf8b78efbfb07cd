// The model_fasttext reference: one step of the fastText classifier in double, plain loops.
//   pooled[b, e] = sum_t embed[tokens[b, t], e] / T
//   z[b]         = sum_e pooled[b, e] W[e] + bias
//   loss         = mean_b (max(z, 0) - z y + log1p(exp(-|z|)))        (bce_logits)
//   dz[b]        = (sigmoid(z[b]) - y[b]) / B
//   dW[e] = sum_b pooled[b, e] dz[b];  db = sum_b dz[b];  dpooled[b, e] = dz[b] W[e]
//   dembed[v, e] = sum over the positions (b, t) holding token v of dpooled[b, e] / T
#include <algorithm>
#include <cmath>

#include "kernels/loss/bce.h"
#include "kernels/model_fasttext/model_fasttext.h"

namespace hotops::model_fasttext {
namespace {

double sigmoid(double z) { return z >= 0 ? 1 / (1 + std::exp(-z)) : std::exp(z) / (1 + std::exp(z)); }

}  // namespace

Reference reference(const Config& c, const Layout& l, const std::vector<double>& params,
                    const std::vector<std::int64_t>& tokens, const HostBuffer& labels, std::int64_t batch, bool backward,
                    bool bf16_rounding) {
  const std::int64_t B = batch, T = c.T, E = c.E;
  const auto at = [](std::int64_t i) { return static_cast<std::size_t>(i); };
  // What a bf16 step stores bf16, rounded (bf16_rounding), else as is.
  const auto stored = [bf16_rounding](double v) { return bf16_rounding ? bf16_to_float(float_to_bf16(static_cast<float>(v))) : v; };
  const auto param = [&](std::size_t i) { return stored(params[i]); };
  Reference r;
  r.pooled.assign(at(B * E), 0.0);
  r.pooled_rss.assign(at(B * E), 0.0);
  r.logits.assign(at(B), 0.0);
  for (std::int64_t b = 0; b < B; ++b) {
    for (std::int64_t t = 0; t < T; ++t) {
      const std::size_t row = l.embed + at(tokens[at(b * T + t)] * E);
      for (std::int64_t e = 0; e < E; ++e) {
        const double x = param(row + at(e));
        r.pooled[at(b * E + e)] += x;
        r.pooled_rss[at(b * E + e)] += x * x;
      }
    }
    double z = param(l.dense_b);
    for (std::int64_t e = 0; e < E; ++e) {
      double& p = r.pooled[at(b * E + e)];
      p = stored(p / static_cast<double>(T));
      r.pooled_rss[at(b * E + e)] = std::sqrt(r.pooled_rss[at(b * E + e)]) / static_cast<double>(T);
      z += p * param(l.dense_w + at(e));
    }
    r.logits[at(b)] = stored(z);
  }
  if (!backward) return r;

  double sum = 0;
  for (std::int64_t b = 0; b < B; ++b) sum += loss::bce::reference_term(r.logits[at(b)], labels.get(at(b)));
  r.loss = sum / static_cast<double>(B);
  r.grad.assign(l.total, 0.0);
  r.grad_terms_sq.assign(l.total, 0.0);
  const auto add = [&](std::size_t i, double term) {
    r.grad[i] += term;
    r.grad_terms_sq[i] += term * term;
  };
  for (std::int64_t b = 0; b < B; ++b) {
    const double dz = stored((sigmoid(r.logits[at(b)]) - labels.get(at(b))) / static_cast<double>(B));
    add(l.dense_b, dz);
    for (std::int64_t e = 0; e < E; ++e) {
      add(l.dense_w + at(e), r.pooled[at(b * E + e)] * dz);
      const double demb = stored(stored(dz * param(l.dense_w + at(e))) / static_cast<double>(T));
      for (std::int64_t t = 0; t < T; ++t) add(l.embed + at(tokens[at(b * T + t)] * E + e), demb);
    }
  }
  return r;
}

}  // namespace hotops::model_fasttext
