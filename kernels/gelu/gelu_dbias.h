// gelu_dbias: the backward of a dense layer's GELU (erf) fused with that layer's bias gradient, as
// the FFN of BERT and ViT runs it (bwd only). Over a [rows, cols] tensor, x the GELU's input:
//   dx[r, c]  = dy[r, c] * gelu'(x[r, c]), stored in the dtype (f32 or bf16);
//   dbias[c]  = sum over r of the stored dx[r, c], f32 (the sum of what the next GEMMs read).
// CPU: an OpenMP loop and the column sums (hotops/cpu_colsum.h). CUDA: one kernel over 4-wide vectors
// that also writes per-32-row partial column sums, then col_finish (hotops/cuda_colsum.cuh).
// Names: gelu_dbias/<backend>/<f32|bf16>/bwd/shape:<model.layer>/batch:B/dims:Bx...xcols/approx:none.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "hotops/buffer.h"
#include "hotops/op.h"
#include "hotops/plan.h"

namespace hotops::gelu::dbias {

struct Shape {
  DType dtype = DType::f32;
  std::int64_t rows = 1, cols = 4;  // CUDA: cols a multiple of 4
};
Shape shape_of(const Problem& p);  // rows: the product of dims but the last; cols: the last

// x uniform in [-5, 5) (gelu's range, as the gelu op) and dy in [-1, 1), in the dtype.
struct Inputs {
  HostBuffer x, dy;
};
Inputs make_inputs(const Shape& s, std::uint64_t seed);
struct Outputs {
  HostBuffer dx;     // [rows, cols], the dtype
  HostBuffer dbias;  // [cols] f32
};
Outputs make_outputs(const Shape& s);

// dx against the double reference as the gelu op bounds it; dbias, a sample of columns, each within
// a bound scaled by that column's sum of |dx| (gelu_dbias.cpp derives it).
Check verify(const Shape& s, const Inputs& in, const Outputs& out);

// The tensors, host memory on the CPU, device memory on CUDA. dx may be dy (in place, as the
// model's backward runs it): each element is read before it is written, by the same thread.
struct Args {
  const void* x = nullptr;   // [rows, cols], the dtype: the GELU's input
  const void* dy = nullptr;  // [rows, cols], the dtype: the gradient of its output
  void* dx = nullptr;        // [rows, cols], the dtype
  float* dbias = nullptr;    // [cols]
};
HOTOPS_PLAN_FACTORIES(Shape, Args);  // CPU: OpenMP loop; CUDA: hotops' kernels

// The family's part for this op: its problems (each named shape's args, as the gelu op names them),
// its test problems, its work and its benchmark case.
void expand(const std::vector<Arg>& args, std::vector<Problem>& out);
Work work(const Problem& p);
std::unique_ptr<Case> make_case(const Problem& p);

}  // namespace hotops::gelu::dbias
