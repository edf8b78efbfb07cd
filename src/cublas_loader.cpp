// cuBLAS and cublasLt, loaded when first called rather than when a program starts. Linked the
// usual way, libcublasLt's start-up code runs in every process that links it, whether it ever
// multiplies a matrix or not: some 0.1 s and 210 MB of memory touched per process on a 2-core
// machine (an empty program linked with it alone), which every test process (one a test, over
// 3,000) and every CPU-only run paid. So hotops defines the few cuBLAS and cublasLt functions it
// calls here, each of which opens the library (dlopen, by the soname of the toolkit hotops was
// built with: libcublas.so.13, libcublasLt.so.13) and looks the real function up at its first
// call. The library is searched where the dynamic loader searches, then in the directory the build
// found it in, then in the one libcudart was loaded from (the toolkit's library directory). A
// library that cannot be loaded makes the call return CUBLAS_STATUS_NOT_INITIALIZED (and
// cublasLtGetVersion 0), and cublasGetStatusString then names what failed.
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <dlfcn.h>

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>
#include <type_traits>

namespace {

enum Lib { kCublas, kCublasLt };

struct Loaded {
  void* handle = nullptr;
  std::string error;  // why it could not be loaded ("" when it was)
};

// The soname first (LD_LIBRARY_PATH, the program's run path, ldconfig), then the directory the build
// found the library in (where the linker would have taken it from), then libcudart's.
Loaded open_library(Lib lib) {
  const std::string soname =
      std::string(lib == kCublas ? "libcublas.so." : "libcublasLt.so.") + std::to_string(CUBLAS_VER_MAJOR);
  Loaded l;
  if ((l.handle = dlopen(soname.c_str(), RTLD_NOW | RTLD_GLOBAL))) return l;
  l.error = dlerror();
  std::string dirs[2] = {lib == kCublas ? HOTOPS_CUBLAS_DIR : HOTOPS_CUBLASLT_DIR, ""};
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&cudaGetDeviceCount), &info) && info.dli_fname) {
    dirs[1] = info.dli_fname;
    dirs[1].resize(dirs[1].find_last_of('/') + 1);
  }
  for (std::string dir : dirs) {
    if (dir.empty()) continue;
    if (dir.back() != '/') dir += '/';
    if ((l.handle = dlopen((dir + soname).c_str(), RTLD_NOW | RTLD_GLOBAL))) {
      l.error.clear();
      break;
    }
  }
  return l;
}

const Loaded& library(Lib lib) {
  static std::once_flag once[2];
  static Loaded loaded[2];
  std::call_once(once[lib], [lib] { loaded[lib] = open_library(lib); });
  return loaded[lib];
}

void* resolve(Lib lib, const char* name) {
  const Loaded& l = library(lib);
  return l.handle ? dlsym(l.handle, name) : nullptr;
}

// What a call returns when its library or function is missing.
template <class R>
R failure() {
  if constexpr (std::is_same_v<R, cublasStatus_t>) return CUBLAS_STATUS_NOT_INITIALIZED;
  else return R{};
}

// Calls the library's `name` (of Fn's type), looked up once.
template <auto Fn, class... Args>
auto forward(Lib lib, const char* name, Args... args) {
  using F = decltype(Fn);
  static const F real = reinterpret_cast<F>(resolve(lib, name));
  using R = decltype(real(args...));
  if (!real) return failure<R>();
  return real(args...);
}

// The status texts: the library's own, or what kept it from loading.
const char* status_text(const char* name, cublasStatus_t s, bool string) {
  using F = const char* (*)(cublasStatus_t);
  static const F real_string = reinterpret_cast<F>(resolve(kCublas, "cublasGetStatusString"));
  static const F real_name = reinterpret_cast<F>(resolve(kCublas, "cublasGetStatusName"));
  const F real = string ? real_string : real_name;
  if (real) return real(s);
  static const std::string why = std::string("cuBLAS could not be loaded (") + name + "): " + library(kCublas).error;
  return why.c_str();
}

}  // namespace

