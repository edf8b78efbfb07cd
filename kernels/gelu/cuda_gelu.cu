// gelu on CUDA: one hand-written, memory-bound pass. Each thread moves 16-byte vectors, kUnroll of
// them per input loaded before any is used, over a grid-stride loop on a grid sized from the SM
// count; the elements before the first 16-byte boundary (the head) and after the last whole vector
// (the tail) are done one per thread. Math in f32 with PyTorch's formulas, as ATen's gelu does.
// The kernel body is __host__ __device__ so that the tests can run it on the host (see gelu.h).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include "hotops/cuda_util.h"
#include "kernels/gelu/gelu.h"

namespace hotops::gelu {
namespace {

// Full unrolling keeps the vectors in registers; the host compiler (tests) needs no hint.
#ifdef __CUDA_ARCH__
#define GELU_UNROLL _Pragma("unroll")
#else
#define GELU_UNROLL
#endif

constexpr unsigned kThreads = 256;
constexpr int kUnroll = 4;  // 16-byte loads in flight per input and thread
constexpr std::size_t kVecBytes = 16;

constexpr float kSqrtHalf = 0.70710678118654752f;    // erf form: Phi(x) = 0.5 (1 + erf(x / sqrt 2))
constexpr float kInvSqrt2Pi = 0.39894228040143268f;  // Phi'(0)
constexpr float kBeta = 0.79788456080286536f;        // tanh form: sqrt(2 / pi)
constexpr float kKappa = 0.044715f;

// exp through the hardware's ex2: a few ulp where the normal density is large, and a relative
// error growing to 1e-6 only where it is below 2e-6 (|x| near 5): 1e-7 relative to rms(dx) at
// most, against expf's ten-odd instructions in a kernel whose 16-bit bwd is close to issue-bound.
__host__ __device__ inline float fast_exp(float x) {
#ifdef __CUDA_ARCH__
  return __expf(x);
#else
  return expf(x);
#endif
}

template <Approx A>
__host__ __device__ inline float gelu_fwd(float x) {
  if constexpr (A == Approx::none) {
    return 0.5f * x * (1.f + erff(x * kSqrtHalf));
  } else {
    return 0.5f * x * (1.f + tanhf(kBeta * (x + kKappa * x * x * x)));
  }
}

template <Approx A>
__host__ __device__ inline float gelu_bwd(float x, float dy) {
  if constexpr (A == Approx::none) {
    const float cdf = 0.5f * (1.f + erff(x * kSqrtHalf));
    const float pdf = kInvSqrt2Pi * fast_exp(-0.5f * x * x);
    return dy * (cdf + x * pdf);
  } else {
    const float x_sq = x * x;
    const float t = tanhf(kBeta * (x + kKappa * x_sq * x));
    const float d_right = 0.5f * x * (1.f - t * t) * kBeta * (1.f + 3.f * kKappa * x_sq);
    return dy * (0.5f * (1.f + t) + d_right);
  }
}

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

// What one launch works on. The vectors start at element `head`; the tail after them is shorter
// than one vector. When the tensors are not equally aligned, head = n: every element is scalar.
struct Args {
  const void* x;
  const void* dy;  // bwd only
  void* out;
  std::size_t n;
  std::size_t head;
  std::size_t vectors;
};

template <Approx A, bool kBwd>
__host__ __device__ inline float gelu_one(float x, float dy) {
  if constexpr (kBwd) return gelu_bwd<A>(x, dy);
  else return gelu_fwd<A>(x);
}

template <DType D, Approx A, bool kBwd>
__host__ __device__ inline void gelu_scalar(const Args& a, std::size_t i) {
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
__host__ __device__ void gelu_span(std::size_t tid, std::size_t nthreads, const Args& a) {
  using T = typename Elem<D>::T;
  using V = Vec<T>;
  for (std::size_t i = tid; i < a.head; i += nthreads) gelu_scalar<D, A, kBwd>(a, i);

  const V* __restrict__ xv = reinterpret_cast<const V*>(static_cast<const T*>(a.x) + a.head);
  const V* __restrict__ dv = kBwd ? reinterpret_cast<const V*>(static_cast<const T*>(a.dy) + a.head) : xv;
  V* __restrict__ yv = reinterpret_cast<V*>(static_cast<T*>(a.out) + a.head);
  // Each round, thread tid takes vectors v, v + nthreads, ...: every load of the round is
  // coalesced across the grid, and all of them are issued before the first result is needed.
  // In the last round, indices past the end load the last vector again (unpredicated loads) and
  // store nothing.
  for (std::size_t v = tid; v < a.vectors; v += kUnroll * nthreads) {
    V xs[kUnroll];
    [[maybe_unused]] V ds[kUnroll];
GELU_UNROLL
    for (int k = 0; k < kUnroll; ++k) {
      const std::size_t j = std::min(v + k * nthreads, a.vectors - 1);
      xs[k] = xv[j];
      if constexpr (kBwd) ds[k] = dv[j];
    }
GELU_UNROLL
    for (int k = 0; k < kUnroll; ++k) {
      const std::size_t j = v + k * nthreads;
      if (j >= a.vectors) continue;
      if constexpr (kBwd) yv[j] = gelu_vec<D, A, kBwd>(xs[k], ds[k]);
      else yv[j] = gelu_vec<D, A, kBwd>(xs[k], xs[k]);
    }
  }

  for (std::size_t i = a.head + a.vectors * V::kCount + tid; i < a.n; i += nthreads) gelu_scalar<D, A, kBwd>(a, i);
}

template <DType D, Approx A, bool kBwd>
__global__ void __launch_bounds__(kThreads) gelu_kernel(Args a) {
  gelu_span<D, A, kBwd>(blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x,
                        static_cast<std::size_t>(gridDim.x) * blockDim.x, a);
}

// One instantiation: the kernel and its body for the host.
struct Variant {
  void (*kernel)(Args);
  void (*host)(std::size_t, std::size_t, const Args&);
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

Args args_for(const Shape& s, const void* x, const void* dy, void* out) {
  const std::size_t e = dtype_size(s.dtype), n = static_cast<std::size_t>(s.elements);
  auto misalignment = [](const void* p) { return reinterpret_cast<std::uintptr_t>(p) % kVecBytes; };
  Args a{x, dy, out, n, n, 0};
  const bool congruent = misalignment(x) == misalignment(out) && (!dy || misalignment(dy) == misalignment(x));
  if (congruent) {
    a.head = std::min(n, (kVecBytes - misalignment(x)) % kVecBytes / e);
    a.vectors = (n - a.head) * e / kVecBytes;
  }
  return a;
}

// Enough threads for one round (kUnroll vectors each) and for the head and tail, at most max_blocks.
unsigned grid_for(const Args& a, const Shape& s, unsigned max_blocks) {
  const std::size_t per_vec = kVecBytes / dtype_size(s.dtype);
  const std::size_t tail = a.n - a.head - a.vectors * per_vec;
  const std::size_t threads = std::max({(a.vectors + kUnroll - 1) / kUnroll, a.head, tail, std::size_t(1)});
  return static_cast<unsigned>(std::min<std::size_t>((threads + kThreads - 1) / kThreads, max_blocks));
}

class CudaGelu final : public Case {
 public:
  explicit CudaGelu(const Problem& p)
      : s_(shape_of(p)), in_(make_inputs(s_, p.seed())), out_(make_output(s_)), variant_(variant_for(s_)) {
    const bool bwd = s_.dir == Direction::bwd;
    x_ = gpu::DeviceBuffer(in_.x);
    if (bwd) dy_ = gpu::DeviceBuffer(in_.dy);
    out_d_ = gpu::DeviceBuffer(out_.bytes());
    const std::size_t off = static_cast<std::size_t>(s_.offset) * dtype_size(s_.dtype);
    args_ = args_for(s_, x_.as<const std::byte>() + off, bwd ? dy_.as<const std::byte>() + off : nullptr,
                     out_d_.as<std::byte>() + off);

    int device = 0;
    HOTOPS_CHECK_CUDA(cudaGetDevice(&device));
    HOTOPS_CHECK_CUDA(cudaDeviceGetAttribute(&sms_, cudaDevAttrMultiProcessorCount, device));
    HOTOPS_CHECK_CUDA(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks_per_sm_, variant_.kernel, kThreads, 0));
    HOTOPS_CHECK(blocks_per_sm_ > 0, "the gelu kernel cannot run on this device");
    blocks_ = grid_for(args_, s_, static_cast<unsigned>(sms_ * blocks_per_sm_));
  }

  void run() override {
    variant_.kernel<<<blocks_, kThreads, 0, gpu::stream()>>>(args_);
    HOTOPS_CHECK_LAUNCH();
  }

  Check verify() override {
    out_d_.poison();
    run();
    out_d_.download(out_);
    return gelu::verify(s_, in_, out_);
  }

  std::string label() const override {
    const bool erf = s_.approx == Approx::none, bwd = s_.dir == Direction::bwd;
    std::string l = std::string("hotops gelu_kernel<") + dtype_name(s_.dtype) + ", " + approx_name(s_.approx) + ", " +
                    direction_name(s_.dir) + ">: f32 math (" + (erf ? (bwd ? "erff, __expf" : "erff") : "tanhf") + "), ";
    l += args_.vectors > 0 ? "16-byte vectors, " + std::to_string(kUnroll) + " per input in flight per thread"
                           : std::string("scalar accesses");
    return l + ", grid-stride " + std::to_string(blocks_) + "x" + std::to_string(kThreads) + " (" +
           std::to_string(blocks_per_sm_) + " blocks/SM x " + std::to_string(sms_) + " SMs)";
  }

 private:
  Shape s_;
  Inputs in_;
  HostBuffer out_;
  Variant variant_;
  gpu::DeviceBuffer x_, dy_, out_d_;
  Args args_{};
  int sms_ = 0, blocks_per_sm_ = 0;
  unsigned blocks_ = 1;
};

}  // namespace

std::unique_ptr<Case> make_cuda(const Problem& p) { return std::make_unique<CudaGelu>(p); }

void run_cuda_kernel_on_host(const Shape& s, const void* x, const void* dy, void* out, unsigned blocks) {
  const Args a = args_for(s, x, dy, out);
  const std::size_t nthreads = static_cast<std::size_t>(grid_for(a, s, blocks)) * kThreads;
  const Variant v = variant_for(s);
  for (std::size_t t = 0; t < nthreads; ++t) v.host(t, nthreads, a);
}

}  // namespace hotops::gelu
