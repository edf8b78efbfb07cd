// cross_entropy on CUDA: hand-written, memory-bound kernels, f32 math for both dtypes.
//  - fwd, stage 1 (ce_fwd_rows): a team per row, a warp (kTeam 32, kThreads / 32 rows per block)
//    for rows up to kWarpMaxClasses, a block (kTeam = kThreads) beyond. Each thread reads its
//    share of the row once (16-byte vectors when the row's bytes are a multiple of 16, else one
//    element per access, interleaved so every load is coalesced) keeping an online (max, sum of
//    exp(x - max)) pair, rescaled once per vector; the pairs are merged by shuffles (and shared
//    memory for a block). The team's first thread writes lse = max + log(sum) and the row loss
//    lse - x[target]; the block's row losses are added in row order into one partial per block.
//  - fwd, stage 2 (ce_mean): one block adds the partials in a fixed order (a strided sum per
//    thread, then a fixed shuffle tree) and writes loss = sum / rows. No atomics: the loss is the
//    same bit for bit on every run.
//  - bwd (ce_bwd_rows): one pass, the same teams: dx = (exp(x - lse) - [j == target]) dloss / rows.
// exp is expf (libdevice, within 2 ulp), not __expf, whose error grows with |x - max|.
// Targets are int64 (PyTorch's long) and trusted to lie in [0, classes) (PyTorch checks them with a
// device assert; here they are made so).
#include <cuda_bf16.h>

#include <cmath>
#include <cstdint>
#include <string>

#include "hotops/cuda_elem.cuh"
#include "hotops/cuda_util.h"
#include "kernels/loss/loss.h"

