// The cublasLt GEMM each matmul direction runs on CUDA, as host-side data, so that the mapping of
// PyTorch's row-major operands onto cublasLt's column-major ones can be checked without a GPU.
#pragma once
#include "hotops/cublaslt_gemm.h"
#include "kernels/matmul/matmul.h"

namespace hotops::matmul {

// D^T = op(A) op(B) in column-major terms: the row-major output seen as its column-major transpose,
// so no operand is copied. The descriptor carries no device pointers: the caller adds them for
// the epilogues named here.
struct CudaGemm {
  gpu::GemmDesc desc;
  Operand a = Operand::a, b = Operand::b;  // cublasLt's A and B
  bool bias = false;       // addmm fwd: the BIAS (RELU_BIAS with relu) epilogue adds beta * bias over D's rows (N)
  bool bias_grad = false;  // addmm bwd_weight with beta 1, dOut as cublasLt's A: BGRADA sums it over k (M), exactly dbias
};
CudaGemm cuda_gemm(const Shape& s);

}  // namespace hotops::matmul
