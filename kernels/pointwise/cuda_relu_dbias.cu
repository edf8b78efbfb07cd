// relu_dbias on CUDA, one hand-written kernel: dx = x > 0 ? dy : 0 over a [rows, cols] row-major
// tensor and db = colsum(dx) in f32, in two deterministic stages within the one launch. A block
// takes 32 columns (one warp across them) and 64 rows (8 warps, 8 rows each); each writes its
// partial sums, and the last block of a column tile to finish (a ticket per tile, which it resets
// for the next launch) adds them in row-split order. The partial sums and the tickets are the
// plan's workspace, made when it is built; the launch needs nothing else, so it can be captured.
// relu_bias: y = act(x + b) in one grid-stride pass, 256 threads a block, at most 4096 blocks.
#include <cuda_bf16.h>

#include <algorithm>
#include <string>

#include "hotops/cuda_elem.cuh"
#include "hotops/cuda_util.h"
#include "kernels/pointwise/pointwise.h"

namespace hotops::pointwise {
namespace {

constexpr int kTileCols = 32;      // a block's columns (one warp across them)
constexpr int kTileRowGroups = 8;  // ... and its rows in flight (blockDim.y)
constexpr int kRowsPerSplit = 64;  // rows per block

// T: the storage of x, dy and dx (float or __nv_bfloat16); the sums in f32. kInPlace: dx is dy, read
// and written through dx alone (dy is not read), so that every pointer may be __restrict__.
template <class T, bool kInPlace>
__global__ void __launch_bounds__(kTileCols* kTileRowGroups) relu_dbias_kernel(
    const T* __restrict__ x, const T* __restrict__ dy, T* __restrict__ dx, float* __restrict__ db,
    float* __restrict__ partial, unsigned* __restrict__ tickets, int rows, int cols) {
  const int col = blockIdx.x * kTileCols + threadIdx.x;
  const int r0 = blockIdx.y * kRowsPerSplit, r1 = min(rows, r0 + kRowsPerSplit);
  float acc = 0.f;
  if (col < cols)
    for (int r = r0 + threadIdx.y; r < r1; r += kTileRowGroups) {
      const std::int64_t i = static_cast<std::int64_t>(r) * cols + col;
      const float d = gpu::to_float(x[i]) > 0.f ? gpu::to_float(kInPlace ? dx[i] : dy[i]) : 0.f;
      dx[i] = gpu::from_float<T>(d);
      acc += d;
    }
  __shared__ float sums[kTileRowGroups][kTileCols + 1];
  __shared__ bool last;
  sums[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y == 0 && col < cols) {
    float s = 0.f;
    for (int g = 0; g < kTileRowGroups; ++g) s += sums[g][threadIdx.x];
    partial[static_cast<std::int64_t>(blockIdx.y) * cols + col] = s;
    __threadfence();
  }
  __syncthreads();
  if (threadIdx.x == 0 && threadIdx.y == 0) {
    last = atomicAdd(&tickets[blockIdx.x], 1u) == gridDim.y - 1;
    if (last) tickets[blockIdx.x] = 0;
  }
  __syncthreads();
  if (last && threadIdx.y == 0 && col < cols) {
    __threadfence();
    float s = 0.f;
    for (unsigned y = 0; y < gridDim.y; ++y) s += static_cast<volatile const float*>(partial)[static_cast<std::int64_t>(y) * cols + col];
    db[col] = s;
  }
}

class CudaReluDbias final : public Plan {
 public:
  explicit CudaReluDbias(const Shape& s)
      : s_(s),
        grid_(static_cast<unsigned>((s.cols + kTileCols - 1) / kTileCols),
              static_cast<unsigned>((s.rows() + kRowsPerSplit - 1) / kRowsPerSplit)) {
    HOTOPS_CHECK(s.rows() < (std::int64_t{1} << 31) && s.cols < (std::int64_t{1} << 31),
                 "relu_dbias: rows and cols must fit an int");
    partial_ = gpu::DeviceBuffer(static_cast<std::size_t>(grid_.y) * static_cast<std::size_t>(s.cols) * sizeof(float));
    tickets_ = gpu::DeviceBuffer(grid_.x * sizeof(unsigned));
    HOTOPS_CHECK_CUDA(cudaMemsetAsync(tickets_.get(), 0, tickets_.bytes(), gpu::stream()));
  }

