// matmul on CUDA: one gpu::LtGemm per direction, on PyTorch's row-major operands seen as
// column-major transposes (C^T = B^T A^T, no copies). addmm's bias is the BIAS epilogue and its
// gradient the BGRADA epilogue or bias_grad's column sums, whichever timed faster (DbiasPath); a
// residual is C with beta 1; bmm is the strided-batched form of the
// same call, and on strided views (attention's heads) a cublasGemmBatchedEx over pointer arrays.
// The algorithm is chosen once at setup, the fastest of the heuristic's first 16 and split-K variants
// of its first 3 timed on the plan's own scratch operands, and named in the label.
#include <cuda_bf16.h>

#include <atomic>
#include <cstdio>
#include <memory>
#include <string>

#include "hotops/cublaslt_gemm.h"
#include "hotops/cuda_util.h"
#include "kernels/matmul/bias_grad.h"
#include "kernels/matmul/cuda_gemm.h"
#include "kernels/matmul/matmul.h"

namespace hotops::matmul {

CudaGemm cuda_gemm(const Shape& s) {
  CudaGemm g;
  gpu::GemmDesc& d = g.desc;
  d.ab = d.cd = s.dtype == DType::bf16 ? CUDA_R_16BF : CUDA_R_32F;  // tf32: f32 storage
  if (s.f32_out) d.cd = CUDA_R_32F;
  d.reduce_in_compute = s.reduce_in_compute;
  d.compute = s.dtype == DType::tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  d.alpha = static_cast<float>(s.alpha);
  d.batch = s.batch_count;  // packed: each matrix right after the previous
  // Row-major D[rows, cols] = X . Y is column-major D^T[cols, rows] = Y^T . X^T: cublasLt's A is Y
  // (stored row-major [depth, cols], i.e. column-major [cols, depth]; transposed where Y is read
  // transposed), its B is X likewise.
  const Product p = product(s);
  d.opa = p.y_t ? CUBLAS_OP_T : CUBLAS_OP_N;
  d.opb = p.x_t ? CUBLAS_OP_T : CUBLAS_OP_N;
  d.m = p.cols, d.n = p.rows, d.k = p.depth;
  g.a = p.y, g.b = p.x;
  g.bias = s.op == Op::addmm && s.dir == Direction::fwd;
  d.relu = g.bias && s.relu;  // RELU_BIAS: the ReLU after the bias, in the epilogue
  g.bias_grad = s.op == Op::addmm && s.dir == Direction::bwd_weight && s.beta == 1.0 && g.a == Operand::dout &&
                d.opa == CUBLAS_OP_N;
  HOTOPS_CHECK(!s.residual || s.dir != Direction::bwd_weight, "matmul: a residual is added in fwd or bwd_data only");
  // A residual is cublasLt's C with beta 1 (C distinct from D, so that autotune may write D).
  d.beta = s.residual ? 1.f : 0.f;
  // Timed, not the heuristic's first: at BERT's batch 32 on an H100, 4 split-K slices were 4.5-4.9%
  // faster for the GEMMs of 768 outputs over k = 3072 (96 output tiles of the heuristic's kernel
  // leave a third of the 132 SMs idle), the heuristic's fourth algorithm 6% for Wo's data gradient;
  // on an H200, mlp_tiny's bf16 train step at batch 4096 went from 175 to 71 us.
  d.autotune = true;
  return g;
}

StridedGemm strided_gemm(const Shape& s) {
  HOTOPS_CHECK(s.strided(), "matmul: a strided GEMM needs the shape's views");
  StridedGemm g;
  g.gemm = cuda_gemm(s);
  const auto view = [&](Operand o) { return o == Operand::a ? s.views.a : o == Operand::b ? s.views.b : s.views.out; };
  g.a = view(g.gemm.a), g.b = view(g.gemm.b);
  g.d = s.dir == Direction::bwd_data ? s.views.a : s.dir == Direction::bwd_weight ? s.views.b : s.views.out;
  g.heads = s.views.heads;
  return g;
}

namespace {

// out[n] = scale * in[n], in the output's type: addmm's beta applied to the bias that the BIAS
// epilogue adds unscaled, and to the column sums of the bias gradient (f32) stored in the dtype.
template <class In, class Out>
__global__ void scale_vector(const In* __restrict__ in, Out* __restrict__ out, std::int64_t count, float scale) {
  const std::int64_t n = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
  if (n < count) out[n] = static_cast<Out>(scale * static_cast<float>(in[n]));
}

template <class In, class Out>
void launch_scale_vector(const In* in, Out* out, std::int64_t count, float scale) {
  const int threads = 256;
  const auto blocks = static_cast<unsigned>((count + threads - 1) / threads);
  scale_vector<<<blocks, threads, 0, gpu::stream()>>>(in, out, count, scale);
  HOTOPS_CHECK_LAUNCH();
}

std::atomic<DbiasPath> g_dbias_path{DbiasPath::timed};

// The epilogue-or-sums choice of one problem (DbiasPath::timed), with the two times that made it.
struct DbiasChoice {
  int sums = 0;
  float epilogue_ms = -1, sums_ms = -1;
};
gpu::ChoiceCache<DbiasChoice>& dbias_cache() {
  static gpu::ChoiceCache<DbiasChoice> cache("dbias");
  return cache;
}

std::string ms_text(float ms) {
  char b[32];
  std::snprintf(b, sizeof b, "%.3g ms", ms);
  return b;
}

class CudaMatmul final : public Plan {
 public:
  explicit CudaMatmul(const Shape& s) : s_(s), g_(cuda_gemm(s)) {
    const std::string what = name();
    has_dbias_ = s_.op == Op::addmm && s_.dir == Direction::bwd_weight;
    // The epilogue is set up on a vector of the plan's own (beta times the caller's bias, where
    // beta != 1); each run points it at the caller's where that is the one it needs.
    gpu::GemmDesc d = g_.desc;
    if (g_.bias || g_.bias_grad) vector_ = gpu::DeviceBuffer(static_cast<std::size_t>(s_.N) * dtype_size(s_.dtype));
    if (g_.bias) d.bias = vector_.get();
    if (g_.bias_grad && cuda_dbias_path() != DbiasPath::sums) d.bias_grad = vector_.get();
    gemm_ = gpu::LtGemm::if_supported(d, what);
    if (!gemm_ && d.bias_grad) {
      // No kernel fuses the bias gradient for this shape/dtype: the GEMM alone, then the column sums.
      d.bias_grad = nullptr;
      dbias_how_ = "no bgrad epilogue for this GEMM";
      gemm_ = gpu::LtGemm::if_supported(d, what);
    }
    if (!gemm_) throw Error("cuBLASLt has no algorithm for " + what, ErrorKind::unsupported);
    fused_dbias_ = d.bias_grad != nullptr;
    const std::int64_t rows = s_.batch_count * s_.M;
    if (has_dbias_ && rows <= bias_grad::kCudaMaxRows) {
      bias_grad::Shape cs;
      cs.dtype = s_.dtype == DType::bf16 ? DType::bf16 : DType::f32;
      cs.rows = rows, cs.cols = s_.N;
      sums_ = bias_grad::make_cuda_plan(cs);
      sums_f32_ = gpu::DeviceBuffer(static_cast<std::size_t>(s_.N) * sizeof(float));
    }
    if (has_dbias_ && !fused_dbias_ && !sums_)
      throw Error("the column sums of the bias gradient take up to " + std::to_string(bias_grad::kCudaMaxRows) +
                      " rows, and cublasLt fuses none here: " + what,
                  ErrorKind::unsupported);
    if (d.autotune) tune(d);
    bound_vector_ = d.bias ? d.bias : fused_dbias_ ? vector_.get() : nullptr;
    describe_algorithm();
  }

