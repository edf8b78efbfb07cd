// The softmax family: problem names and shapes, work, inputs, verification and its bounds.
//
// Names: softmax/<backend>/<dtype>/<fwd|bwd>/shape:<model.layer>/batch:B/rows:R/cols:C, with
// R = B x the rows of one sample (e.g. 12 heads x 128 queries); test problems are
// softmax/.../shape:test/rows:R/cols:C (no batch). The softmax runs over the last dimension (cols).
#include "kernels/softmax/softmax.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <vector>

#include "hotops/check.h"
#include "hotops/op_family.h"

namespace hotops::softmax {
namespace {

// The op as the benchmark runs it: a PlanCase over the problem's inputs and output.
struct Op : OpOf<Shape, Args, Inputs, HostBuffer> {
  static Shape shape(const Problem& p) { return shape_of(p); }
  static Args bind(const Shape& s, Io& io, Binder& b) {
    if (s.dir == Direction::fwd) return {b.in(io.in.x), nullptr, nullptr, b.out(io.out)};
    return {nullptr, b.in(io.in.y), b.in(io.in.dy), b.out(io.out)};
  }
};

// A softmax of a real model: rows_per_sample rows of cols per sample, at its default batch.
struct NamedShape {
  const char* name;
  std::int64_t rows_per_sample;
  std::int64_t cols;
  std::int64_t batch;
};

constexpr NamedShape kNamedShapes[] = {
    // BERT-base, sequence 128: attention probabilities, 12 heads x 128 queries over 128 keys.
    {"bert.attn", 12 * 128, 128, 32},
    // ViT-B/16 at 224x224: 196 patches + the class token, 12 heads x 197 queries over 197 keys.
    {"vit.attn", 12 * 197, 197, 32},
    // An ImageNet classifier head: 1000 logits per image.
    {"classifier", 1, 1000, 256},
};


void expand(const std::vector<Arg>& args, std::vector<Problem>& out) { expand_fwd_bwd("softmax", args, out); }

// FLOPs per element, each exp counted as one:
//   fwd 5: max (a compare), x - max, exp, the sum's add, the divide
//   bwd 4: dy * y, the sum's add, dy - s, y * (dy - s)
double flops_per_element(Direction d) { return d == Direction::fwd ? 5 : 4; }

class SoftmaxFamily final : public PlanFamily<Op> {
 public:
  SoftmaxFamily() : PlanFamily("softmax", onednn_unsupported_reason) {}

  std::vector<Problem> benchmark_problems(const std::vector<std::int64_t>& batches) const override {
    return per_shape_and_batch(kNamedShapes, batches, [](const NamedShape& ns, std::int64_t b, std::vector<Problem>& out) {
      expand({{"shape", ns.name},
              {"batch", std::to_string(b)},
              {"rows", std::to_string(b * ns.rows_per_sample)},
              {"cols", std::to_string(ns.cols)}},
             out);
    });
  }

  std::vector<Problem> test_problems() const override {
    // cols 1 (y = 1, dx = 0); odd widths below, at and above one warp (scalar accesses on CUDA);
    // 8, 40 and 128 (16-byte vectors; in bf16, and in f32 to 40, several rows a warp on CUDA: 4 and 8
    // lanes a row, one or two vectors a lane, a warp's last rows past the end); 200 and 1000 (16-byte
    // vectors, a warp a row); 1024, the widest row a warp holds; 3001, one block per row on CUDA.
    constexpr std::int64_t kShapes[][2] = {{3, 1},    {7, 5},    {5, 33},   {11, 8},   {6, 40},
                                           {9, 128},  {5, 200},  {3, 1000}, {2, 1024}, {2, 3001}};
    std::vector<Problem> out;
    for (const auto& rc : kShapes)
      expand({{"shape", "test"}, {"rows", std::to_string(rc[0])}, {"cols", std::to_string(rc[1])}}, out);
    return out;
  }

