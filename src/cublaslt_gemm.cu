#include "hotops/cublaslt_gemm.h"

#include "hotops/check.h"

namespace hotops::gpu {
namespace {

const char* type_name(cudaDataType_t t) {
  switch (t) {
    case CUDA_R_32F: return "f32";
    case CUDA_R_16BF: return "bf16";
    case CUDA_R_16F: return "f16";
    default: return "?";
  }
}

void make_layout(LtLayout& l, cudaDataType_t t, std::int64_t rows, std::int64_t cols, std::int64_t ld) {
  HOTOPS_CHECK_CUBLAS(cublasLtMatrixLayoutCreate(&l.h, t, static_cast<std::uint64_t>(rows), static_cast<std::uint64_t>(cols),
                                                 ld ? ld : rows));
}

}  // namespace

LtGemm::LtGemm(const GemmDesc& d, const std::string& what) : beta_(d.beta) {
  HOTOPS_CHECK(!d.relu || d.bias, what + ": a ReLU epilogue needs a bias");
  HOTOPS_CHECK_CUBLAS(cublasLtMatmulDescCreate(&desc_.h, d.compute, CUDA_R_32F));
  HOTOPS_CHECK_CUBLAS(cublasLtMatmulDescSetAttribute(desc_.h, CUBLASLT_MATMUL_DESC_TRANSA, &d.opa, sizeof d.opa));
  HOTOPS_CHECK_CUBLAS(cublasLtMatmulDescSetAttribute(desc_.h, CUBLASLT_MATMUL_DESC_TRANSB, &d.opb, sizeof d.opb));
  if (d.opa == CUBLAS_OP_N) make_layout(la_, d.ab, d.m, d.k, d.lda); else make_layout(la_, d.ab, d.k, d.m, d.lda);
  if (d.opb == CUBLAS_OP_N) make_layout(lb_, d.ab, d.k, d.n, d.ldb); else make_layout(lb_, d.ab, d.n, d.k, d.ldb);
  make_layout(ld_, d.cd, d.m, d.n, d.ldd);
  if (d.bias) {  // the bias takes D's type (cublasLt's default)
    const cublasLtEpilogue_t epi = d.relu ? CUBLASLT_EPILOGUE_RELU_BIAS : CUBLASLT_EPILOGUE_BIAS;
    HOTOPS_CHECK_CUBLAS(cublasLtMatmulDescSetAttribute(desc_.h, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi));
    HOTOPS_CHECK_CUBLAS(cublasLtMatmulDescSetAttribute(desc_.h, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &d.bias, sizeof d.bias));
  }
  cublasLtMatmulPreference_t pref = nullptr;
  HOTOPS_CHECK_CUBLAS(cublasLtMatmulPreferenceCreate(&pref));
  const std::uint64_t ws = kCublasWorkspaceBytes;
  cublasLtMatmulHeuristicResult_t results[kTuneHeuristics] = {};
  const int want = d.autotune ? kTuneHeuristics : 1;
  int found = 0;
  cublasStatus_t st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws);
  if (st == CUBLAS_STATUS_SUCCESS && d.reduce_in_compute) {
    const std::uint32_t mask = CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
    st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &mask, sizeof mask);
  }
  if (st == CUBLAS_STATUS_SUCCESS)
    st = cublasLtMatmulAlgoGetHeuristic(cublaslt(), desc_.h, la_.h, lb_.h, ld_.h, ld_.h, pref, want, results, &found);
  cublasLtMatmulPreferenceDestroy(pref);
  if (st != CUBLAS_STATUS_SUCCESS || found == 0) {
    if (st != CUBLAS_STATUS_SUCCESS && st != CUBLAS_STATUS_NOT_SUPPORTED) HOTOPS_CHECK_CUBLAS(st);
    throw Error(what + ": cublasLt has no algorithm for a " + type_name(d.ab) + " x " + type_name(d.ab) + " -> " +
                    type_name(d.cd) + " " + std::to_string(d.m) + "x" + std::to_string(d.n) + "x" + std::to_string(d.k) +
                    (d.bias ? (d.relu ? " GEMM with a bias + ReLU epilogue" : " GEMM with a bias epilogue") : " GEMM"),
                ErrorKind::unsupported);
  }
  algo_ = results[0].algo;
  if (!d.autotune) return;
  for (int i = 0; i < found; ++i) candidates_.push_back(results[i].algo);
  // Split-K variants of the first, where cublasLt accepts them for this GEMM within the workspace.
  for (const std::int32_t slices : {2, 3, 4, 6, 8}) {
    cublasLtMatmulAlgo_t a = algo_;
    const std::uint32_t scheme = CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
    cublasLtMatmulHeuristicResult_t check{};
    if (cublasLtMatmulAlgoConfigSetAttribute(&a, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &slices, sizeof slices) == CUBLAS_STATUS_SUCCESS &&
        cublasLtMatmulAlgoConfigSetAttribute(&a, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &scheme, sizeof scheme) == CUBLAS_STATUS_SUCCESS &&
        cublasLtMatmulAlgoCheck(cublaslt(), desc_.h, la_.h, lb_.h, ld_.h, ld_.h, &a, &check) == CUBLAS_STATUS_SUCCESS &&
        check.workspaceSize <= kCublasWorkspaceBytes)
      candidates_.push_back(a);
  }
}

void LtGemm::tune(const void* A, const void* B, void* D, const void* C) {
  if (candidates_.empty()) return;
  const float one = 1.f;
  float best = -1;
  for (const cublasLtMatmulAlgo_t& a : candidates_) {
    auto call = [&] {
      return cublasLtMatmul(cublaslt(), desc_.h, &one, A, la_.h, B, lb_.h, &beta_, C ? C : D, ld_.h, D, ld_.h, &a, cublas_workspace(),
                            kCublasWorkspaceBytes, stream());
    };
    if (call() != CUBLAS_STATUS_SUCCESS) continue;  // a candidate cublasLt refuses at run time is dropped
    const float t = best_batch_ms([&] { HOTOPS_CHECK_CUBLAS(call()); });
    if (best < 0 || t < best) best = t, algo_ = a;
  }
  candidates_.clear();
}

void LtGemm::run(const void* A, const void* B, void* D, const void* C) const {
  const float one = 1.f;
  HOTOPS_CHECK_CUBLAS(cublasLtMatmul(cublaslt(), desc_.h, &one, A, la_.h, B, lb_.h, &beta_, C ? C : D, ld_.h, D, ld_.h, &algo_,
                                     cublas_workspace(), kCublasWorkspaceBytes, stream()));
}

int LtGemm::algo_id() const {
  int id = 0;
  std::size_t w = 0;
  cublasLtMatmulAlgoConfigGetAttribute(&algo_, CUBLASLT_ALGO_CONFIG_ID, &id, sizeof id, &w);
  return id;
}

std::string algo_label(const cublasLtMatmulAlgo_t& algo) {
  int id = 0, tile = 0, splitk = 0, stages = 0;
  std::size_t w = 0;
  cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_ID, &id, sizeof id, &w);
  cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_TILE_ID, &tile, sizeof tile, &w);
  cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splitk, sizeof splitk, &w);
  cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_STAGES_ID, &stages, sizeof stages, &w);
  return "algo " + std::to_string(id) + " tile " + std::to_string(tile) + " stages " + std::to_string(stages) + " splitK " +
         std::to_string(splitk);
}

}  // namespace hotops::gpu
