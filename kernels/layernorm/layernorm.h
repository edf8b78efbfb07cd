// The layernorm family: torch.nn.LayerNorm over the last dimension (normalized_shape = hidden) with
// an elementwise affine gamma and beta, on oneDNN (CPU) and hand-written CUDA kernels.
//
//   fwd  per row r of [rows, H]: mean = sum x / H, var = sum (x - mean)^2 / H (biased),
//        rstd = 1 / sqrt(var + eps), y = (x - mean) * rstd * gamma + beta;
//        mean and rstd are saved ([rows] each, f32) for bwd.
//   bwd  from x, dy, gamma and the saved mean / rstd, with xhat = (x - mean) * rstd, g = gamma * dy:
//        dx = rstd * (g - sum(g) / H - xhat * sum(g * xhat) / H)   (sums over the row),
//        dgamma = sum over rows of dy * xhat, dbeta = sum over rows of dy.
// x, y, dy and dx are in the problem's dtype (f32 or bf16); gamma, beta, dgamma, dbeta, mean and rstd
// are f32 in both dtypes (as with PyTorch autocast, where LayerNorm's parameters stay f32), and every
// statistic and sum is accumulated in f32 or wider. The family's second op, layernorm_dbias (the
// backward fused with a residual gradient and the next dense layer's bias gradient), is in
// layernorm_dbias.h.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "hotops/buffer.h"
#include "hotops/op.h"
#include "hotops/op_family.h"
#include "hotops/plan.h"

namespace hotops::layernorm {

struct Shape {
  Direction dir = Direction::fwd;  // fwd or bwd
  DType dtype = DType::f32;
  std::int64_t batch = 1, tokens = 1, hidden = 1;
  double eps = 1e-5;

  std::int64_t rows() const { return batch * tokens; }
  std::int64_t count() const { return rows() * hidden; }
};

Shape shape_of(const Problem& p);

struct Inputs {
  HostBuffer x;            // [rows, H], the dtype
  HostBuffer dy;           // bwd: [rows, H], the dtype
  HostBuffer gamma, beta;  // [H] f32 (bwd reads gamma only)
  HostBuffer mean, rstd;   // bwd: [rows] f32, the statistics of x as fwd saves them
};
Inputs make_inputs(const Shape& s, std::uint64_t seed);

struct Outputs {
  HostBuffer out;            // y (fwd) or dx (bwd)
  HostBuffer mean, rstd;     // fwd
  HostBuffer dgamma, dbeta;  // bwd
};
Outputs make_outputs(const Shape& s);

// The reference, double accumulation: the per-row and per-column passes are done at construction,
// then any element of `out` is O(1).
class Reference {
 public:
  Reference(const Shape& s, const Inputs& in);
  double out(std::int64_t i) const;      // y or dx
  std::vector<double> mean, rstd;        // fwd
  std::vector<double> dgamma, dbeta;     // bwd

 private:
  const Shape& s_;
  const Inputs& in_;
  std::vector<double> c1_, c2_;  // bwd, per row: sum(g) / H and sum(g * xhat) / H
};

// Verifies every output of the direction (out sampled when large) against the reference.
Check verify(const Shape& s, const Inputs& in, const Outputs& out);
// Its bounds (layernorm.cpp derives them), as compare() takes them: y or dx, and a sum of n f32 terms
// (mean and rstd over H, dgamma and dbeta over the rows); accumulation_bound(n): the relative error
// of n terms added in f32.
double out_tolerance(const Shape& s);
double sum_tolerance(std::int64_t n);
double accumulation_bound(std::int64_t n);

// The tensors of one layernorm, each [rows, H] row-major in the shape's dtype or f32 as named.
//   fwd reads x, gamma, beta and writes y, mean, rstd;
//   bwd reads x, dy, gamma, mean, rstd (the statistics fwd saved) and writes dx, dgamma, dbeta.
struct Args {
  const void* x = nullptr;      // [rows, H], dtype
  const void* gamma = nullptr;  // [H] f32
  const void* beta = nullptr;   // [H] f32; fwd (oneDNN's bwd is also given it where passed: it only reads gamma)
  void* y = nullptr;            // fwd: [rows, H], dtype
  void* mean = nullptr;         // fwd: [rows] f32, written
  void* rstd = nullptr;         // fwd: [rows] f32, written
  const void* dy = nullptr;          // bwd: [rows, H], dtype
  const void* saved_mean = nullptr;  // bwd: [rows] f32
  const void* saved_rstd = nullptr;  // bwd: [rows] f32
  void* dx = nullptr;                // bwd: [rows, H], dtype
  void* dgamma = nullptr;            // bwd: [H] f32
  void* dbeta = nullptr;             // bwd: [H] f32
};
HOTOPS_PLAN_FACTORIES(Shape, Args);  // CPU: oneDNN; CUDA: hotops' kernels

std::string onednn_unsupported_reason(const Problem& p);
const Family& family();

}  // namespace hotops::layernorm
