// bias_grad: a dense layer's bias gradient on its own, addmm's dbias (matmul.h) for a layer whose
// weight gradient is an mm (a model with f32 master weights, whose dW is written in f32) and whose
// bias gradient no fused op computes. Over a row-major [rows, cols] output gradient dy:
//   db[c] = sum over r of dy[r, c], f32 (dy in f32 or bf16, summed in f32).
// CPU: the column-sum loop of hotops/cpu_colsum.h (OpenMP over blocks of 64 columns). CUDA: per-64-row
// partial sums, a thread per column, then col_finish (hotops/cuda_colsum.cuh); deterministic.
// Names: bias_grad/<backend>/<f32|bf16>/bwd/shape:<model.layer>/batch:B/M:rows/N:cols.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "hotops/buffer.h"
#include "hotops/op.h"
#include "hotops/plan.h"

namespace hotops::matmul::bias_grad {

struct Shape {
  DType dtype = DType::f32;  // dy's: f32 or bf16
  std::int64_t rows = 1, cols = 1;
};
Shape shape_of(const Problem& p);

// dy uniform in [-1, 1), in the dtype.
struct Inputs {
  HostBuffer dy;  // [rows, cols]
};
Inputs make_inputs(const Shape& s, std::uint64_t seed);
HostBuffer make_output(const Shape& s);  // db: [cols] f32

// Reference, double accumulation: db[c], and the sum of its terms' magnitudes.
double reference(const Shape& s, const Inputs& in, std::size_t col, double* abs_sum = nullptr);
// Every column of db against the reference, each within a bound scaled by its sum of |dy|
// (bias_grad.cpp derives it).
Check verify(const Shape& s, const Inputs& in, const HostBuffer& db);

// The tensors: host memory on the CPU, device memory on CUDA.
struct Args {
  const void* dy = nullptr;  // [rows, cols], the dtype
  float* db = nullptr;       // [cols]
};
HOTOPS_PLAN_FACTORIES(Shape, Args);  // CPU: hotops' column-sum loop; CUDA: hotops' two-stage kernels
// The most rows the CUDA plan takes (65535 chains of 64 rows: its grid's y axis).
constexpr std::int64_t kCudaMaxRows = std::int64_t(65535) * 64;

// The models' bias gradients that run through this op: [batch * rows_per_sample, cols].
struct NamedShape {
  std::string name;  // the dense layer, as the matmul shapes name it (e.g. "bert.qkv")
  std::int64_t rows_per_sample, cols;
  std::vector<std::int64_t> batches;
};
const std::vector<NamedShape>& named_shapes();

// The family's part for this op: its problems, its test problems, its work and its benchmark case.
std::vector<Problem> benchmark_problems(const std::vector<std::int64_t>& batches);
std::vector<Problem> test_problems();
Work work(const Problem& p);
std::unique_ptr<Case> make_case(const Problem& p);

}  // namespace hotops::matmul::bias_grad
