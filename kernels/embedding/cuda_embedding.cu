// embedding on CUDA: hand-written, memory-bound kernels.
//   fwd: one thread per 16-byte piece of an output row, threads of a warp on consecutive pieces;
//        the index is read by every thread of its row (cached). Rows whose bytes are not a multiple
//        of 16 (fastText's 50 f32 or bf16): one thread per 16-byte vector of the whole output,
//        gathered from 8-, 4- or 2-byte pieces of the one or two rows it spans; 4 vectors a thread
//        (their loads together) where the output has twice the vectors the GPU holds threads, one
//        otherwise (pieces alone where the output is not 16-byte aligned).
//   bwd: one thread per V columns of one dW row (V = 4 f32 or 8 bf16: a 16-byte load of dout, one
//        or two 16-byte stores of dW; the largest of 4, 2, 1 (f32) or 8, 4, 2, 1 (bf16) that divides
//        the dim otherwise). The thread sums
//        the row's dout pieces in f32 in the CSR's position order (which the caller builds at setup),
//        so the result is deterministic, and writes dW once: zeros where no index hits the row.
//   time_major: fwd as above, each index's row written to its time-major place; an f32 table's rows
//        rounded to bf16 (f32_table) 4 elements a thread. bwd groups the indices by row in the run:
//        CUB's stable radix sort of (index, its dout row) by index over the bits the vocabulary needs,
//        one kernel turning the sorted indices into the CSR's row offsets, then the sum above (rows
//        in index order). The plan holds the sort's buffers and the dout row of each index (fixed
//        by the shape), made at setup.
#include <cub/device/device_radix_sort.cuh>
#include <cuda_bf16.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "hotops/cuda_elem.cuh"
#include "hotops/cuda_util.h"
#include "kernels/embedding/embedding.h"

