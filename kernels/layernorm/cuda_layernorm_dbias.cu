// layernorm_dbias on CUDA: ln_bwd, a warp per row over a grid that fills the GPU in one wave (the
// SMs times the blocks of 8 warps each holds, fewer for few rows; warps stride over the rows), writes
// dx and each block's column sums of dy * xhat, dy and the stored dx into partial[block][3H]; then
// col_finish (hotops/cuda_colsum.cuh) adds the blocks' partials into dgamma | dbeta | dbias. A warp
// keeps its columns' three sums in shared memory (its own region, each lane its own slots), not in
// registers: 72 more registers a lane at H = 768 held one block an SM, 8 warps, too few to hide the
// rows' load latency. A lane holds VEC elements per access, 16 bytes where H is a multiple of 16
// bytes' worth and the tensors are 16-byte aligned, else one (any H up to kCudaMaxHidden); a row's
// loads all go out before its first sum. Deterministic: fixed-order sums, no atomics. Both launches
// on gpu::stream(): capturable.
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

constexpr int kMaxHidden = static_cast<int>(kCudaMaxHidden);
constexpr unsigned kThreads = 256;
constexpr int kWarps = kThreads / 32;

using bf16 = __nv_bfloat16;
using gpu::Pack;
using gpu::to_float;
using gpu::warp_sum;

// The shared-memory slot of element j of a lane's k-th vector: slots run lane-fastest, with the
// lane index xor-swizzled by j so that both a warp adding its elements (fixed k, j; all lanes) and a
// block reading consecutive columns (VEC elements of 32 / VEC lanes) touch 32 distinct banks.
template <int VEC>
__device__ __forceinline__ int slot(int k, int j, int lane) {
  return (k * VEC + j) * 32 + (lane ^ (j * (32 / VEC)));
}

// The shared memory of ln_bwd<T, VEC, N>: each warp's three column sums, N * VEC * 32 slots each.
template <int VEC, int N>
constexpr std::size_t smem_bytes() {
  return static_cast<std::size_t>(kWarps) * 3 * N * VEC * 32 * sizeof(float);
}

