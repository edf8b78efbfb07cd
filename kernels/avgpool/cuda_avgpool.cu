// global_avgpool on CUDA: hand-written kernels, deterministic (each sum in a fixed order, no atomics),
// f32 math on the stored values, one launch a pass on gpu::stream():
//   fwd nlc: a block of 32 x 8 threads for 32 channels of one sample: each row of 8 takes every 8th
//            position (a warp reads 32 consecutive channels of a position: coalesced), then thread
//            row 0 adds the 8 partial sums in order and writes the mean;
//   fwd ncl: a warp a (sample, channel), its lanes striding over the contiguous positions, then a
//            warp sum;
//   bwd:     a grid-stride loop over dx, each element its (sample, channel)'s dy / L.
#include <cuda_bf16.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>

#include "hotops/check.h"
#include "hotops/cuda_elem.cuh"
#include "hotops/cuda_util.h"
#include "kernels/avgpool/avgpool.h"

namespace hotops::avgpool {
namespace {

constexpr unsigned kTile = 32, kRows = 8;  // fwd nlc: channels and position rows of a block
constexpr unsigned kThreads = 256;         // fwd ncl and bwd
constexpr std::int64_t kMaxBlocks = 4096;  // bwd's grid-stride loop

using bf16 = __nv_bfloat16;
using gpu::from_float;
using gpu::to_float;

template <class T>
__global__ void __launch_bounds__(kTile * kRows) mean_nlc(const T* __restrict__ x, T* __restrict__ y, std::int64_t L,
                                                          std::int64_t C) {
  const std::int64_t n = blockIdx.x, c = static_cast<std::int64_t>(blockIdx.y) * kTile + threadIdx.x;
  float s = 0.f;
  if (c < C)
    for (std::int64_t l = threadIdx.y; l < L; l += kRows) s += to_float(x[(n * L + l) * C + c]);
  __shared__ float part[kRows][kTile + 1];
  part[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y != 0 || c >= C) return;
  float total = 0.f;
  for (unsigned r = 0; r < kRows; ++r) total += part[r][threadIdx.x];
  y[n * C + c] = from_float<T>(total / static_cast<float>(L));
}

template <class T>
__global__ void __launch_bounds__(kThreads) mean_ncl(const T* __restrict__ x, T* __restrict__ y, std::int64_t rows,
                                                     std::int64_t L) {
  const std::int64_t row = static_cast<std::int64_t>(blockIdx.x) * (kThreads / 32) + threadIdx.x / 32;
  if (row >= rows) return;  // the whole warp
  const unsigned lane = threadIdx.x % 32;
  float s = 0.f;
  for (std::int64_t l = lane; l < L; l += 32) s += to_float(x[row * L + l]);
  s = gpu::warp_sum(s);
  if (lane == 0) y[row] = from_float<T>(s / static_cast<float>(L));
}

template <class T>
__global__ void __launch_bounds__(kThreads) spread(const T* __restrict__ dy, T* __restrict__ dx, std::int64_t count,
                                                   std::int64_t L, std::int64_t C, bool nlc) {
  const float len = static_cast<float>(L);
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t nc = nlc ? i / (L * C) * C + i % C : i / L;  // dy's element: n C + c
    dx[i] = from_float<T>(to_float(dy[nc]) / len);
  }
}

// T: the storage, float or bf16.
template <class T>
class CudaAvgpool final : public Plan {
 public:
  explicit CudaAvgpool(const Shape& s) : s_(s) {
    HOTOPS_CHECK(s.N <= 0x7fffffff && (s.C + kTile - 1) / kTile <= 65535, "global_avgpool: too many samples or channels for the grid");
  }

  void run(const Args& a) override {
    const cudaStream_t st = gpu::stream();
    if (s_.dir == Direction::bwd) {
      const auto count = static_cast<std::int64_t>(s_.in_elements());
      const auto blocks = static_cast<unsigned>(std::min<std::int64_t>((count + kThreads - 1) / kThreads, kMaxBlocks));
      spread<T><<<blocks, kThreads, 0, st>>>(static_cast<const T*>(a.dy), static_cast<T*>(a.out), count, s_.L, s_.C,
                                             s_.layout == Layout::nlc);
    } else if (s_.layout == Layout::nlc) {
      const dim3 grid(static_cast<unsigned>(s_.N), static_cast<unsigned>((s_.C + kTile - 1) / kTile));
      mean_nlc<T><<<grid, dim3(kTile, kRows), 0, st>>>(static_cast<const T*>(a.x), static_cast<T*>(a.out), s_.L, s_.C);
    } else {
      const std::int64_t rows = s_.N * s_.C, per_block = kThreads / 32;
      mean_ncl<T><<<static_cast<unsigned>((rows + per_block - 1) / per_block), kThreads, 0, st>>>(
          static_cast<const T*>(a.x), static_cast<T*>(a.out), rows, s_.L);
    }
    HOTOPS_CHECK_LAUNCH();
  }

  std::string label() const override {
    if (s_.dir == Direction::bwd) return "hotops kernel: dx = dy / L, grid-stride";
    return s_.layout == Layout::nlc ? "hotops kernel: 32 channels x 8 position rows a block, partial sums added in order"
                                    : "hotops kernel: a warp a (sample, channel), warp sum";
  }

 private:
  Shape s_;
};

}  // namespace

std::unique_ptr<Plan> make_cuda_plan(const Shape& s) {
  if (s.dtype == DType::bf16) return std::make_unique<CudaAvgpool<bf16>>(s);
  return std::make_unique<CudaAvgpool<float>>(s);
}

}  // namespace hotops::avgpool
