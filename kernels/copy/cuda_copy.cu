// copy on CUDA. Raw copies are cudaMemcpyAsync on gpu::stream(): device-to-device (kind:memcpy),
// host-to-device and device-to-host from pinned (cudaHostAlloc) or pageable host memory. The
// conversions are hotops kernels: NCHW <-> NHWC is a batched matrix transpose through shared-memory
// tiles with 16-byte global loads and stores on both sides; f32 <-> bf16 is an elementwise kernel
// with 16-byte accesses (round to nearest even, as PyTorch's .to(torch.bfloat16)).
#include <cuda_bf16.h>

#include <memory>
#include <string>

#include "hotops/cuda_util.h"
#include "kernels/copy/copy.h"
#include "kernels/copy/pinned.h"

namespace hotops::copy {
namespace {

constexpr int kThreads = 128;  // per block, for every copy kernel

std::int64_t ceil_div(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }

// ---- the layout transpose --------------------------------------------------------------------
// NCHW -> NHWC transposes each image's [C, H*W] matrix into [H*W, C]; NHWC -> NCHW the reverse.
// A block moves one square tile: it reads the tile's rows with 16-byte loads (8 per 128-byte tile
// row), transposes through shared memory, and writes the output's rows with 16-byte stores, so
// both sides are fully coalesced. Elements are moved as raw bits (u32 for f32, u16 for bf16).

template <class T>
struct TileOf {
  static constexpr int V = 16 / sizeof(T);             // elements per 16-byte vector
  static constexpr int kEdge = 8 * V;                   // 32 (f32) or 64 (bf16) elements a side
  static constexpr int kPitch = kEdge + 4 / sizeof(T);  // +1 word a row: column reads spread over banks
  static constexpr int kPerThread = kEdge * kEdge / V / kThreads;  // vectors per thread: 2 or 4
};

// Element j of a 16-byte vector of T (little-endian: element 0 in the low bits of word 0; register
// moves once unrolled), and the 16-byte vector of column tc of a tile from row tr on.
template <class T>
__device__ __forceinline__ T element(const uint4& v, int j) {
  const unsigned w[4] = {v.x, v.y, v.z, v.w};
  if constexpr (sizeof(T) == 4) return static_cast<T>(w[j]);
  else return static_cast<T>(w[j / 2] >> (16 * (j % 2)));
}

template <class T, int kPitch>
__device__ __forceinline__ uint4 column_vector(const T (*tile)[kPitch], int tr, int tc) {
  if constexpr (sizeof(T) == 4) return make_uint4(tile[tr][tc], tile[tr + 1][tc], tile[tr + 2][tc], tile[tr + 3][tc]);
  const auto pair = [&](int j) {
    return static_cast<unsigned>(tile[tr + j][tc]) | static_cast<unsigned>(tile[tr + j + 1][tc]) << 16;
  };
  return make_uint4(pair(0), pair(2), pair(4), pair(6));
}

// out[b][c][r] = in[b][r][c] for `batch` (= gridDim.z) matrices of rows x cols. kVecIn: cols is a
// multiple of V, so input rows are read as whole vectors; kVecOut: rows is, so output rows are
// written as whole vectors. Otherwise that side moves scalars, bounds-checked one by one.
template <class T, bool kVecIn, bool kVecOut>
__global__ void __launch_bounds__(kThreads)
    transpose_tiles(const T* __restrict__ in, T* __restrict__ out, std::int64_t rows, std::int64_t cols) {
  using G = TileOf<T>;
  constexpr int V = G::V;
  __shared__ T tile[G::kEdge][G::kPitch];
  const std::int64_t r0 = static_cast<std::int64_t>(blockIdx.y) * G::kEdge;
  const std::int64_t c0 = static_cast<std::int64_t>(blockIdx.x) * G::kEdge;
  in += static_cast<std::int64_t>(blockIdx.z) * rows * cols;
  out += static_cast<std::int64_t>(blockIdx.z) * rows * cols;

  // Vector v of the tile is tile row v / 8, columns (v % 8) * V ... Every global load is issued
  // before the first shared-memory store, so that each thread has all its bytes in flight at once.
  uint4 reg[G::kPerThread];
#pragma unroll
  for (int k = 0; k < G::kPerThread; ++k) {
    const int v = threadIdx.x + k * kThreads, tr = v / 8, tc = (v % 8) * V;
    const std::int64_t r = r0 + tr, c = c0 + tc;
    if constexpr (kVecIn) {
      reg[k] = r < rows && c < cols ? *reinterpret_cast<const uint4*>(in + r * cols + c) : make_uint4(0, 0, 0, 0);
    } else {
#pragma unroll
      for (int j = 0; j < V; ++j)
        if (r < rows && c + j < cols) tile[tr][tc + j] = in[r * cols + c + j];
    }
  }
  if constexpr (kVecIn) {
#pragma unroll
    for (int k = 0; k < G::kPerThread; ++k) {
      const int v = threadIdx.x + k * kThreads, tr = v / 8, tc = (v % 8) * V;
#pragma unroll
      for (int j = 0; j < V; ++j) tile[tr][tc + j] = element<T>(reg[k], j);
    }
  }
  __syncthreads();

  // Vector w of the output is output row c0 + w / 8 (tile column tc), columns r0 + (w % 8) * V ...
#pragma unroll
  for (int k = 0; k < G::kPerThread; ++k) {
    const int w = threadIdx.x + k * kThreads, tc = w / 8, tr = (w % 8) * V;
    const std::int64_t orow = c0 + tc, ocol = r0 + tr;
    if constexpr (kVecOut) {
      // __stwb (a store with the default write-back policy): plain assignment through a uint4*
      // was split into four 4-byte stores here by nvcc 13.
      if (orow < cols && ocol < rows)
        __stwb(reinterpret_cast<uint4*>(out + orow * rows + ocol), column_vector<T, G::kPitch>(tile, tr, tc));
    } else {
#pragma unroll
      for (int j = 0; j < V; ++j)
        if (orow < cols && ocol + j < rows) out[orow * rows + ocol + j] = tile[tr + j][tc];
    }
  }
}

template <class T>
void launch_transpose(const void* in, void* out, std::int64_t batch, std::int64_t rows, std::int64_t cols,
                      cudaStream_t stream) {
  using G = TileOf<T>;
  const dim3 grid(static_cast<unsigned>(ceil_div(cols, G::kEdge)), static_cast<unsigned>(ceil_div(rows, G::kEdge)),
                  static_cast<unsigned>(batch));
  const bool vin = cols % G::V == 0, vout = rows % G::V == 0;
  auto* kernel = vin ? (vout ? transpose_tiles<T, true, true> : transpose_tiles<T, true, false>)
                     : (vout ? transpose_tiles<T, false, true> : transpose_tiles<T, false, false>);
  kernel<<<grid, kThreads, 0, stream>>>(static_cast<const T*>(in), static_cast<T*>(out), rows, cols);
  HOTOPS_CHECK_LAUNCH();
}

// ---- the dtype conversions -------------------------------------------------------------------
// f32 -> bf16: thread g converts elements 8g .. 8g+7 with 16-byte accesses (f32 side: two, bf16
// side: one); the n % 8 elements of the tail go one each to the threads after the last group.

__global__ void __launch_bounds__(kThreads)
    f32_to_bf16(const float* __restrict__ in, __nv_bfloat16* __restrict__ out, std::int64_t n) {
  const std::int64_t g = static_cast<std::int64_t>(blockIdx.x) * kThreads + threadIdx.x, groups = n / 8;
  if (g < groups) {
    const float4 a = reinterpret_cast<const float4*>(in)[2 * g];
    const float4 b = reinterpret_cast<const float4*>(in)[2 * g + 1];
    alignas(16) __nv_bfloat162 h[4] = {__floats2bfloat162_rn(a.x, a.y), __floats2bfloat162_rn(a.z, a.w),
                                       __floats2bfloat162_rn(b.x, b.y), __floats2bfloat162_rn(b.z, b.w)};
    reinterpret_cast<uint4*>(out)[g] = *reinterpret_cast<const uint4*>(h);
  } else if (const std::int64_t i = 8 * groups + (g - groups); i < n) {
    out[i] = __float2bfloat16_rn(in[i]);
  }
}

// bf16 -> f32 takes 4 elements a thread: one 8-byte load and one 16-byte store, so that a warp's
// stores are one contiguous 512-byte run (with 8 elements a thread, each of its two 16-byte stores
// covered every other 16 bytes of 1 KiB: 0.87 of the copy bandwidth at 16M elements).
__global__ void __launch_bounds__(kThreads)
    bf16_to_f32(const __nv_bfloat16* __restrict__ in, float* __restrict__ out, std::int64_t n) {
  const std::int64_t g = static_cast<std::int64_t>(blockIdx.x) * kThreads + threadIdx.x, groups = n / 4;
  if (g < groups) {
    const uint2 x = reinterpret_cast<const uint2*>(in)[g];
    const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&x);
    const float2 f0 = __bfloat1622float2(h[0]), f1 = __bfloat1622float2(h[1]);
    reinterpret_cast<float4*>(out)[g] = make_float4(f0.x, f0.y, f1.x, f1.y);
  } else if (const std::int64_t i = 4 * groups + (g - groups); i < n) {
    out[i] = __bfloat162float(in[i]);
  }
}

// The blocks of a conversion of n elements: a thread per group of 8 (f32 -> bf16) or 4 (bf16 -> f32)
// elements and one per element of the tail.
std::int64_t convert_blocks(Kind k, std::size_t count) {
  const std::int64_t n = static_cast<std::int64_t>(count), per = k == Kind::f32_to_bf16 ? 8 : 4;
  return ceil_div(n / per + n % per, kThreads);
}

}  // namespace