namespace hotops::embedding {
namespace {

constexpr unsigned kThreads = 256;

// The index whose row lands in row r of out: r itself, or with time-major rows (batch > 0: r = t *
// batch + b) index b * T + t.
__device__ inline std::int64_t index_of_row(std::int64_t r, std::int64_t batch, std::int64_t T) {
  return batch > 0 ? (r % batch) * T + r / batch : r;
}

template <class P>  // P: the piece, uint4, unsigned or unsigned short
__global__ void __launch_bounds__(kThreads) gather_rows(const P* __restrict__ w, const std::int64_t* __restrict__ idx,
                                                        P* __restrict__ out, std::int64_t n, std::int64_t pieces,
                                                        std::int64_t batch, std::int64_t T) {
  const std::int64_t t = static_cast<std::int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (t >= n * pieces) return;
  const std::int64_t r = t / pieces, k = t - r * pieces;
  out[t] = w[idx[index_of_row(r, batch, T)] * pieces + k];
}

// Rows of `pieces` P each, the output as one run of 16-byte vectors: a block stores U * kThreads of
// them, thread t of the block the vectors t, t + kThreads, ... (each vector's pieces from the rows
// it spans, all loads before the stores); the output's last vector, where its bytes end inside it,
// a piece at a time.
template <class P, int U>  // P: the piece, uint2, unsigned or unsigned short; U: vectors a thread
__global__ void __launch_bounds__(kThreads) gather_vectors(const P* __restrict__ w, const std::int64_t* __restrict__ idx,
                                                           P* __restrict__ out, std::int64_t n, std::int64_t pieces,
                                                           std::int64_t batch, std::int64_t T) {
  constexpr int G = 16 / sizeof(P);
  const std::int64_t total = n * pieces;
  const std::int64_t first = (static_cast<std::int64_t>(blockIdx.x) * U * kThreads + threadIdx.x) * G;
  gpu::Pack<P, G> v[U];
#pragma unroll
  for (int u = 0; u < U; ++u) {
    const std::int64_t p = first + static_cast<std::int64_t>(u) * kThreads * G;
    const int m = static_cast<int>(std::clamp<std::int64_t>(total - p, 0, G));
    if (m == 0) continue;
    std::int64_t r = p / pieces, k = p - r * pieces;
    const P* row = w + idx[index_of_row(r, batch, T)] * pieces;
#pragma unroll
    for (int j = 0; j < G; ++j) {
      if (j < m) v[u].v[j] = row[k];
      if (++k == pieces && j + 1 < m) {
        k = 0;
        row = w + idx[index_of_row(++r, batch, T)] * pieces;
      }
    }
  }
#pragma unroll
  for (int u = 0; u < U; ++u) {
    const std::int64_t p = first + static_cast<std::int64_t>(u) * kThreads * G;
    const int m = static_cast<int>(std::clamp<std::int64_t>(total - p, 0, G));
    if (m == G) {
      *reinterpret_cast<gpu::Pack<P, G>*>(out + p) = v[u];
    } else {
      for (int j = 0; j < m; ++j) out[p + j] = v[u].v[j];
    }
  }
}

// bf16 rows of an f32 table: V (4 or 1) elements a thread, rounded to nearest even.
template <int V>
__global__ void __launch_bounds__(kThreads) gather_rows_bf16(const float* __restrict__ w, const std::int64_t* __restrict__ idx,
                                                             __nv_bfloat16* __restrict__ out, std::int64_t n,
                                                             std::int64_t dim, std::int64_t batch, std::int64_t T) {
  const std::int64_t groups = dim / V;
  const std::int64_t t = static_cast<std::int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (t >= n * groups) return;
  const std::int64_t r = t / groups, g = t - r * groups;
  const std::int64_t from = idx[index_of_row(r, batch, T)] * groups + g;
  if constexpr (V == 4) {
    const float4 v = reinterpret_cast<const float4*>(w)[from];
    __nv_bfloat162* o = reinterpret_cast<__nv_bfloat162*>(out) + 2 * t;
    o[0] = __floats2bfloat162_rn(v.x, v.y);
    o[1] = __floats2bfloat162_rn(v.z, v.w);
  } else {
    out[t] = __float2bfloat16_rn(w[from]);
  }
}

// offset[r] = the first position in the sorted indices whose index is >= r, for r in [0, vocab]:
// thread i (of n + 1) writes the rows in (sorted[i - 1], sorted[i]] (0 before the first, vocab after
// the last).
__global__ void __launch_bounds__(kThreads) row_offsets(const std::uint64_t* __restrict__ sorted, std::int32_t* __restrict__ off,
                                                        std::int64_t n, std::int64_t vocab) {
  const std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (i > n) return;
  const std::int64_t lo = i == 0 ? 0 : static_cast<std::int64_t>(sorted[i - 1]) + 1;
  const std::int64_t hi = i == n ? vocab : static_cast<std::int64_t>(sorted[i]);
  for (std::int64_t r = lo; r <= hi; ++r) off[r] = static_cast<std::int32_t>(i);
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
#pragma unroll 4
  for (std::int32_t k = off[r]; k < e; ++k) {
    const Pack<T, V> v = reinterpret_cast<const Pack<T, V>*>(dout + static_cast<std::int64_t>(pos[k]) * dim)[g];
#pragma unroll
    for (int j = 0; j < V; ++j) acc[j] += widen(v.v[j]);
  }
  float* dst = dw + r * dim + g * V;
  if constexpr (V % 4 == 0) {
#pragma unroll
    for (int j = 0; j < V; j += 4) reinterpret_cast<float4*>(dst)[j / 4] = make_float4(acc[j], acc[j + 1], acc[j + 2], acc[j + 3]);
  } else if constexpr (V == 2) {
    *reinterpret_cast<float2*>(dst) = make_float2(acc[0], acc[1]);
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
      resident_threads_ = std::int64_t{gpu::limits().sms} * gpu::limits().threads_per_sm;
      piece_ = s_.f32_table ? (s_.dim % 4 == 0 ? 4 : 1)
               : row_bytes % 16 == 0 ? 16
               : row_bytes % 8 == 0  ? 8
               : row_bytes % 4 == 0  ? 4
                                     : 2;
    } else {
      vec_ = s_.dtype == DType::f32 ? 4 : 8;
      while (s_.dim % vec_ != 0) vec_ /= 2;
      if (s_.time_major) make_grouping();
    }
  }