namespace hotops::loss {
namespace {

constexpr int kWarp = 32;
constexpr int kThreads = 256;              // every kernel's block
constexpr std::int64_t kWarpMaxClasses = 1024;  // wider rows get a block each
constexpr int kMeanThreads = 1024;

using gpu::Elem;
using gpu::Pack;

// The online softmax state of part of a row: its max and the sum of exp(x - max).
struct MaxSum {
  float m;
  float s;
};

__device__ inline MaxSum merge(MaxSum a, MaxSum b) {
  const float m = fmaxf(a.m, b.m);
  if (m == -INFINITY) return {m, 0.f};  // both empty: -inf - -inf would be NaN
  return {m, a.s * expf(a.m - m) + b.s * expf(b.m - m)};
}

__device__ inline MaxSum warp_merge(MaxSum v) {
#pragma unroll
  for (int o = kWarp / 2; o > 0; o /= 2)
    v = merge(v, {__shfl_xor_sync(0xffffffffu, v.m, o), __shfl_xor_sync(0xffffffffu, v.s, o)});
  return v;
}

using gpu::warp_sum;

struct FwdArgs {
  const void* x;
  const std::int64_t* target;
  float* lse;      // rows
  float* partial;  // one per block of stage 1
  float* loss;     // 1
  std::int64_t rows;
  std::int64_t classes;
  int partials;
};

struct BwdArgs {
  const void* x;
  const std::int64_t* target;
  const float* lse;
  const float* dloss;
  void* dx;
  std::int64_t rows;
  std::int64_t classes;
};

// Stage 1 of fwd. Rows past the end (the last block's) contribute 0.
template <class T, int V, int kTeam>
__global__ void __launch_bounds__(kThreads) ce_fwd_rows(FwdArgs a) {
  using E = Elem<T>;
  constexpr int kRows = kThreads / kTeam;
  __shared__ MaxSum team_state[kThreads / kWarp];
  __shared__ float row_loss[kRows];
  const int team = static_cast<int>(threadIdx.x) / kTeam, t = static_cast<int>(threadIdx.x) % kTeam;
  const std::int64_t row = static_cast<std::int64_t>(blockIdx.x) * kRows + team;
  MaxSum st{-INFINITY, 0.f};
  const std::size_t base = static_cast<std::size_t>(row) * static_cast<std::size_t>(a.classes);
  if (row < a.rows) {
    const auto* src = reinterpret_cast<const Pack<T, V>*>(static_cast<const T*>(a.x) + base);
    const std::int64_t nvec = a.classes / V;
#pragma unroll 4
    for (std::int64_t k = t; k < nvec; k += kTeam) {
      const Pack<T, V> v = src[k];
      float x[V];
      float vm = -INFINITY;
#pragma unroll
      for (int j = 0; j < V; ++j) vm = fmaxf(vm, x[j] = E::load(v.v[j]));
      const float m = fmaxf(st.m, vm);
      float s = st.s * expf(st.m - m);  // st.m = -inf at first: exp(-inf) = 0
#pragma unroll
      for (int j = 0; j < V; ++j) s += expf(x[j] - m);
      st = {m, s};
    }
  }
  st = warp_merge(st);
  if constexpr (kTeam > kWarp) {
    const int warp = static_cast<int>(threadIdx.x) / kWarp, lane = static_cast<int>(threadIdx.x) % kWarp;
    if (lane == 0) team_state[warp] = st;
    __syncthreads();
    st = lane < kThreads / kWarp ? team_state[lane] : MaxSum{-INFINITY, 0.f};
    st = warp_merge(st);
  }
  if (t == 0) {
    float l = 0.f;
    if (row < a.rows) {
      const float lse = st.m + logf(st.s);
      a.lse[row] = lse;
      l = lse - Elem<T>::load(static_cast<const T*>(a.x)[base + static_cast<std::size_t>(a.target[row])]);
    }
    row_loss[team] = l;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    float sum = 0.f;
    for (int r = 0; r < kRows; ++r) sum += row_loss[r];
    a.partial[blockIdx.x] = sum;
  }
}

// Stage 2 of fwd: one block of kMeanThreads.
__global__ void __launch_bounds__(kMeanThreads) ce_mean(FwdArgs a) {
  __shared__ float warp_total[kMeanThreads / kWarp];
  float s = 0.f;
  for (int i = static_cast<int>(threadIdx.x); i < a.partials; i += kMeanThreads) s += a.partial[i];
  s = warp_sum(s);
  const int warp = static_cast<int>(threadIdx.x) / kWarp, lane = static_cast<int>(threadIdx.x) % kWarp;
  if (lane == 0) warp_total[warp] = s;
  __syncthreads();
  if (warp == 0) {
    s = warp_sum(warp_total[lane]);
    if (lane == 0) a.loss[0] = s / static_cast<float>(a.rows);
  }
}

template <class T, int V, int kTeam>
__global__ void __launch_bounds__(kThreads) ce_bwd_rows(BwdArgs a) {
  using E = Elem<T>;
  constexpr int kRows = kThreads / kTeam;
  const int team = static_cast<int>(threadIdx.x) / kTeam, t = static_cast<int>(threadIdx.x) % kTeam;
  const std::int64_t row = static_cast<std::int64_t>(blockIdx.x) * kRows + team;
  if (row >= a.rows) return;  // no block-wide synchronisation below
  const std::size_t base = static_cast<std::size_t>(row) * static_cast<std::size_t>(a.classes);
  const auto* src = reinterpret_cast<const Pack<T, V>*>(static_cast<const T*>(a.x) + base);
  auto* dst = reinterpret_cast<Pack<T, V>*>(static_cast<T*>(a.dx) + base);
  const float lse = a.lse[row];
  const float scale = a.dloss[0] / static_cast<float>(a.rows);
  const std::int64_t target = a.target[row];
  const std::int64_t nvec = a.classes / V;
#pragma unroll 4
  for (std::int64_t k = t; k < nvec; k += kTeam) {
    const Pack<T, V> v = src[k];
    Pack<T, V> o;
#pragma unroll
    for (int j = 0; j < V; ++j) {
      const float onehot = k * V + j == target ? 1.f : 0.f;
      o.v[j] = E::store((expf(E::load(v.v[j]) - lse) - onehot) * scale);
    }
    dst[k] = o;
  }
}

struct Choice {
  void (*fwd)(FwdArgs);
  void (*bwd)(BwdArgs);
  int team;  // threads per row
  int vec;   // elements per access
};

template <class T, int V>
Choice choose_vec(std::int64_t classes) {
  if (classes > kWarpMaxClasses) return {ce_fwd_rows<T, V, kThreads>, ce_bwd_rows<T, V, kThreads>, kThreads, V};
  return {ce_fwd_rows<T, V, kWarp>, ce_bwd_rows<T, V, kWarp>, kWarp, V};
}

template <class T>
Choice choose_type(std::int64_t classes) {
  constexpr int kVec = static_cast<int>(16 / sizeof(T));
  return classes % kVec == 0 ? choose_vec<T, kVec>(classes) : choose_vec<T, 1>(classes);
}

class CudaCrossEntropy final : public Plan {
 public:
  explicit CudaCrossEntropy(const Shape& s)
      : s_(s),
        choice_(s_.dtype == DType::bf16 ? choose_type<std::uint16_t>(s_.classes) : choose_type<float>(s_.classes)) {
    const std::int64_t rows_per_block = kThreads / choice_.team;
    const std::int64_t blocks = (s_.rows + rows_per_block - 1) / rows_per_block;
    HOTOPS_CHECK(blocks <= gpu::limits().max_grid_x, "cross_entropy: too many rows for one grid: " + std::to_string(s_.rows));
    blocks_ = static_cast<unsigned>(blocks);
    if (s_.dir == Direction::fwd) partial_ = gpu::DeviceBuffer(static_cast<std::size_t>(blocks) * sizeof(float));
  }