void cuda_convert(Kind k, const void* src, void* dst, std::size_t count, cudaStream_t st) {
  const auto n = static_cast<std::int64_t>(count);
  const auto blocks = static_cast<unsigned>(convert_blocks(k, count));
  if (n == 0) return;
  if (k == Kind::f32_to_bf16)
    f32_to_bf16<<<blocks, kThreads, 0, st>>>(static_cast<const float*>(src), static_cast<__nv_bfloat16*>(dst), n);
  else
    bf16_to_f32<<<blocks, kThreads, 0, st>>>(static_cast<const __nv_bfloat16*>(src), static_cast<float*>(dst), n);
  HOTOPS_CHECK_LAUNCH();
}

namespace {

// ---- the plans -------------------------------------------------------------------------------

const char* host_name(Host h) { return h == Host::pinned ? "pinned (cudaHostAlloc)" : "pageable"; }

class CudaMemcpy final : public Plan {
 public:
  explicit CudaMemcpy(const Shape& s) : s_(s) {
    dir_ = s_.kind == Kind::memcpy ? cudaMemcpyDeviceToDevice
           : s_.kind == Kind::h2d  ? cudaMemcpyHostToDevice
                                   : cudaMemcpyDeviceToHost;
  }

  void run(const Args& a) override {
    HOTOPS_CHECK_CUDA(cudaMemcpyAsync(a.dst, a.src, s_.src_bytes(), dir_, gpu::stream()));
  }

