// gelu_dbias on CUDA: one kernel computes dx = dy * gelu'(x) (erff and __expf, f32 math) and, per
// block of 16 rows, the column sums of the stored dx; col_finish (hotops/cuda_colsum.cuh) adds those
// partial sums into dbias. A thread takes one vector of columns down its 16 rows, loading 4 rows'
// vectors before it computes any (16-byte vectors where cols and the tensors allow, else 4 elements:
// float4, or 4 bf16 in 8 bytes). Deterministic.
#include <cuda_bf16.h>

#include <cstdint>
#include <memory>
#include <string>

#include "hotops/check.h"
#include "hotops/cuda_colsum.cuh"
#include "hotops/cuda_elem.cuh"
#include "hotops/cuda_util.h"
#include "kernels/gelu/gelu_dbias.h"

namespace hotops::gelu::dbias {
namespace {

constexpr unsigned kThreads = 128;  // vectors of columns per block
constexpr int kRows = 16;           // rows per block (and per partial sum): BERT's 4096 rows fill the GPU
constexpr int kBatch = 4;           // rows whose loads a thread has in flight together
constexpr unsigned kFinishThreads = 256;

using bf16 = __nv_bfloat16;

__device__ inline float gelu_grad(float z) {
  return 0.5f * (1.f + erff(z * 0.70710678118654752f)) + z * 0.39894228040143268f * __expf(-0.5f * z * z);
}

// dx = dy * gelu'(z) over [rows, nvec vectors of VEC], with the column sums of the stored dx: block
// (x, y) takes vectors x * blockDim + thread over rows [y * kRows, ...) and writes partial[y][their
// VEC columns]; each column's rows are added in order. kInPlace: dx is dy, read and written through
// dx (dy is not read; each element is read before the same thread writes it).
template <class T, int VEC, bool kInPlace>
__global__ void __launch_bounds__(kThreads) gelu_dbias(const T* __restrict__ dy, T* __restrict__ dx, const T* __restrict__ z,
                                                      std::int64_t rows, int nvec, float* __restrict__ partial) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= nvec) return;
  const std::int64_t cols = static_cast<std::int64_t>(nvec) * VEC;
  const std::int64_t r0 = static_cast<std::int64_t>(blockIdx.y) * kRows, r1 = min(rows, r0 + kRows);
  float s[VEC];
#pragma unroll
  for (int j = 0; j < VEC; ++j) s[j] = 0.f;
  for (std::int64_t r = r0; r < r1; r += kBatch) {
    float v[kBatch][VEC], d[kBatch][VEC];
#pragma unroll
    for (int b = 0; b < kBatch; ++b)
      if (r + b < r1) {
        const std::int64_t i = (r + b) * cols + static_cast<std::int64_t>(c) * VEC;
        gpu::load<T, VEC>(z + i, v[b]);
        gpu::load<T, VEC>(kInPlace ? dx + i : dy + i, d[b]);
      }
#pragma unroll
    for (int b = 0; b < kBatch; ++b)
      if (r + b < r1) {
#pragma unroll
        for (int j = 0; j < VEC; ++j) {
          d[b][j] = gpu::rounded<T>(d[b][j] * gelu_grad(v[b][j]));
          s[j] += d[b][j];  // the sum of what the next GEMMs read
        }
        gpu::store<T, VEC>(dx + (r + b) * cols + static_cast<std::int64_t>(c) * VEC, d[b]);
      }
  }
  gpu::store<float, VEC>(partial + static_cast<std::int64_t>(blockIdx.y) * cols + static_cast<std::int64_t>(c) * VEC, s);
}

// T: the storage, float or bf16.
template <class T>
class CudaGeluDbias final : public Plan {
  static constexpr int kWide = 16 / static_cast<int>(sizeof(T));  // elements of a 16-byte vector

 public:
  explicit CudaGeluDbias(const Shape& s)
      : s_(s), splits_((s.rows + kRows - 1) / kRows), partial_(static_cast<std::size_t>(splits_ * s.cols) * sizeof(float)) {
    HOTOPS_CHECK(s.cols % 4 == 0 && s.cols <= (std::int64_t{1} << 30), "gelu_dbias on CUDA: cols must be a multiple of 4");
    HOTOPS_CHECK(splits_ <= 65535, "gelu_dbias on CUDA: at most 65535 x 16 rows");
  }

  void run(const Args& a) override {
    if (s_.cols % kWide == 0 && gpu::all_aligned(16, {a.x, a.dy, a.dx}))
      launch<kWide>(a);
    else
      launch<4>(a);
    const gpu::ColOut o{static_cast<int>(s_.cols), {a.dbias, nullptr, nullptr}};
    gpu::col_finish<kFinishThreads><<<gpu::col_finish_blocks(s_.cols), kFinishThreads, 0, gpu::stream()>>>(
        partial_.as<float>(), static_cast<int>(splits_), static_cast<int>(s_.cols), o);
    HOTOPS_CHECK_LAUNCH();
  }

  std::string label() const override {
    return std::string("hotops kernels: GELU (erf) backward with per-16-row column sums, ") +
           (s_.cols % kWide == 0 ? "16-byte" : "4-element") + " vectors, 4 rows in flight a thread; col_finish";
  }

 private:
  template <int VEC>
  void launch(const Args& a) {
    const int nvec = static_cast<int>(s_.cols / VEC);
    const dim3 grid((nvec + kThreads - 1) / kThreads, static_cast<unsigned>(splits_));
    const T* x = static_cast<const T*>(a.x);
    T* dx = static_cast<T*>(a.dx);
    float* partial = partial_.as<float>();
    if (a.dy == a.dx)
      gelu_dbias<T, VEC, true><<<grid, kThreads, 0, gpu::stream()>>>(nullptr, dx, x, s_.rows, nvec, partial);
    else
      gelu_dbias<T, VEC, false><<<grid, kThreads, 0, gpu::stream()>>>(static_cast<const T*>(a.dy), dx, x, s_.rows, nvec, partial);
    HOTOPS_CHECK_LAUNCH();
  }

  Shape s_;
  std::int64_t splits_;
  gpu::DeviceBuffer partial_;  // [splits_, cols]
};

}  // namespace

std::unique_ptr<Plan> make_cuda_plan(const Shape& s) {
  if (s.dtype == DType::bf16) return std::make_unique<CudaGeluDbias<bf16>>(s);
  return std::make_unique<CudaGeluDbias<float>>(s);
}

}  // namespace hotops::gelu::dbias