// dx = rstd (dy g - mean(dy g) - xhat mean(dy g xhat)) (+ dres), when dx is given; each block's sums
// of dy xhat, dy and (with dx) the stored dx per column into partial[block][3h]. Lane `lane` of a
// warp owns the row's vectors lane + 32 k (k < N) of VEC elements, and adds its columns' three sums
// over the warp's rows into its slots of the warp's shared-memory region; the block adds its warps'
// sums in warp order (deterministic). The third sum is the next dense layer's bias gradient, so that
// output needs no column-sum pass of its own.
template <class T, int VEC, int N>
__global__ void __launch_bounds__(kThreads) ln_bwd(const T* __restrict__ dy, const T* __restrict__ x,
                                                  const float* __restrict__ mean, const float* __restrict__ rstd,
                                                  const float* __restrict__ g, T* __restrict__ dx,
                                                  const T* __restrict__ dres, float* __restrict__ partial,
                                                  std::int64_t rows, int h) {
  static_assert(N * VEC * 32 <= kMaxHidden, "a lane's vectors past the widest row");
  constexpr int kSlots = N * VEC * 32;  // a warp's slots for one of the three sums
  using P = Pack<T, VEC>;
  extern __shared__ float sums[];  // [kWarps][3][kSlots]
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, nvec = h / VEC;
  float* const acc = sums + warp * 3 * kSlots;
#pragma unroll
  for (int k = 0; k < N; ++k)
#pragma unroll
    for (int j = 0; j < VEC; ++j) {
      const int i = slot<VEC>(k, j, lane);
      acc[i] = acc[kSlots + i] = acc[2 * kSlots + i] = 0.f;
    }
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * kWarps;
  for (std::int64_t r = static_cast<std::int64_t>(blockIdx.x) * kWarps + warp; r < rows; r += stride) {
    const T* xr = x + r * h;
    const T* dyr = dy + r * h;
    P xv[N], dv[N], rv[N];
#pragma unroll
    for (int k = 0; k < N; ++k) {
      const int v = lane + 32 * k;
      if (v < nvec) {
        xv[k] = gpu::load_pack<T, VEC>(xr + v * VEC);
        dv[k] = gpu::load_pack<T, VEC>(dyr + v * VEC);
        if (dx && dres) rv[k] = gpu::load_pack<T, VEC>(dres + r * h + v * VEC);
      }
    }
    const float m = mean[r], rs = rstd[r];
    float m1 = 0.f, m2 = 0.f;
#pragma unroll
    for (int k = 0; k < N; ++k) {
      const int v = lane + 32 * k;
      if (v < nvec) {
        float gm[VEC];
        gpu::load<float, VEC>(g + v * VEC, gm);
#pragma unroll
        for (int j = 0; j < VEC; ++j) {
          const float d = to_float(dv[k].v[j]), xh = (to_float(xv[k].v[j]) - m) * rs;
          const int i = slot<VEC>(k, j, lane);
          acc[i] += d * xh, acc[kSlots + i] += d;
          const float dg = d * gm[j];
          m1 += dg, m2 += dg * xh;
        }
      }
    }
    if (!dx) continue;
    m1 = warp_sum(m1) / static_cast<float>(h), m2 = warp_sum(m2) / static_cast<float>(h);
#pragma unroll
    for (int k = 0; k < N; ++k) {
      const int v = lane + 32 * k;
      if (v < nvec) {
        float gm[VEC];
        gpu::load<float, VEC>(g + v * VEC, gm);
        P out;
#pragma unroll
        for (int j = 0; j < VEC; ++j) {
          const float d = to_float(dv[k].v[j]), xh = (to_float(xv[k].v[j]) - m) * rs;
          out.v[j] = gpu::from_float<T>(rs * (d * gm[j] - m1 - xh * m2) + (dres ? to_float(rv[k].v[j]) : 0.f));
          acc[2 * kSlots + slot<VEC>(k, j, lane)] += to_float(out.v[j]);  // the sum of what the next layer reads
        }
        *reinterpret_cast<P*>(dx + r * h + v * VEC) = out;
      }
    }
  }
  // The block's sums: each column's warps added in warp order.
  __syncthreads();
  float* out = partial + static_cast<std::int64_t>(blockIdx.x) * 3 * h;
  for (int c = threadIdx.x; c < h; c += kThreads) {
    const int v = c / VEC, i = slot<VEC>(v / 32, c % VEC, v % 32);
#pragma unroll
    for (int q = 0; q < 3; ++q) {
      float s = 0.f;
#pragma unroll
      for (int w = 0; w < kWarps; ++w) s += sums[(w * 3 + q) * kSlots + i];
      out[q * h + c] = s;
    }
  }
}

template <class T>
using KernelFn = void (*)(const T*, const T*, const float*, const float*, const float*, T*, const T*, float*, std::int64_t, int);
// A kernel instance and the shared memory it launches with.
template <class T>
struct Kernel {
  KernelFn<T> fn = nullptr;
  std::size_t smem = 0;
};

// ln_bwd<T, VEC, N> for the smallest N of 1, 2, 3, 4, 6, 8, 16, 32 (from 8 for one element per
// access) that holds `need` vectors per lane; at most the vectors per lane of a kMaxHidden row.
template <class T, int VEC, int N = (VEC > 1 ? 1 : 8)>
Kernel<T> ln_bwd_for(int need) {
  constexpr int kMax = kMaxHidden / (32 * VEC);
  if constexpr (N >= kMax) {
    return {ln_bwd<T, VEC, kMax>, smem_bytes<VEC, kMax>()};
  } else {
    if (need <= N) return {ln_bwd<T, VEC, N>, smem_bytes<VEC, N>()};
    return ln_bwd_for<T, VEC, (N < 4 ? N + 1 : N == 4 ? 6 : N == 6 ? 8 : 2 * N)>(need);
  }
}

