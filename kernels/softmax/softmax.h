// The softmax family: torch.softmax over the last dimension of a [rows, cols] tensor (fwd) and its
// gradient (bwd: dx = y * (dy - sum(dy * y)) per row, from the output y and dy), on the CPU
// (oneDNN's softmax primitives) and on CUDA (hand-written kernels: one warp per row up to
// kWarpMaxCols columns, the row in registers; one block per row beyond).
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "hotops/buffer.h"
#include "hotops/op.h"
#include "hotops/op_family.h"
#include "hotops/plan.h"

namespace hotops::softmax {

// One problem: `rows` independent rows of `cols` contiguous elements, followed by kGuard elements
// that no op may write.
struct Shape {
  Direction dir = Direction::fwd;
  DType dtype = DType::f32;
  std::int64_t rows = 1;
  std::int64_t cols = 1;
  std::size_t elements() const { return static_cast<std::size_t>(rows * cols); }
};
constexpr std::size_t kGuard = 8;
constexpr std::int64_t kWarpMaxCols = 1024;

Shape shape_of(const Problem& p);

// Inputs, seeded from the problem name so every backend sees the same numbers.
//   fwd: x uniform in [-4, 4) (exp spans e^8 within a row, like attention scores).
//   bwd: y = softmax(x') of such an x', computed in double and rounded to the dtype (a real
//        softmax output: positive, rows summing to 1 up to that rounding); dy uniform in [-1, 1).
struct Inputs {
  HostBuffer x;   // fwd
  HostBuffer y;   // bwd
  HostBuffer dy;  // bwd
};
Inputs make_inputs(const Shape& s, std::uint64_t seed);
HostBuffer make_output(const Shape& s);  // y (fwd) or dx (bwd): elements() + kGuard

// The reference in double over one row of n elements.
void reference_fwd(const double* x, std::size_t n, double* y);
void reference_bwd(const double* y, const double* dy, std::size_t n, double* dx);

// The per-element bound k (see softmax.cpp): |out - ref| <= k * max over the checked elements of
// the magnitude that the error scales with (|y| fwd; y (|dy| + sum |dy y|) bwd).
double error_bound(const Shape& s);

// Checks whole rows (all of them, or a seeded sample that always has the first and last) against
// the reference, and that the kGuard elements after the output are still poisoned (NaN).
Check verify(const Shape& s, const Inputs& in, const HostBuffer& out);

// The tensors of one softmax: fwd y = softmax(x); bwd dx = softmax_bwd(y, dy). `out` is y (fwd) or
// dx (bwd); each is [rows, cols] row-major in the shape's dtype.
struct Args {
  const void* x = nullptr;   // fwd
  const void* y = nullptr;   // bwd
  const void* dy = nullptr;  // bwd
  void* out = nullptr;
};
HOTOPS_PLAN_FACTORIES(Shape, Args);  // CPU: oneDNN; CUDA: hotops' kernels

std::string onednn_unsupported_reason(const Problem& p);
const Family& family();

}  // namespace hotops::softmax