  void run(const Args& t) override {
    const void* vector = g_.bias ? bias(t.bias) : fused_dbias_ ? t.dbias : nullptr;
    if (vector && vector != bound_vector_) {
      gemm_->set_vector(vector);
      bound_vector_ = vector;
    }
    if (s_.residual) HOTOPS_CHECK(t.c && t.c != t.out, "matmul: a residual GEMM needs its C, apart from its output");
    gemm_->run(operand(t, g_.a), operand(t, g_.b), t.out, s_.residual ? t.c : nullptr);  // beta 0 without it
    if (has_dbias_ && !fused_dbias_) column_sums(t.dout, t.dbias);
  }

  std::string label() const override { return label_; }

 private:
  std::string name() const {
    const char* op = s_.op == Op::mm ? "mm " : s_.op == Op::addmm ? "addmm " : "bmm ";
    return op + std::string(dtype_name(s_.dtype)) + " " + direction_name(s_.dir) + " " +
           std::to_string(s_.batch_count) + "x" + std::to_string(s_.M) + "x" + std::to_string(s_.N) + "x" +
           std::to_string(s_.K);
  }

  // The bias the epilogue adds: the caller's, or beta times it (in the plan's own buffer).
  const void* bias(const void* b) {
    if (s_.beta == 1.0) return b;
    const auto beta = static_cast<float>(s_.beta);
    if (s_.dtype == DType::bf16)
      launch_scale_vector(static_cast<const __nv_bfloat16*>(b), vector_.as<__nv_bfloat16>(), s_.N, beta);
    else
      launch_scale_vector(static_cast<const float*>(b), vector_.as<float>(), s_.N, beta);
    return vector_.get();
  }