// The kernel's launch allowing its shared memory (above the default 48 KiB where it needs it).
template <class T>
Kernel<T> allowed(Kernel<T> k) {
  HOTOPS_CHECK_CUDA(cudaFuncSetAttribute(k.fn, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(k.smem)));
  return k;
}

// T: the storage, float or bf16.
template <class T>
class CudaLayernormDbias final : public Plan {
  static constexpr int kVec = 16 / static_cast<int>(sizeof(T));

 public:
  explicit CudaLayernormDbias(const Shape& s) : s_(s) {
    HOTOPS_CHECK(s.hidden <= kMaxHidden, "layernorm_dbias on CUDA: hidden must be at most 1024");
    const int H = static_cast<int>(s.hidden);
    vec_per_lane_ = H % kVec == 0 ? (H / kVec + 31) / 32 : 0;
    if (vec_per_lane_) vector_ = allowed(ln_bwd_for<T, kVec>(vec_per_lane_));
    scalar_ = allowed(ln_bwd_for<T, 1>((H + 31) / 32));
    const Kernel<T>& k = vector_.fn ? vector_ : scalar_;
    blocks_ = gpu::resident_blocks(k.fn, kThreads, (s.rows() + kWarps - 1) / kWarps, k.smem);
    partial_ = gpu::DeviceBuffer(static_cast<std::size_t>(blocks_) * 3 * static_cast<std::size_t>(H) * sizeof(float));
  }

  void run(const Args& a) override {
    HOTOPS_CHECK(!a.dbias || a.dx, "layernorm_dbias: dbias is the column sums of dx, which needs dx");
    const int H = static_cast<int>(s_.hidden);
    const bool vec = vector_.fn && gpu::all_aligned(16, {a.x, a.dy, a.dx, a.dres, a.gamma});
    const Kernel<T>& k = vec ? vector_ : scalar_;
    k.fn<<<blocks_, kThreads, k.smem, gpu::stream()>>>(
        static_cast<const T*>(a.dy), static_cast<const T*>(a.x), a.saved_mean, a.saved_rstd, a.gamma, static_cast<T*>(a.dx),
        static_cast<const T*>(a.dres), partial_.as<float>(), s_.rows(), H);
    HOTOPS_CHECK_LAUNCH();
    const gpu::ColOut o{H, {a.dgamma, a.dbeta, a.dbias}};
    gpu::finish_columns(partial_.as<float>(), static_cast<int>(blocks_), 3 * H, o, gpu::stream());
  }

  std::string label() const override {
    const std::string access = vec_per_lane_ ? std::to_string(vec_per_lane_) + " x 16-byte vectors per lane"
                                             : std::string("one element per access");
    return "hotops kernels: LayerNorm backward a warp per row (+ dres), " + access + ", " + std::to_string(blocks_) +
           " blocks of " + std::to_string(kWarps) + " warps with column sums of dy*xhat, dy, dx in shared memory; col_finish";
  }

 private:
  Shape s_;
  int vec_per_lane_ = 0;  // 0: H is not a multiple of 16 bytes' worth
  Kernel<T> vector_;  // 16-byte vectors, where H and the tensors allow
  Kernel<T> scalar_;  // one element per access: any H, any alignment
  unsigned blocks_ = 1;
  gpu::DeviceBuffer partial_;  // [blocks_, 3H]
};

}  // namespace

std::unique_ptr<Plan> make_cuda_plan(const Shape& s) {
  if (s.dtype == DType::bf16) return std::make_unique<CudaLayernormDbias<bf16>>(s);
  return std::make_unique<CudaLayernormDbias<float>>(s);
}

}  // namespace hotops::layernorm::dbias
