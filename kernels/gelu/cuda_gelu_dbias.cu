// gelu_dbias on CUDA: one kernel over 4-wide vectors (float4, or 4 bf16 in 8 bytes) computes
// dx = dy * gelu'(x) (the gelu op's f32 math, cuda_gelu_math.cuh) and, per block of rows, the column
// sums of the stored dx; col_finish (hotops/cuda_colsum.cuh) adds those partial sums into dbias. The
// rows a block takes (8 to 32) are chosen so that the grid is about one wave of the blocks the GPU
// holds at once: fewer rows a block leave SMs idle no longer, more would write more partial sums.
// Deterministic.
#include <cuda_bf16.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>

#include "hotops/check.h"
#include "hotops/cuda_colsum.cuh"
#include "hotops/cuda_elem.cuh"
#include "hotops/cuda_util.h"
#include "kernels/gelu/cuda_gelu_math.cuh"
#include "kernels/gelu/gelu_dbias.h"

namespace hotops::gelu::dbias {
namespace {

constexpr unsigned kThreads = 256;
constexpr std::int64_t kMinRows = 8, kMaxRows = 32;  // rows a block (and a partial sum) takes
constexpr std::int64_t kMaxGridY = 65535;

using bf16 = __nv_bfloat16;
using gpu::f32_of;
using gpu::stored4;

__device__ inline float gelu_bwd(float z, float dy) { return math::gelu_bwd<Approx::none>(z, dy); }

// dx = dy * gelu'(z) over [rows, n4 vectors of 4], with the column sums of the stored dx: block (x, y)
// takes vector columns x * blockDim + thread over rows [y * per, ...) and writes partial[y][4
// columns]. kInPlace: dx is dy, read and written through dx (dy is not read).
template <class Q, bool kInPlace>
__global__ void __launch_bounds__(kThreads) gelu_dbias(const Q* __restrict__ dy, Q* __restrict__ dx, const Q* __restrict__ z,
                                                      std::int64_t rows, std::int64_t per, int n4, float4* __restrict__ partial) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= n4) return;
  const std::int64_t r0 = static_cast<std::int64_t>(blockIdx.y) * per, r1 = min(rows, r0 + per);
  float4 s = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll 4
  for (std::int64_t r = r0; r < r1; ++r) {
    const std::int64_t i = r * n4 + c;
    const float4 v = f32_of(z[i]);
    float4 d = f32_of(kInPlace ? dx[i] : dy[i]);
    d.x = gelu_bwd(v.x, d.x), d.y = gelu_bwd(v.y, d.y), d.z = gelu_bwd(v.z, d.z), d.w = gelu_bwd(v.w, d.w);
    const Q q = stored4<Q>(d);
    dx[i] = q;
    const float4 back = f32_of(q);  // the sum of what the next GEMMs read
    s.x += back.x, s.y += back.y, s.z += back.z, s.w += back.w;
  }
  partial[static_cast<std::int64_t>(blockIdx.y) * n4 + c] = s;
}

// T: the storage, float or bf16.
template <class T>
class CudaGeluDbias final : public Plan {
  using Q = typename gpu::Quad<T>::type;

 public:
  explicit CudaGeluDbias(const Shape& s) : s_(s), n4_(s.cols / 4) {
    HOTOPS_CHECK(s.cols % 4 == 0 && s.cols <= (std::int64_t{1} << 30), "gelu_dbias on CUDA: cols must be a multiple of 4");
    const std::int64_t col_blocks = (n4_ + kThreads - 1) / kThreads;
    const std::int64_t wave = gpu::resident_blocks(gelu_dbias<Q, true>, kThreads, std::int64_t{1} << 30);
    const std::int64_t groups = std::max<std::int64_t>(1, wave / col_blocks);  // row groups in one wave
    per_ = std::clamp<std::int64_t>((s.rows + groups - 1) / groups, kMinRows, kMaxRows);
    per_ = std::max(per_, (s.rows + kMaxGridY - 1) / kMaxGridY);
    splits_ = (s.rows + per_ - 1) / per_;
    partial_ = gpu::DeviceBuffer(static_cast<std::size_t>(splits_ * s.cols) * sizeof(float));
  }

  void run(const Args& a) override {
    const dim3 grid(static_cast<unsigned>((n4_ + kThreads - 1) / kThreads), static_cast<unsigned>(splits_));
    const Q* x = static_cast<const Q*>(a.x);
    Q* dx = static_cast<Q*>(a.dx);
    float4* partial = partial_.as<float4>();
    const int n4 = static_cast<int>(n4_);
    if (a.dy == a.dx)
      gelu_dbias<Q, true><<<grid, kThreads, 0, gpu::stream()>>>(nullptr, dx, x, s_.rows, per_, n4, partial);
    else
      gelu_dbias<Q, false><<<grid, kThreads, 0, gpu::stream()>>>(static_cast<const Q*>(a.dy), dx, x, s_.rows, per_, n4, partial);
    HOTOPS_CHECK_LAUNCH();
    const gpu::ColOut o{static_cast<int>(s_.cols), {a.dbias, nullptr, nullptr}};
    gpu::finish_columns(partial_.as<float>(), static_cast<int>(splits_), static_cast<int>(s_.cols), o, gpu::stream());
  }

  std::string label() const override {
    return "hotops kernels: GELU (erf: erfc by Abramowitz-Stegun 7.1.26) backward with column sums per " + std::to_string(per_) +
           " rows, 4-wide vectors; col_finish";
  }

 private:
  Shape s_;
  std::int64_t n4_, per_ = kMaxRows, splits_ = 1;
  gpu::DeviceBuffer partial_;  // [splits_, cols]
};

}  // namespace

std::unique_ptr<Plan> make_cuda_plan(const Shape& s) {
  if (s.dtype == DType::bf16) return std::make_unique<CudaGeluDbias<bf16>>(s);
  return std::make_unique<CudaGeluDbias<float>>(s);
}

}  // namespace hotops::gelu::dbias