  Work work(const Problem& p) const override {
    const Shape s = shape_of(p);
    const double n = static_cast<double>(s.elements()), e = static_cast<double>(dtype_size(s.dtype));
    Work w;
    w.flops = n * flops_per_element(s.dir);
    w.bytes = n * e * (s.dir == Direction::fwd ? 2 : 3);  // x read, y written; y and dy read, dx written
    w.items = p.batch() ? static_cast<double>(*p.batch()) : 1.0;
    return w;
  }
};

}  // namespace

Shape shape_of(const Problem& p) {
  Shape s = fwd_bwd_shape<Shape>(p, "softmax");
  s.rows = p.get_int("rows");
  s.cols = p.get_int("cols");
  HOTOPS_CHECK(s.rows > 0 && s.cols > 0, "bad softmax shape: " + p.name());
  if (p.batch()) HOTOPS_CHECK(s.rows % *p.batch() == 0, "softmax rows must be a multiple of the batch: " + p.name());
  return s;
}

Inputs make_inputs(const Shape& s, std::uint64_t seed) {
  const std::size_t n = s.elements() + kGuard;
  Inputs in;
  HostBuffer x(s.dtype, n);
  x.fill_uniform(seed, 0, -4.f, 4.f);
  if (s.dir == Direction::fwd) {
    in.x = std::move(x);
    return in;
  }
  in.y = HostBuffer(s.dtype, n);
  const auto cols = static_cast<std::size_t>(s.cols);
#pragma omp parallel
  {
    std::vector<double> xr(cols), yr(cols);
#pragma omp for
    for (std::int64_t r = 0; r < s.rows; ++r) {
      const std::size_t base = static_cast<std::size_t>(r) * cols;
      for (std::size_t j = 0; j < cols; ++j) xr[j] = x.get(base + j);
      reference_fwd(xr.data(), cols, yr.data());
      for (std::size_t j = 0; j < cols; ++j) in.y.set(base + j, yr[j]);
    }
  }
  for (std::size_t i = s.elements(); i < n; ++i) in.y.set(i, 0);
  in.dy = HostBuffer(s.dtype, n);
  in.dy.fill_uniform(seed, 1);
  return in;
}

HostBuffer make_output(const Shape& s) { return HostBuffer(s.dtype, s.elements() + kGuard); }

// The bound is on |out - ref| relative to the largest magnitude the error scales with, M, and is
// handed to compare() (whose metric is relative to rms(ref)) as k * M / rms(ref). Inputs are exact
// in the dtype, so the error is the f32 math plus the output's rounding (u = 2^-24 f32, 2^-8 bf16).
//   fwd: y_i = exp(x_i - m) / sum. exp is within a few ulp, the f32 sum of n positive terms within
//        about log2(n) u (trees) to n u (a sequential sum, worst case; 6e-5 at n = 1000, typically
//        sqrt(n) u), the divide or reciprocal 1-2 ulp: |err_i| <= (a few + n) u * y_i <= k max y.
//        M = max y. f32: k = 1e-5; bf16: the output rounding, u = 3.9e-3 relative at most, plus the
//        f32 part -> 8e-3.
//   bwd: dx_i = y_i (dy_i - s), s = sum_j dy_j y_j. The f32 sum errs by at most about n u
//        sum_j |dy_j y_j|; the subtraction and the products each by an ulp of their results:
//        |err_i| <= c u y_i (|dy_i| + sum_j |dy_j y_j|), M = the max of that over the checked
//        elements. This measure does not blow up where dy_i - s cancels. f32: k = 1e-5;
//        bf16: output rounding -> 8e-3.
// Measured on oneDNN 2.6 (jit:avx2 fwd, ref:any bwd) at the benchmark shapes, f32: fwd k = 1.5e-7
// (cols 128, 197) to 2.8e-7 (cols 1000), bwd 8e-8: the f32 bound has a 35x margin and stays under
// the worst case of a sequential sum (n u = 6e-5 at n = 1000) only because rounding errors do not
// all add up.
// A wrong row, column or a missing subtraction of s is O(M), hundreds of times the bound.
double error_bound(const Shape& s) { return s.dtype == DType::bf16 ? 8e-3 : 1e-5; }

Check verify(const Shape& s, const Inputs& in, const HostBuffer& out) {
  const auto rows = static_cast<std::size_t>(s.rows), cols = static_cast<std::size_t>(s.cols);
  const bool bwd = s.dir == Direction::bwd;
  // Whole rows, so that the reference is exact for every checked element: all rows up to ~2^18
  // elements, else a sample of rows (sample_indices keeps the first and last).
  const std::size_t row_limit = std::max<std::size_t>(16, (std::size_t(1) << 18) / cols);
  const std::vector<std::size_t> sampled = sample_indices(rows, row_limit, 17);
  std::vector<std::int64_t> pos(rows, -1);
  std::vector<std::size_t> idx;
  idx.reserve(sampled.size() * cols);
  for (std::size_t k = 0; k < sampled.size(); ++k) {
    pos[sampled[k]] = static_cast<std::int64_t>(k);
    for (std::size_t j = 0; j < cols; ++j) idx.push_back(sampled[k] * cols + j);
  }
  std::vector<double> ref(idx.size());
  double mag = 0, sumsq = 0;
  const auto nrows = static_cast<std::int64_t>(sampled.size());
#pragma omp parallel reduction(max : mag) reduction(+ : sumsq)
  {
    std::vector<double> a(cols), b(cols);
#pragma omp for
    for (std::int64_t k = 0; k < nrows; ++k) {
      const std::size_t base = sampled[static_cast<std::size_t>(k)] * cols;
      double* r = ref.data() + static_cast<std::size_t>(k) * cols;
      if (!bwd) {
        for (std::size_t j = 0; j < cols; ++j) a[j] = in.x.get(base + j);
        reference_fwd(a.data(), cols, r);
        for (std::size_t j = 0; j < cols; ++j) mag = std::max(mag, std::fabs(r[j]));
      } else {
        double abs_sum = 0;
        for (std::size_t j = 0; j < cols; ++j) {
          a[j] = in.y.get(base + j), b[j] = in.dy.get(base + j);
          abs_sum += std::fabs(a[j] * b[j]);
        }
        reference_bwd(a.data(), b.data(), cols, r);
        for (std::size_t j = 0; j < cols; ++j) mag = std::max(mag, std::fabs(a[j]) * (std::fabs(b[j]) + abs_sum));
      }
      for (std::size_t j = 0; j < cols; ++j) sumsq += r[j] * r[j];
    }
  }
  const double rms = std::sqrt(sumsq / static_cast<double>(idx.size()));
  const double tol = error_bound(s) * mag / (rms > 0 ? rms : 1.0);
  Check c = compare(
      out, idx,
      [&](std::size_t i) {
        return ref[static_cast<std::size_t>(pos[i / cols]) * cols + i % cols];
      },
      tol);
  if (!c.ok) return c;
  for (std::size_t i = s.elements(); i < out.count(); ++i)
    if (!std::isnan(out.get(i))) {
      char buf[160];
      std::snprintf(buf, sizeof buf, "guard element %zu after the %zu outputs was written (%g)", i, s.elements(),
                    out.get(i));
      c.ok = false;
      c.message = buf;
      return c;
    }
  return c;
}

HOTOPS_DEFINE_FAMILY(SoftmaxFamily);

}  // namespace hotops::softmax
