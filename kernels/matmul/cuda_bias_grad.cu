// bias_grad on CUDA, in two deterministic stages: col_partial sums each column over a chain of 64
// rows (a thread per column, a block row of threads per chain) into the plan's partials
// [chains, cols], then col_finish (hotops/cuda_colsum.cuh) adds each column's chains into db.
#include <cuda_bf16.h>

#include <cstdint>
#include <memory>
#include <string>

#include "hotops/check.h"
#include "hotops/cuda_colsum.cuh"
#include "hotops/cuda_elem.cuh"
#include "hotops/cuda_util.h"
#include "kernels/matmul/bias_grad.h"

namespace hotops::matmul::bias_grad {
namespace {

constexpr unsigned kThreads = 256;
constexpr int kChainRows = 64;  // rows per partial sum

// partial[chain][c] = the sum of x's rows [chain * kChainRows, ...) in column c, x [rows, n].
template <class T>
__global__ void __launch_bounds__(kThreads) col_partial(const T* __restrict__ x, float* __restrict__ partial, std::int64_t rows, int n) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= n) return;
  const std::int64_t r0 = static_cast<std::int64_t>(blockIdx.y) * kChainRows, r1 = min(rows, r0 + kChainRows);
  float s = 0.f;
  for (std::int64_t r = r0; r < r1; ++r) s += gpu::to_float(x[r * n + c]);
  partial[static_cast<std::int64_t>(blockIdx.y) * n + c] = s;
}

template <class T>
class CudaBiasGrad final : public Plan {
 public:
  explicit CudaBiasGrad(const Shape& s)
      : s_(s), chains_((s.rows + kChainRows - 1) / kChainRows),
        partial_(static_cast<std::size_t>(chains_ * s.cols) * sizeof(float)) {
    HOTOPS_CHECK(s.rows > 0 && s.cols > 0, "bias_grad: rows and cols must be positive");
    HOTOPS_CHECK(s.cols <= 2147483647 && s.rows <= kCudaMaxRows, "bias_grad: CUDA takes up to 2^31 - 1 columns and 65535 x 64 rows");
  }

  void run(const Args& a) override {
    const int n = static_cast<int>(s_.cols);
    const dim3 grid(static_cast<unsigned>((s_.cols + kThreads - 1) / kThreads), static_cast<unsigned>(chains_));
    col_partial<T><<<grid, kThreads, 0, gpu::stream()>>>(static_cast<const T*>(a.dy), partial_.as<float>(), s_.rows, n);
    HOTOPS_CHECK_LAUNCH();
    const gpu::ColOut o{n, {a.db, nullptr, nullptr}};
    gpu::finish_columns(partial_.as<float>(), static_cast<int>(chains_), n, o, gpu::stream());
  }

  std::string label() const override {
    return "hotops kernels: column sums over " + std::to_string(chains_) + " chains of 64 rows, a thread per column; col_finish";
  }

 private:
  Shape s_;
  std::int64_t chains_;
  gpu::DeviceBuffer partial_;  // [chains, cols]
};

}  // namespace

std::unique_ptr<Plan> make_cuda_plan(const Shape& s) {
  if (s.dtype == DType::bf16) return std::make_unique<CudaBiasGrad<__nv_bfloat16>>(s);
  HOTOPS_CHECK(s.dtype == DType::f32, "bias_grad has f32 and bf16 only");
  return std::make_unique<CudaBiasGrad<float>>(s);
}

}  // namespace hotops::matmul::bias_grad
