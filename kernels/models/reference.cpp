// The models family's reference: a dense ReLU network's forward, softmax cross-entropy loss and
// backward in double, written as plainly as the math.
#include <algorithm>
#include <cmath>

#include "kernels/models/models.h"

namespace hotops::models {

Reference reference(const std::vector<std::int64_t>& widths, const ParamLayout& l, const std::vector<double>& params,
                    const std::vector<double>& x, const std::vector<std::int32_t>& labels, std::int64_t batch,
                    bool backward, const std::vector<const float*>& tie_hidden, double tie_rel) {
  const std::size_t L = widths.size() - 1;
  // a[0] = x; a[k] = relu(a[k-1].W_k + b_k) for hidden layers, the logits for the last.
  // on[k] is where layer k's ReLU passed its input (and so its gradient).
  std::vector<std::vector<double>> a(L + 1);
  std::vector<std::vector<char>> on(L + 1);
  a[0] = x;
  for (std::size_t k = 0; k < L; ++k) {
    const std::int64_t in = widths[k], out = widths[k + 1];
    const bool hidden = k + 1 < L;
    a[k + 1].assign(static_cast<std::size_t>(batch * out), 0.0);
    on[k + 1].assign(static_cast<std::size_t>(batch * out), 1);
#pragma omp parallel for schedule(static)
    for (std::int64_t r = 0; r < batch; ++r)
      for (std::int64_t o = 0; o < out; ++o) {
        const double bias = params[l.b[k] + static_cast<std::size_t>(o)];
        double z = bias, magnitude = std::fabs(bias);
        for (std::int64_t i = 0; i < in; ++i) {
          const double t = a[k][static_cast<std::size_t>(r * in + i)] * params[l.w[k] + static_cast<std::size_t>(i * out + o)];
          z += t, magnitude += std::fabs(t);
        }
        double& y = a[k + 1][static_cast<std::size_t>(r * out + o)];
        if (!hidden) {
          y = z;
          continue;
        }
        bool pass = z > 0;
        // Zero up to the implementation's rounding of the sum: decided as the implementation decided.
        if (k < tie_hidden.size() && tie_hidden[k] && std::fabs(z) <= tie_rel * magnitude)
          pass = tie_hidden[k][r * out + o] > 0;
        y = pass ? std::max(z, 0.0) : 0.0;
        on[k + 1][static_cast<std::size_t>(r * out + o)] = pass;
      }
  }
  Reference ref;
  ref.logits = a[L];
  if (!backward) return ref;

  // Loss and dlogits = (softmax - onehot) / batch.
  const std::int64_t C = widths[L];
  std::vector<double> dz(static_cast<std::size_t>(batch * C));
  double loss = 0;
  for (std::int64_t r = 0; r < batch; ++r) {
    const double* z = &a[L][static_cast<std::size_t>(r * C)];
    const double mx = *std::max_element(z, z + C);
    double sum = 0;
    for (std::int64_t c = 0; c < C; ++c) sum += std::exp(z[c] - mx);
    const std::int32_t y = labels[static_cast<std::size_t>(r)];
    loss += std::log(sum) - (z[y] - mx);
    for (std::int64_t c = 0; c < C; ++c)
      dz[static_cast<std::size_t>(r * C + c)] = (std::exp(z[c] - mx) / sum - (c == y ? 1.0 : 0.0)) / static_cast<double>(batch);
  }
  ref.loss = loss / static_cast<double>(batch);

  // Backward, last layer first: dW = a^T.dz, db = colsum(dz), da = dz.W^T, dz = da * (a > 0).
  ref.grad.assign(l.total, 0.0);
  ref.grad_terms_sq.assign(l.total, 0.0);
  for (std::size_t k = L; k-- > 0;) {
    const std::int64_t in = widths[k], out = widths[k + 1];
    for (std::int64_t r = 0; r < batch; ++r)
      for (std::int64_t o = 0; o < out; ++o) {
        const double t = dz[static_cast<std::size_t>(r * out + o)];
        ref.grad[l.b[k] + static_cast<std::size_t>(o)] += t;
        ref.grad_terms_sq[l.b[k] + static_cast<std::size_t>(o)] += t * t;
      }
#pragma omp parallel for schedule(static)
    for (std::int64_t i = 0; i < in; ++i)
      for (std::int64_t r = 0; r < batch; ++r) {
        const double ai = a[k][static_cast<std::size_t>(r * in + i)];
        for (std::int64_t o = 0; o < out; ++o) {
          const double t = ai * dz[static_cast<std::size_t>(r * out + o)];
          ref.grad[l.w[k] + static_cast<std::size_t>(i * out + o)] += t;
          ref.grad_terms_sq[l.w[k] + static_cast<std::size_t>(i * out + o)] += t * t;
        }
      }
    if (k == 0) break;
    std::vector<double> da(static_cast<std::size_t>(batch * in), 0.0);
#pragma omp parallel for schedule(static)
    for (std::int64_t r = 0; r < batch; ++r)
      for (std::int64_t i = 0; i < in; ++i) {
        if (!on[k][static_cast<std::size_t>(r * in + i)]) continue;  // ReLU's gradient: 0 where it was off
        double s = 0;
        for (std::int64_t o = 0; o < out; ++o)
          s += dz[static_cast<std::size_t>(r * out + o)] * params[l.w[k] + static_cast<std::size_t>(i * out + o)];
        da[static_cast<std::size_t>(r * in + i)] = s;
      }
    dz = std::move(da);
  }
  return ref;
}

}  // namespace hotops::models