  // dbias = beta * the column sums of dOut, without the epilogue: bias_grad's sums in f32 (straight
  // into dbias where that is f32 and beta 1), then stored in the dtype.
  void column_sums(const void* dout, void* dbias) {
    const bool direct = s_.dtype != DType::bf16 && s_.beta == 1.0;
    sums_->run(bias_grad::Args{dout, direct ? static_cast<float*>(dbias) : sums_f32_.as<float>()});
    if (direct) return;
    const auto beta = static_cast<float>(s_.beta);
    if (s_.dtype == DType::bf16)
      launch_scale_vector(sums_f32_.as<float>(), static_cast<__nv_bfloat16*>(dbias), s_.N, beta);
    else
      launch_scale_vector(sums_f32_.as<float>(), static_cast<float*>(dbias), s_.N, beta);
  }

  // Times the candidates on operands of the problem's sizes, allocated for this only and seeded like
  // the benchmark's, so that the timed kernels see numbers of the same range (the epilogue's vector
  // is the plan's own). Where the bias gradient may be the epilogue or the column sums, times both
  // (DbiasPath::timed), each on its own tuned GEMM, and keeps one.
  void tune(const gpu::GemmDesc& d) {
    const Inputs in = make_inputs(s_, 1);
    const gpu::DeviceBuffer a(operand(in, g_.a)), b(operand(in, g_.b));
    const gpu::DeviceBuffer out(primary_count(s_) * dtype_size(out_dtype(s_)));
    gpu::DeviceBuffer c;
    if (s_.residual) {
      HostBuffer r(out_dtype(s_), primary_count(s_));
      r.fill_uniform(1, 4);
      c = gpu::DeviceBuffer(r);
    }
    if (g_.bias) {
      HostBuffer v(s_.dtype, static_cast<std::size_t>(s_.N));
      v.fill_uniform(1, 3);
      vector_.upload(v);
    }
    gemm_->tune(a.get(), b.get(), out.get(), s_.residual ? c.get() : nullptr);
    if (fused_dbias_ && sums_ && cuda_dbias_path() == DbiasPath::timed) choose_dbias_path(d, a.get(), b.get(), out.get());
    gpu::synchronize();
  }