extern "C" {

// ---- cuBLAS ----
cublasStatus_t CUBLASWINAPI cublasCreate_v2(cublasHandle_t* h) { return forward<&cublasCreate_v2>(kCublas, "cublasCreate_v2", h); }
cublasStatus_t CUBLASWINAPI cublasSetStream_v2(cublasHandle_t h, cudaStream_t s) {
  return forward<&cublasSetStream_v2>(kCublas, "cublasSetStream_v2", h, s);
}
cublasStatus_t CUBLASWINAPI cublasSetWorkspace_v2(cublasHandle_t h, void* ws, size_t bytes) {
  return forward<&cublasSetWorkspace_v2>(kCublas, "cublasSetWorkspace_v2", h, ws, bytes);
}
cublasStatus_t CUBLASWINAPI cublasSetMathMode(cublasHandle_t h, cublasMath_t mode) {
  return forward<&cublasSetMathMode>(kCublas, "cublasSetMathMode", h, mode);
}
cublasStatus_t CUBLASWINAPI cublasGemmBatchedEx(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                                                const void* alpha, const void* const A[], cudaDataType_t at, int lda,
                                                const void* const B[], cudaDataType_t bt, int ldb, const void* beta, void* const C[],
                                                cudaDataType_t ct, int ldc, int count, cublasComputeType_t compute,
                                                cublasGemmAlgo_t algo) {
  // The C function, not the header's C++ overload of the same name.
  using F = cublasStatus_t (*)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int, const void*, const void* const*,
                               cudaDataType_t, int, const void* const*, cudaDataType_t, int, const void*, void* const*, cudaDataType_t,
                               int, int, cublasComputeType_t, cublasGemmAlgo_t);
  return forward<static_cast<F>(&cublasGemmBatchedEx)>(kCublas, "cublasGemmBatchedEx", h, ta, tb, m, n, k, alpha, A, at, lda, B, bt, ldb, beta, C, ct,
                                       ldc, count, compute, algo);
}
const char* CUBLASWINAPI cublasGetStatusString(cublasStatus_t s) { return status_text("cublasGetStatusString", s, true); }
const char* CUBLASWINAPI cublasGetStatusName(cublasStatus_t s) { return status_text("cublasGetStatusName", s, false); }

