// embedding on CUDA: hand-written, memory-bound kernels.
//   fwd: one thread per 16-byte piece of an output row (4-byte or 2-byte pieces when the row's
//        bytes are not a multiple of 16), threads of a warp on consecutive pieces; the index is
//        read by every thread of its row (cached).
//   bwd: one thread per V columns of one dW row (V = 4 f32 or 8 bf16: a 16-byte load of dout, one
//        or two 16-byte stores of dW; V = 1 for dims that are not a multiple of V). The thread sums
//        the row's dout pieces in f32 in the CSR's position order (which the caller builds at setup),
//        so the result is deterministic, and writes dW once: zeros where no index hits the row.
#include <cuda_bf16.h>

#include <cstdint>
#include <string>

#include "hotops/cuda_elem.cuh"
#include "hotops/cuda_util.h"
#include "kernels/embedding/embedding.h"

namespace hotops::embedding {
namespace {

constexpr unsigned kThreads = 256;

template <class P>  // P: the piece, uint4, unsigned or unsigned short
__global__ void __launch_bounds__(kThreads) gather_rows(const P* __restrict__ w, const std::int64_t* __restrict__ idx,
                                                        P* __restrict__ out, std::int64_t n, std::int64_t pieces) {
  const std::int64_t t = static_cast<std::int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (t >= n * pieces) return;
  const std::int64_t i = t / pieces, k = t - i * pieces;
  out[t] = w[idx[i] * pieces + k];
}

using gpu::Pack;

__device__ inline float widen(float v) { return v; }
__device__ inline float widen(std::uint16_t v) { return __uint_as_float(static_cast<unsigned>(v) << 16); }

template <class T, int V>
__global__ void __launch_bounds__(kThreads) sum_rows(const T* __restrict__ dout, const std::int32_t* __restrict__ off,
                                                     const std::int32_t* __restrict__ pos, float* __restrict__ dw,
                                                     std::int64_t vocab, std::int64_t dim) {
  const std::int64_t groups = dim / V;
  const std::int64_t t = static_cast<std::int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (t >= vocab * groups) return;
  const std::int64_t r = t / groups, g = t - r * groups;
  float acc[V];
#pragma unroll
  for (int j = 0; j < V; ++j) acc[j] = 0.f;
  const std::int32_t e = off[r + 1];
  for (std::int32_t k = off[r]; k < e; ++k) {
    const Pack<T, V> v = reinterpret_cast<const Pack<T, V>*>(dout + static_cast<std::int64_t>(pos[k]) * dim)[g];
#pragma unroll
    for (int j = 0; j < V; ++j) acc[j] += widen(v.v[j]);
  }
  float* dst = dw + r * dim + g * V;
  if constexpr (V % 4 == 0) {
#pragma unroll
    for (int j = 0; j < V; j += 4) reinterpret_cast<float4*>(dst)[j / 4] = make_float4(acc[j], acc[j + 1], acc[j + 2], acc[j + 3]);
  } else {
#pragma unroll
    for (int j = 0; j < V; ++j) dst[j] = acc[j];
  }
}

unsigned blocks_for(std::int64_t threads) { return static_cast<unsigned>((threads + kThreads - 1) / kThreads); }

class CudaEmbedding final : public Plan {
 public:
  explicit CudaEmbedding(const Shape& s) : s_(s) {
    const std::size_t row_bytes = static_cast<std::size_t>(s_.dim) * dtype_size(s_.dtype);
    if (s_.dir == Direction::fwd) {
      piece_ = row_bytes % 16 == 0 ? 16 : row_bytes % 4 == 0 ? 4 : 2;
    } else {
      const int v = s_.dtype == DType::f32 ? 4 : 8;
      vec_ = s_.dim % v == 0 ? v : 1;
    }
  }

  void run(const Args& a) override {
    const cudaStream_t st = gpu::stream();
    if (s_.dir == Direction::fwd) {
      const std::int64_t pieces =
          static_cast<std::int64_t>(static_cast<std::size_t>(s_.dim) * dtype_size(s_.dtype) / piece_);
      const unsigned blocks = blocks_for(s_.n() * pieces);
      const std::int64_t* idx = a.idx;
      if (piece_ == 16)
        gather_rows<<<blocks, kThreads, 0, st>>>(static_cast<const uint4*>(a.W), idx, static_cast<uint4*>(a.out), s_.n(),
                                                 pieces);
      else if (piece_ == 4)
        gather_rows<<<blocks, kThreads, 0, st>>>(static_cast<const unsigned*>(a.W), idx, static_cast<unsigned*>(a.out),
                                                 s_.n(), pieces);
      else
        gather_rows<<<blocks, kThreads, 0, st>>>(static_cast<const unsigned short*>(a.W), idx,
                                                 static_cast<unsigned short*>(a.out), s_.n(), pieces);
      HOTOPS_CHECK_LAUNCH();
      return;
    }
    const unsigned blocks = blocks_for(s_.vocab * (s_.dim / vec_));
    const std::int32_t* off = a.offset;
    const std::int32_t* pos = a.pos;
    auto* dw = static_cast<float*>(a.dW);
    if (s_.dtype == DType::f32) {
      const auto* d = static_cast<const float*>(a.dout);
      if (vec_ == 4) sum_rows<float, 4><<<blocks, kThreads, 0, st>>>(d, off, pos, dw, s_.vocab, s_.dim);
      else sum_rows<float, 1><<<blocks, kThreads, 0, st>>>(d, off, pos, dw, s_.vocab, s_.dim);
    } else {
      const auto* d = static_cast<const std::uint16_t*>(a.dout);
      if (vec_ == 8) sum_rows<std::uint16_t, 8><<<blocks, kThreads, 0, st>>>(d, off, pos, dw, s_.vocab, s_.dim);
      else sum_rows<std::uint16_t, 1><<<blocks, kThreads, 0, st>>>(d, off, pos, dw, s_.vocab, s_.dim);
    }
    HOTOPS_CHECK_LAUNCH();
  }

  std::string label() const override {
    if (s_.dir == Direction::fwd) return "hotops CUDA row gather, " + std::to_string(piece_) + "-byte pieces";
    return "hotops CUDA dW per vocab row from a setup-time CSR, f32 sums in fixed order, " + std::to_string(vec_) +
           " columns per thread";
  }

 private:
  Shape s_;
  std::size_t piece_ = 16;  // fwd: bytes each thread copies
  int vec_ = 1;             // bwd: columns each thread sums
};

}  // namespace

std::unique_ptr<Plan> make_cuda_plan(const Shape& s) { return std::make_unique<CudaEmbedding>(s); }

}  // namespace hotops::embedding
