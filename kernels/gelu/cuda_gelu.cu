// gelu on CUDA: one hand-written, memory-bound pass. Each thread moves 16-byte vectors, kUnroll of
// them per input loaded before any is used; the grid covers all vectors in one round (kUnroll per
// thread), so blocks come and go as their work ends and every SM keeps loads in flight to the last
// block. The body is still a grid-stride loop, correct on any grid (the host tests run it on small
// ones). The elements before the first 16-byte boundary (the head) and after the last whole vector
// (the tail) are done one per thread. The math is cuda_gelu_math.cuh's (a 16-byte vector of bf16 or
// f16 holds 8 elements: with libm's erff / tanhf the kernel came close to issue-bound).
// The kernel body is __host__ __device__ so that the tests can run it on the host (see gelu.h).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>

#include "hotops/cuda_util.h"
#include "kernels/gelu/cuda_gelu_math.cuh"
#include "kernels/gelu/gelu.h"

namespace hotops::gelu {
namespace {

using math::gelu_bwd;
using math::gelu_fwd;

// Full unrolling keeps the vectors in registers; the host compiler (tests) needs no hint.
#ifdef __CUDA_ARCH__
#define GELU_UNROLL _Pragma("unroll")
#else
#define GELU_UNROLL
#endif

constexpr unsigned kThreads = 256;
constexpr unsigned kMinBlocks = 8;  // 2048 threads per SM: at most 32 registers per thread
constexpr std::size_t kVecBytes = 16;
// 16-byte loads in flight per input and thread: 32 bytes per thread either way, 64 KiB per SM.
constexpr int unroll(bool bwd) { return bwd ? 1 : 2; }

// Storage of each dtype and its conversions (round to nearest even), in pairs where the hardware
// converts two at once. The host side uses hotops' own conversions.
template <DType D>
struct Elem;

template <>
struct Elem<DType::f32> {
  using T = float;
  __host__ __device__ static float to_float(T v) { return v; }
  __host__ __device__ static T from_float(float f) { return f; }
  __host__ __device__ static void from_float2(float a, float b, T& ra, T& rb) { ra = a, rb = b; }
};

template <>
struct Elem<DType::bf16> {
  using T = std::uint16_t;
  __host__ __device__ static float to_float(T v) {
#ifdef __CUDA_ARCH__
    return __uint_as_float(static_cast<unsigned>(v) << 16);
#else
    return bf16_to_float(v);
#endif
  }
  __host__ __device__ static T from_float(float f) {
#ifdef __CUDA_ARCH__
    return __bfloat16_as_ushort(__float2bfloat16_rn(f));
#else
    return float_to_bf16(f);
#endif
  }
  __host__ __device__ static void from_float2(float a, float b, T& ra, T& rb) {
#ifdef __CUDA_ARCH__
    const __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
    ra = __bfloat16_as_ushort(h.x), rb = __bfloat16_as_ushort(h.y);
#else
    ra = float_to_bf16(a), rb = float_to_bf16(b);
#endif
  }
};

template <>
struct Elem<DType::f16> {
  using T = std::uint16_t;
  __host__ __device__ static float to_float(T v) {
#ifdef __CUDA_ARCH__
    return __half2float(__ushort_as_half(v));
#else
    return f16_to_float(v);
#endif
  }
  __host__ __device__ static T from_float(float f) {
#ifdef __CUDA_ARCH__
    return __half_as_ushort(__float2half_rn(f));
#else
    return float_to_f16(f);
#endif
  }
  __host__ __device__ static void from_float2(float a, float b, T& ra, T& rb) {
#ifdef __CUDA_ARCH__
    const __half2 h = __floats2half2_rn(a, b);
    ra = __half_as_ushort(h.x), rb = __half_as_ushort(h.y);
#else
    ra = float_to_f16(a), rb = float_to_f16(b);
#endif
  }
};

// One 16-byte access.
template <class T>
struct alignas(kVecBytes) Vec {
  static constexpr int kCount = static_cast<int>(kVecBytes / sizeof(T));
  T e[kCount];
};

// One 16-byte load through the non-coherent (read-only) path, not cached in L1: the data is read
// once.
template <class T>
__host__ __device__ inline Vec<T> load(const Vec<T>* p) {
#ifdef __CUDA_ARCH__
  Vec<T> v;
  uint4 u;
  asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(u.x), "=r"(u.y), "=r"(u.z), "=r"(u.w)
               : "l"(p));
  static_assert(sizeof(u) == sizeof(v));
  memcpy(&v, &u, sizeof v);
  return v;
#else
  return *p;
#endif
}

// ptxas likes to sink a load down to the math that first uses it, after the math on the vectors
// loaded before it: a second trip to memory per thread. ORing into every word of every vector the
// first words of all, masked by a zero it cannot see through (KernelArgs::zero), makes all the math wait
// on all the loads, so that all are issued first. One LOP3 per word.
template <class T>
__host__ __device__ inline std::uint32_t first_word(const Vec<T>& v) {
  std::uint32_t w;
  memcpy(&w, &v, sizeof w);
  return w;
}

template <class T, int N>
__host__ __device__ inline void tie(Vec<T> (&v)[N], std::uint32_t& all) {
GELU_UNROLL
  for (int k = 0; k < N; ++k) all |= first_word(v[k]);
}

template <class T, int N>
__host__ __device__ inline void untie(Vec<T> (&v)[N], std::uint32_t all) {
GELU_UNROLL
  for (int k = 0; k < N; ++k) {
    std::uint32_t w[kVecBytes / 4];
    memcpy(w, &v[k], sizeof w);
GELU_UNROLL
    for (std::uint32_t& x : w) x |= all;
    memcpy(&v[k], w, sizeof w);
  }
}

// What one launch works on. The vectors start at element `head`; the tail after them is shorter
// than one vector. When the tensors are not equally aligned, head = n: every element is scalar.
struct KernelArgs {
  const void* x;
  const void* dy;  // bwd only
  void* out;
  std::size_t n;
  std::size_t head;
  std::size_t vectors;
  std::uint32_t zero;  // 0, unknown to the compiler: see tie()
};

template <Approx A, bool kBwd>
__host__ __device__ inline float gelu_one(float x, float dy) {
  if constexpr (kBwd) return gelu_bwd<A>(x, dy);
  else return gelu_fwd<A>(x);
}

template <DType D, Approx A, bool kBwd>
__host__ __device__ inline void gelu_scalar(const KernelArgs& a, std::size_t i) {
  using E = Elem<D>;
  using T = typename E::T;
  const float dy = kBwd ? E::to_float(static_cast<const T*>(a.dy)[i]) : 0.f;
  static_cast<T*>(a.out)[i] = E::from_float(gelu_one<A, kBwd>(E::to_float(static_cast<const T*>(a.x)[i]), dy));
}

template <DType D, Approx A, bool kBwd>
__host__ __device__ inline Vec<typename Elem<D>::T> gelu_vec(const Vec<typename Elem<D>::T>& x,
                                                             const Vec<typename Elem<D>::T>& dy) {
  using E = Elem<D>;
  Vec<typename E::T> y;
GELU_UNROLL
  for (int j = 0; j < y.kCount; j += 2) {
    const float y0 = gelu_one<A, kBwd>(E::to_float(x.e[j]), kBwd ? E::to_float(dy.e[j]) : 0.f);
    const float y1 = gelu_one<A, kBwd>(E::to_float(x.e[j + 1]), kBwd ? E::to_float(dy.e[j + 1]) : 0.f);
    E::from_float2(y0, y1, y.e[j], y.e[j + 1]);
  }
  return y;
}

// Thread `tid` of `nthreads`: its share of the head, the vectors and the tail.
template <DType D, Approx A, bool kBwd>
__host__ __device__ void gelu_span(std::size_t tid, std::size_t nthreads, const KernelArgs& a) {
  using T = typename Elem<D>::T;
  using V = Vec<T>;
  for (std::size_t i = tid; i < a.head; i += nthreads) gelu_scalar<D, A, kBwd>(a, i);

  const V* __restrict__ xv = reinterpret_cast<const V*>(static_cast<const T*>(a.x) + a.head);
  const V* __restrict__ dv = kBwd ? reinterpret_cast<const V*>(static_cast<const T*>(a.dy) + a.head) : xv;
  V* __restrict__ yv = reinterpret_cast<V*>(static_cast<T*>(a.out) + a.head);
  // Each round, thread tid takes vectors v, v + nthreads, ...: every load of the round is
  // coalesced across the grid, and in a whole round all of them are issued before the first result
  // is needed. In the last, partial round each vector is loaded, done and stored in turn. On the
  // device's grid (grid_for without a cap) there is one round.
  constexpr int kUnroll = unroll(kBwd);
  for (std::size_t v = tid; v < a.vectors; v += kUnroll * nthreads) {
    if (v + (kUnroll - 1) * nthreads < a.vectors) {
      V xs[kUnroll];
      [[maybe_unused]] V ds[kUnroll];
GELU_UNROLL
      for (int k = 0; k < kUnroll; ++k) {
        xs[k] = load(xv + v + k * nthreads);
        if constexpr (kBwd) ds[k] = load(dv + v + k * nthreads);
      }
      std::uint32_t all = 0;
      tie(xs, all);
      if constexpr (kBwd) tie(ds, all);
      all &= a.zero;
      untie(xs, all);
      if constexpr (kBwd) untie(ds, all);
GELU_UNROLL
      for (int k = 0; k < kUnroll; ++k) yv[v + k * nthreads] = gelu_vec<D, A, kBwd>(xs[k], kBwd ? ds[k] : xs[k]);
    } else {
      for (std::size_t j = v; j < a.vectors; j += nthreads)
        yv[j] = gelu_vec<D, A, kBwd>(load(xv + j), kBwd ? load(dv + j) : V{});
    }
  }

  for (std::size_t i = a.head + a.vectors * V::kCount + tid; i < a.n; i += nthreads) gelu_scalar<D, A, kBwd>(a, i);
}

template <DType D, Approx A, bool kBwd>
__global__ void __launch_bounds__(kThreads, kMinBlocks) gelu_kernel(KernelArgs a) {
  gelu_span<D, A, kBwd>(blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x,
                        static_cast<std::size_t>(gridDim.x) * blockDim.x, a);
}

// One instantiation: the kernel and its body for the host.
struct Variant {
  void (*kernel)(KernelArgs);
  void (*host)(std::size_t, std::size_t, const KernelArgs&);
};

template <DType D, Approx A, bool kBwd>
Variant variant() {
  return {gelu_kernel<D, A, kBwd>, gelu_span<D, A, kBwd>};
}

template <DType D>
Variant variant(Approx a, Direction d) {
  const bool bwd = d == Direction::bwd;
  if (a == Approx::none) return bwd ? variant<D, Approx::none, true>() : variant<D, Approx::none, false>();
  return bwd ? variant<D, Approx::tanh, true>() : variant<D, Approx::tanh, false>();
}

Variant variant_for(const Shape& s) {
  switch (s.dtype) {
    case DType::bf16: return variant<DType::bf16>(s.approx, s.dir);
    case DType::f16: return variant<DType::f16>(s.approx, s.dir);
    default: return variant<DType::f32>(s.approx, s.dir);
  }
}

KernelArgs args_for(const Shape& s, const void* x, const void* dy, void* out) {
  const std::size_t e = dtype_size(s.dtype), n = static_cast<std::size_t>(s.elements);
  auto misalignment = [](const void* p) { return reinterpret_cast<std::uintptr_t>(p) % kVecBytes; };
  KernelArgs a{x, dy, out, n, n, 0, 0};
  const bool congruent = misalignment(x) == misalignment(out) && (!dy || misalignment(dy) == misalignment(x));
  if (congruent) {
    a.head = std::min(n, (kVecBytes - misalignment(x)) % kVecBytes / e);
    a.vectors = (n - a.head) * e / kVecBytes;
  }
  return a;
}

// Enough threads for one round (kUnroll vectors each) and for the head and tail, at most max_blocks.
unsigned grid_for(const KernelArgs& a, const Shape& s, unsigned max_blocks) {
  const std::size_t kUnroll = unroll(s.dir == Direction::bwd);
  const std::size_t per_vec = kVecBytes / dtype_size(s.dtype);
  const std::size_t tail = a.n - a.head - a.vectors * per_vec;
  const std::size_t threads = std::max({(a.vectors + kUnroll - 1) / kUnroll, a.head, tail, std::size_t(1)});
  return static_cast<unsigned>(std::min<std::size_t>((threads + kThreads - 1) / kThreads, max_blocks));
}

class CudaGelu final : public Plan {
 public:
  explicit CudaGelu(const Shape& s) : s_(s), variant_(variant_for(s_)) {
    sms_ = gpu::limits().sms;
    HOTOPS_CHECK_CUDA(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks_per_sm_, variant_.kernel, kThreads, 0));
    HOTOPS_CHECK(blocks_per_sm_ > 0, "the gelu kernel cannot run on this device");
    max_grid_ = static_cast<unsigned>(gpu::limits().max_grid_x);
    // The launch on buffers that start at a 16-byte boundary, as cudaMalloc's do (only the
    // tensors' place in their 16-byte lines matters to it, so any such address stands for them):
    // the one the label describes.
    auto* const aligned = reinterpret_cast<void*>(std::uintptr_t{256});
    aligned_ = kernel_args({aligned, aligned, aligned});
    blocks_ = grid_for(aligned_, s_, max_grid_);
  }

