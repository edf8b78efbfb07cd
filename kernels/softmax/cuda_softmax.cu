// softmax on CUDA: hand-written, memory-bound kernels, f32 math for both dtypes.
//  - cols <= kWarpMaxCols: one warp per row (rows of at most 16 vectors: a group of 4 or 8 lanes
//    per row, two vectors a lane), kWarpsPerBlock warps per block. The row is loaded once
//    into registers (16-byte vectors when the row's bytes are a multiple of 16, else one element
//    per access, lanes interleaved so every load is coalesced), max and sum by shuffles within the
//    row's lanes, and written once: the fewest bytes. Instantiated for the per-lane register counts
//    1..32.
//  - wider rows: one block per row, kBlockThreads threads, block reductions through shared memory;
//    the row is read twice (fwd: max, then sum and write re-reading exp(x - max) from L2) or once
//    plus once (bwd: sum, then write).
// exp is expf (libdevice, within 2 ulp), not __expf, whose error grows with |x - max|.
#include <cuda_bf16.h>

#include <cmath>
#include <cstdint>
#include <string>

#include "hotops/cuda_elem.cuh"
#include "hotops/cuda_util.h"
#include "kernels/softmax/softmax.h"

namespace hotops::softmax {
namespace {

constexpr unsigned kWarp = 32;
constexpr unsigned kWarpsPerBlock = 4;
constexpr unsigned kBlockThreads = 512;

using gpu::Elem;
using gpu::Pack;

using gpu::warp_max;
using gpu::warp_sum;

struct KernelArgs {
  const void* a;  // x (fwd) or y (bwd)
  const void* dy;  // bwd only
  void* out;
  std::int64_t rows;
  std::int64_t cols;
};

// kLanes lanes per row (a warp, or an aligned group of it: 32 / kLanes rows a warp, where a row's
// vectors fill fewer lanes than a warp has). Lane l of a row holds its vectors l, l + kLanes, ...
// (kIters of them, V elements each); vectors past the row's end are masked (-inf for the max, 0 for
// the sums). A group past the last row computes on masked values and stores nothing: every lane of
// the warp takes part in the shuffles.
template <class T, int V, int kIters, int kLanes, bool kBwd>
__global__ void __launch_bounds__(kWarp * kWarpsPerBlock) warp_softmax(KernelArgs a) {
  using E = Elem<T>;
  using Vt = Pack<T, V>;
  constexpr int kRowsPerWarp = static_cast<int>(kWarp) / kLanes;
  const std::int64_t first = (static_cast<std::int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / kWarp) * kRowsPerWarp;
  if (first >= a.rows) return;  // whole warps leave together
  const std::int64_t row = first + static_cast<int>(threadIdx.x % kWarp) / kLanes;
  const bool live = row < a.rows;
  const int lane = static_cast<int>(threadIdx.x % kLanes);
  const int nvec = live ? static_cast<int>(a.cols / V) : 0;
  const std::size_t base = static_cast<std::size_t>(live ? row : 0) * static_cast<std::size_t>(a.cols);
  const Vt* src = reinterpret_cast<const Vt*>(static_cast<const T*>(a.a) + base);
  Vt* dst = reinterpret_cast<Vt*>(static_cast<T*>(a.out) + base);
  float v[kIters][V];
  if constexpr (!kBwd) {
#pragma unroll
    for (int it = 0; it < kIters; ++it) {
      const int k = lane + it * kLanes;
      if (k < nvec) {
        const Vt t = src[k];
#pragma unroll
        for (int j = 0; j < V; ++j) v[it][j] = E::load(t.v[j]);
      } else {
#pragma unroll
        for (int j = 0; j < V; ++j) v[it][j] = -INFINITY;
      }
    }
    float m = -INFINITY;
#pragma unroll
    for (int it = 0; it < kIters; ++it)
#pragma unroll
      for (int j = 0; j < V; ++j) m = fmaxf(m, v[it][j]);
    m = warp_max<kLanes>(m);
    if (!live) m = 0.f;  // an all-masked group: exp(-inf - 0) = 0, no NaN
    float sum = 0.f;
#pragma unroll
    for (int it = 0; it < kIters; ++it)
#pragma unroll
      for (int j = 0; j < V; ++j) sum += (v[it][j] = expf(v[it][j] - m));  // masked: exp(-inf) = 0
    const float inv = 1.f / warp_sum<kLanes>(sum);
#pragma unroll
    for (int it = 0; it < kIters; ++it) {
      const int k = lane + it * kLanes;
      if (k < nvec) {
        Vt t;
#pragma unroll
        for (int j = 0; j < V; ++j) t.v[j] = E::store(v[it][j] * inv);
        dst[k] = t;
      }
    }
  } else {
    const Vt* dsrc = reinterpret_cast<const Vt*>(static_cast<const T*>(a.dy) + base);
    float d[kIters][V];
    float s = 0.f;
#pragma unroll
    for (int it = 0; it < kIters; ++it) {
      const int k = lane + it * kLanes;
      if (k < nvec) {
        const Vt ty = src[k], td = dsrc[k];
#pragma unroll
        for (int j = 0; j < V; ++j) v[it][j] = E::load(ty.v[j]), d[it][j] = E::load(td.v[j]);
      } else {
#pragma unroll
        for (int j = 0; j < V; ++j) v[it][j] = 0.f, d[it][j] = 0.f;
      }
    }
#pragma unroll
    for (int it = 0; it < kIters; ++it)
#pragma unroll
      for (int j = 0; j < V; ++j) s = fmaf(d[it][j], v[it][j], s);
    s = warp_sum<kLanes>(s);
#pragma unroll
    for (int it = 0; it < kIters; ++it) {
      const int k = lane + it * kLanes;
      if (k < nvec) {
        Vt t;
#pragma unroll
        for (int j = 0; j < V; ++j) t.v[j] = E::store(v[it][j] * (d[it][j] - s));
        dst[k] = t;
      }
    }
  }
}

// The block-wide reduction of v (max or sum) through shared memory; every thread gets the result.
template <bool kMax>
__device__ float block_reduce(float v, float* shared) {
  v = kMax ? warp_max(v) : warp_sum(v);
  const unsigned lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  __syncthreads();  // shared may still be read from the previous reduction
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  v = lane < blockDim.x / kWarp ? shared[lane] : (kMax ? -INFINITY : 0.f);
  return kMax ? warp_max(v) : warp_sum(v);
}

// One block per row, one element per access (rows wider than a warp holds are rare and long).
template <class T, bool kBwd>
__global__ void __launch_bounds__(kBlockThreads) block_softmax(KernelArgs a) {
  using E = Elem<T>;
  __shared__ float shared[kBlockThreads / kWarp];
  const std::size_t base = static_cast<std::size_t>(blockIdx.x) * static_cast<std::size_t>(a.cols);
  const T* src = static_cast<const T*>(a.a) + base;
  T* dst = static_cast<T*>(a.out) + base;
  if constexpr (!kBwd) {
    float m = -INFINITY;
    for (std::int64_t i = threadIdx.x; i < a.cols; i += blockDim.x) m = fmaxf(m, E::load(src[i]));
    m = block_reduce<true>(m, shared);
    float sum = 0.f;
    for (std::int64_t i = threadIdx.x; i < a.cols; i += blockDim.x) sum += expf(E::load(src[i]) - m);
    const float inv = 1.f / block_reduce<false>(sum, shared);
    for (std::int64_t i = threadIdx.x; i < a.cols; i += blockDim.x) dst[i] = E::store(expf(E::load(src[i]) - m) * inv);
  } else {
    const T* dsrc = static_cast<const T*>(a.dy) + base;
    float s = 0.f;
    for (std::int64_t i = threadIdx.x; i < a.cols; i += blockDim.x) s = fmaf(E::load(dsrc[i]), E::load(src[i]), s);
    s = block_reduce<false>(s, shared);
    for (std::int64_t i = threadIdx.x; i < a.cols; i += blockDim.x)
      dst[i] = E::store(E::load(src[i]) * (E::load(dsrc[i]) - s));
  }
}

using Kernel = void (*)(KernelArgs);

// A whole warp a row: the smallest power-of-two kIters that holds the row (vectors per lane).
template <class T, int V, bool kBwd>
Kernel warp_kernel(int iters) {
  static_assert(32 % V == 0);
  if (iters <= 1) return warp_softmax<T, V, 1, 32, kBwd>;
  if (iters <= 2) return warp_softmax<T, V, 2, 32, kBwd>;
  if (iters <= 4) return warp_softmax<T, V, 4, 32, kBwd>;
  if (iters <= 8 && 8 * V <= 32) return warp_softmax<T, V, (8 * V <= 32 ? 8 : 1), 32, kBwd>;
  if (iters <= 16 && 16 * V <= 32) return warp_softmax<T, V, (16 * V <= 32 ? 16 : 1), 32, kBwd>;
  if (iters <= 32 && V == 1) return warp_softmax<T, V, 32, 32, kBwd>;
  throw Error("softmax: no warp kernel for this row width", ErrorKind::failure);
}

// Rows of at most 16 vectors (half a warp or less): 4 or 8 lanes a row, two vectors a lane (one where
// the row has at most 4), so that few lanes of a warp idle past their row's end.
template <class T, int V, bool kBwd>
Kernel group_kernel(int lanes, int iters) {
  if (lanes == 4) return iters == 1 ? warp_softmax<T, V, 1, 4, kBwd> : warp_softmax<T, V, 2, 4, kBwd>;
  return warp_softmax<T, V, 2, 8, kBwd>;
}

struct Choice {
  Kernel kernel;
  int vec;    // elements per access
  int iters;  // accesses per lane and input (warp kernel)
  int lanes;  // lanes a row (warp kernel; 0: the block kernel, a block a row)
  bool per_warp() const { return lanes > 0; }
};

template <class T, bool kBwd>
Choice choose(std::int64_t cols) {
  constexpr int kVec = static_cast<int>(16 / sizeof(T));
  if (cols > kWarpMaxCols) return {block_softmax<T, kBwd>, 1, 0, 0};
  const int v = cols % kVec == 0 ? kVec : 1;
  const int nvec = static_cast<int>(cols) / v;
  if (nvec <= static_cast<int>(kWarp) / 2) {
    int lanes = 4;
    while (2 * lanes < nvec) lanes *= 2;
    const int iters = nvec <= lanes ? 1 : 2;
    return {v == kVec ? group_kernel<T, kVec, kBwd>(lanes, iters) : group_kernel<T, 1, kBwd>(lanes, iters), v, iters, lanes};
  }
  const int need = (nvec + static_cast<int>(kWarp) - 1) / static_cast<int>(kWarp);
  int iters = 1;
  while (iters < need) iters *= 2;
  return {v == kVec ? warp_kernel<T, kVec, kBwd>(iters) : warp_kernel<T, 1, kBwd>(iters), v, iters, static_cast<int>(kWarp)};
}

Choice choose(const Shape& s) {
  const bool bwd = s.dir == Direction::bwd;
  if (s.dtype == DType::bf16) return bwd ? choose<std::uint16_t, true>(s.cols) : choose<std::uint16_t, false>(s.cols);
  return bwd ? choose<float, true>(s.cols) : choose<float, false>(s.cols);
}

class CudaSoftmax final : public Plan {
 public:
  explicit CudaSoftmax(const Shape& s) : s_(s), choice_(choose(s_)) {
    const std::int64_t per_block = choice_.per_warp() ? kWarpsPerBlock * (kWarp / choice_.lanes) : 1;  // rows
    const std::int64_t blocks = (s_.rows + per_block - 1) / per_block;
    HOTOPS_CHECK(blocks <= gpu::limits().max_grid_x, "softmax: too many rows for one grid: " + std::to_string(s_.rows));
    blocks_ = static_cast<unsigned>(blocks);
    threads_ = choice_.per_warp() ? kWarp * kWarpsPerBlock : kBlockThreads;
  }