  void run(const Args& a) override {
    if (s_.dir == Direction::fwd) {
      const FwdArgs f{a.logits, a.target, static_cast<float*>(a.lse), partial_.as<float>(),
                      static_cast<float*>(a.loss), s_.rows, s_.classes, static_cast<int>(blocks_)};
      choice_.fwd<<<blocks_, kThreads, 0, gpu::stream()>>>(f);
      HOTOPS_CHECK_LAUNCH();
      ce_mean<<<1, kMeanThreads, 0, gpu::stream()>>>(f);
      HOTOPS_CHECK_LAUNCH();
    } else {
      const BwdArgs b{a.logits, a.target, static_cast<const float*>(a.saved_lse),
                      static_cast<const float*>(a.dloss), a.dlogits, s_.rows, s_.classes};
      choice_.bwd<<<blocks_, kThreads, 0, gpu::stream()>>>(b);
      HOTOPS_CHECK_LAUNCH();
    }
  }

  std::string label() const override {
    const bool fwd = s_.dir == Direction::fwd;
    std::string l = std::string("hotops ") + (fwd ? "ce_fwd_rows" : "ce_bwd_rows") + "<" + dtype_name(s_.dtype) +
                    ">: f32 math, expf, " + (choice_.team == kWarp ? "one warp" : "one block") + " per row, " +
                    (choice_.vec > 1 ? "16-byte vectors" : "scalar accesses") + ", grid " + std::to_string(blocks_) +
                    "x" + std::to_string(kThreads);
    if (fwd) l += ", then ce_mean (one block, fixed-order sum of " + std::to_string(blocks_) + " partials)";
    return l;
  }

 private:
  Shape s_;
  Choice choice_;
  unsigned blocks_ = 1;
  gpu::DeviceBuffer partial_;  // fwd: one sum of row losses per block of the first kernel
};

}  // namespace

std::unique_ptr<Plan> make_cuda_plan(const Shape& s) {
  if (s.kind == Kind::cross_entropy_dbias) return make_cuda_dbias_plan(s);
  return std::make_unique<CudaCrossEntropy>(s);
}

}  // namespace hotops::loss
