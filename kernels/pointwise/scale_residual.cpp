// The scale_residual op: shapes, inputs, the reference, verification and its bounds, and its benchmark case.
#include "kernels/pointwise/scale_residual.h"

#include <algorithm>
#include <cmath>

#include "hotops/check.h"
#include "hotops/elementwise.h"
#include "hotops/op_family.h"

namespace hotops::pointwise::scale_residual {
namespace {


// The op as the benchmark runs it, out of place in both directions (in place, repeated runs would
// scale dy by gamma again each time, towards overflow or subnormals).
struct Op : OpOf<Shape, Args, Inputs, Outputs> {
  static Shape shape(const Problem& p) { return shape_of(p); }
  static Args bind(const Shape& s, Io& io, Binder& b) {
    Args a;
    if (s.dir == Direction::fwd) a.x = b.in(io.in.x);
    a.z = b.in(io.in.z);
    if (s.dir == Direction::bwd) a.dy = b.in(io.in.dy);
    a.gamma = static_cast<const float*>(b.in(io.in.gamma));
    a.out = b.out(io.out.out);
    if (s.dir == Direction::bwd) {
      a.dgamma = static_cast<float*>(b.out(io.out.dgamma));
      a.dbias = static_cast<float*>(b.out(io.out.dbias));
    }
    return a;
  }
};

// The unit roundoff of the stored dtype: bf16 keeps 8 significant bits, so rounding to nearest moves
// a value by at most 2^-8 of itself.
double stored_u(DType t) { return t == DType::bf16 ? std::ldexp(1.0, -8) : 0.0; }

}  // namespace

Shape shape_of(const Problem& p) {
  HOTOPS_CHECK(p.op == "scale_residual", "not a scale_residual problem: " + p.name());
  Shape s = fwd_bwd_shape<Shape>(p, p.op);
  HOTOPS_CHECK(p.has("dims"), "scale_residual is over named dims: " + p.name());
  const std::string& dims = p.get("dims");
  s.cols = std::stoll(dims.substr(dims.rfind('x') + 1));
  const std::int64_t n = elementwise::extent_of(p).elements;
  HOTOPS_CHECK(s.cols > 0 && n % s.cols == 0, "scale_residual: bad dims in " + p.name());
  s.rows = n / s.cols;
  return s;
}

Inputs make_inputs(const Shape& s, std::uint64_t seed) {
  const auto n = static_cast<std::size_t>(s.count());
  Inputs in;
  if (s.dir == Direction::fwd) {
    in.x = HostBuffer(s.dtype, n);
    in.x.fill_uniform(seed, 0);
  }
  in.z = HostBuffer(s.dtype, n);
  in.z.fill_uniform(seed, 1);
  if (s.dir == Direction::bwd) {
    in.dy = HostBuffer(s.dtype, n);
    in.dy.fill_uniform(seed, 2);
  }
  in.gamma = HostBuffer(DType::f32, static_cast<std::size_t>(s.cols));
  in.gamma.fill_uniform(seed, 3, 0.5f, 1.5f);
  return in;
}

Outputs make_outputs(const Shape& s) {
  Outputs o;
  o.out = HostBuffer(s.dtype, static_cast<std::size_t>(s.count()));
  if (s.dir == Direction::bwd) {
    o.dgamma = HostBuffer(DType::f32, static_cast<std::size_t>(s.cols));
    o.dbias = HostBuffer(DType::f32, static_cast<std::size_t>(s.cols));
  }
  return o;
}

double reference(const Shape& s, const Inputs& in, std::size_t i) {
  const double g = in.gamma.get(i % static_cast<std::size_t>(s.cols));
  return s.dir == Direction::fwd ? in.x.get(i) + g * in.z.get(i) : g * in.dy.get(i);
}

// Bounds.
// - y = x + gamma z in f32: the product and the sum each rounded (or one fused rounding), at most
//   2^-24 (|x| + |gamma z|) each, then stored: bf16 rounds y once more, 2^-8 |y| (plus the f32 error
//   it carries, below 2^-22 of the terms). So |y - ref| <= 2^-22 (|x| + |gamma z|) + u |ref|, u the
//   stored dtype's roundoff (0 for f32). dz = gamma dy: one f32 rounding, then the store's:
//   |dz - ref| <= (2^-23 + u) |ref|. A wrong channel's gamma moves an element by up to |z| (gammas
//   0.5..1.5 apart), a missing residual by |x|: far beyond either bound.
// - dgamma[c] = sum of f32 products dy z (exact for bf16 operands; one rounding each for f32), summed
//   in f32 in chains of at most 256 rows, then those sums in order: a random walk of rounding errors,
//   bounded as gelu_dbias bounds its column sums: (2^-23 + 16 * 2^-24 sqrt(rows)) sum |dy z|.
// - dbias[c] sums the stored dz (checked first): 16 * 2^-24 sqrt(rows) of sum |dz| (and 2^-23, for
//   a single row). At the tests' 130 rows both bounds are ~2e-4 of sum |terms|: a dropped row, one
//   term of ~1/130 of the sum, is 40 times that.
Check verify(const Shape& s, const Inputs& in, const Outputs& out) {
  const double u = stored_u(s.dtype);
  const auto n = static_cast<std::size_t>(s.count()), cols = static_cast<std::size_t>(s.cols);
  std::vector<std::size_t> idx = sample_indices(n, std::size_t(1) << 20, 31);
  for (std::size_t i = 0; i < std::min<std::size_t>(n, 4 * cols); ++i) idx.push_back(i), idx.push_back(n - 1 - i);
  const bool fwd = s.dir == Direction::fwd;
  Check all = compare_each(out.out, idx,
                           [&](std::size_t i, double& bound) {
                             const double ref = reference(s, in, i);
                             const double terms = fwd ? std::fabs(in.x.get(i)) + std::fabs(ref - in.x.get(i)) : std::fabs(ref);
                             bound = (fwd ? std::ldexp(1.0, -22) : std::ldexp(1.0, -23)) * terms + u * std::fabs(ref);
                             return ref;
                           },
                           fwd ? "y" : "dz");
  if (fwd || !all.ok) return all;
  const double walk = 16 * std::ldexp(1.0, -24) * std::sqrt(static_cast<double>(s.rows)) + std::ldexp(1.0, -23);
  std::vector<std::size_t> columns(cols);
  for (std::size_t c = 0; c < cols; ++c) columns[c] = c;
  all.merge(compare_each(out.dgamma, columns,
                         [&](std::size_t c, double& bound) {
                           double ref = 0, terms = 0;
                           for (std::size_t r = 0; r < static_cast<std::size_t>(s.rows); ++r) {
                             const double t = in.dy.get(r * cols + c) * in.z.get(r * cols + c);
                             ref += t, terms += std::fabs(t);
                           }
                           bound = walk * terms;
                           return ref;
                         },
                         "dgamma"),
            "dgamma");
  all.merge(compare_each(out.dbias, columns,
                         [&](std::size_t c, double& bound) {
                           double ref = 0, terms = 0;
                           for (std::size_t r = 0; r < static_cast<std::size_t>(s.rows); ++r) {
                             const double t = out.out.get(r * cols + c);
                             ref += t, terms += std::fabs(t);
                           }
                           bound = walk * terms;
                           return ref;
                         },
                         "dbias"),
            "dbias");
  return all;
}

void expand(const std::vector<Arg>& args, std::vector<Problem>& out) { expand_fwd_bwd("scale_residual", args, out); }

// FLOPs per element: fwd 2 (the multiply, the add); bwd 4 (dz's multiply, dgamma's multiply-add,
// dbias's add). Bytes: fwd x and z read, y written; bwd dy and z read, dz written, in the dtype; gamma
// read (and bwd dgamma and dbias written), f32.
Work work(const Problem& p) {
  const Shape s = shape_of(p);
  const double n = static_cast<double>(s.count()), e = static_cast<double>(dtype_size(s.dtype));
  const double cols = static_cast<double>(s.cols);
  Work w;
  w.flops = (s.dir == Direction::fwd ? 2 : 4) * n;
  w.bytes = 3 * e * n + 4 * cols * (s.dir == Direction::fwd ? 1 : 3);
  w.items = p.batch() ? static_cast<double>(*p.batch()) : 1.0;
  return w;
}

std::unique_ptr<Case> make_case(const Problem& p) { return make_plan_case<Op>(p); }

}  // namespace hotops::pointwise::scale_residual
