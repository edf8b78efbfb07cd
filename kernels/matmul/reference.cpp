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

double reference_primary(const Shape& s, const Inputs& in, std::size_t idx) {
  const auto i = static_cast<std::int64_t>(idx);
  const std::int64_t M = s.M, N = s.N, K = s.K;
  double acc = 0;
  switch (s.dir) {
    case Direction::bwd_data: {  // dA[b,m,k] = alpha * sum_n dOut[b,m,n] B[b,k,n]
      const std::int64_t b = i / (M * K), m = (i / K) % M, k = i % K;
      for (std::int64_t n = 0; n < N; ++n)
        acc += in.dout.get(static_cast<std::size_t>((b * M + m) * N + n)) *
               in.b.get(static_cast<std::size_t>((b * K + k) * N + n));
      return s.alpha * acc;
    }
    case Direction::bwd_weight: {  // dB[b,k,n] = alpha * sum_m A[b,m,k] dOut[b,m,n]
      const std::int64_t b = i / (K * N), k = (i / N) % K, n = i % N;
      for (std::int64_t m = 0; m < M; ++m)
        acc += in.a.get(static_cast<std::size_t>((b * M + m) * K + k)) *
               in.dout.get(static_cast<std::size_t>((b * M + m) * N + n));
      return s.alpha * acc;
    }
    default: {  // out[b,m,n] = alpha * sum_k A[b,m,k] B[b,k,n] + beta * bias[n]
      const std::int64_t b = i / (M * N), m = (i / N) % M, n = i % N;
      for (std::int64_t k = 0; k < K; ++k)
        acc += in.a.get(static_cast<std::size_t>((b * M + m) * K + k)) *
               in.b.get(static_cast<std::size_t>((b * K + k) * N + n));
      const double bias = s.op == Op::addmm ? s.beta * in.bias.get(static_cast<std::size_t>(n)) : 0.0;
      return s.alpha * acc + bias;
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