  void run(const Args& a) override {
    const cudaStream_t st = gpu::stream();
    const std::int64_t batch = s_.time_major ? s_.batch : 0;  // 0: rows in index order
    if (s_.dir == Direction::fwd) {
      const std::int64_t* idx = a.idx;
      if (s_.f32_table) {
        const unsigned blocks = blocks_for(s_.n() * (s_.dim / static_cast<std::int64_t>(piece_)));
        const auto* w = static_cast<const float*>(a.W);
        auto* out = static_cast<__nv_bfloat16*>(a.out);
        if (piece_ == 4) gather_rows_bf16<4><<<blocks, kThreads, 0, st>>>(w, idx, out, s_.n(), s_.dim, batch, s_.T);
        else gather_rows_bf16<1><<<blocks, kThreads, 0, st>>>(w, idx, out, s_.n(), s_.dim, batch, s_.T);
        HOTOPS_CHECK_LAUNCH();
        return;
      }
      const std::int64_t pieces =
          static_cast<std::int64_t>(static_cast<std::size_t>(s_.dim) * dtype_size(s_.dtype) / piece_);
      if (piece_ < 16 && gpu::all_aligned(16, {a.out})) {
        const std::int64_t vectors = (s_.n() * pieces * static_cast<std::int64_t>(piece_) + 15) / 16;
        if (vectors >= 2 * resident_threads_) {
          gather_pieces<4>(a, vectors, pieces, batch, st);
        } else {
          gather_pieces<1>(a, vectors, pieces, batch, st);
        }
        return;
      }
      const unsigned blocks = blocks_for(s_.n() * pieces);
      if (piece_ == 16)
        gather_rows<<<blocks, kThreads, 0, st>>>(static_cast<const uint4*>(a.W), idx, static_cast<uint4*>(a.out), s_.n(),
                                                 pieces, batch, s_.T);
      else if (piece_ == 8)
        gather_rows<<<blocks, kThreads, 0, st>>>(static_cast<const uint2*>(a.W), idx, static_cast<uint2*>(a.out), s_.n(),
                                                 pieces, batch, s_.T);
      else if (piece_ == 4)
        gather_rows<<<blocks, kThreads, 0, st>>>(static_cast<const unsigned*>(a.W), idx, static_cast<unsigned*>(a.out),
                                                 s_.n(), pieces, batch, s_.T);
      else
        gather_rows<<<blocks, kThreads, 0, st>>>(static_cast<const unsigned short*>(a.W), idx,
                                                 static_cast<unsigned short*>(a.out), s_.n(), pieces, batch, s_.T);
      HOTOPS_CHECK_LAUNCH();
      return;
    }
    const std::int32_t* off = a.offset;
    const std::int32_t* pos = a.pos;
    if (s_.time_major) {  // the grouping of this run's indices, on the device
      std::size_t temp_bytes = sort_temp_.bytes();
      HOTOPS_CHECK_CUDA(cub::DeviceRadixSort::SortPairs(
          sort_temp_.get(), temp_bytes, reinterpret_cast<const std::uint64_t*>(a.idx), sorted_.as<std::uint64_t>(),
          rows_.as<const std::int32_t>(), sorted_rows_.as<std::int32_t>(), static_cast<int>(s_.n()), 0, key_bits_, st));
      row_offsets<<<blocks_for(s_.n() + 1), kThreads, 0, st>>>(sorted_.as<const std::uint64_t>(), offsets_.as<std::int32_t>(),
                                                               s_.n(), s_.vocab);
      HOTOPS_CHECK_LAUNCH();
      off = offsets_.as<const std::int32_t>();
      pos = sorted_rows_.as<const std::int32_t>();
    }
    const unsigned blocks = blocks_for(s_.vocab * (s_.dim / vec_));
    auto* dw = static_cast<float*>(a.dW);
    if (s_.dtype == DType::f32) {
      const auto* d = static_cast<const float*>(a.dout);
      if (vec_ == 4) sum_rows<float, 4><<<blocks, kThreads, 0, st>>>(d, off, pos, dw, s_.vocab, s_.dim);
      else if (vec_ == 2) sum_rows<float, 2><<<blocks, kThreads, 0, st>>>(d, off, pos, dw, s_.vocab, s_.dim);
      else sum_rows<float, 1><<<blocks, kThreads, 0, st>>>(d, off, pos, dw, s_.vocab, s_.dim);
    } else {
      const auto* d = static_cast<const std::uint16_t*>(a.dout);
      if (vec_ == 8) sum_rows<std::uint16_t, 8><<<blocks, kThreads, 0, st>>>(d, off, pos, dw, s_.vocab, s_.dim);
      else if (vec_ == 4) sum_rows<std::uint16_t, 4><<<blocks, kThreads, 0, st>>>(d, off, pos, dw, s_.vocab, s_.dim);
      else if (vec_ == 2) sum_rows<std::uint16_t, 2><<<blocks, kThreads, 0, st>>>(d, off, pos, dw, s_.vocab, s_.dim);
      else sum_rows<std::uint16_t, 1><<<blocks, kThreads, 0, st>>>(d, off, pos, dw, s_.vocab, s_.dim);
    }
    HOTOPS_CHECK_LAUNCH();
  }

