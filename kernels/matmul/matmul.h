// The matmul family: mm (A·B), addmm (beta·bias + alpha·A·B, PyTorch semantics) and bmm (batched),
// forward and both backward directions, on oneDNN (CPU) and cuBLASLt (CUDA).
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "hotops/buffer.h"
#include "hotops/op.h"
#include "hotops/op_family.h"
#include "hotops/plan.h"

namespace hotops::matmul {

enum class Op { mm, addmm, bmm };

// Row-major operands, in PyTorch's terms:
//   fwd        out[b,m,n] = alpha * sum_k A[b,m,k] * B[b,k,n] + beta * bias[n]     (bias: addmm only)
//   bwd_data   dA[b,m,k]  = alpha * sum_n dOut[b,m,n] * B[b,k,n]
//   bwd_weight dB[b,k,n]  = alpha * sum_m A[b,m,k] * dOut[b,m,n];  dbias[n] = beta * sum_m dOut[m,n]
// mm and bmm have no bias; addmm has batch_count 1 (a Linear layer's rows are M). An operand stored
// transposed (trans_a: A as [b,k,m]; trans_b: B as [b,n,k], a PyTorch Linear's weight) has its
// gradient written in the same layout. A Linear layer y = x W^T + bias (W [N, K]) is addmm with
// trans_b: fwd gives y, bwd_data dx, bwd_weight dW and dbias.
struct Shape {
  Op op = Op::mm;
  Direction dir = Direction::fwd;
  DType dtype = DType::f32;  // f32, bf16, or tf32 (f32 storage, TF32 tensor cores; CUDA only)
  std::int64_t batch_count = 1, M = 1, N = 1, K = 1;
  bool trans_a = false, trans_b = false;
  double alpha = 1, beta = 1;
  // addmm fwd: a ReLU after the bias, in the same GEMM (a hidden dense layer's activation: cublasLt's
  // bias + ReLU epilogue, oneDNN's ReLU post-op).
  bool relu = false;
  // mm: the output written in f32 (a weight gradient for f32 master weights), A and B in the dtype.
  bool f32_out = false;
  // CUDA: choose the cublasLt algorithm by timing candidates at setup (on the plan's own scratch
  // operands), instead of taking the heuristic's first.
  bool autotune = false;
  // fwd and bwd_data: out += C, C (Args::c) in out's layout and dtype, added unscaled after alpha and
  // the bias; the residual a model folds into its GEMM (cublasLt's beta = 1 C, oneDNN's binary add
  // post-op). No named problem sets it.
  bool residual = false;
  // CUDA: split-K partial sums reduced in f32 only, never rounded to a bf16 output
  // (gpu::GemmDesc::reduce_in_compute), for a mixed-precision model's GEMMs.
  bool reduce_in_compute = false;
};

Shape shape_of(const Problem& p);
// The dtype of the output: f32 with f32_out, else the dtype (tf32: f32 storage).
DType out_dtype(const Shape& s);

// The tensors of one matmul direction (see Shape for each one's layout); each direction reads and
// writes only its own, the others stay null.
struct Args {
  const void* a = nullptr;     // A        fwd, bwd_weight
  const void* b = nullptr;     // B        fwd, bwd_data
  const void* bias = nullptr;  // bias[N]  addmm fwd (the plan applies beta)
  const void* dout = nullptr;  // dOut     bwd_data, bwd_weight
  void* out = nullptr;         // out (fwd), dA (bwd_data) or dB (bwd_weight)
  void* dbias = nullptr;       // dbias[N] addmm bwd_weight
  const void* c = nullptr;     // residual: added to out (fwd, bwd_data), out's layout; not out itself
};

// Inputs, seeded from the problem name so every backend sees the same numbers.
struct Inputs {
  HostBuffer a;     // [B,M,K]  fwd, bwd_weight ([B,K,M] with trans_a)
  HostBuffer b;     // [B,K,N]  fwd, bwd_data   ([B,N,K] with trans_b)
  HostBuffer bias;  // [N]      addmm fwd
  HostBuffer dout;  // [B,M,N]  bwd_data, bwd_weight
};
Inputs make_inputs(const Shape& s, std::uint64_t seed);

enum class Operand { a, b, dout };  // which of a direction's inputs
const HostBuffer& operand(const Inputs& in, Operand o);
const void* operand(const Args& a, Operand o);

// The product a direction computes, in row-major terms with its output dense as stored:
// D[b][r][c] = alpha * sum_q X[b][r][q] * Y[b][q][c], where X ([rows, depth]) and Y ([depth, cols])
// are inputs read as stored or as the transpose of what is stored (x_t, y_t). An output stored
// transposed (dA with trans_a, dB with trans_b) is computed as D^T = Y^T X^T. Every operand of a
// batch is packed: each matrix right after the previous.
struct Product {
  Operand x = Operand::a, y = Operand::b;
  bool x_t = false, y_t = false;
  std::int64_t rows = 0, cols = 0, depth = 0;
};
Product product(const Shape& s);

// The primary output of a direction (out, dA or dB) and, for addmm bwd_weight, dbias.
struct Outputs {
  HostBuffer primary;
  HostBuffer dbias;
};
Outputs make_outputs(const Shape& s);
std::size_t primary_count(const Shape& s);

// Reference, double accumulation: one element of the primary output / of dbias.
double reference_primary(const Shape& s, const Inputs& in, std::size_t idx);
double reference_dbias(const Shape& s, const Inputs& in, std::size_t n);
// Every element, for the tests.
void reference(const Shape& s, const Inputs& in, Outputs& out);

// Verifies outputs (sampled when large) against the reference.
Check verify(const Shape& s, const Inputs& in, const Outputs& out);

// Named shapes from real models, with the batch axis (see shapes.cpp).
struct NamedShape {
  std::string name;                     // e.g. "bert.ffn_up"
  std::vector<Op> ops;                  // which ops it is benchmarked for
  std::int64_t rows_per_sample;         // M = batch * rows_per_sample (mm/addmm); 0: no batch axis
  std::int64_t heads;                   // bmm: batch_count = batch * heads
  std::int64_t M, N, K;                 // M is used when there is no batch axis, or for bmm
  std::vector<std::int64_t> batches;    // default batch sizes
  bool cuda_only = false;               // too slow to be worth a CPU run in every sweep
};
const std::vector<NamedShape>& named_shapes();

HOTOPS_PLAN_FACTORIES(Shape, Args);  // CPU: oneDNN matmul; CUDA: cublasLt (gpu::LtGemm)

// Why the CPU cannot run `p` ("" when it can): a dtype it has no matmul for, or oneDNN's answer.
std::string cpu_unsupported_reason(const Problem& p);
// The same for a plan's shape (a model's layer), from the descriptors alone: no primitive is made.
std::string cpu_unsupported_reason(const Shape& s);
const Family& family();

}  // namespace hotops::matmul