  std::string label() const override {
    switch (s_.kind) {
      case Kind::memcpy: return "cudaMemcpyAsync device-to-device";
      case Kind::h2d: return std::string("cudaMemcpyAsync host-to-device from ") + host_name(s_.host) + " memory";
      default: return std::string("cudaMemcpyAsync device-to-host into ") + host_name(s_.host) + " memory";
    }
  }

  // Transfers to or from host memory run as direct cudaMemcpyAsync calls, never as graph nodes:
  // a pageable transfer is staged by the driver synchronously with the host, which stream capture
  // rejects, and on the H100 host a captured pinned 256 MiB host-to-device copy ran at 31 GB/s
  // against 49-55 GB/s for the same call issued directly.
  bool capturable() const override { return s_.host == Host::none; }

 private:
  Shape s_;
  cudaMemcpyKind dir_ = cudaMemcpyDefault;
};

// The conversions: a hotops kernel from a device source to a device destination.
class CudaConvert final : public Plan {
 public:
  explicit CudaConvert(const Shape& s) : s_(s) {
    if (s_.is_layout()) {
      const bool to_nhwc = s_.kind == Kind::nchw_to_nhwc;
      const std::int64_t HW = s_.H * s_.W;
      rows_ = to_nhwc ? s_.C : HW;
      cols_ = to_nhwc ? HW : s_.C;
      const int edge = s_.src == DType::bf16 ? TileOf<std::uint16_t>::kEdge : TileOf<std::uint32_t>::kEdge;
      if (ceil_div(rows_, edge) > 65535 || s_.N > 65535)
        throw Error("the transpose grid's y and z axes (rows / tile, batch) are limited to 65535: " + shape_name(),
                    ErrorKind::unsupported);
    } else {
      if (convert_blocks(s_.kind, s_.count) > 0x7fffffff)
        throw Error("too many elements for one grid: " + shape_name(), ErrorKind::unsupported);
    }
    label_ = describe();
  }

