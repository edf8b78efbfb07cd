// gpu::LtGemm: the cublasLt descriptors, algorithm choice and call behind every cublasLt GEMM of hotops.
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

MatrixLayout layout_of(std::int64_t rows, std::int64_t cols, std::int64_t ld, std::int64_t stride) {
  MatrixLayout l;
  l.rows = rows, l.cols = cols, l.ld = ld ? ld : rows;
  l.stride = stride ? stride : l.ld * cols;
  return l;
}

void make_layout(LtLayout& l, cudaDataType_t t, const MatrixLayout& m, std::int64_t batch) {
  HOTOPS_CHECK_CUBLAS(cublasLtMatrixLayoutCreate(&l.h, t, static_cast<std::uint64_t>(m.rows), static_cast<std::uint64_t>(m.cols),
                                                 m.ld));
  if (batch > 1) {
    const auto count = static_cast<std::int32_t>(batch);
    HOTOPS_CHECK_CUBLAS(cublasLtMatrixLayoutSetAttribute(l.h, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof count));
    HOTOPS_CHECK_CUBLAS(cublasLtMatrixLayoutSetAttribute(l.h, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &m.stride,
                                                         sizeof m.stride));
  }
}

void set_epilogue(cublasLtMatmulDesc_t desc, cublasLtEpilogue_t epi, const void* vector) {
  HOTOPS_CHECK_CUBLAS(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi));
  HOTOPS_CHECK_CUBLAS(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &vector, sizeof vector));
}

const char* epilogue_words(const GemmDesc& d) {
  if (d.bias_grad) return " GEMM with a bias-gradient epilogue";
  if (d.bias) return d.relu ? " GEMM with a bias + ReLU epilogue" : " GEMM with a bias epilogue";
  return " GEMM";
}

// The problem an autotune answers, as text: every field of the description that can change the
// choice, and the operands' placement.
std::string tune_key(const GemmDesc& d, const void* A, const void* B, const void* D, const void* C) {
  std::string key;
  const auto add = [&key](long long v) { key += std::to_string(v) + ","; };
  add(d.opa), add(d.opb), add(d.m), add(d.n), add(d.k), add(d.lda), add(d.ldb), add(d.ldd), add(d.batch);
  add(d.stride_a), add(d.stride_b), add(d.stride_d), add(d.ab), add(d.cd), add(d.compute);
  add(d.bias != nullptr), add(d.relu), add(d.bias_grad != nullptr), add(d.reduce_in_compute), add(C == nullptr || C == D);
  return key + std::to_string(d.alpha) + "," + std::to_string(d.beta) + "|" +
         placement_key({A, B, D, C, d.bias, d.bias_grad});
}

ChoiceCache<cublasLtMatmulAlgo_t>& tune_cache() {
  static ChoiceCache<cublasLtMatmulAlgo_t> cache("gemm");
  return cache;
}

}  // namespace

int lt_gemm_tunings() { return tune_cache().searches(); }

GemmLayouts gemm_layouts(const GemmDesc& d) {
  GemmLayouts l;
  l.a = d.opa == CUBLAS_OP_N ? layout_of(d.m, d.k, d.lda, d.stride_a) : layout_of(d.k, d.m, d.lda, d.stride_a);
  l.b = d.opb == CUBLAS_OP_N ? layout_of(d.k, d.n, d.ldb, d.stride_b) : layout_of(d.n, d.k, d.ldb, d.stride_b);
  l.d = layout_of(d.m, d.n, d.ldd, d.stride_d);
  return l;
}

LtGemm::LtGemm(const GemmDesc& d, const std::string& what) : LtGemm(d, what, nullptr) {}

std::unique_ptr<LtGemm> LtGemm::if_supported(const GemmDesc& d, const std::string& what) {
  bool found = true;
  std::unique_ptr<LtGemm> g(new LtGemm(d, what, &found));
  if (!found) g.reset();
  return g;
}

