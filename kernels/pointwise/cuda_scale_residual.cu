// scale_residual on CUDA, hand-written kernels. fwd: y = x + gamma z in one grid-stride pass, 256
// threads a block, at most 4096 blocks. bwd: a kernel over tiles of 32 columns (one warp across them)
// by 64 rows (8 warps, 8 rows each) writes dz = gamma dy and each tile's partial sums of dy z (dgamma)
// and of the stored dz (dbias); then col_finish adds each column's tiles in order (deterministic). The
// partial sums are the plan's workspace, made when it is built; the launches need nothing else, so
// they can be captured.
#include <cuda_bf16.h>

#include <algorithm>
#include <string>

#include "hotops/cuda_colsum.cuh"
#include "hotops/cuda_elem.cuh"
#include "hotops/cuda_util.h"
#include "kernels/pointwise/scale_residual.h"

namespace hotops::pointwise::scale_residual {
namespace {

constexpr int kTileCols = 32;      // a block's columns (one warp across them)
constexpr int kTileRowGroups = 8;  // ... and its rows in flight (blockDim.y)
constexpr int kRowsPerSplit = 64;  // rows per block

template <class T>
__global__ void scale_residual_fwd(const T* __restrict__ x, const T* z, const float* __restrict__ gamma, T* y,
                                   std::int64_t n, int cols) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x)
    y[i] = gpu::from_float<T>(gpu::to_float(x[i]) + gamma[i % cols] * gpu::to_float(z[i]));
}

// dz may be dy (in place): each element is read before it is written, by the same thread.
template <class T>
__global__ void __launch_bounds__(kTileCols* kTileRowGroups)
    scale_residual_bwd(const T* __restrict__ z, const T* dy, const float* __restrict__ gamma, T* dz,
                       float* __restrict__ partial, int rows, int cols) {
  const int col = blockIdx.x * kTileCols + threadIdx.x;
  const int r0 = blockIdx.y * kRowsPerSplit, r1 = min(rows, r0 + kRowsPerSplit);
  float acc_g = 0.f, acc_b = 0.f;
  if (col < cols) {
    const float g = gamma[col];
    for (int r = r0 + threadIdx.y; r < r1; r += kTileRowGroups) {
      const std::int64_t i = static_cast<std::int64_t>(r) * cols + col;
      const float d = gpu::to_float(dy[i]);
      const T stored = gpu::from_float<T>(g * d);
      acc_g += d * gpu::to_float(z[i]);
      acc_b += gpu::to_float(stored);
      dz[i] = stored;
    }
  }
  __shared__ float sums[2][kTileRowGroups][kTileCols + 1];
  sums[0][threadIdx.y][threadIdx.x] = acc_g;
  sums[1][threadIdx.y][threadIdx.x] = acc_b;
  __syncthreads();
  if (threadIdx.y < 2 && col < cols) {  // warp 0 the dgamma partial, warp 1 the dbias partial
    float s = 0.f;
    for (int k = 0; k < kTileRowGroups; ++k) s += sums[threadIdx.y][k][threadIdx.x];
    partial[static_cast<std::int64_t>(blockIdx.y) * 2 * cols + threadIdx.y * cols + col] = s;
  }
}

unsigned blocks_for(std::int64_t n) { return static_cast<unsigned>(std::max<std::int64_t>(1, std::min<std::int64_t>((n + 255) / 256, 4096))); }

class CudaScaleResidual final : public Plan {
 public:
  explicit CudaScaleResidual(const Shape& s)
      : s_(s),
        grid_(static_cast<unsigned>((s.cols + kTileCols - 1) / kTileCols),
              static_cast<unsigned>((s.rows + kRowsPerSplit - 1) / kRowsPerSplit)) {
    HOTOPS_CHECK(s.rows < (std::int64_t{1} << 31) && 2 * s.cols < (std::int64_t{1} << 31),
                 "scale_residual: rows and cols must fit an int");
    HOTOPS_CHECK(s.dir == Direction::fwd || grid_.y < 65536u, "scale_residual: at most 65535 x 64 rows on CUDA");
    if (s.dir == Direction::bwd)
      partial_ = gpu::DeviceBuffer(static_cast<std::size_t>(grid_.y) * 2 * static_cast<std::size_t>(s.cols) * sizeof(float));
  }

  void run(const Args& a) override {
    if (s_.dtype == DType::bf16) launch<__nv_bfloat16>(a);
    else launch<float>(a);
  }

  std::string label() const override {
    const std::string t = dtype_name(s_.dtype);
    if (s_.dir == Direction::fwd)
      return "hotops scale_residual_fwd<" + t + ">, grid-stride, grid " + std::to_string(blocks_for(s_.count())) + "x256";
    return "hotops scale_residual_bwd<" + t + ">, grid " + std::to_string(grid_.x) + "x" + std::to_string(grid_.y) +
           " of 32x8 threads, + col_finish: dgamma and dbias in two deterministic stages";
  }

 private:
  template <class T>
  void launch(const Args& a) {
    const cudaStream_t st = gpu::stream();
    const int cols = static_cast<int>(s_.cols);
    if (s_.dir == Direction::fwd) {
      scale_residual_fwd<T><<<blocks_for(s_.count()), 256, 0, st>>>(static_cast<const T*>(a.x), static_cast<const T*>(a.z),
                                                                    a.gamma, static_cast<T*>(a.out), s_.count(), cols);
      HOTOPS_CHECK_LAUNCH();
      return;
    }
    scale_residual_bwd<T><<<grid_, dim3(kTileCols, kTileRowGroups), 0, st>>>(
        static_cast<const T*>(a.z), static_cast<const T*>(a.dy), a.gamma, static_cast<T*>(a.out), partial_.as<float>(),
        static_cast<int>(s_.rows), cols);
    HOTOPS_CHECK_LAUNCH();
    const gpu::ColOut o{cols, {a.dgamma, a.dbias, nullptr}};
    gpu::finish_columns(partial_.as<const float>(), static_cast<int>(grid_.y), 2 * cols, o, st);
  }

  Shape s_;
  dim3 grid_;
  gpu::DeviceBuffer partial_;  // bwd: [row splits][dgamma | dbias]
};

}  // namespace

std::unique_ptr<Plan> make_cuda_plan(const Shape& s) { return std::make_unique<CudaScaleResidual>(s); }

}  // namespace hotops::pointwise::scale_residual