  std::string label() const override {
    const std::string rows = s_.time_major ? ", time-major rows" : "";
    if (s_.dir == Direction::fwd) {
      if (s_.f32_table) return "hotops CUDA row gather, f32 rows rounded to bf16, " + std::to_string(piece_) + " per thread" + rows;
      if (piece_ < 16)
        return "hotops CUDA row gather, 16-byte vectors of " + std::to_string(piece_) +
               "-byte pieces (pieces alone where the output is not 16-byte aligned)" + rows;
      return "hotops CUDA row gather, 16-byte pieces" + rows;
    }
    return std::string("hotops CUDA dW per vocab row from ") +
           (s_.time_major ? "the run's CUB stable radix sort of the indices + row offsets" : "a setup-time CSR") +
           ", f32 sums in fixed order, " + std::to_string(vec_) + " columns per thread" + rows;
  }

 private:
  // The output in 16-byte vectors of pieces, U a thread.
  template <int U>
  void gather_pieces(const Args& a, std::int64_t vectors, std::int64_t pieces, std::int64_t batch, cudaStream_t st) {
    const unsigned blocks = blocks_for((vectors + U - 1) / U);
    if (piece_ == 8)
      gather_vectors<uint2, U><<<blocks, kThreads, 0, st>>>(static_cast<const uint2*>(a.W), a.idx,
                                                            static_cast<uint2*>(a.out), s_.n(), pieces, batch, s_.T);
    else if (piece_ == 4)
      gather_vectors<unsigned, U><<<blocks, kThreads, 0, st>>>(static_cast<const unsigned*>(a.W), a.idx,
                                                               static_cast<unsigned*>(a.out), s_.n(), pieces, batch, s_.T);
    else
      gather_vectors<unsigned short, U><<<blocks, kThreads, 0, st>>>(static_cast<const unsigned short*>(a.W), a.idx,
                                                                     static_cast<unsigned short*>(a.out), s_.n(), pieces,
                                                                     batch, s_.T);
    HOTOPS_CHECK_LAUNCH();
  }

  // time_major bwd: the sort's buffers, its scratch, and each index's dout row (fixed by the shape).
  void make_grouping() {
    const std::int64_t n = s_.n();
    HOTOPS_CHECK(n < (std::int64_t{1} << 31), "embedding: a time-major bwd sorts at most 2^31 indices");
    while ((std::int64_t{1} << key_bits_) < s_.vocab) ++key_bits_;
    HostBuffer rows(DType::f32, static_cast<std::size_t>(n));  // int32 row numbers in f32-sized slots
    auto* r = reinterpret_cast<std::int32_t*>(rows.data());
    for (std::int64_t i = 0; i < n; ++i) r[i] = static_cast<std::int32_t>(s_.row_of(i));
    rows_ = gpu::DeviceBuffer(rows);
    sorted_ = gpu::DeviceBuffer(static_cast<std::size_t>(n) * sizeof(std::uint64_t));
    sorted_rows_ = gpu::DeviceBuffer(static_cast<std::size_t>(n) * sizeof(std::int32_t));
    offsets_ = gpu::DeviceBuffer(static_cast<std::size_t>(s_.vocab + 1) * sizeof(std::int32_t));
    std::size_t temp_bytes = 0;
    HOTOPS_CHECK_CUDA(cub::DeviceRadixSort::SortPairs(nullptr, temp_bytes, static_cast<const std::uint64_t*>(nullptr),
                                                      static_cast<std::uint64_t*>(nullptr),
                                                      static_cast<const std::int32_t*>(nullptr),
                                                      static_cast<std::int32_t*>(nullptr), static_cast<int>(n), 0,
                                                      key_bits_, gpu::stream()));
    sort_temp_ = gpu::DeviceBuffer(std::max<std::size_t>(temp_bytes, 16));
  }

  Shape s_;
  std::size_t piece_ = 16;  // fwd: bytes of a piece (f32_table: elements a thread)
  std::int64_t resident_threads_ = 0;  // fwd: the threads the GPU holds at once
  int vec_ = 1;             // bwd: columns each thread sums
  int key_bits_ = 1;        // time_major bwd: the bits of an index the sort looks at
  gpu::DeviceBuffer rows_, sorted_, sorted_rows_, offsets_, sort_temp_;
};

}  // namespace

std::unique_ptr<Plan> make_cuda_plan(const Shape& s) { return std::make_unique<CudaEmbedding>(s); }

}  // namespace hotops::embedding
