// global_avgpool on CUDA: hand-written kernels, deterministic (each sum in a fixed order, no atomics),
// f32 math on the stored values, one launch a pass on gpu::stream():
//   nlc in 16-byte vectors, where a sample's L x C elements are whole aligned vectors: a sample is
//            one flat run of vectors, and a block steps through it a span of whole rows at a time
//            (blockDim vectors, a multiple of C elements), so each thread meets the same channels
//            at every step.
//            fwd, where the samples are at least the SMs: a block a sample (of up to 1024 threads,
//            to fill the SMs); each thread sums its vector's elements over the steps, the sums
//            meet in shared memory and thread c adds channel c's partial sums of the span's rows
//            in order. bwd: a block a (sample, range of steps); each thread makes its vector of
//            dy / L once and stores it at every step.
//   fwd nlc otherwise: a block of 32 x 8 threads for 32 channels of one sample: each row of 8 takes
//            every 8th position (a warp reads 32 consecutive channels of a position: coalesced), then
//            thread row 0 adds the 8 partial sums in order and writes the mean;
//   fwd ncl: a warp a (sample, channel), its lanes striding over the contiguous positions, then a
//            warp sum;
//   bwd otherwise: a grid-stride loop over dx, each element its (sample, channel)'s dy / L.
#include <cuda_bf16.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <numeric>
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
constexpr unsigned kSpanThreads = 256;     // nlc in vectors: a step's threads, at least
constexpr unsigned kMaxSpanThreads = 1024;  // and at most (fwd: to fill the GPU with few samples)

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

// The steps of the vector kernels: V elements a thread, `rows` rows of C a step (rows * C = blockDim.x * V).
template <class T>
__global__ void __launch_bounds__(kMaxSpanThreads) mean_nlc_vec(const T* __restrict__ x, T* __restrict__ y, std::int64_t L,
                                                             std::int64_t C, int rows) {
  constexpr int V = 16 / sizeof(T);
  const std::int64_t n = blockIdx.x, total = L * C, span = static_cast<std::int64_t>(rows) * C;
  const T* xs = x + n * total;
  float acc[V];
#pragma unroll
  for (int j = 0; j < V; ++j) acc[j] = 0.f;
#pragma unroll 4
  for (std::int64_t e = static_cast<std::int64_t>(threadIdx.x) * V; e < total; e += span) {
    float v[V];
    gpu::load<T, V>(xs + e, v);
#pragma unroll
    for (int j = 0; j < V; ++j) acc[j] += v[j];
  }
  extern __shared__ float part[];  // span floats: part[q * C + c], row q of the span, channel c
#pragma unroll
  for (int j = 0; j < V; ++j) part[threadIdx.x * V + j] = acc[j];
  __syncthreads();
  for (std::int64_t c = threadIdx.x; c < C; c += blockDim.x) {
    float s = 0.f;
    for (int q = 0; q < rows; ++q) s += part[q * C + c];
    y[n * C + c] = from_float<T>(s / static_cast<float>(L));
  }
}

