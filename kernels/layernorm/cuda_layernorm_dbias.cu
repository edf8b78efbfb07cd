// layernorm_dbias on CUDA: ln_bwd, a warp per row (rows strided over 128 blocks of 8 warps), writes
// dx and each block's column sums of dy * xhat, dy and the stored dx into partial[block][3H]; then
// col_finish (hotops/cuda_colsum.cuh) adds the blocks' partials into dgamma | dbeta | dbias.
// Deterministic: fixed-order sums, no atomics. Both launches on gpu::stream(): capturable.
#include <cuda_bf16.h>

#include <cstdint>
#include <memory>
#include <string>

#include "hotops/check.h"
#include "hotops/cuda_colsum.cuh"
#include "hotops/cuda_elem.cuh"
#include "hotops/cuda_util.h"
#include "kernels/layernorm/layernorm_dbias.h"

namespace hotops::layernorm::dbias {
namespace {

constexpr int kMaxHidden = static_cast<int>(kCudaMaxHidden);  // 32 elements of a row per lane
constexpr unsigned kThreads = 256;
constexpr int kBlocks = 128;

using bf16 = __nv_bfloat16;
using gpu::warp_sum;

// dx = rstd (dy g - mean(dy g) - xhat mean(dy g xhat)) (+ dres), when dx is given; each block's sums
// of dy xhat, dy and (with dx) the stored dx per column into partial[block][3h] (warps added in
// order: deterministic). The third is the next dense layer's bias gradient, so its output needs no
// column-sum pass of its own; each warp keeps it in shared memory (in registers, beside the other
// two, the kernel takes 1.7x as long).
template <class T>
__global__ void __launch_bounds__(kThreads) ln_bwd(const T* __restrict__ dy, const T* __restrict__ x,
                                                  const float* __restrict__ mean, const float* __restrict__ rstd,
                                                  const float* __restrict__ g, T* __restrict__ dx,
                                                  const T* __restrict__ dres, float* __restrict__ partial,
                                                  std::int64_t rows, int h) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  float pg[kMaxHidden / 32], pb[kMaxHidden / 32];
#pragma unroll
  for (int k = 0; k < kMaxHidden / 32; ++k) pg[k] = pb[k] = 0.f;
  __shared__ float px[kThreads / 32][kMaxHidden];
  for (int c = lane; c < h; c += 32) px[warp][c] = 0.f;
  for (std::int64_t r = static_cast<std::int64_t>(blockIdx.x) * warps + warp; r < rows; r += static_cast<std::int64_t>(gridDim.x) * warps) {
    const float m = mean[r], rs = rstd[r];
    float d[kMaxHidden / 32], xh[kMaxHidden / 32];
    float m1 = 0.f, m2 = 0.f;
#pragma unroll
    for (int k = 0; k < kMaxHidden / 32; ++k) {
      const int c = lane + 32 * k;
      if (c < h) {
        d[k] = gpu::to_float(dy[r * h + c]);
        xh[k] = (gpu::to_float(x[r * h + c]) - m) * rs;
        pg[k] += d[k] * xh[k], pb[k] += d[k];
        const float dg = d[k] * g[c];
        m1 += dg, m2 += dg * xh[k];
      }
    }
    if (!dx) continue;
    m1 = warp_sum(m1) / static_cast<float>(h), m2 = warp_sum(m2) / static_cast<float>(h);
#pragma unroll
    for (int k = 0; k < kMaxHidden / 32; ++k) {
      const int c = lane + 32 * k;
      if (c < h) {
        const T v = gpu::from_float<T>(rs * (d[k] * g[c] - m1 - xh[k] * m2) + (dres ? gpu::to_float(dres[r * h + c]) : 0.f));
        dx[r * h + c] = v;
        px[warp][c] += gpu::to_float(v);  // the sum of what the next layer reads
      }
    }
  }
  __shared__ float acc[3 * kMaxHidden];
  for (int c = threadIdx.x; c < 3 * h; c += blockDim.x) acc[c] = 0.f;
  for (int w = 0; w < warps; ++w) {
    __syncthreads();
    if (warp == w)
#pragma unroll
      for (int k = 0; k < kMaxHidden / 32; ++k) {
        const int c = lane + 32 * k;
        if (c < h) acc[c] += pg[k], acc[h + c] += pb[k], acc[2 * h + c] += px[w][c];
      }
  }
  __syncthreads();
  for (int c = threadIdx.x; c < 3 * h; c += blockDim.x) partial[static_cast<std::int64_t>(blockIdx.x) * 3 * h + c] = acc[c];
}

// T: the storage, float or bf16.
template <class T>
class CudaLayernormDbias final : public Plan {
 public:
  explicit CudaLayernormDbias(const Shape& s)
      : s_(s), partial_(static_cast<std::size_t>(kBlocks) * 3 * static_cast<std::size_t>(s.hidden) * sizeof(float)) {
    HOTOPS_CHECK(s.hidden <= kMaxHidden, "layernorm_dbias on CUDA: hidden must be at most 1024");
  }

  void run(const Args& a) override {
    HOTOPS_CHECK(!a.dbias || a.dx, "layernorm_dbias: dbias is the column sums of dx, which needs dx");
    const int H = static_cast<int>(s_.hidden);
    ln_bwd<T><<<kBlocks, kThreads, 0, gpu::stream()>>>(static_cast<const T*>(a.dy), static_cast<const T*>(a.x), a.saved_mean,
                                                       a.saved_rstd, a.gamma, static_cast<T*>(a.dx), static_cast<const T*>(a.dres),
                                                       partial_.as<float>(), s_.rows(), H);
    HOTOPS_CHECK_LAUNCH();
    const gpu::ColOut o{H, {a.dgamma, a.dbeta, a.dbias}};
    gpu::col_finish<kThreads><<<gpu::col_finish_blocks(3 * s_.hidden), kThreads, 0, gpu::stream()>>>(partial_.as<float>(), kBlocks,
                                                                                                      3 * H, o);
    HOTOPS_CHECK_LAUNCH();
  }

  std::string label() const override {
    return "hotops kernels: LayerNorm backward a warp per row (+ dres) with per-block column sums of dy*xhat, dy, dx; col_finish";
  }

 private:
  Shape s_;
  gpu::DeviceBuffer partial_;  // [kBlocks, 3H]
};

}  // namespace

std::unique_ptr<Plan> make_cuda_plan(const Shape& s) {
  if (s.dtype == DType::bf16) return std::make_unique<CudaLayernormDbias<bf16>>(s);
  return std::make_unique<CudaLayernormDbias<float>>(s);
}

}  // namespace hotops::layernorm::dbias
