// layernorm on CUDA, hand-written kernels aimed at memory bandwidth.
//
//   fwd  one warp per row (8 rows per block): 16-byte vector loads where the row allows (hidden a
//        multiple of 4 f32 / 8 bf16, so that every row starts 16-byte aligned), the row kept in f32
//        registers (up to 8 vectors per lane), two passes over the registers for an exact mean and
//        variance, warp-shuffle sums; lane 0 saves mean and rstd. Rows too long for the register
//        cache are re-read (from L1/L2) on every pass.
//   bwd  two launches plus a small final one, all deterministic (fixed-order sums, no atomics):
//        1. dx, one warp per row as in fwd: xhat and g = gamma*dy in registers, the two row sums
//           c1 = sum g / H and c2 = sum g*xhat / H by warp shuffles, dx = rstd*(g - c1 - xhat*c2).
//        2. dgamma / dbeta partials: blocks of 32 columns x 8 row-threads, each block over a chunk of
//           64 rows, reducing through shared memory in a fixed order to one partial per column and
//           chunk ([chunks][H] each).
//        3. the final sum of the partials over chunks, in order, per column.
// Every launch goes on gpu::stream(); nothing synchronises the host, so run() is capturable.
#include <cuda_bf16.h>

#include <string>

#include "hotops/cuda_elem.cuh"
#include "hotops/cuda_util.h"
#include "kernels/layernorm/layernorm.h"