  // DbiasPath::timed: the epilogue's GEMM against the plain GEMM and the column sums, each after a
  // warm-up call, by gpu::best_batch_ms; once per problem per process, or from --hotops_choices.
  // The plain GEMM is made only where it is timed or kept.
  void choose_dbias_path(const gpu::GemmDesc& d, const void* a, const void* b, void* out) {
    const auto make_plain = [&] {
      gpu::GemmDesc plain_desc = d;
      plain_desc.bias_grad = nullptr;
      return gpu::LtGemm::if_supported(plain_desc, name());
    };
    const std::string key = name() + "|" + gpu::placement_key({});
    DbiasChoice choice;
    bool from_file = false;
    std::unique_ptr<gpu::LtGemm> plain;
    if (!dbias_cache().find(key, &choice, &from_file)) {
      plain = make_plain();
      if (!plain) return;  // no plain GEMM for the problem: the epilogue it is
      plain->tune(a, b, out, nullptr);
      // g_.a is dOut wherever the epilogue can sum it (cuda_gemm's bias_grad); the sums go to vector_.
      const auto fused = [&] { gemm_->run(a, b, out); };
      const auto split = [&] {
        plain->run(a, b, out);
        column_sums(a, vector_.get());
      };
      fused();
      choice.epilogue_ms = gpu::best_batch_ms(fused);
      split();
      choice.sums_ms = gpu::best_batch_ms(split);
      choice.sums = dbias_sums_are_faster(choice.sums_ms, choice.epilogue_ms) ? 1 : 0;
      dbias_cache().add(key, choice);
    } else if (choice.sums) {
      plain = make_plain();
      HOTOPS_CHECK(plain != nullptr, name() + ": the kept bias-gradient choice is the column sums, but cublasLt has no plain GEMM for the problem");
      plain->tune(a, b, out, nullptr);  // the GEMM's own choice, from its cache or the file
    }
    if (choice.sums) gemm_ = std::move(plain);
    fused_dbias_ = !choice.sums;
    dbias_how_ = std::string(from_file ? "from --hotops_choices, as a search found it: " : "") + "timed " +
                 ms_text(choice.sums ? choice.sums_ms : choice.epilogue_ms) + "; " +
                 (choice.sums ? "the bgrad epilogue " + ms_text(choice.epilogue_ms)
                              : "the GEMM + column sums " + ms_text(choice.sums_ms));
  }

  void describe_algorithm() {
    label_ = "cublasLt " + gemm_->algo_label();
    if (g_.bias) label_ += s_.relu ? ", bias + ReLU epilogue" : ", bias epilogue";
    if (s_.f32_out) label_ += ", f32 output";
    if (fused_dbias_) label_ += ", bgrad epilogue";
    if (has_dbias_ && !fused_dbias_) label_ += " + hotops column sums for dbias";
    if (has_dbias_ && !dbias_how_.empty()) label_ += " (" + dbias_how_ + ")";
    if (g_.bias && s_.beta != 1.0) label_ += " (beta folded into bias)";
    if (s_.residual) label_ += ", residual as C";
    if (s_.f32_out && s_.dtype != DType::f32) label_ += ", f32 output";
    if (s_.batch_count > 1) label_ += ", strided batch " + std::to_string(s_.batch_count);
  }

  Shape s_;
  CudaGemm g_;
  std::unique_ptr<gpu::LtGemm> gemm_;
  gpu::DeviceBuffer vector_;               // the epilogue's at setup; beta * bias where beta != 1
  const void* bound_vector_ = nullptr;     // the vector the epilogue points at
  bool has_dbias_ = false;
  bool fused_dbias_ = false;
  std::unique_ptr<bias_grad::Plan> sums_;  // bias_grad's column sums, where the epilogue does not write dbias
  gpu::DeviceBuffer sums_f32_;             // their f32 sums, before beta and the dtype
  std::string dbias_how_;                  // how the bias gradient's path was chosen, for the label
  std::string label_;
};

// The family's cuBLAS handle (bmm over strided views), bound to gpu::stream() and the shared
// workspace; CUBLAS_DEFAULT_MATH: TF32 only where the compute type asks for it.
cublasHandle_t cublas() {
  static cublasHandle_t h = [] {
    cublasHandle_t c = nullptr;
    HOTOPS_CHECK_CUBLAS(cublasCreate(&c));
    HOTOPS_CHECK_CUBLAS(cublasSetStream(c, gpu::stream()));
    HOTOPS_CHECK_CUBLAS(cublasSetWorkspace(c, gpu::cublas_workspace(), gpu::kCublasWorkspaceBytes));
    HOTOPS_CHECK_CUBLAS(cublasSetMathMode(c, CUBLAS_DEFAULT_MATH));
    return c;
  }();
  return h;
}

// The batch items' pointers into the caller's tensors: pointers[i] (cublas' A), [count + i] (B) and
// [2 count + i] (D), item i at its views' offsets; `bytes` per element.
__global__ void item_pointers(const char* a, const char* b, char* d, View va, View vb, View vd, std::int64_t heads,
                              std::int64_t count, std::int64_t bytes, const void** pointers) {
  const std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
  if (i >= count) return;
  const auto at = [&](const View& v) { return (i / heads * v.per_sample + i % heads * v.per_head) * bytes; };
  pointers[i] = a + at(va);
  pointers[count + i] = b + at(vb);
  pointers[2 * count + i] = d + at(vd);
}

// bmm over strided views (attention's heads, read and written in place): one cublasGemmBatchedEx
// (CUBLAS_COMPUTE_32F, or its TF32 mode for tf32; beta 0) over device arrays of each item's
// pointers. item_pointers writes the arrays, on the stream, when a run's tensors are not the last
// run's; a caller that passes the same tensors each step (a model) runs the GEMM alone.
class CudaStridedBmm final : public Plan {
 public:
  explicit CudaStridedBmm(const Shape& s)
      : s_(s), g_(strided_gemm(s)), pointers_(3 * static_cast<std::size_t>(s.batch_count) * sizeof(void*)) {
    const gpu::GemmDesc& d = g_.gemm.desc;
    HOTOPS_CHECK(d.m <= kMaxInt && d.n <= kMaxInt && d.k <= kMaxInt && s.batch_count <= kMaxInt && g_.a.ld <= kMaxInt &&
                     g_.b.ld <= kMaxInt && g_.d.ld <= kMaxInt,
                 "matmul: a strided bmm's sizes must fit cuBLAS' int");
    cublas();
    label_ = std::string("cublasGemmBatchedEx ") + (s.dtype == DType::tf32 ? "TF32" : dtype_name(s.dtype)) +
             " (f32 accumulate), pointer arrays over " + std::to_string(s.batch_count) + " strided heads";
  }