  void run(const Args& t) override {
    const KernelArgs a = kernel_args(t);
    variant_.kernel<<<grid_for(a, s_, max_grid_), kThreads, 0, gpu::stream()>>>(a);
    HOTOPS_CHECK_LAUNCH();
  }

  std::string label() const override {
    const bool erf = s_.approx == Approx::none, bwd = s_.dir == Direction::bwd;
    std::string l = std::string("hotops gelu_kernel<") + dtype_name(s_.dtype) + ", " + approx_name(s_.approx) + ", " +
                    direction_name(s_.dir) + ">: f32 math on ex2.approx + rcp.approx (" +
                    (erf ? "erfc by Abramowitz-Stegun 7.1.26" : "tanh as a logistic") + "), ";
    l += aligned_.vectors > 0 ? "16-byte vectors, " + std::to_string(unroll(bwd)) + " per input in flight per thread"
                              : std::string("scalar accesses");
    return l + ", grid " + std::to_string(blocks_) + "x" + std::to_string(kThreads) + " (" +
           std::to_string(blocks_per_sm_) + " blocks/SM resident x " + std::to_string(sms_) + " SMs)";
  }

 private:
  // The launch's arguments on the buffers of `t`: the tensors start `offset` elements into them.
  KernelArgs kernel_args(const Args& t) const {
    const std::size_t off = static_cast<std::size_t>(s_.offset) * dtype_size(s_.dtype);
    const bool bwd = s_.dir == Direction::bwd;
    return args_for(s_, static_cast<const std::byte*>(t.x) + off,
                    bwd ? static_cast<const std::byte*>(t.dy) + off : nullptr, static_cast<std::byte*>(t.out) + off);
  }

  Shape s_;
  Variant variant_;
  KernelArgs aligned_{};  // the launch on 16-byte aligned buffers
  int sms_ = 0, blocks_per_sm_ = 0;
  unsigned max_grid_ = 1, blocks_ = 1;
};

}  // namespace

std::unique_ptr<Plan> make_cuda_plan(const Shape& s) { return std::make_unique<CudaGelu>(s); }

void run_cuda_kernel_on_host(const Shape& s, const void* x, const void* dy, void* out, unsigned blocks) {
  const KernelArgs a = args_for(s, x, dy, out);
  const std::size_t nthreads = static_cast<std::size_t>(grid_for(a, s, blocks)) * kThreads;
  const Variant v = variant_for(s);
  for (std::size_t t = 0; t < nthreads; ++t) v.host(t, nthreads, a);
}

}  // namespace hotops::gelu