namespace hotops::layernorm {
namespace {

constexpr int kWarps = 8;            // rows per block of the row kernels, one warp each
constexpr int kColThreadsY = 8;      // row-threads per block of the column reduction
constexpr int kRowsPerChunk = 64;    // rows per block of the column reduction

using gpu::from_float;
using gpu::load;
using gpu::Pack;
using gpu::store;
using gpu::to_float;

using gpu::warp_sum;

template <class T>
struct Params {
  const T* x = nullptr;
  const T* dy = nullptr;
  T* out = nullptr;  // y or dx
  const float* gamma = nullptr;
  const float* beta = nullptr;
  float* mean = nullptr;  // fwd: written; bwd: read
  float* rstd = nullptr;  // fwd: written; bwd: read
  long long rows = 0;
  int H = 0;
  float eps = 0;
};

// fwd, one warp per row. CACHE vectors per lane stay in registers; CACHE == 0 re-reads the row.
template <class T, int VEC, int CACHE>
__global__ void __launch_bounds__(32 * kWarps) fwd_rows(Params<T> p) {
  const long long row = static_cast<long long>(blockIdx.x) * kWarps + threadIdx.y;
  if (row >= p.rows) return;
  const int lane = threadIdx.x, nvec = p.H / VEC;
  const T* x = p.x + row * p.H;
  T* y = p.out + row * p.H;
  float cache[CACHE > 0 ? CACHE : 1][VEC];
  // Calls f(c, values) for every vector c of the row that this lane owns.
  auto each = [&](auto&& f) {
    if constexpr (CACHE > 0) {
#pragma unroll
      for (int k = 0; k < CACHE; ++k)
        if (k * 32 + lane < nvec) f(k * 32 + lane, cache[k]);
    } else {
      for (int c = lane; c < nvec; c += 32) {
        float v[VEC];
        load<T, VEC>(x + c * VEC, v);
        f(c, v);
      }
    }
  };
  if constexpr (CACHE > 0) {
#pragma unroll
    for (int k = 0; k < CACHE; ++k)
      if (k * 32 + lane < nvec) load<T, VEC>(x + (k * 32 + lane) * VEC, cache[k]);
  }
  float sum = 0;
  each([&](int, const float(&v)[VEC]) {
#pragma unroll
    for (int i = 0; i < VEC; ++i) sum += v[i];
  });
  const float mean = warp_sum(sum) / p.H;
  float sq = 0;
  each([&](int, const float(&v)[VEC]) {
#pragma unroll
    for (int i = 0; i < VEC; ++i) sq += (v[i] - mean) * (v[i] - mean);
  });
  const float rstd = rsqrtf(warp_sum(sq) / p.H + p.eps);
  if (lane == 0) {
    p.mean[row] = mean;
    p.rstd[row] = rstd;
  }
  each([&](int c, const float(&v)[VEC]) {
    float g[VEC], b[VEC], o[VEC];
    load<float, VEC>(p.gamma + c * VEC, g);
    load<float, VEC>(p.beta + c * VEC, b);
#pragma unroll
    for (int i = 0; i < VEC; ++i) o[i] = (v[i] - mean) * rstd * g[i] + b[i];
    store<T, VEC>(y + c * VEC, o);
  });
}

// bwd dx, one warp per row: xhat and g = gamma*dy in registers (or recomputed when CACHE == 0).
template <class T, int VEC, int CACHE>
__global__ void __launch_bounds__(32 * kWarps) bwd_rows(Params<T> p) {
  const long long row = static_cast<long long>(blockIdx.x) * kWarps + threadIdx.y;
  if (row >= p.rows) return;
  const int lane = threadIdx.x, nvec = p.H / VEC;
  const T* x = p.x + row * p.H;
  const T* dy = p.dy + row * p.H;
  T* dx = p.out + row * p.H;
  const float mean = p.mean[row], rstd = p.rstd[row];
  auto compute = [&](int c, float (&xh)[VEC], float (&g)[VEC]) {
    float gm[VEC];
    load<T, VEC>(x + c * VEC, xh);
    load<T, VEC>(dy + c * VEC, g);
    load<float, VEC>(p.gamma + c * VEC, gm);
#pragma unroll
    for (int i = 0; i < VEC; ++i) {
      xh[i] = (xh[i] - mean) * rstd;
      g[i] *= gm[i];
    }
  };
  float xcache[CACHE > 0 ? CACHE : 1][VEC], gcache[CACHE > 0 ? CACHE : 1][VEC];
  auto each = [&](auto&& f) {
    if constexpr (CACHE > 0) {
#pragma unroll
      for (int k = 0; k < CACHE; ++k)
        if (k * 32 + lane < nvec) f(k * 32 + lane, xcache[k], gcache[k]);
    } else {
      for (int c = lane; c < nvec; c += 32) {
        float xh[VEC], g[VEC];
        compute(c, xh, g);
        f(c, xh, g);
      }
    }
  };
  if constexpr (CACHE > 0) {
#pragma unroll
    for (int k = 0; k < CACHE; ++k)
      if (k * 32 + lane < nvec) compute(k * 32 + lane, xcache[k], gcache[k]);
  }
  float s1 = 0, s2 = 0;
  each([&](int, const float(&xh)[VEC], const float(&g)[VEC]) {
#pragma unroll
    for (int i = 0; i < VEC; ++i) {
      s1 += g[i];
      s2 += g[i] * xh[i];
    }
  });
  const float c1 = warp_sum(s1) / p.H, c2 = warp_sum(s2) / p.H;
  each([&](int c, const float(&xh)[VEC], const float(&g)[VEC]) {
    float o[VEC];
#pragma unroll
    for (int i = 0; i < VEC; ++i) o[i] = rstd * (g[i] - c1 - xh[i] * c2);
    store<T, VEC>(dx + c * VEC, o);
  });
}

// bwd dgamma / dbeta, stage 1: block (32 columns, kColThreadsY rows) over one chunk of rows.
template <class T>
__global__ void __launch_bounds__(32 * kColThreadsY)
    column_partials(Params<T> p, float* part_gamma, float* part_beta) {
  const int col = blockIdx.x * 32 + threadIdx.x;
  const long long r0 = static_cast<long long>(blockIdx.y) * kRowsPerChunk;
  const long long r1 = r0 + kRowsPerChunk < p.rows ? r0 + kRowsPerChunk : p.rows;
  float sg = 0, sb = 0;
  if (col < p.H)
    for (long long r = r0 + threadIdx.y; r < r1; r += kColThreadsY) {
      const float d = to_float(p.dy[r * p.H + col]);
      sg += d * (to_float(p.x[r * p.H + col]) - p.mean[r]) * p.rstd[r];
      sb += d;
    }
  __shared__ float sh_g[kColThreadsY][33], sh_b[kColThreadsY][33];
  sh_g[threadIdx.y][threadIdx.x] = sg;
  sh_b[threadIdx.y][threadIdx.x] = sb;
  __syncthreads();
  if (threadIdx.y == 0 && col < p.H) {
    for (int k = 1; k < kColThreadsY; ++k) {
      sg += sh_g[k][threadIdx.x];
      sb += sh_b[k][threadIdx.x];
    }
    part_gamma[static_cast<long long>(blockIdx.y) * p.H + col] = sg;
    part_beta[static_cast<long long>(blockIdx.y) * p.H + col] = sb;
  }
}

// bwd dgamma / dbeta, stage 2: each column's partials summed over the chunks, in order.
__global__ void column_final(const float* part_gamma, const float* part_beta, int chunks, int H, float* dgamma,
                             float* dbeta) {
  const int col = blockIdx.x * blockDim.x + threadIdx.x;
  if (col >= H) return;
  float sg = 0, sb = 0;
  for (int k = 0; k < chunks; ++k) {
    sg += part_gamma[static_cast<long long>(k) * H + col];
    sb += part_beta[static_cast<long long>(k) * H + col];
  }
  dgamma[col] = sg;
  dbeta[col] = sb;
}

// The vector width of a row (16 bytes when hidden allows) and the register cache that holds it.
struct Launch {
  int vec = 1;
  int cache = 0;  // vectors per lane: 1, 2, 4, 8, or 0 for a re-read row
};

template <class T>
Launch launch_of(int H) {
  Launch l;
  constexpr int kVec = 16 / static_cast<int>(sizeof(T));
  l.vec = H % kVec == 0 ? kVec : 1;
  const int per_lane = (H / l.vec + 31) / 32;
  for (int c : {1, 2, 4, 8})
    if (per_lane <= c) {
      l.cache = c;
      break;
    }
  return l;
}

template <class T, int VEC, int CACHE>
void launch_one(bool bwd, const Params<T>& p) {
  const dim3 block(32, kWarps);
  const auto grid = static_cast<unsigned>((p.rows + kWarps - 1) / kWarps);
  if (bwd)
    bwd_rows<T, VEC, CACHE><<<grid, block, 0, gpu::stream()>>>(p);
  else
    fwd_rows<T, VEC, CACHE><<<grid, block, 0, gpu::stream()>>>(p);
  HOTOPS_CHECK_LAUNCH();
}

template <class T, int VEC>
void launch_rows(bool bwd, int cache, const Params<T>& p) {
  switch (cache) {
    case 1: return launch_one<T, VEC, 1>(bwd, p);
    case 2: return launch_one<T, VEC, 2>(bwd, p);
    case 4: return launch_one<T, VEC, 4>(bwd, p);
    case 8: return launch_one<T, VEC, 8>(bwd, p);
    default: return launch_one<T, VEC, 0>(bwd, p);
  }
}

template <class T>
class CudaLayernorm final : public Plan {
 public:
  explicit CudaLayernorm(const Shape& s)
      : s_(s), launch_(launch_of<T>(static_cast<int>(s_.hidden))),
        chunks_(static_cast<int>((s_.rows() + kRowsPerChunk - 1) / kRowsPerChunk)) {
    const std::size_t hbytes = static_cast<std::size_t>(s_.hidden) * sizeof(float);
    if (s_.dir == Direction::bwd) partials_ = gpu::DeviceBuffer(2 * static_cast<std::size_t>(chunks_) * hbytes);
    p_.rows = s_.rows();
    p_.H = static_cast<int>(s_.hidden);
    p_.eps = static_cast<float>(s_.eps);
  }