// ---- cublasLt ----
cublasStatus_t CUBLASWINAPI cublasLtCreate(cublasLtHandle_t* h) { return forward<&cublasLtCreate>(kCublasLt, "cublasLtCreate", h); }
size_t CUBLASWINAPI cublasLtGetVersion(void) { return forward<&cublasLtGetVersion>(kCublasLt, "cublasLtGetVersion"); }
cublasStatus_t CUBLASWINAPI cublasLtMatmul(cublasLtHandle_t h, cublasLtMatmulDesc_t desc, const void* alpha, const void* A,
                                           cublasLtMatrixLayout_t a, const void* B, cublasLtMatrixLayout_t b, const void* beta,
                                           const void* C, cublasLtMatrixLayout_t c, void* D, cublasLtMatrixLayout_t d,
                                           const cublasLtMatmulAlgo_t* algo, void* ws, size_t ws_bytes, cudaStream_t stream) {
  return forward<&cublasLtMatmul>(kCublasLt, "cublasLtMatmul", h, desc, alpha, A, a, B, b, beta, C, c, D, d, algo, ws, ws_bytes, stream);
}
cublasStatus_t CUBLASWINAPI cublasLtMatmulAlgoCheck(cublasLtHandle_t h, cublasLtMatmulDesc_t desc, cublasLtMatrixLayout_t a,
                                                    cublasLtMatrixLayout_t b, cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t d,
                                                    const cublasLtMatmulAlgo_t* algo, cublasLtMatmulHeuristicResult_t* result) {
  return forward<&cublasLtMatmulAlgoCheck>(kCublasLt, "cublasLtMatmulAlgoCheck", h, desc, a, b, c, d, algo, result);
}
cublasStatus_t CUBLASWINAPI cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t h, cublasLtMatmulDesc_t desc, cublasLtMatrixLayout_t a,
                                                           cublasLtMatrixLayout_t b, cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t d,
                                                           cublasLtMatmulPreference_t pref, int wanted,
                                                           cublasLtMatmulHeuristicResult_t results[], int* count) {
  return forward<&cublasLtMatmulAlgoGetHeuristic>(kCublasLt, "cublasLtMatmulAlgoGetHeuristic", h, desc, a, b, c, d, pref, wanted, results,
                                                  count);
}
cublasStatus_t CUBLASWINAPI cublasLtMatmulAlgoConfigGetAttribute(const cublasLtMatmulAlgo_t* algo, cublasLtMatmulAlgoConfigAttributes_t attr,
                                                                 void* buf, size_t bytes, size_t* written) {
  return forward<&cublasLtMatmulAlgoConfigGetAttribute>(kCublasLt, "cublasLtMatmulAlgoConfigGetAttribute", algo, attr, buf, bytes, written);
}
cublasStatus_t CUBLASWINAPI cublasLtMatmulAlgoConfigSetAttribute(cublasLtMatmulAlgo_t* algo, cublasLtMatmulAlgoConfigAttributes_t attr,
                                                                 const void* buf, size_t bytes) {
  return forward<&cublasLtMatmulAlgoConfigSetAttribute>(kCublasLt, "cublasLtMatmulAlgoConfigSetAttribute", algo, attr, buf, bytes);
}
cublasStatus_t CUBLASWINAPI cublasLtMatmulDescCreate(cublasLtMatmulDesc_t* desc, cublasComputeType_t compute, cudaDataType_t scale) {
  return forward<&cublasLtMatmulDescCreate>(kCublasLt, "cublasLtMatmulDescCreate", desc, compute, scale);
}
cublasStatus_t CUBLASWINAPI cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t desc) {
  return forward<&cublasLtMatmulDescDestroy>(kCublasLt, "cublasLtMatmulDescDestroy", desc);
}
cublasStatus_t CUBLASWINAPI cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attr, const void* buf,
                                                           size_t bytes) {
  return forward<&cublasLtMatmulDescSetAttribute>(kCublasLt, "cublasLtMatmulDescSetAttribute", desc, attr, buf, bytes);
}
cublasStatus_t CUBLASWINAPI cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t* pref) {
  return forward<&cublasLtMatmulPreferenceCreate>(kCublasLt, "cublasLtMatmulPreferenceCreate", pref);
}
cublasStatus_t CUBLASWINAPI cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t pref) {
  return forward<&cublasLtMatmulPreferenceDestroy>(kCublasLt, "cublasLtMatmulPreferenceDestroy", pref);
}
cublasStatus_t CUBLASWINAPI cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t pref, cublasLtMatmulPreferenceAttributes_t attr,
                                                                 const void* buf, size_t bytes) {
  return forward<&cublasLtMatmulPreferenceSetAttribute>(kCublasLt, "cublasLtMatmulPreferenceSetAttribute", pref, attr, buf, bytes);
}
cublasStatus_t CUBLASWINAPI cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t* layout, cudaDataType type, uint64_t rows, uint64_t cols,
                                                       int64_t ld) {
  return forward<&cublasLtMatrixLayoutCreate>(kCublasLt, "cublasLtMatrixLayoutCreate", layout, type, rows, cols, ld);
}
cublasStatus_t CUBLASWINAPI cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t layout) {
  return forward<&cublasLtMatrixLayoutDestroy>(kCublasLt, "cublasLtMatrixLayoutDestroy", layout);
}
cublasStatus_t CUBLASWINAPI cublasLtMatrixLayoutSetAttribute(cublasLtMatrixLayout_t layout, cublasLtMatrixLayoutAttribute_t attr,
                                                             const void* buf, size_t bytes) {
  return forward<&cublasLtMatrixLayoutSetAttribute>(kCublasLt, "cublasLtMatrixLayoutSetAttribute", layout, attr, buf, bytes);
}

}  // extern "C"
