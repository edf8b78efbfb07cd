// The layernorm_dbias op: shapes, inputs, the double reference of dbias, verification and its
// bounds, and its benchmark case (dx, dgamma and dbeta's reference: layernorm's Reference).
#include "kernels/layernorm/layernorm_dbias.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "hotops/check.h"

namespace hotops::layernorm::dbias {
namespace {

constexpr DType kDTypes[] = {DType::f32, DType::bf16};

// The op as the benchmark runs it: every input and output given, dres where the problem has it.
struct Op : OpOf<Shape, Args, Inputs, Outputs> {
  static Shape shape(const Problem& p) { return shape_of(p); }
  static Args bind(const Shape& s, Io& io, Binder& b) {
    Args a;
    a.x = b.in(io.in.ln.x);
    a.dy = b.in(io.in.ln.dy);
    a.gamma = static_cast<const float*>(b.in(io.in.ln.gamma));
    a.saved_mean = static_cast<const float*>(b.in(io.in.ln.mean));
    a.saved_rstd = static_cast<const float*>(b.in(io.in.ln.rstd));
    if (s.dres) a.dres = b.in(io.in.dres);
    a.dx = b.out(io.out.dx);
    a.dgamma = static_cast<float*>(b.out(io.out.dgamma));
    a.dbeta = static_cast<float*>(b.out(io.out.dbeta));
    a.dbias = static_cast<float*>(b.out(io.out.dbias));
    return a;
  }
};

// The reference of the op's dx: layernorm's backward, plus dres.
struct DxReference {
  DxReference(const Shape& s, const Inputs& in) : shape(s.backward()), ln(shape, in.ln), dres(s.dres ? &in.dres : nullptr) {}
  double operator()(std::size_t i) const { return ln.out(static_cast<std::int64_t>(i)) + (dres ? dres->get(i) : 0.0); }
  layernorm::Shape shape;  // before `ln`, which keeps a reference to it
  layernorm::Reference ln;
  const HostBuffer* dres;
};

// dbias[c] sums the rows' stored dx. Each stored element is off its exact value by
//   - the f32 math of LayerNorm's backward: the row sums sum(g) and sum(g * xhat) err by
//     accumulation_bound(H) of the sums of their terms' sizes, and the few products and differences
//     by a few 2^-24 of theirs: within 4 accumulation_bound(H) (out_tolerance's factor) of
//     a = rstd (|g| + sum |g| / H + |xhat| sum |g * xhat| / H);
//   - the dtype's rounding of the stored value (the f32 add of dres included): 2^-8 |dx| in bf16,
//     2^-23 in f32 (twice the half-ulp).
// Their sum adds the f32 accumulation over the rows, accumulation_bound(rows) of sum |dx|. So per column
// |dbias[c] - ref| <= (u + accumulation_bound(rows)) * sum |dx| + 4 accumulation_bound(H) * sum a.
Check verify_dbias(const Shape& s, const Inputs& in, const DxReference& ref, const HostBuffer& dbias) {
  const auto rows = static_cast<std::size_t>(s.rows()), H = static_cast<std::size_t>(s.hidden);
  const layernorm::Inputs& ln = in.ln;
  std::vector<double> abs_g(rows, 0.0), abs_gx(rows, 0.0);  // per row: sum |g| / H, sum |g * xhat| / H
  for (std::size_t r = 0; r < rows; ++r) {
    const double m = ln.mean.get(r), rs = ln.rstd.get(r);
    for (std::size_t c = 0; c < H; ++c) {
      const double g = std::fabs(ln.gamma.get(c) * ln.dy.get(r * H + c));
      abs_g[r] += g, abs_gx[r] += g * std::fabs((ln.x.get(r * H + c) - m) * rs);
    }
    abs_g[r] /= static_cast<double>(H), abs_gx[r] /= static_cast<double>(H);
  }
  const double u = s.dtype == DType::bf16 ? std::ldexp(1.0, -8) : std::ldexp(1.0, -23);
  const double k_sum = u + accumulation_bound(s.rows()), k_ln = 4 * accumulation_bound(s.hidden);
  const auto column = [&](std::size_t col, double& bound) {
    double want = 0, abs_dx = 0, terms = 0;
    for (std::size_t r = 0; r < rows; ++r) {
      const std::size_t i = r * H + col;
      const double d = ref(i), rs = ln.rstd.get(r), xhat = std::fabs((ln.x.get(i) - ln.mean.get(r)) * rs);
      want += d, abs_dx += std::fabs(d);
      terms += rs * (std::fabs(ln.gamma.get(col) * ln.dy.get(i)) + abs_g[r] + xhat * abs_gx[r]);
    }
    bound = k_sum * abs_dx + k_ln * terms;
    return want;
  };
  return compare_each(dbias, sample_indices(H, 256, 17), column, "dbias");
}

}  // namespace

layernorm::Shape Shape::backward() const {
  layernorm::Shape ln;
  ln.dir = Direction::bwd;
  ln.dtype = dtype;
  ln.batch = batch, ln.tokens = tokens, ln.hidden = hidden, ln.eps = eps;
  return ln;
}

Shape shape_of(const Problem& p) {
  HOTOPS_CHECK(p.op == "layernorm_dbias" && p.dir == Direction::bwd, "layernorm_dbias is a bwd op: " + p.name());
  HOTOPS_CHECK(p.dtype == DType::f32 || p.dtype == DType::bf16, "layernorm_dbias has f32 and bf16 only: " + p.name());
  const layernorm::Shape ln = layernorm::shape_of(p);
  const std::string& dres = p.get("dres");
  HOTOPS_CHECK(dres == "yes" || dres == "no", "layernorm_dbias: dres is yes or no in " + p.name());
  Shape s;
  s.dtype = p.dtype;
  s.batch = ln.batch, s.tokens = ln.tokens, s.hidden = ln.hidden, s.eps = ln.eps;
  s.dres = dres == "yes";
  return s;
}

Inputs make_inputs(const Shape& s, std::uint64_t seed) {
  Inputs in{layernorm::make_inputs(s.backward(), seed), HostBuffer()};
  if (s.dres) {
    in.dres = HostBuffer(s.dtype, static_cast<std::size_t>(s.count()));
    in.dres.fill_uniform(seed, 7);
  }
  return in;
}

Outputs make_outputs(const Shape& s) {
  const auto H = static_cast<std::size_t>(s.hidden);
  return {HostBuffer(s.dtype, static_cast<std::size_t>(s.count())), HostBuffer(DType::f32, H), HostBuffer(DType::f32, H),
          HostBuffer(DType::f32, H)};
}

Check verify(const Shape& s, const Inputs& in, const Outputs& out) {
  const DxReference ref(s, in);
  const std::size_t limit = std::size_t(1) << 18;
  auto vec = [&](const HostBuffer& b, const std::vector<double>& r) {
    return compare(b, sample_indices(b.count(), limit, 11), [&](std::size_t i) { return r[i]; }, sum_tolerance(s.rows()));
  };
  Check all;
  all.merge(compare(out.dx, sample_indices(out.dx.count(), limit, 7), [&](std::size_t i) { return ref(i); }, out_tolerance(ref.shape)),
            "dx");
  all.merge(vec(out.dgamma, ref.ln.dgamma), "dgamma");
  all.merge(vec(out.dbeta, ref.ln.dbeta), "dbeta");
  all.merge(verify_dbias(s, in, ref, out.dbias), "dbias");
  return all;
}

void expand(const std::vector<Arg>& args, bool dres, std::vector<Problem>& out) {
  for (Backend be : kAllBackends)
    for (DType t : kDTypes) {
      Problem p{"layernorm_dbias", be, t, Direction::bwd, args};
      p.args.push_back({"dres", dres ? "yes" : "no"});
      out.push_back(std::move(p));
    }
}

// FLOPs per element: layernorm's bwd (13, layernorm.cpp), the column sum's add, and dres's add where
// given. Bytes: x, dy, dx (and dres) in the dtype; gamma, dgamma, dbeta and dbias f32 [H]; the saved
// mean and rstd f32 [rows].
Work work(const Problem& p) {
  const Shape s = shape_of(p);
  const double n = static_cast<double>(s.count()), e = static_cast<double>(dtype_size(s.dtype));
  const double h4 = 4.0 * static_cast<double>(s.hidden), r4 = 4.0 * static_cast<double>(s.rows());
  const double tensors = s.dres ? 4 : 3;
  Work w;
  w.flops = (s.dres ? 15 : 14) * n;
  w.bytes = tensors * e * n + 4 * h4 + 2 * r4;
  w.items = static_cast<double>(s.batch);
  return w;
}

std::unique_ptr<Case> make_case(const Problem& p) { return make_plan_case<Op>(p); }

}  // namespace hotops::layernorm::dbias
