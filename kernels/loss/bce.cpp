// The bce_logits op: shapes, inputs, the double reference, verification and its bounds, and its
// benchmark case.
#include "kernels/loss/bce.h"

#include <algorithm>
#include <cmath>

#include "hotops/check.h"
#include "hotops/op_family.h"

namespace hotops::loss::bce {
namespace {

// The op as the benchmark runs it: z and y in; the loss (fwd) or dlogits (bwd) out.
struct Op : OpOf<Shape, Args, Inputs, Outputs> {
  static Args bind(const Shape& s, Io& io, Binder& b) {
    Args a;
    a.logits = b.in(io.in.logits);
    a.target = static_cast<const float*>(b.in(io.in.target));
    if (s.dir == Direction::fwd)
      a.loss = static_cast<float*>(b.out(io.out.loss));
    else
      a.dlogits = b.out(io.out.dlogits);
    return a;
  }
  static Shape shape(const Problem& p) { return shape_of(p); }
};

// The sigmoid in double, without overflow at either end.
double sigmoid(double z) {
  if (z >= 0) return 1 / (1 + std::exp(-z));
  const double e = std::exp(z);
  return e / (1 + e);
}

}  // namespace

Shape shape_of(const Problem& p) {
  HOTOPS_CHECK(p.op == "bce_logits", "not a bce_logits problem: " + p.name());
  Shape s = fwd_bwd_shape<Shape>(p, "bce_logits");
  s.batch = p.get_int("batch"), s.outputs = p.get_int("outputs");
  HOTOPS_CHECK(s.batch > 0 && s.outputs > 0, "bce_logits dimensions must be positive: " + p.name());
  return s;
}

Inputs make_inputs(const Shape& s, std::uint64_t seed) {
  const auto n = static_cast<std::size_t>(s.count());
  Inputs in{HostBuffer(s.dtype, n), HostBuffer(DType::f32, n)};
  in.logits.fill_uniform(seed, 0, -8.f, 8.f);
  in.target.fill_uniform(seed, 1, 0.f, 1.f);
  return in;
}

Outputs make_outputs(const Shape& s) {
  Outputs o;
  if (s.dir == Direction::fwd)
    o.loss = HostBuffer(DType::f32, 1);
  else
    o.dlogits = HostBuffer(s.dtype, static_cast<std::size_t>(s.count()));
  return o;
}

double reference_term(double z, double y) { return std::max(z, 0.0) - z * y + std::log1p(std::exp(-std::fabs(z))); }

double reference_loss(const Inputs& in) {
  const auto n = static_cast<std::int64_t>(in.logits.count());
  double sum = 0;
#pragma omp parallel for reduction(+ : sum) schedule(static) if (n > (1 << 16))
  for (std::int64_t i = 0; i < n; ++i)
    sum += reference_term(in.logits.get(static_cast<std::size_t>(i)), in.target.get(static_cast<std::size_t>(i)));
  return sum / static_cast<double>(n);
}

double reference_dlogits(const Inputs& in, std::size_t i) {
  return (sigmoid(in.logits.get(i)) - in.target.get(i)) / static_cast<double>(in.logits.count());
}

// u = 2^-24. The stored z and y are exact (the reference reads them), so the errors are the f32 math.
//   loss: each term computes z·y (u |z y|), max(z, 0) − z·y (u of the difference), exp(−|z|) and its
//         log1p (a few u of log1p's value, lp) and the last add (u of the term): within
//         6u m_i, m_i = max(z, 0) + |z y| + lp. The terms are positive, and the longest chain of adds
//         (CUDA: n / 65536 per thread, 5 warp steps, 8 warps, 8 + 5 over the partials; the CPU sums
//         in double) adds (n / 65536 + 30) u of their sum; the mean's division one u more:
//         |loss − ref| <= (6u Σ m_i + (n / 65536 + 31) u Σ term_i) / n, bounded at twice that.
//         A term left out moves the loss by term / n: at fasttext's n = 32 about 1/10 of it, far
//         beyond the bound; a missing / n scales the loss by n.
//   dlogits: sigmoid(z) in f32 (exp, 1 + e and the division: 4u of sigmoid), minus y (u of the
//         difference), over n (u, or 2u as a product with 1/n), then the store (bf16: 2^-8 of it):
//         |d − ref| <= 6u (sigmoid + y) / n + r |ref|, bounded at twice that. A wrong sign, a
//         missing / n, an element off by 2% of itself all fail.
Check verify(const Shape& s, const Inputs& in, const Outputs& out) {
  const double u = std::ldexp(1.0, -24), n = static_cast<double>(s.count());
  if (s.dir == Direction::fwd)
    return compare_each(out.loss, {0},
                        [&](std::size_t, double& bound) {
                          double m = 0, terms = 0;
                          for (std::size_t i = 0; i < in.logits.count(); ++i) {
                            const double z = in.logits.get(i), y = in.target.get(i);
                            m += std::max(z, 0.0) + std::fabs(z * y) + std::log1p(std::exp(-std::fabs(z)));
                            terms += reference_term(z, y);
                          }
                          bound = 2 * (6 * u * m + (n / 65536 + 31) * u * terms) / n;
                          return reference_loss(in);
                        },
                        "loss");
  const double r = s.dtype == DType::bf16 ? std::ldexp(1.0, -8) : 0.0;
  return compare_each(out.dlogits, sample_indices(out.dlogits.count(), std::size_t(1) << 18, 31),
                      [&](std::size_t i, double& bound) {
                        const double want = reference_dlogits(in, i);
                        bound = 2 * (6 * u * (sigmoid(in.logits.get(i)) + in.target.get(i)) / n + r * std::fabs(want));
                        return want;
                      },
                      "dlogits");
}

void expand(const std::vector<Arg>& args, std::vector<Problem>& out) { expand_fwd_bwd("bce_logits", args, out); }

// FLOPs per element, each exp and log1p counted as one: fwd 7 (max, z·y, the difference, |z|, exp,
// log1p, the sum's add), bwd 5 (exp, 1 + e, the division, − y, / n). Bytes: z read in the dtype, y
// read in f32, and the f32 loss (fwd) or dlogits in the dtype (bwd) written.
Work work(const Problem& p) {
  const Shape s = shape_of(p);
  const double n = static_cast<double>(s.count()), e = static_cast<double>(dtype_size(s.dtype));
  Work w;
  const bool fwd = s.dir == Direction::fwd;
  w.flops = (fwd ? 7 : 5) * n;
  w.bytes = e * n + 4 * n + (fwd ? 4 : e * n);
  w.items = static_cast<double>(s.batch);
  return w;
}

std::unique_ptr<Case> make_case(const Problem& p) { return make_plan_case<Op>(p); }

}  // namespace hotops::loss::bce