template <class T>
__global__ void __launch_bounds__(kSpanThreads) spread_nlc_vec(const T* __restrict__ dy, T* __restrict__ dx,
                                                               std::int64_t L, std::int64_t C, int rows,
                                                               std::int64_t steps_per_block) {
  constexpr int V = 16 / sizeof(T);
  const std::int64_t n = blockIdx.x, total = L * C, span = static_cast<std::int64_t>(rows) * C;
  const std::int64_t first = static_cast<std::int64_t>(threadIdx.x) * V;
  float v[V];
#pragma unroll
  for (int j = 0; j < V; ++j) v[j] = to_float(dy[n * C + (first + j) % C]) / static_cast<float>(L);
  T* d = dx + n * total;
  const std::int64_t begin = first + blockIdx.y * steps_per_block * span;
  const std::int64_t end = std::min(total, begin + steps_per_block * span);
#pragma unroll 4
  for (std::int64_t e = begin; e < end; e += span) gpu::store<T, V>(d + e, v);
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
    // The vector kernels: r rows of C make whole vectors, a step holds as many r-row groups as
    // its threads' vectors take, and a sample's elements are whole vectors. fwd, a block a sample,
    // takes them where the samples fill every SM, with steps of up to kMaxSpanThreads threads so
    // that the blocks fill them; with fewer samples the 32 x 8 blocks spread a sample wider.
    constexpr std::int64_t V = 16 / sizeof(T);
    const std::int64_t r = V / std::gcd(s.C, V), group = r * s.C / V;  // rows, vectors of a group
    const int sms = gpu::limits().sms, per_sm = gpu::limits().threads_per_sm;
    const bool fwd = s.dir == Direction::fwd;
    if (s.layout == Layout::nlc && (s.L * s.C) % V == 0 && group <= kSpanThreads && (!fwd || s.N >= sms)) {
      const std::int64_t want = fwd ? std::clamp<std::int64_t>(std::int64_t{sms} * per_sm / s.N, kSpanThreads, kMaxSpanThreads)
                                    : kSpanThreads;
      const std::int64_t groups = want / group;
      span_threads_ = static_cast<unsigned>(groups * group);
      span_rows_ = static_cast<int>(groups * r);
    }
  }

  void run(const Args& a) override {
    const cudaStream_t st = gpu::stream();
    if (span_threads_ && gpu::all_aligned(16, {a.x, a.out})) {  // a.x: null in bwd
      run_vectors(a, st);
      return;
    }
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
    if (span_threads_)
      return std::string("hotops kernel: 16-byte vectors, ") + std::to_string(span_rows_) + "-row steps of " +
             std::to_string(span_threads_) + " threads, " +
             (s_.dir == Direction::bwd ? "dy / L made once a thread" : "a block a sample, partial sums added in order") +
             " (other kernels where a buffer is not 16-byte aligned)";
    if (s_.dir == Direction::bwd) return "hotops kernel: dx = dy / L, grid-stride";
    return s_.layout == Layout::nlc ? "hotops kernel: 32 channels x 8 position rows a block, partial sums added in order"
                                    : "hotops kernel: a warp a (sample, channel), warp sum";
  }

 private:
  void run_vectors(const Args& a, cudaStream_t st) {
    const std::int64_t span = static_cast<std::int64_t>(span_rows_) * s_.C;
    if (s_.dir == Direction::fwd) {
      mean_nlc_vec<T><<<static_cast<unsigned>(s_.N), span_threads_, static_cast<std::size_t>(span) * sizeof(float), st>>>(
          static_cast<const T*>(a.x), static_cast<T*>(a.out), s_.L, s_.C, span_rows_);
    } else {
      // Enough blocks to fill the GPU at small batches: a sample's steps split over up to
      // kMinBlocks / N blocks.
      constexpr std::int64_t kMinBlocks = 2048;
      const std::int64_t steps = (s_.L * s_.C + span - 1) / span;
      const std::int64_t split = std::clamp<std::int64_t>(kMinBlocks / s_.N, 1, std::min<std::int64_t>(steps, 65535));
      const std::int64_t per_block = (steps + split - 1) / split;
      const dim3 grid(static_cast<unsigned>(s_.N), static_cast<unsigned>((steps + per_block - 1) / per_block));
      spread_nlc_vec<T><<<grid, span_threads_, 0, st>>>(static_cast<const T*>(a.dy), static_cast<T*>(a.out), s_.L, s_.C,
                                                         span_rows_, per_block);
    }
    HOTOPS_CHECK_LAUNCH();
  }

  Shape s_;
  unsigned span_threads_ = 0;  // the vector kernels' block (0: they do not apply)
  int span_rows_ = 0;          // rows of C a step of theirs covers
};

}  // namespace

std::unique_ptr<Plan> make_cuda_plan(const Shape& s) {
  if (s.dtype == DType::bf16) return std::make_unique<CudaAvgpool<bf16>>(s);
  return std::make_unique<CudaAvgpool<float>>(s);
}

}  // namespace hotops::avgpool