  void run(const Args& a) override {
    if (s_.dtype == DType::bf16) launch<__nv_bfloat16>(a);
    else launch<float>(a);
  }

  std::string label() const override {
    return std::string("hotops relu_dbias_kernel<") + dtype_name(s_.dtype) + ">, grid " + std::to_string(grid_.x) +
           "x" + std::to_string(grid_.y) + " of 32x8 threads, db in two deterministic stages in one launch";
  }

 private:
  template <class T>
  void launch(const Args& a) {
    const std::size_t off = static_cast<std::size_t>(s_.offset);
    const auto kernel = a.out == a.dy ? relu_dbias_kernel<T, true> : relu_dbias_kernel<T, false>;
    kernel<<<grid_, dim3(kTileCols, kTileRowGroups), 0, gpu::stream()>>>(
        static_cast<const T*>(a.x) + off, static_cast<const T*>(a.dy) + off, static_cast<T*>(a.out) + off, a.db,
        partial_.as<float>(), tickets_.as<unsigned>(), static_cast<int>(s_.rows()), static_cast<int>(s_.cols));
    HOTOPS_CHECK_LAUNCH();
  }

  Shape s_;
  dim3 grid_;
  gpu::DeviceBuffer partial_, tickets_;
};

// y = act(x + b) over [rows, cols] row-major, the bias add and the ReLU in one pass. kInPlace: y is
// x, read and written through y alone.
template <class T, bool kInPlace>
__global__ void relu_bias_kernel(const T* __restrict__ x, T* __restrict__ y, const T* __restrict__ b, std::int64_t rows,
                                 int cols, bool relu) {
  const std::int64_t n = rows * cols;
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const float v = gpu::to_float(kInPlace ? y[i] : x[i]) + gpu::to_float(b[i % cols]);
    y[i] = gpu::from_float<T>(relu ? fmaxf(v, 0.f) : v);
  }
}

class CudaReluBias final : public Plan {
 public:
  explicit CudaReluBias(const Shape& s)
      : s_(s), blocks_(static_cast<unsigned>(std::min<std::int64_t>((s.elements + 255) / 256, 4096))) {
    HOTOPS_CHECK(s.cols < (std::int64_t{1} << 31), "relu_bias: cols must fit an int");
  }

  void run(const Args& a) override {
    if (s_.dtype == DType::bf16) launch<__nv_bfloat16>(a);
    else launch<float>(a);
  }

  std::string label() const override {
    return std::string("hotops relu_bias_kernel<") + dtype_name(s_.dtype) + ">" + (s_.relu ? "" : " (no ReLU)") +
           ", grid-stride, grid " + std::to_string(blocks_) + "x256";
  }

 private:
  template <class T>
  void launch(const Args& a) {
    const std::size_t off = static_cast<std::size_t>(s_.offset);
    const auto kernel = a.out == a.x ? relu_bias_kernel<T, true> : relu_bias_kernel<T, false>;
    kernel<<<blocks_, 256, 0, gpu::stream()>>>(static_cast<const T*>(a.x) + off, static_cast<T*>(a.out) + off,
                                               static_cast<const T*>(a.b), s_.rows(), static_cast<int>(s_.cols), s_.relu);
    HOTOPS_CHECK_LAUNCH();
  }

  Shape s_;
  unsigned blocks_;
};

}  // namespace

std::unique_ptr<Plan> make_cuda_relu_dbias_plan(const Shape& s) { return std::make_unique<CudaReluDbias>(s); }
std::unique_ptr<Plan> make_cuda_relu_bias_plan(const Shape& s) { return std::make_unique<CudaReluBias>(s); }

}  // namespace hotops::pointwise
