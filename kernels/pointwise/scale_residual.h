// scale_residual: a ConvNeXt block's layer scale and residual add in one pass, over [rows, cols]
// row-major (rows the N·H·W positions of an NHWC tensor, cols its channels), gamma per column:
//   fwd  y[r, c]  = x[r, c] + gamma[c] * z[r, c]            (x the block's input, z its branch's output)
//   bwd  dz[r, c] = gamma[c] * dy[r, c], stored in the dtype;
//        dgamma[c] = sum over r of dy[r, c] * z[r, c] (f32);
//        dbias[c]  = sum over r of the stored dz[r, c] (f32, optional: the bias gradient of the dense
//                    layer that produced z, which reads dz next).
// The residual's own gradient, dx = dy, is the identity: a step that needs its input's gradient adds
// dy where the branch's gradient lands. x, z, y, dy and dz are in the problem's dtype (f32 or bf16);
// gamma, dgamma and dbias are f32 in both (the master parameter and its gradients); all math in f32.
// CPU: OpenMP loops (bwd: per-chunk partial sums over fixed 256-row chunks, added in chunk order, so
// the sums do not depend on the thread count). CUDA: a grid-stride kernel (fwd); a kernel over 32-column
// by 64-row tiles that writes dz and each tile's partial sums, then col_finish (hotops/cuda_colsum.cuh).
// Names: scale_residual/<backend>/<f32|bf16>/<fwd|bwd>/shape:<model.layer>/batch:B/dims:Bx...xcols.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "hotops/buffer.h"
#include "hotops/op.h"
#include "hotops/plan.h"

namespace hotops::pointwise::scale_residual {

struct Shape {
  Direction dir = Direction::fwd;  // fwd or bwd
  DType dtype = DType::f32;
  std::int64_t rows = 1, cols = 1;
  std::int64_t count() const { return rows * cols; }
};
Shape shape_of(const Problem& p);  // rows: the product of dims but the last; cols: the last

// x, z and dy uniform in [-1, 1) in the dtype; gamma uniform in [0.5, 1.5), f32 (distinct per
// channel, so that a wrong channel shows).
struct Inputs {
  HostBuffer x;      // fwd
  HostBuffer z;      // both
  HostBuffer dy;     // bwd
  HostBuffer gamma;  // [cols] f32
};
Inputs make_inputs(const Shape& s, std::uint64_t seed);
struct Outputs {
  HostBuffer out;            // y (fwd) or dz (bwd), [rows, cols] in the dtype
  HostBuffer dgamma, dbias;  // bwd: [cols] f32
};
Outputs make_outputs(const Shape& s);

// y or dz against the double reference within the f32 math's and the dtype's rounding; dgamma and
// dbias, every column, each within a bound scaled by that column's sum of |terms|
// (scale_residual.cpp derives both).
Check verify(const Shape& s, const Inputs& in, const Outputs& out);
// The reference of element i of y or dz, in double.
double reference(const Shape& s, const Inputs& in, std::size_t i);

// The tensors, host memory on the CPU, device memory on CUDA. fwd may run in place over z (out == z);
// bwd over dy (out == dy): each element is read before it is written, by the same thread.
struct Args {
  const void* x = nullptr;      // fwd: [rows, cols], the dtype
  const void* z = nullptr;      // [rows, cols], the dtype
  const void* dy = nullptr;     // bwd: [rows, cols], the dtype
  const float* gamma = nullptr; // [cols]
  void* out = nullptr;          // y (fwd) or dz (bwd)
  float* dgamma = nullptr;      // bwd: [cols]
  float* dbias = nullptr;       // bwd, optional: [cols]
};
HOTOPS_PLAN_FACTORIES(Shape, Args);  // CPU: OpenMP loops; CUDA: hotops' kernels

// The family's part for this op: its problems (both directions, backends and dtypes for `args`), its
// work and its benchmark case.
void expand(const std::vector<Arg>& args, std::vector<Problem>& out);
Work work(const Problem& p);
std::unique_ptr<Case> make_case(const Problem& p);

}  // namespace hotops::pointwise::scale_residual