LtGemm::LtGemm(const GemmDesc& d, const std::string& what, bool* found) : alpha_(d.alpha), beta_(d.beta) {
  HOTOPS_CHECK(!d.relu || d.bias, what + ": a ReLU epilogue needs a bias");
  HOTOPS_CHECK(!d.bias || !d.bias_grad, what + ": one GEMM has a bias or a bias gradient, not both");
  has_vector_ = d.bias || d.bias_grad;
  HOTOPS_CHECK_CUBLAS(cublasLtMatmulDescCreate(&desc_.h, d.compute, CUDA_R_32F));
  HOTOPS_CHECK_CUBLAS(cublasLtMatmulDescSetAttribute(desc_.h, CUBLASLT_MATMUL_DESC_TRANSA, &d.opa, sizeof d.opa));
  HOTOPS_CHECK_CUBLAS(cublasLtMatmulDescSetAttribute(desc_.h, CUBLASLT_MATMUL_DESC_TRANSB, &d.opb, sizeof d.opb));
  const GemmLayouts layouts = gemm_layouts(d);
  make_layout(la_, d.ab, layouts.a, d.batch);
  make_layout(lb_, d.ab, layouts.b, d.batch);
  make_layout(ld_, d.cd, layouts.d, d.batch);
  // The bias and its gradient take D's type (cublasLt's default).
  if (d.bias) set_epilogue(desc_.h, d.relu ? CUBLASLT_EPILOGUE_RELU_BIAS : CUBLASLT_EPILOGUE_BIAS, d.bias);
  if (d.bias_grad) set_epilogue(desc_.h, CUBLASLT_EPILOGUE_BGRADA, d.bias_grad);
  cublasLtMatmulPreference_t pref = nullptr;
  HOTOPS_CHECK_CUBLAS(cublasLtMatmulPreferenceCreate(&pref));
  const std::uint64_t ws = kCublasWorkspaceBytes;
  cublasLtMatmulHeuristicResult_t results[kTuneHeuristics] = {};
  const int want = d.autotune ? kTuneHeuristics : 1;
  int count = 0;
  cublasStatus_t st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws);
  if (st == CUBLAS_STATUS_SUCCESS && d.reduce_in_compute) {
    const std::uint32_t mask = CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
    st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &mask, sizeof mask);
  }
  if (st == CUBLAS_STATUS_SUCCESS)
    st = cublasLtMatmulAlgoGetHeuristic(cublaslt(), desc_.h, la_.h, lb_.h, ld_.h, ld_.h, pref, want, results, &count);
  cublasLtMatmulPreferenceDestroy(pref);
  if (st != CUBLAS_STATUS_SUCCESS || count == 0) {
    if (st != CUBLAS_STATUS_SUCCESS && st != CUBLAS_STATUS_NOT_SUPPORTED) HOTOPS_CHECK_CUBLAS(st);
    if (found) {
      *found = false;
      return;
    }
    throw Error(what + ": cublasLt has no algorithm for a " + type_name(d.ab) + " x " + type_name(d.ab) + " -> " +
                    type_name(d.cd) + " " + std::to_string(d.m) + "x" + std::to_string(d.n) + "x" + std::to_string(d.k) +
                    epilogue_words(d),
                ErrorKind::unsupported);
  }
  algo_ = results[0].algo;
  if (!d.autotune) return;
  desc_copy_ = d;
  for (int i = 0; i < count; ++i) candidates_.push_back(results[i].algo);
  // Split-K variants of the first kSplitKAlgos, where cublasLt accepts them for this GEMM within the
  // workspace and each slice keeps at least 128 of k (a tiny k split into slices crashed cublasLt's
  // kernel: an illegal address at a model's k = 5).
  for (int i = 0; i < std::min(count, kSplitKAlgos); ++i)
    for (const std::int32_t slices : {2, 3, 4, 6, 8}) {
      if (d.k < 128 * static_cast<std::int64_t>(slices)) break;
      cublasLtMatmulAlgo_t a = results[i].algo;
      const std::uint32_t scheme = CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
      cublasLtMatmulHeuristicResult_t check{};
      if (cublasLtMatmulAlgoConfigSetAttribute(&a, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &slices, sizeof slices) == CUBLAS_STATUS_SUCCESS &&
          cublasLtMatmulAlgoConfigSetAttribute(&a, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &scheme, sizeof scheme) == CUBLAS_STATUS_SUCCESS &&
          cublasLtMatmulAlgoCheck(cublaslt(), desc_.h, la_.h, lb_.h, ld_.h, ld_.h, &a, &check) == CUBLAS_STATUS_SUCCESS &&
          check.workspaceSize <= kCublasWorkspaceBytes)
        candidates_.push_back(a);
    }
}

void LtGemm::set_vector(const void* v) {
  HOTOPS_CHECK(has_vector_ && v, "a cublasLt GEMM's epilogue vector: the GEMM has none, or it was given none");
  HOTOPS_CHECK_CUBLAS(cublasLtMatmulDescSetAttribute(desc_.h, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &v, sizeof v));
}

void LtGemm::tune(const void* A, const void* B, void* D, const void* C) {
  if (candidates_.empty()) return;
  const std::string key = tune_key(desc_copy_, A, B, D, C);
  if (tune_cache().find(key, &algo_)) {
    candidates_.clear();
    return;
  }
  float best = -1;
  for (const cublasLtMatmulAlgo_t& a : candidates_) {
    auto call = [&] {
      return cublasLtMatmul(cublaslt(), desc_.h, &alpha_, A, la_.h, B, lb_.h, &beta_, C ? C : D, ld_.h, D, ld_.h, &a, cublas_workspace(),
                            kCublasWorkspaceBytes, stream());
    };
    if (call() != CUBLAS_STATUS_SUCCESS) continue;  // a candidate cublasLt refuses at run time is dropped
    const float t = best_batch_ms([&] { HOTOPS_CHECK_CUBLAS(call()); });
    if (best < 0 || t < best) best = t, algo_ = a;
  }
  candidates_.clear();
  tune_cache().add(key, algo_);
}

void LtGemm::run(const void* A, const void* B, void* D, const void* C) const {
  HOTOPS_CHECK_CUBLAS(cublasLtMatmul(cublaslt(), desc_.h, &alpha_, A, la_.h, B, lb_.h, &beta_, C ? C : D, ld_.h, D, ld_.h, &algo_,
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
