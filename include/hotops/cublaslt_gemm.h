// The one cublasLt GEMM of hotops (matmul, lstm_cell, the models): its descriptors, the algorithm
// chosen once at setup (the heuristic's first, or with autotune the fastest of several timed), and
// the call.
#pragma once
#include <cublasLt.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "hotops/cuda_util.h"

namespace hotops::gpu {

// D[m x n] = alpha op(A) op(B) (+ bias over the rows of D) (+ beta C), column-major, f32
// accumulation; with batch > 1, that many such GEMMs at fixed strides in one call.
struct GemmDesc {
  cublasOperation_t opa = CUBLAS_OP_N, opb = CUBLAS_OP_N;
  std::int64_t m = 0, n = 0, k = 0;
  std::int64_t lda = 0, ldb = 0, ldd = 0;            // leading dimensions; 0: packed
  std::int64_t batch = 1;
  std::int64_t stride_a = 0, stride_b = 0, stride_d = 0;  // elements from one matrix to the next; 0: packed
  cudaDataType_t ab = CUDA_R_32F;                    // A and B
  cudaDataType_t cd = CUDA_R_32F;                    // C, D and the bias
  cublasComputeType_t compute = CUBLAS_COMPUTE_32F;  // no TF32 unless CUBLAS_COMPUTE_32F_FAST_TF32
  const void* bias = nullptr;                        // a bias epilogue (fixed at setup), + ReLU if relu
  bool relu = false;
  // The BGRADA epilogue: the sums of op(A)'s rows over k (a bias's gradient), D's type, written here.
  void* bias_grad = nullptr;
  float alpha = 1.f;
  float beta = 0.f;
  // Split-K partial sums reduced in the compute type (f32) only, never in a narrower D type (cublasLt's
  // CUBLASLT_REDUCTION_SCHEME_OUTPUT_TYPE / INPLACE round each partial to D's type).
  bool reduce_in_compute = false;
  // Choose the algorithm by timing, on the operands BoundGemm binds: the heuristic's first
  // kTuneHeuristics algorithms and split-K variants of its first kSplitKAlgos (2, 3, 4, 6, 8 slices,
  // partials reduced in f32), each timed after a warm-up call by gpu::best_batch_ms, the fastest
  // kept. Writes D during setup, so only for GEMMs whose D is not also read (beta 0, or C distinct
  // from D).
  bool autotune = false;
};

constexpr int kTuneHeuristics = 16;
constexpr int kSplitKAlgos = 3;  // the heuristic's first algorithms whose split-K variants are timed too

// One operand as cublasLt sees it: rows x cols, column-major, `ld` elements from one column to the
// next and, in a batch, `stride` elements from one matrix to the next.
struct MatrixLayout {
  std::int64_t rows = 0, cols = 0, ld = 0, stride = 0;
};
struct GemmLayouts {
  MatrixLayout a, b, d;  // C shares D's
};
// The layouts LtGemm gives cublasLt for `d` (its zeros resolved to packed); host only, no GPU needed.
GemmLayouts gemm_layouts(const GemmDesc& d);

// "algo I tile T stages S splitK K": a cublasLt algorithm's configuration, for labels.
std::string algo_label(const cublasLtMatmulAlgo_t& algo);

// Owners of cublasLt's descriptors (released however the constructor that made them ends).
struct LtMatmulDesc {
  cublasLtMatmulDesc_t h = nullptr;
  LtMatmulDesc() = default;
  LtMatmulDesc(const LtMatmulDesc&) = delete;
  LtMatmulDesc& operator=(const LtMatmulDesc&) = delete;
  ~LtMatmulDesc() { if (h) cublasLtMatmulDescDestroy(h); }
};
struct LtLayout {
  cublasLtMatrixLayout_t h = nullptr;
  LtLayout() = default;
  LtLayout(const LtLayout&) = delete;
  LtLayout& operator=(const LtLayout&) = delete;
  ~LtLayout() { if (h) cublasLtMatrixLayoutDestroy(h); }
};

class LtGemm {
 public:
  // Takes the heuristic's first algorithm for the shared workspace (gpu::cublas_workspace()); with
  // GemmDesc::autotune, also the candidates tune() times (BoundGemm calls it with its operands).
  // Throws Error(unsupported) naming `what` and the GEMM when cublasLt offers none.
  LtGemm(const GemmDesc& d, const std::string& what);
  // The same, or null where cublasLt offers no algorithm (the caller has a fallback or its own words).
  static std::unique_ptr<LtGemm> if_supported(const GemmDesc& d, const std::string& what);

  // On gpu::stream(); C (read when beta != 0) defaults to D.
  void run(const void* A, const void* B, void* D, const void* C = nullptr) const;
  // Points the bias epilogue at another bias, or the bias-gradient epilogue at another output (a plan,
  // whose caller passes its tensors to each run): host-side only, it queues nothing.
  void set_vector(const void* v);
  // GemmDesc::autotune: times the candidates on these operands and keeps the fastest (no-op otherwise).
  // Once per problem per process: a later GEMM of the same description, operand alignments (mod 256
  // bytes) and device takes the first one's choice without timing, so that every variant of a step
  // runs the same algorithms and computes the same outputs.
  void tune(const void* A, const void* B, void* D, const void* C);
  int algo_id() const;             // CUBLASLT_ALGO_CONFIG_ID
  std::string algo_label() const { return gpu::algo_label(algo_); }

 private:
  // Sets *found instead of throwing when there is no algorithm (where found is not null).
  LtGemm(const GemmDesc& d, const std::string& what, bool* found);

  float alpha_;
  float beta_;
  bool has_vector_ = false;  // a bias or bias-gradient epilogue
  LtMatmulDesc desc_;
  LtLayout la_, lb_, ld_;
  cublasLtMatmulAlgo_t algo_{};
  std::vector<cublasLtMatmulAlgo_t> candidates_;  // autotune: what tune() times (the first is algo_)
  GemmDesc desc_copy_;                            // autotune: the description, the key of tune()'s cache
};

// How many autotunes LtGemm::tune has run in this process (not those it answered from its cache).
int lt_gemm_tunings();

// An LtGemm whose operands are fixed buffers of a model's step, bound at setup.
class BoundGemm {
 public:
  BoundGemm(const GemmDesc& d, const std::string& what, const void* A, const void* B, void* D, const void* C = nullptr)
      : g_(d, what), a_(A), b_(B), d_(D), c_(C) {
    g_.tune(A, B, D, C);
  }
  void run() const { g_.run(a_, b_, d_, c_); }
  std::string algo_label() const { return g_.algo_label(); }

 private:
  LtGemm g_;
  const void* a_;
  const void* b_;
  void* d_;
  const void* c_;
};

}  // namespace hotops::gpu
