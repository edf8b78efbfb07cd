// layernorm_dbias: LayerNorm's backward fused with the residual gradient that joins its result and
// with the column sums of that result (the bias gradient of the dense layer that reads it next), as
// BERT's and ViT's encoder layers run it (bwd only). Over [rows, H], with xhat = (x - mean) * rstd
// and g = gamma * dy:
//   dx[r, c]  = rstd * (g - sum(g) / H - xhat * sum(g * xhat) / H) + dres[r, c] (dres optional);
//   dgamma[c] = sum over r of dy * xhat, dbeta[c] = sum over r of dy (f32);
//   dbias[c]  = sum over r of the stored dx[r, c] (f32, optional).
// dx is optional too (a pre-LN layer's first LayerNorm). A second gradient reaching the output is
// added before, by the data-gradient GEMM's residual (matmul's `c`): the op takes one dy.
// CPU: OpenMP over rows with per-thread dgamma / dbeta partials, then dx's column sums. CUDA: one
// kernel, a warp per row over a grid that fills the GPU, writing dx and each block's partial column
// sums, then col_finish (hotops/cuda_colsum.cuh).
// Names: layernorm_dbias/<backend>/<f32|bf16>/bwd/shape:<model.layer>/batch:B/tokens:T/hidden:H/
// eps:E/dres:<yes|no>.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "hotops/buffer.h"
#include "hotops/op.h"
#include "hotops/plan.h"
#include "kernels/layernorm/layernorm.h"

namespace hotops::layernorm::dbias {

constexpr std::int64_t kCudaMaxHidden = 1024;  // the CUDA kernel keeps a row in a warp's registers

struct Shape {
  DType dtype = DType::f32;
  std::int64_t batch = 1, tokens = 1, hidden = 1;  // CUDA: hidden <= kCudaMaxHidden
  double eps = 1e-5;    // of the forward whose statistics the inputs hold
  bool dres = false;    // whether the benchmark passes dres (the plan takes it or not on each run)

  std::int64_t rows() const { return batch * tokens; }
  std::int64_t count() const { return rows() * hidden; }
  layernorm::Shape backward() const;  // the layernorm op's bwd of the same tensors
};
Shape shape_of(const Problem& p);

// The layernorm op's bwd inputs (x, dy, gamma, the saved mean and rstd), and dres uniform in
// [-1, 1) in the dtype where the shape has it.
struct Inputs {
  layernorm::Inputs ln;
  HostBuffer dres;
};
Inputs make_inputs(const Shape& s, std::uint64_t seed);
struct Outputs {
  HostBuffer dx;                    // [rows, H], the dtype
  HostBuffer dgamma, dbeta, dbias;  // [H] f32
};
Outputs make_outputs(const Shape& s);

// dx, dgamma and dbeta as the layernorm op checks its bwd (dx with dres added); dbias, a sample of
// columns, each within a bound scaled by that column's sums of |dx| and of dx's terms
// (layernorm_dbias.cpp derives it).
Check verify(const Shape& s, const Inputs& in, const Outputs& out);

// The tensors, host memory on the CPU, device memory on CUDA.
struct Args {
  const void* x = nullptr;            // [rows, H], dtype: the LayerNorm's input
  const void* dy = nullptr;           // [rows, H], dtype: the gradient of its output
  const float* gamma = nullptr;       // [H]
  const float* saved_mean = nullptr;  // [rows]
  const float* saved_rstd = nullptr;  // [rows]
  const void* dres = nullptr;         // [rows, H], dtype, or null: added to dx
  void* dx = nullptr;                 // [rows, H], dtype, or null (then no dbias)
  float* dgamma = nullptr;            // [H]
  float* dbeta = nullptr;             // [H]
  float* dbias = nullptr;             // [H], or null: the column sums of dx
};
HOTOPS_PLAN_FACTORIES(Shape, Args);  // CPU: OpenMP loop; CUDA: hotops' kernels

// The family's part for this op: its problems (the layernorm op's args and dres), its work and its
// benchmark case.
void expand(const std::vector<Arg>& args, bool dres, std::vector<Problem>& out);
Work work(const Problem& p);
std::unique_ptr<Case> make_case(const Problem& p);

}  // namespace hotops::layernorm::dbias
