// The cublasLt GEMM (on strided views, the cublasGemmBatchedEx) each matmul direction runs on CUDA,
// as host-side data, so that the mapping of PyTorch's row-major operands onto cuBLAS' column-major
// ones can be checked without a GPU.
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

// How addmm bwd_weight computes its bias gradient on CUDA: cublasLt's BGRADA epilogue in the GEMM,
// or the GEMM alone then bias_grad's column sums of dOut (beta times them stored in the dtype). Per
// problem at setup, whichever timed faster (`timed`, the default: dbias_sums_are_faster), the sums
// where cublasLt fuses no epilogue for the GEMM, or forced to one of the two (tests, so that both
// are verified at any shape). Process-wide, read when a plan is made; the label names the choice and
// both times. CUDA builds only.
enum class DbiasPath { timed, epilogue, sums };
void set_cuda_dbias_path(DbiasPath p);
DbiasPath cuda_dbias_path();
// timed's rule: the column sums only where they are faster than the epilogue beyond a near tie
// (gpu::kRetimeTie), so that timings a few percent apart do not choose the path by process.
bool dbias_sums_are_faster(float sums_ms, float epilogue_ms);

// A bmm over strided views (Shape::views) is one cublasGemmBatchedEx over arrays of each batch
// item's pointers: cuda_gemm's operands, transposes, m, n, k and alpha, each matrix's leading
// dimension its View's ld. Item i = sample * heads + head of cublas' A, B and D starts at
// item_offset(a, heads, i) (b, d) elements from the pointer the caller gives for that tensor.
struct StridedGemm {
  CudaGemm gemm;
  View a, b, d;  // cublas' A (the tensor gemm.a), B (gemm.b), D (the output)
  std::int64_t heads = 1;
};
StridedGemm strided_gemm(const Shape& s);
inline std::int64_t item_offset(const View& v, std::int64_t heads, std::int64_t item) {
  return item / heads * v.per_sample + item % heads * v.per_head;
}

}  // namespace hotops::matmul
