// The gelu_dbias op: shapes, inputs, verification and its bounds, and its benchmark case.
#include "kernels/gelu/gelu_dbias.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "hotops/check.h"
#include "hotops/elementwise.h"
#include "kernels/gelu/gelu.h"

namespace hotops::gelu::dbias {
namespace {

constexpr DType kDTypes[] = {DType::f32, DType::bf16};

// The op as the benchmark runs it. On CUDA dx is dy, as the model's backward runs the kernel; on the
// CPU, whose loop is the same code either way, dx is a tensor of its own, so that repeated runs do
// not shrink dy towards subnormals.
struct Op : OpOf<Shape, Args, Inputs, Outputs> {
  static Shape shape(const Problem& p) { return shape_of(p); }
  static Args bind(const Shape&, Io& io, Binder& b) {
    Args a;
    a.x = b.in(io.in.x);
    if (b.backend() == Backend::cuda) {
      a.dx = b.inout(io.in.dy, io.out.dx);
      a.dy = a.dx;
    } else {
      a.dy = b.in(io.in.dy);
      a.dx = b.out(io.out.dx);
    }
    a.dbias = static_cast<float*>(b.out(io.out.dbias));
    return a;
  }
};

double dx_ref(const Inputs& in, std::size_t i) {
  return reference(Approx::none, Direction::bwd, in.x.get(i), in.dy.get(i));
}

// dx as the gelu op checks its bwd: max |out - ref| over max(rms(ref), 0.4), within gelu's bound.
Check verify_dx(const Shape& s, const Inputs& in, const HostBuffer& dx) {
  const std::vector<std::size_t> idx = sample_indices(dx.count(), std::size_t(1) << 18, 13);
  double sumsq = 0;
  for (std::size_t i : idx) sumsq += dx_ref(in, i) * dx_ref(in, i);
  const double rms = std::sqrt(sumsq / static_cast<double>(idx.size())), floor = 0.4;
  gelu::Shape g;
  g.dir = Direction::bwd, g.dtype = s.dtype, g.approx = Approx::none;
  const double tol = error_bound(g) * (rms < floor ? floor / std::max(rms, 1e-300) : 1.0);
  return compare(dx, idx, [&](std::size_t i) { return dx_ref(in, i); }, tol);
}

// dbias[c] sums the rows' stored dx. Each stored element is off its exact value by the dtype's
// rounding (at most 2^-9 |dx| in bf16, 2^-24 in f32; bounded at twice that) plus the f32 math of
// gelu' (the gelu op's, on either backend: a few 1e-7 absolute, times |dy|; bounded at 1e-6 |dy|); their sum adds the f32
// accumulation over the rows, about 2^-24 sqrt(rows) of sum |dx| (a random walk; 16 times that). So
// |dbias[c] - ref| <= (u + 16 * 2^-24 sqrt(rows)) * sum |dx| + 1e-6 * sum |dy|, per column.
Check verify_dbias(const Shape& s, const Inputs& in, const HostBuffer& dbias) {
  const double u = s.dtype == DType::bf16 ? std::ldexp(1.0, -8) : std::ldexp(1.0, -23);
  const double k = u + 16 * std::ldexp(1.0, -24) * std::sqrt(static_cast<double>(s.rows));
  const auto cols = static_cast<std::size_t>(s.cols);
  const auto column = [&](std::size_t col, double& bound) {
    double ref = 0, abs_dx = 0, abs_dy = 0;
    for (std::size_t r = 0; r < static_cast<std::size_t>(s.rows); ++r) {
      const double d = dx_ref(in, r * cols + col);
      ref += d, abs_dx += std::fabs(d), abs_dy += std::fabs(in.dy.get(r * cols + col));
    }
    bound = k * abs_dx + 1e-6 * abs_dy;
    return ref;
  };
  return compare_each(dbias, sample_indices(cols, 256, 17), column, "dbias");
}

}  // namespace

Shape shape_of(const Problem& p) {
  HOTOPS_CHECK(p.op == "gelu_dbias" && p.dir == Direction::bwd, "gelu_dbias is a bwd op: " + p.name());
  HOTOPS_CHECK(p.dtype == DType::f32 || p.dtype == DType::bf16, "gelu_dbias has f32 and bf16 only: " + p.name());
  HOTOPS_CHECK(p.get("approx") == "none", "gelu_dbias has approx:none only (BERT's and ViT's erf GELU): " + p.name());
  const std::string& dims = p.get("dims");
  Shape s;
  s.dtype = p.dtype;
  s.cols = std::stoll(dims.substr(dims.rfind('x') + 1));
  const std::int64_t n = elementwise::extent_of(p).elements;
  HOTOPS_CHECK(s.cols > 0 && n % s.cols == 0, "gelu_dbias: bad dims in " + p.name());
  s.rows = n / s.cols;
  return s;
}

Inputs make_inputs(const Shape& s, std::uint64_t seed) {
  const auto n = static_cast<std::size_t>(s.rows * s.cols);
  Inputs in{HostBuffer(s.dtype, n), HostBuffer(s.dtype, n)};
  in.x.fill_uniform(seed, 0, -5.f, 5.f);
  in.dy.fill_uniform(seed, 1);
  return in;
}

Outputs make_outputs(const Shape& s) {
  return {HostBuffer(s.dtype, static_cast<std::size_t>(s.rows * s.cols)), HostBuffer(DType::f32, static_cast<std::size_t>(s.cols))};
}

Check verify(const Shape& s, const Inputs& in, const Outputs& out) {
  Check all;
  all.merge(verify_dx(s, in, out.dx), "dx");
  all.merge(verify_dbias(s, in, out.dbias), "dbias");
  return all;
}

void expand(const std::vector<Arg>& args, std::vector<Problem>& out) {
  for (Backend be : kAllBackends)
    for (DType t : kDTypes) {
      Problem p{"gelu_dbias", be, t, Direction::bwd, args};
      p.args.push_back({"approx", "none"});
      out.push_back(std::move(p));
    }
}

// FLOPs per element: gelu's bwd (11, gelu.cpp) and one add of the column sum. Bytes: x and dy read,
// dx written, in the dtype; dbias written, f32.
Work work(const Problem& p) {
  const Shape s = shape_of(p);
  const double n = static_cast<double>(s.rows * s.cols), e = static_cast<double>(dtype_size(s.dtype));
  Work w;
  w.flops = 12 * n;
  w.bytes = 3 * e * n + 4.0 * static_cast<double>(s.cols);
  w.items = p.batch() ? static_cast<double>(*p.batch()) : 1.0;
  return w;
}

std::unique_ptr<Case> make_case(const Problem& p) { return make_plan_case<Op>(p); }

}  // namespace hotops::gelu::dbias