  void run(const Args& a) override {
    cudaStream_t st = gpu::stream();
    switch (s_.kind) {
      case Kind::nchw_to_nhwc:
      case Kind::nhwc_to_nchw:
        if (s_.src == DType::bf16) launch_transpose<std::uint16_t>(a.src, a.dst, s_.N, rows_, cols_, st);
        else launch_transpose<std::uint32_t>(a.src, a.dst, s_.N, rows_, cols_, st);
        break;
      default:
        cuda_convert(s_.kind, a.src, a.dst, s_.count, st);
    }
  }

  std::string label() const override { return label_; }

 private:
  // The problem in words, for errors: its kind and sizes.
  std::string shape_name() const {
    if (!s_.is_layout()) return std::string(kind_name(s_.kind)) + " of " + std::to_string(s_.count) + " elements";
    return std::string(kind_name(s_.kind)) + " [" + std::to_string(s_.N) + ", " + std::to_string(s_.C) + ", " +
           std::to_string(s_.H) + ", " + std::to_string(s_.W) + "]";
  }

  std::string describe() const {
    if (!s_.is_layout())
      return s_.kind == Kind::f32_to_bf16
                 ? "hotops f32_to_bf16 kernel, 8 elements a thread, 16-byte loads and stores, round to nearest even"
                 : "hotops bf16_to_f32 kernel, 4 elements a thread, 8-byte loads, 16-byte stores";
    const int v = 16 / static_cast<int>(dtype_size(s_.src)), edge = 8 * v;
    const char* in = cols_ % v == 0 ? "16-byte" : "scalar";
    const char* out = rows_ % v == 0 ? "16-byte" : "scalar";
    return "hotops transpose_tiles " + std::to_string(edge) + "x" + std::to_string(edge) + " " + dtype_name(s_.src) +
           " tiles through shared memory, " + in + " loads, " + out + " stores, " + std::to_string(kThreads) +
           " threads a block";
  }

  Shape s_;
  std::int64_t rows_ = 0, cols_ = 0;  // the layouts: each image is a rows x cols matrix
  std::string label_;
};

}  // namespace

std::unique_ptr<Plan> make_cuda_plan(const Shape& s) {
  if (s.is_raw()) return std::make_unique<CudaMemcpy>(s);
  return std::make_unique<CudaConvert>(s);
}

std::shared_ptr<void> pinned_host(std::size_t bytes) {
  auto buffer = std::make_shared<gpu::PinnedBuffer>(bytes);
  return std::shared_ptr<void>(buffer, buffer->get());
}

}  // namespace hotops::copy
