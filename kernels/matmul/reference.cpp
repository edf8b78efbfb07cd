// The matmul reference: plain loops, double accumulation. The oracle every backend is checked against.
#include <cmath>

#include "kernels/matmul/matmul.h"

namespace hotops::matmul {

std::size_t primary_count(const Shape& s) {
  switch (s.dir) {
    case Direction::bwd_data: return static_cast<std::size_t>(s.batch_count * s.M * s.K);
    case Direction::bwd_weight: return static_cast<std::size_t>(s.batch_count * s.K * s.N);
    default: return static_cast<std::size_t>(s.batch_count * s.M * s.N);
  }
}

namespace {

// Where A[b,m,k] and B[b,k,n] are stored, in either layout.
std::size_t at_a(const Shape& s, std::int64_t b, std::int64_t m, std::int64_t k) {
  return static_cast<std::size_t>(s.trans_a ? (b * s.K + k) * s.M + m : (b * s.M + m) * s.K + k);
}
std::size_t at_b(const Shape& s, std::int64_t b, std::int64_t k, std::int64_t n) {
  return static_cast<std::size_t>(s.trans_b ? (b * s.N + n) * s.K + k : (b * s.K + k) * s.N + n);
}

}  // namespace

double reference_primary(const Shape& s, const Inputs& in, std::size_t idx) {
  const auto i = static_cast<std::int64_t>(idx);
  const std::int64_t M = s.M, N = s.N, K = s.K;
  double acc = 0;
  switch (s.dir) {
    case Direction::bwd_data: {  // dA[b,m,k] = alpha * sum_n dOut[b,m,n] B[b,k,n], stored as A is
      const std::int64_t b = s.trans_a ? i / (K * M) : i / (M * K);
      const std::int64_t m = s.trans_a ? i % M : (i / K) % M, k = s.trans_a ? (i / M) % K : i % K;
      for (std::int64_t n = 0; n < N; ++n)
        acc += in.dout.get(static_cast<std::size_t>((b * M + m) * N + n)) * in.b.get(at_b(s, b, k, n));
      return s.alpha * acc;
    }
    case Direction::bwd_weight: {  // dB[b,k,n] = alpha * sum_m A[b,m,k] dOut[b,m,n], stored as B is
      const std::int64_t b = i / (K * N);
      const std::int64_t k = s.trans_b ? i % K : (i / N) % K, n = s.trans_b ? (i / K) % N : i % N;
      for (std::int64_t m = 0; m < M; ++m)
        acc += in.a.get(at_a(s, b, m, k)) * in.dout.get(static_cast<std::size_t>((b * M + m) * N + n));
      return s.alpha * acc;
    }
    default: {  // out[b,m,n] = alpha * sum_k A[b,m,k] B[b,k,n] + beta * bias[n], then ReLU with relu
      const std::int64_t b = i / (M * N), m = (i / N) % M, n = i % N;
      for (std::int64_t k = 0; k < K; ++k) acc += in.a.get(at_a(s, b, m, k)) * in.b.get(at_b(s, b, k, n));
      const double bias = s.op == Op::addmm ? s.beta * in.bias.get(static_cast<std::size_t>(n)) : 0.0;
      const double v = s.alpha * acc + bias;
      return s.relu ? std::fmax(v, 0.0) : v;
    }
  }
}

double reference_dbias(const Shape& s, const Inputs& in, std::size_t n) {
  double acc = 0;
  for (std::int64_t r = 0; r < s.batch_count * s.M; ++r)
    acc += in.dout.get(static_cast<std::size_t>(r * s.N) + n);
  return s.beta * acc;
}

void reference(const Shape& s, const Inputs& in, Outputs& out) {
  for (std::size_t i = 0; i < out.primary.count(); ++i) out.primary.set(i, reference_primary(s, in, i));
  for (std::size_t n = 0; n < out.dbias.count(); ++n) out.dbias.set(n, reference_dbias(s, in, n));
}

}  // namespace hotops::matmul