  void run(const Args& t) override {
    const bool bwd = s_.dir == Direction::bwd;
    choice_.kernel<<<blocks_, threads_, 0, gpu::stream()>>>(KernelArgs{bwd ? t.y : t.x, t.dy, t.out, s_.rows, s_.cols});
    HOTOPS_CHECK_LAUNCH();
  }

  std::string label() const override {
    std::string l = std::string("hotops ") + (choice_.per_warp() ? "warp_softmax<" : "block_softmax<") +
                    dtype_name(s_.dtype) + ", " + direction_name(s_.dir) + ">: f32 math, expf, ";
    if (choice_.per_warp())
      l += (choice_.lanes == static_cast<int>(kWarp) ? std::string("one warp") : std::to_string(choice_.lanes) + " lanes") +
           " per row, " + std::to_string(choice_.iters) + " x " +
           (choice_.vec > 1 ? "16-byte vectors" : std::string("scalars")) + " per lane in registers";
    else
      l += "one block of " + std::to_string(kBlockThreads) + " per row";
    return l + ", grid " + std::to_string(blocks_) + "x" + std::to_string(threads_);
  }

 private:
  Shape s_;
  Choice choice_;
  unsigned blocks_ = 1, threads_ = 1;
};

}  // namespace

std::unique_ptr<Plan> make_cuda_plan(const Shape& s) { return std::make_unique<CudaSoftmax>(s); }

}  // namespace hotops::softmax