  void run(const Args& t) override {
    const void* a = operand(t, g_.gemm.a);
    const void* b = operand(t, g_.gemm.b);
    HOTOPS_CHECK(a && b && t.out, "matmul: a strided bmm needs its two inputs and its output");
    const std::int64_t count = s_.batch_count;
    const void** p = pointers_.as<const void*>();
    if (a != bound_[0] || b != bound_[1] || t.out != bound_[2]) {
      const unsigned threads = 256;
      const auto blocks = static_cast<unsigned>((count + threads - 1) / threads);
      item_pointers<<<blocks, threads, 0, gpu::stream()>>>(static_cast<const char*>(a), static_cast<const char*>(b),
                                                           static_cast<char*>(t.out), g_.a, g_.b, g_.d, g_.heads, count,
                                                           static_cast<std::int64_t>(dtype_size(s_.dtype)), p);
      HOTOPS_CHECK_LAUNCH();
      bound_[0] = a, bound_[1] = b, bound_[2] = t.out;
    }
    const gpu::GemmDesc& d = g_.gemm.desc;
    const float zero = 0.f;
    HOTOPS_CHECK_CUBLAS(cublasGemmBatchedEx(cublas(), d.opa, d.opb, static_cast<int>(d.m), static_cast<int>(d.n),
                                            static_cast<int>(d.k), &d.alpha, p, d.ab, static_cast<int>(g_.a.ld), p + count,
                                            d.ab, static_cast<int>(g_.b.ld), &zero, const_cast<void* const*>(p + 2 * count),
                                            d.cd, static_cast<int>(g_.d.ld), static_cast<int>(count), d.compute,
                                            CUBLAS_GEMM_DEFAULT));
  }

  std::string label() const override { return label_; }

 private:
  static constexpr std::int64_t kMaxInt = 2147483647;
  Shape s_;
  StridedGemm g_;
  gpu::DeviceBuffer pointers_;                         // A's, B's and D's, count each
  const void* bound_[3] = {nullptr, nullptr, nullptr};  // the tensors the arrays point into
  std::string label_;
};

}  // namespace

void set_cuda_dbias_path(DbiasPath p) { g_dbias_path = p; }
DbiasPath cuda_dbias_path() { return g_dbias_path; }
bool dbias_sums_are_faster(float sums_ms, float epilogue_ms) { return sums_ms * (1 + gpu::kRetimeTie) < epilogue_ms; }

std::unique_ptr<Plan> make_cuda_plan(const Shape& s) {
  if (s.blocked()) return make_cuda_blocks_plan(s);
  if (s.strided()) return std::make_unique<CudaStridedBmm>(s);
  return std::make_unique<CudaMatmul>(s);
}

}  // namespace hotops::matmul
