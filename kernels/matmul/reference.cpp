// The matmul reference: plain loops, double accumulation. The oracle every backend is checked against.
#include <algorithm>
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

// An operand's matrices as stored ([rows, cols] each) and the view they lie in: the shape's, or
// packed (one after another).
struct Stored {
  std::int64_t rows, cols, heads;
  View view;
  std::size_t at(std::int64_t item, std::int64_t row, std::int64_t col) const {
    return static_cast<std::size_t>(item / heads * view.per_sample + item % heads * view.per_head + row * view.ld + col);
  }
};

Stored stored(const Shape& s, Operand o) {
  Stored st{s.M, s.N, 1, {}};  // dOut (and out)
  if (o == Operand::a) st.rows = s.trans_a ? s.K : s.M, st.cols = s.trans_a ? s.M : s.K;
  if (o == Operand::b) st.rows = s.trans_b ? s.N : s.K, st.cols = s.trans_b ? s.K : s.N;
  if (!s.strided()) {
    st.view = {st.rows * st.cols, 0, st.cols};
    return st;
  }
  st.heads = s.views.heads;
  st.view = o == Operand::a ? s.views.a : o == Operand::b ? s.views.b : s.views.out;
  return st;
}

// The operand whose layout the primary output has: dA A's, dB B's, out dOut's.
Operand primary_layout(const Shape& s) {
  return s.dir == Direction::bwd_data ? Operand::a : s.dir == Direction::bwd_weight ? Operand::b : Operand::dout;
}

// Where A[b,m,k], B[b,k,n] and dOut[b,m,n] are stored, in either layout.
std::size_t at_a(const Shape& s, std::int64_t b, std::int64_t m, std::int64_t k) {
  if (s.blocked()) return blocked_at(s, m, k);
  const Stored st = stored(s, Operand::a);
  return s.trans_a ? st.at(b, k, m) : st.at(b, m, k);
}
std::size_t at_b(const Shape& s, std::int64_t b, std::int64_t k, std::int64_t n) {
  const Stored st = stored(s, Operand::b);
  return s.trans_b ? st.at(b, n, k) : st.at(b, k, n);
}
std::size_t at_dout(const Shape& s, std::int64_t b, std::int64_t m, std::int64_t n) {
  return stored(s, Operand::dout).at(b, m, n);
}

// x's elements at_x(j) times y's at_y(j), summed over j < n in double: the reference's dot products.
// Where both addresses are affine in j (every layout along a dot product's index, but A in blocks
// along k), their addressing is taken out of the loop; the terms and their order are the same.
template <class AtX, class AtY>
double dot(const HostBuffer& x, AtX at_x, const HostBuffer& y, AtY at_y, std::int64_t n, bool affine = true) {
  if (n <= 0) return 0;
  if (!affine) {
    double acc = 0;
    for (std::int64_t j = 0; j < n; ++j) acc += x.get(at_x(j)) * y.get(at_y(j));
    return acc;
  }
  const auto x0 = static_cast<std::ptrdiff_t>(at_x(0)), y0 = static_cast<std::ptrdiff_t>(at_y(0));
  const std::ptrdiff_t xs = n > 1 ? static_cast<std::ptrdiff_t>(at_x(1)) - x0 : 0;
  const std::ptrdiff_t ys = n > 1 ? static_cast<std::ptrdiff_t>(at_y(1)) - y0 : 0;
  double acc = 0;
  for (std::int64_t j = 0; j < n; ++j)
    acc += x.get(static_cast<std::size_t>(x0 + j * xs)) * y.get(static_cast<std::size_t>(y0 + j * ys));
  return acc;
}

}  // namespace

std::size_t blocked_at(const Shape& s, std::int64_t m, std::int64_t k) {
  const std::int64_t kb = s.K / s.a_blocks;
  return static_cast<std::size_t>((k / kb * s.M + m) * kb + k % kb);
}

std::size_t operand_count(const Shape& s, Operand o) {
  const Stored st = stored(s, o);
  if (!s.strided()) return static_cast<std::size_t>(s.batch_count * st.rows * st.cols);
  const std::int64_t samples = s.batch_count / st.heads;
  const View& v = st.view;
  const std::int64_t last = (samples - 1) * v.per_sample + (st.heads - 1) * v.per_head + (st.rows - 1) * v.ld + st.cols;
  return static_cast<std::size_t>(std::max(last, samples * v.per_sample));
}

std::size_t primary_at(const Shape& s, std::size_t i) {
  if (!s.strided()) return i;
  const Stored st = stored(s, primary_layout(s));
  const auto e = static_cast<std::int64_t>(i);
  return st.at(e / (st.rows * st.cols), e / st.cols % st.rows, e % st.cols);
}

double reference_primary(const Shape& s, const Inputs& in, std::size_t idx) {
  const auto i = static_cast<std::int64_t>(idx);
  const std::int64_t M = s.M, N = s.N, K = s.K;
  double acc = 0;
  switch (s.dir) {
    case Direction::bwd_data: {  // dA[b,m,k] = alpha * sum_n dOut[b,m,n] B[b,k,n], stored as A is
      const std::int64_t b = s.trans_a ? i / (K * M) : i / (M * K);
      std::int64_t m = s.trans_a ? i % M : (i / K) % M, k = s.trans_a ? (i / M) % K : i % K;
      if (s.blocked()) {  // i = (block * M + m) * kb + column
        const std::int64_t kb = K / s.a_blocks;
        m = i / kb % M, k = i / (M * kb) * kb + i % kb;
      }
      acc = dot(in.dout, [&](std::int64_t n) { return at_dout(s, b, m, n); }, in.b, [&](std::int64_t n) { return at_b(s, b, k, n); }, N);
      return s.alpha * acc;
    }
    case Direction::bwd_weight: {  // dB[b,k,n] = alpha * sum_m A[b,m,k] dOut[b,m,n], stored as B is
      const std::int64_t b = i / (K * N);
      const std::int64_t k = s.trans_b ? i % K : (i / N) % K, n = s.trans_b ? (i / K) % N : i % N;
      acc = dot(in.a, [&](std::int64_t m) { return at_a(s, b, m, k); }, in.dout, [&](std::int64_t m) { return at_dout(s, b, m, n); },
                M);  // (A in blocks too: a block's rows are kb apart)
      return s.alpha * acc;
    }
    default: {  // out[b,m,n] = alpha * sum_k A[b,m,k] B[b,k,n] + beta * bias[n], then ReLU with relu
      const std::int64_t b = i / (M * N), m = (i / N) % M, n = i % N;
      acc = dot(in.a, [&](std::int64_t k) { return at_a(s, b, m, k); }, in.b, [&](std::int64_t k) { return at_b(s, b, k, n); }, K,
                !s.blocked());
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
  for (std::size_t i = 0; i < primary_count(s); ++i) out.primary.set(primary_at(s, i), reference_primary(s, in, i));
  for (std::size_t n = 0; n < out.dbias.count(); ++n) out.dbias.set(n, reference_dbias(s, in, n));
}

}  // namespace hotops::matmul
