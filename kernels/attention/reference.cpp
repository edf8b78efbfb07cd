// The attention reference in double: one head's softmax(Q K^T / sqrt(D)) V and its backward,
// written from the formulas.
#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/attention/attention.h"

namespace hotops::attention {

void reference_fwd(const double* q, const double* k, const double* v, std::size_t seq, std::size_t head_dim, double* p,
                   double* o) {
  const double scale = 1 / std::sqrt(static_cast<double>(head_dim));
  for (std::size_t i = 0; i < seq; ++i) {
    double* row = p + i * seq;
    for (std::size_t j = 0; j < seq; ++j) {
      double s = 0;
      for (std::size_t d = 0; d < head_dim; ++d) s += q[i * head_dim + d] * k[j * head_dim + d];
      row[j] = s * scale;
    }
    const double m = *std::max_element(row, row + seq);
    double sum = 0;
    for (std::size_t j = 0; j < seq; ++j) sum += (row[j] = std::exp(row[j] - m));
    for (std::size_t j = 0; j < seq; ++j) row[j] /= sum;
    for (std::size_t d = 0; d < head_dim; ++d) {
      double acc = 0;
      for (std::size_t j = 0; j < seq; ++j) acc += row[j] * v[j * head_dim + d];
      o[i * head_dim + d] = acc;
    }
  }
}

void reference_bwd(const double* q, const double* k, const double* v, const double* p, const double* dout, std::size_t seq,
                   std::size_t head_dim, double* dq, double* dk, double* dv) {
  const double scale = 1 / std::sqrt(static_cast<double>(head_dim));
  std::fill_n(dq, seq * head_dim, 0.0);
  std::fill_n(dk, seq * head_dim, 0.0);
  std::fill_n(dv, seq * head_dim, 0.0);
  std::vector<double> ds(seq);
  for (std::size_t i = 0; i < seq; ++i) {
    const double* pi = p + i * seq;
    const double* doi = dout + i * head_dim;
    // dP_ij = dO_i . V_j; dS_ij = P_ij (dP_ij - sum_l dP_il P_il)
    double r = 0;
    for (std::size_t j = 0; j < seq; ++j) {
      double dp = 0;
      for (std::size_t d = 0; d < head_dim; ++d) dp += doi[d] * v[j * head_dim + d];
      ds[j] = dp;
      r += dp * pi[j];
    }
    for (std::size_t j = 0; j < seq; ++j) ds[j] = pi[j] * (ds[j] - r);
    for (std::size_t j = 0; j < seq; ++j)
      for (std::size_t d = 0; d < head_dim; ++d) {
        dv[j * head_dim + d] += pi[j] * doi[d];                   // dV = P^T dO
        dq[i * head_dim + d] += ds[j] * k[j * head_dim + d] * scale;  // dQ = dS K / sqrt(D)
        dk[j * head_dim + d] += ds[j] * q[i * head_dim + d] * scale;  // dK = dS^T Q / sqrt(D)
      }
  }
}

}  // namespace hotops::attention