  void run(const Args& a) override {
    const bool bwd = s_.dir == Direction::bwd;
    Params<T> p = p_;
    p.x = static_cast<const T*>(a.x);
    p.gamma = static_cast<const float*>(a.gamma);
    if (bwd) {
      p.dy = static_cast<const T*>(a.dy);
      p.out = static_cast<T*>(a.dx);
      p.mean = static_cast<float*>(const_cast<void*>(a.saved_mean));  // read only in bwd
      p.rstd = static_cast<float*>(const_cast<void*>(a.saved_rstd));
    } else {
      p.out = static_cast<T*>(a.y);
      p.beta = static_cast<const float*>(a.beta);
      p.mean = static_cast<float*>(a.mean);
      p.rstd = static_cast<float*>(a.rstd);
    }
    if (launch_.vec == 1) launch_rows<T, 1>(bwd, launch_.cache, p);
    else launch_rows<T, 16 / static_cast<int>(sizeof(T))>(bwd, launch_.cache, p);
    if (!bwd) return;
    cudaStream_t st = gpu::stream();
    float* part_gamma = partials_.as<float>();
    float* part_beta = part_gamma + static_cast<std::size_t>(chunks_) * static_cast<std::size_t>(s_.hidden);
    const dim3 grid(static_cast<unsigned>((s_.hidden + 31) / 32), static_cast<unsigned>(chunks_));
    column_partials<T><<<grid, dim3(32, kColThreadsY), 0, st>>>(p, part_gamma, part_beta);
    HOTOPS_CHECK_LAUNCH();
    column_final<<<static_cast<unsigned>((s_.hidden + 255) / 256), 256, 0, st>>>(
        part_gamma, part_beta, chunks_, p.H, static_cast<float*>(a.dgamma), static_cast<float*>(a.dbeta));
    HOTOPS_CHECK_LAUNCH();
  }

  std::string label() const override {
    std::string l = "hotops CUDA: one warp per row, " + std::string(launch_.vec == 1 ? "scalar" : "16-byte") +
                    " loads, " +
                    (launch_.cache ? "row in registers (" + std::to_string(launch_.cache) + " vectors/lane)"
                                   : std::string("row re-read per pass"));
    if (s_.dir == Direction::bwd)
      l += "; dgamma/dbeta: " + std::to_string(chunks_) + " row chunks of " + std::to_string(kRowsPerChunk) +
           " + final sum";
    return l;
  }

 private:
  Shape s_;
  Launch launch_;
  int chunks_;
  gpu::DeviceBuffer partials_;  // bwd: the per-chunk column sums of dgamma and dbeta
  Params<T> p_;                 // the problem's sizes; run() adds the pointers
};

}  // namespace

std::unique_ptr<Plan> make_cuda_plan(const Shape& s) {
  HOTOPS_CHECK(s.hidden < (1 << 30), "layernorm: hidden too large for the CUDA kernels: " + std::to_string(s.hidden));
  if (s.dtype == DType::bf16) return std::make_unique<CudaLayernorm<__nv_bfloat16>>(s);
  if (s.dtype == DType::f32) return std::make_unique<CudaLayernorm<float>>(s);
  throw Error("layernorm: no CUDA kernel for " + std::string(dtype_name(s.dtype)), ErrorKind::unsupported);
}

}  // namespace hotops::layernorm
