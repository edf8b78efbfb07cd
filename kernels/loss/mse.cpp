// The mse op: shapes, inputs, the double reference, verification and its bounds, and its benchmark case.
#include "kernels/loss/mse.h"

#include <algorithm>
#include <cmath>

#include "hotops/check.h"

namespace hotops::loss::mse {
namespace {

// The op as the benchmark runs it: y and t in, the loss and dy out.
struct Op : OpOf<Shape, Args, Inputs, Outputs> {
  static Args bind(const Shape&, Io& io, Binder& b) {
    return Args{b.in(io.in.y), b.in(io.in.target), static_cast<float*>(b.out(io.out.loss)), b.out(io.out.dy)};
  }
  static Shape shape(const Problem& p) { return shape_of(p); }
};

}  // namespace

Shape shape_of(const Problem& p) {
  HOTOPS_CHECK(p.op == "mse" && p.dir == Direction::bwd, "mse is a bwd op (the loss and its gradient): " + p.name());
  HOTOPS_CHECK(p.dtype == DType::f32 || p.dtype == DType::bf16, "mse has f32 and bf16 only: " + p.name());
  Shape s;
  s.dtype = p.dtype;
  s.batch = p.get_int("batch"), s.tokens = p.get_int("tokens"), s.hidden = p.get_int("hidden");
  HOTOPS_CHECK(s.batch > 0 && s.tokens > 0 && s.hidden > 0, "mse dimensions must be positive: " + p.name());
  return s;
}

Inputs make_inputs(const Shape& s, std::uint64_t seed) {
  const auto n = static_cast<std::size_t>(s.count());
  Inputs in{HostBuffer(s.dtype, n), HostBuffer(s.dtype, n)};
  in.y.fill_uniform(seed, 0);
  in.target.fill_uniform(seed, 1);
  return in;
}

Outputs make_outputs(const Shape& s) { return {HostBuffer(DType::f32, 1), HostBuffer(s.dtype, static_cast<std::size_t>(s.count()))}; }

double reference_loss(const Inputs& in) {
  const auto n = static_cast<std::int64_t>(in.y.count());
  double sum = 0;
#pragma omp parallel for reduction(+ : sum) schedule(static) if (n > (1 << 16))
  for (std::int64_t i = 0; i < n; ++i) {
    const double e = in.y.get(static_cast<std::size_t>(i)) - in.target.get(static_cast<std::size_t>(i));
    sum += e * e;
  }
  return sum / static_cast<double>(n);
}

double reference_dy(const Inputs& in, std::size_t i) {
  return 2 * (in.y.get(i) - in.target.get(i)) / static_cast<double>(in.y.count());
}

// u = 2^-24. The stored y and t are exact (the reference reads them), so the errors are the f32 math:
//   loss: each term (y - t)^2 is off by 3u of itself (the difference and the square rounded), and
//         its sum adds up to u per add along the longest chain of adds: on CUDA a thread adds one
//         8-element vector (at most; 4 in f32) in every kCudaMaxBlocks x 256 (262144) vectors, at
//         most n / 262144 + 8 terms, the first thread 7 more (the last n mod 8), then 5 warp steps
//         and 8 warps, and the stage-2 thread its 4 partials, 5 warp steps and 8 warps; on the CPU
//         the sum is in double. All terms are positive, so the relative error is at most
//         (n / 262144 + 45) u: bounded at 4 times that, of the loss.
//   dy:   2 / n, y - t and their product each round by u, and the store rounds (bf16: 2^-9; bounded
//         at 2^-8): |dy - ref| <= (8u + bf16's 2^-8) |ref|, per element.
// A 256th of the terms left out moves the loss by about 0.4%, over 100 times its bound at the models'
// sizes; a wrong n scales every output.
Check verify(const Shape& s, const Inputs& in, const Outputs& out) {
  const double u = std::ldexp(1.0, -24), n = static_cast<double>(s.count());
  const double k_loss = 4 * (n / static_cast<double>(kCudaMaxBlocks * 256) + 45) * u;
  const double k_dy = 8 * u + (s.dtype == DType::bf16 ? std::ldexp(1.0, -8) : 0.0);
  const double tiny = u * 1e-3 * 2 / n;  // y == t: dy is exactly 0
  Check all;
  all.merge(compare_each(out.loss, {0},
                         [&](std::size_t, double& bound) {
                           const double want = reference_loss(in);
                           bound = k_loss * want + tiny;
                           return want;
                         },
                         "loss"),
            "loss");
  all.merge(compare_each(out.dy, sample_indices(out.dy.count(), std::size_t(1) << 18, 7),
                         [&](std::size_t i, double& bound) {
                           const double want = reference_dy(in, i);
                           bound = k_dy * std::fabs(want) + tiny;
                           return want;
                         },
                         "dy"),
            "dy");
  return all;
}

void expand(const std::vector<Arg>& args, std::vector<Problem>& out) {
  for (Backend be : kAllBackends)
    for (DType t : {DType::f32, DType::bf16}) out.push_back(Problem{"mse", be, t, Direction::bwd, args});
}

// FLOPs per element: y - t, its square, the sum's add, dy's product: 4. Bytes: y and t read, dy
// written, in the dtype; the f32 loss written.
Work work(const Problem& p) {
  const Shape s = shape_of(p);
  const double n = static_cast<double>(s.count()), e = static_cast<double>(dtype_size(s.dtype));
  Work w;
  w.flops = 4 * n;
  w.bytes = 3 * e * n + 4;
  w.items = static_cast<double>(s.batch);
  return w;
}

std::unique_ptr<Case> make_case(const Problem& p) { return make_plan_case<Op>(p); }

}  // namespace hotops::loss::mse
