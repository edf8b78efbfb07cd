// The bias_grad op: its named shapes, inputs, reference and bound, problems, work and benchmark case.
#include "kernels/matmul/bias_grad.h"

#include <algorithm>
#include <cmath>

#include "hotops/check.h"
#include "hotops/verify.h"

namespace hotops::matmul::bias_grad {
namespace {

// The op as the benchmark runs it: dy in, db out.
struct Op : OpOf<Shape, Args, Inputs, HostBuffer> {
  static Shape shape(const Problem& p) { return shape_of(p); }
  static Args bind(const Shape&, Io& io, Binder& b) { return {b.in(io.in.dy), static_cast<float*>(b.out(io.out))}; }
};

std::vector<Arg> dims(std::int64_t rows, std::int64_t cols) {
  return {{"M", std::to_string(rows)}, {"N", std::to_string(cols)}};
}

// Every backend x dtype of one problem's args.
void expand(const std::vector<Arg>& args, std::vector<Problem>& out) {
  for (Backend be : kAllBackends)
    for (DType t : {DType::f32, DType::bf16}) out.push_back(Problem{"bias_grad", be, t, Direction::bwd, args});
}

// The bound on |db[c] - ref| per unit of the column's sum of |dy|. The terms are exact (dy as
// stored, bf16 widened exactly), so the only error is the f32 accumulation: each add rounds by at
// most u = 2^-24 of a partial sum, itself at most sum |dy|, and no term passes through more adds
// than there are rows (the CPU loop runs down the rows; CUDA sums 64-row chains, then the chains
// in fewer adds than they have rows). That worst case, gamma_rows = rows u / (1 - rows u) (1% for
// the denominator), is kept where it is below 16 u sqrt(rows), the same errors as a random walk
// (16 times its deviation, as gelu_dbias bounds its sums): past 256 rows the worst case is too
// loose to catch a row left out (at BERT's 4096 rows, 2.5e-4 of sum |dy| ~ 2048: 0.5, about
// one term), where the random walk's 6.1e-5 (0.12) is not.
double error_bound(const Shape& s) {
  const double rows = static_cast<double>(s.rows), u = std::ldexp(1.0, -24);
  return std::min(1.01 * rows * u, 16 * u * std::sqrt(rows));
}

}  // namespace

const std::vector<NamedShape>& named_shapes() {
  using V = std::vector<std::int64_t>;
  static const std::vector<NamedShape> shapes = {
      // BERT-base (post-LN, sequence 128): the QKV projection's bias, [tokens, 3 x 768]. The FFN's
      // biases come from gelu_dbias and layernorm_dbias, the output projection's from
      // layernorm_dbias.
      {"bert.qkv", 128, 2304, V{8, 32}},
      // ViT-B/16 (pre-LN, 197 tokens): the QKV projection's bias and the FFN's second (its gradient
      // is the layer's output gradient, which no LayerNorm backward precedes).
      {"vit.qkv", 197, 2304, V{8, 32}},
      {"vit.mlp_down", 197, 768, V{8, 32}},
  };
  return shapes;
}

Shape shape_of(const Problem& p) {
  HOTOPS_CHECK(p.op == "bias_grad" && p.dir == Direction::bwd && (p.dtype == DType::f32 || p.dtype == DType::bf16),
               "bias_grad is a bwd op in f32 or bf16: " + p.name());
  const Shape s{p.dtype, p.get_int("M"), p.get_int("N")};
  HOTOPS_CHECK(s.rows > 0 && s.cols > 0, "bias_grad: M and N must be positive: " + p.name());
  return s;
}

Inputs make_inputs(const Shape& s, std::uint64_t seed) {
  Inputs in{HostBuffer(s.dtype, static_cast<std::size_t>(s.rows * s.cols))};
  in.dy.fill_uniform(seed, 4);  // dOut's stream, as addmm seeds it
  return in;
}

HostBuffer make_output(const Shape& s) { return HostBuffer(DType::f32, static_cast<std::size_t>(s.cols)); }

double reference(const Shape& s, const Inputs& in, std::size_t col, double* abs_sum) {
  const auto cols = static_cast<std::size_t>(s.cols);
  double sum = 0, mag = 0;
  for (std::size_t r = 0; r < static_cast<std::size_t>(s.rows); ++r) {
    const double v = in.dy.get(r * cols + col);
    sum += v, mag += std::fabs(v);
  }
  if (abs_sum) *abs_sum = mag;
  return sum;
}

Check verify(const Shape& s, const Inputs& in, const HostBuffer& db) {
  const double k = error_bound(s);
  std::vector<std::size_t> all(static_cast<std::size_t>(s.cols));
  for (std::size_t c = 0; c < all.size(); ++c) all[c] = c;
  return compare_each(db, all, [&](std::size_t c, double& bound) {
    double mag = 0;
    const double ref = reference(s, in, c, &mag);
    bound = k * mag;
    return ref;
  }, "db");
}

std::vector<Problem> benchmark_problems(const std::vector<std::int64_t>& batches) {
  std::vector<Problem> out;
  for (const NamedShape& ns : named_shapes())
    for (std::int64_t b : batches.empty() ? ns.batches : batches) {
      std::vector<Arg> args{{"shape", ns.name}, {"batch", std::to_string(b)}};
      for (const Arg& a : dims(b * ns.rows_per_sample, ns.cols)) args.push_back(a);
      expand(args, out);
    }
  return out;
}

std::vector<Problem> test_problems() {
  // One element; fewer rows than a CUDA chain; a partial last chain of rows and more than one block
  // of 256 columns (and of col_finish's 32); columns not a multiple of 4 or of 64 (the CPU's blocks).
  const std::int64_t sizes[][2] = {{1, 1}, {37, 20}, {130, 47}, {200, 1100}};
  std::vector<Problem> out;
  for (const auto& rc : sizes) {
    std::vector<Arg> args{{"shape", "test"}};
    for (const Arg& a : dims(rc[0], rc[1])) args.push_back(a);
    expand(args, out);
  }
  return out;
}

// FLOPs: one add per element. Bytes: dy read in the dtype, db written in f32.
Work work(const Problem& p) {
  const Shape s = shape_of(p);
  const double n = static_cast<double>(s.rows * s.cols);
  Work w;
  w.flops = n;
  w.bytes = n * static_cast<double>(dtype_size(s.dtype)) + 4.0 * static_cast<double>(s.cols);
  w.items = p.batch() ? static_cast<double>(*p.batch()) : 1.0;
  return w;
}

std::unique_ptr<Case> make_case(const Problem& p) { return make_plan_case<Op>(p); }

}  // namespace hotops::matmul::bias_grad
