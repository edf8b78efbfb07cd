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

namespace hotops::matmul {

enum class Op { mm, addmm, bmm };

// Row-major operands, in PyTorch's terms:
//   fwd        out[b,m,n] = alpha * sum_k A[b,m,k] * B[b,k,n] + beta * bias[n]     (bias: addmm only)
//   bwd_data   dA[b,m,k]  = alpha * sum_n dOut[b,m,n] * B[b,k,n]
//   bwd_weight dB[b,k,n]  = alpha * sum_m A[b,m,k] * dOut[b,m,n];  dbias[n] = beta * sum_m dOut[m,n]
// mm and bmm have alpha = 1 and no bias; `batch_count` is 1 except for bmm.
struct Shape {
  Op op = Op::mm;
  Direction dir = Direction::fwd;
  DType dtype = DType::f32;
  std::int64_t batch_count = 1, M = 1, N = 1, K = 1;
  double alpha = 1, beta = 1;
};

Shape shape_of(const Problem& p);

// Inputs, seeded from the problem name so every backend sees the same numbers.
struct Inputs {
  HostBuffer a;     // [B,M,K]  fwd, bwd_weight
  HostBuffer b;     // [B,K,N]  fwd, bwd_data
  HostBuffer bias;  // [N]      addmm fwd
  HostBuffer dout;  // [B,M,N]  bwd_data, bwd_weight
};
Inputs make_inputs(const Shape& s, std::uint64_t seed);

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

HOTOPS_FAMILY_ENTRY_POINTS(make_cpu, cpu_unsupported_reason, make_cuda);

}  // namespace hotops::matmul
