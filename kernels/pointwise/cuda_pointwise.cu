// relu and dropout on CUDA: hand-written, memory-bound passes. Each thread moves 16-byte vectors,
// two per input loaded before either is used; the grid covers all vectors in one round, and the
// body is a grid-stride loop, correct on any grid (the host tests run it on small ones). The
// elements before the first 16-byte boundary (the head) and after the last whole vector (the tail)
// are done one per thread. relu works on the stored bits (x > 0 is a signed integer compare of
// them), so it is exact by construction; dropout draws its mask with pointwise.h's hash, the code the
// CPU loop and the reference run, and multiplies in f32. The bodies are __host__ __device__ so that
// the tests can run them on the host (see pointwise.h).
#include <cuda_bf16.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>

#include "hotops/cuda_util.h"
#include "kernels/pointwise/pointwise.h"

namespace hotops::pointwise {
namespace {

#ifdef __CUDA_ARCH__
#define POINTWISE_UNROLL _Pragma("unroll")
#else
#define POINTWISE_UNROLL
#endif

constexpr unsigned kThreads = 256;
constexpr std::size_t kVecBytes = 16;
constexpr int kUnroll = 2;  // vectors in flight per input and thread

// Storage of each dtype: the bits (U), the same bits signed (S, for relu's x > 0), f32 conversions.
template <DType D>
struct Elem {
  using U = std::uint32_t;
  using S = std::int32_t;
  __host__ __device__ static float to_float(U v) {
    float f;
    memcpy(&f, &v, 4);
    return f;
  }
  __host__ __device__ static U from_float(float f) {
    U v;
    memcpy(&v, &f, 4);
    return v;
  }
};
template <>
struct Elem<DType::bf16> {
  using U = std::uint16_t;
  using S = std::int16_t;
  __host__ __device__ static float to_float(U v) { return Elem<DType::f32>::to_float(static_cast<std::uint32_t>(v) << 16); }
  __host__ __device__ static U from_float(float f) {
#ifdef __CUDA_ARCH__
    return __bfloat16_as_ushort(__float2bfloat16_rn(f));
#else
    return float_to_bf16(f);
#endif
  }
};

// One 16-byte access of elements, and the mask bytes of the same elements (4 or 8 bytes).
template <class U>
struct alignas(kVecBytes) Vec {
  static constexpr int kCount = static_cast<int>(kVecBytes / sizeof(U));
  U e[kCount];
};
template <int N>
struct alignas(N) MaskVec {
  std::uint8_t e[N];
};

// A 16-byte load through the read-only (non-coherent) path: the data is read once.
template <class V>
__host__ __device__ inline V load(const V* p) {
#ifdef __CUDA_ARCH__
  const uint4 u = __ldg(reinterpret_cast<const uint4*>(p));
  V v;
  static_assert(sizeof u == sizeof v);
  memcpy(&v, &u, sizeof v);
  return v;
#else
  return *p;
#endif
}

// What one launch works on. in0: x (relu, dropout fwd) or dy (dropout bwd); in1: dy (relu bwd).
// The vectors start at element `head`; the tail after them is shorter than one vector. When the
// tensors are not equally aligned, head = n: every element is scalar.
struct KernelArgs {
  const void* in0;
  const void* in1;
  const std::uint8_t* mask_in;  // dropout bwd
  void* out;
  std::uint8_t* mask_out;  // dropout fwd
  std::size_t n;
  std::size_t head;
  std::size_t vectors;
  DropoutKey key;
};

// Element i: relu on the bits; dropout through f32. `keep` for dropout fwd is drawn here.
template <Op O, DType D, bool kBwd>
__host__ __device__ inline typename Elem<D>::U one(const KernelArgs& a, std::size_t i, typename Elem<D>::U v0,
                                                   typename Elem<D>::U v1, std::uint8_t m_in, std::uint8_t& m_out) {
  using E = Elem<D>;
  using S = typename E::S;
  if constexpr (O == Op::relu) {
    if constexpr (kBwd) return static_cast<S>(v0) > 0 ? v1 : typename E::U(0);  // x > 0 ? dy : 0
    else return static_cast<S>(v0) > 0 ? v0 : typename E::U(0);               // max(x, 0)
  } else {
    bool keep;
    if constexpr (kBwd) {
      keep = m_in != 0;
    } else {
      keep = dropout_keep(a.key, static_cast<std::uint64_t>(i));
      m_out = static_cast<std::uint8_t>(keep);
    }
    return E::from_float(E::to_float(v0) * (keep ? a.key.scale : 0.f));
  }
}

template <Op O, DType D, bool kBwd>
__host__ __device__ inline void scalar(const KernelArgs& a, std::size_t i) {
  using U = typename Elem<D>::U;
  const U v0 = static_cast<const U*>(a.in0)[i];
  const U v1 = O == Op::relu && kBwd ? static_cast<const U*>(a.in1)[i] : U(0);
  const std::uint8_t m_in = O == Op::dropout && kBwd ? a.mask_in[i] : 0;
  std::uint8_t m_out = 0;
  static_cast<U*>(a.out)[i] = one<O, D, kBwd>(a, i, v0, v1, m_in, m_out);
  if constexpr (O == Op::dropout && !kBwd) a.mask_out[i] = m_out;
}

// The inputs of one vector, loaded; the elements start at tensor index `first`.
template <Op O, DType D, bool kBwd>
struct Loaded {
  using U = typename Elem<D>::U;
  static constexpr int kCount = Vec<U>::kCount;
  Vec<U> v0, v1;
  MaskVec<kCount> m;
};

template <Op O, DType D, bool kBwd>
__host__ __device__ inline Loaded<O, D, kBwd> load_vec(const KernelArgs& a, std::size_t v) {
  using L = Loaded<O, D, kBwd>;
  using U = typename Elem<D>::U;
  L l{};
  l.v0 = load(reinterpret_cast<const Vec<U>*>(static_cast<const U*>(a.in0) + a.head) + v);
  if constexpr (O == Op::relu && kBwd) l.v1 = load(reinterpret_cast<const Vec<U>*>(static_cast<const U*>(a.in1) + a.head) + v);
  if constexpr (O == Op::dropout && kBwd) l.m = reinterpret_cast<const MaskVec<L::kCount>*>(a.mask_in + a.head)[v];
  return l;
}

template <Op O, DType D, bool kBwd>
__host__ __device__ inline void do_vec(const KernelArgs& a, std::size_t v, const Loaded<O, D, kBwd>& l) {
  using L = Loaded<O, D, kBwd>;
  using U = typename Elem<D>::U;
  const std::size_t first = a.head + v * L::kCount;
  Vec<U> y;
  MaskVec<L::kCount> m{};
POINTWISE_UNROLL
  for (int j = 0; j < L::kCount; ++j) y.e[j] = one<O, D, kBwd>(a, first + j, l.v0.e[j], l.v1.e[j], l.m.e[j], m.e[j]);
  reinterpret_cast<Vec<U>*>(static_cast<U*>(a.out) + a.head)[v] = y;
  if constexpr (O == Op::dropout && !kBwd) reinterpret_cast<MaskVec<L::kCount>*>(a.mask_out + a.head)[v] = m;
}

// Thread `tid` of `nthreads`: its share of the head, the vectors (kUnroll per round, each round's
// loads all issued before its math) and the tail.
template <Op O, DType D, bool kBwd>
__host__ __device__ void span(std::size_t tid, std::size_t nthreads, const KernelArgs& a) {
  using L = Loaded<O, D, kBwd>;
  for (std::size_t i = tid; i < a.head; i += nthreads) scalar<O, D, kBwd>(a, i);
  for (std::size_t v = tid; v < a.vectors; v += kUnroll * nthreads) {
    if (v + (kUnroll - 1) * nthreads < a.vectors) {
      L l[kUnroll];
POINTWISE_UNROLL
      for (int k = 0; k < kUnroll; ++k) l[k] = load_vec<O, D, kBwd>(a, v + k * nthreads);
POINTWISE_UNROLL
      for (int k = 0; k < kUnroll; ++k) do_vec<O, D, kBwd>(a, v + k * nthreads, l[k]);
    } else {
      for (std::size_t j = v; j < a.vectors; j += nthreads) do_vec<O, D, kBwd>(a, j, load_vec<O, D, kBwd>(a, j));
    }
  }
  for (std::size_t i = a.head + a.vectors * L::kCount + tid; i < a.n; i += nthreads) scalar<O, D, kBwd>(a, i);
}

template <Op O, DType D, bool kBwd>
__global__ void __launch_bounds__(kThreads) pointwise_kernel(KernelArgs a) {
  span<O, D, kBwd>(blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x,
                   static_cast<std::size_t>(gridDim.x) * blockDim.x, a);
}

// One instantiation: the kernel and its body for the host.
struct Variant {
  void (*kernel)(KernelArgs);
  void (*host)(std::size_t, std::size_t, const KernelArgs&);
};

template <Op O, DType D, bool kBwd>
Variant variant() {
  return {pointwise_kernel<O, D, kBwd>, span<O, D, kBwd>};
}

template <Op O>
Variant variant(DType t, bool bwd) {
  if (t == DType::bf16) return bwd ? variant<O, DType::bf16, true>() : variant<O, DType::bf16, false>();
  return bwd ? variant<O, DType::f32, true>() : variant<O, DType::f32, false>();
}

Variant variant_for(const Shape& s) {
  const bool bwd = s.dir == Direction::bwd;
  return s.op == Op::relu ? variant<Op::relu>(s.dtype, bwd) : variant<Op::dropout>(s.dtype, bwd);
}

// The pointers are those of the tensors. Vectors need every element tensor at the same place in
// its 16-byte line and the mask bytes of each vector aligned to their own size.
KernelArgs args_for(const Shape& s, const DropoutKey& k, const void* in0, const void* in1, const std::uint8_t* mask_in,
              void* out, std::uint8_t* mask_out) {
  const std::size_t e = dtype_size(s.dtype), n = static_cast<std::size_t>(s.elements), per_vec = kVecBytes / e;
  auto mis = [](const void* p, std::size_t a) { return reinterpret_cast<std::uintptr_t>(p) % a; };
  KernelArgs a{in0, in1, mask_in, out, mask_out, n, n, 0, k};
  bool congruent = mis(in0, e) == 0 && mis(in0, kVecBytes) == mis(out, kVecBytes) &&
                   (!in1 || mis(in1, kVecBytes) == mis(in0, kVecBytes));
  if (!congruent) return a;
  const std::size_t head = std::min(n, (kVecBytes - mis(in0, kVecBytes)) % kVecBytes / e);
  for (const std::uint8_t* m : {mask_in, static_cast<const std::uint8_t*>(mask_out)})
    if (m && mis(m + head, per_vec) != 0) return a;
  a.head = head;
  a.vectors = (n - head) / per_vec;
  return a;
}

// Enough threads for one round (kUnroll vectors each) and for the head and tail, at most max_blocks.
unsigned grid_for(const KernelArgs& a, const Shape& s, unsigned max_blocks) {
  const std::size_t per_vec = kVecBytes / dtype_size(s.dtype);
  const std::size_t tail = a.n - a.head - a.vectors * per_vec;
  const std::size_t threads = std::max({(a.vectors + kUnroll - 1) / kUnroll, a.head, tail, std::size_t(1)});
  return static_cast<unsigned>(std::min<std::size_t>((threads + kThreads - 1) / kThreads, max_blocks));
}

class CudaPointwise final : public Plan {
 public:
  explicit CudaPointwise(const Shape& s) : s_(s), variant_(variant_for(s_)) {
    max_grid_ = static_cast<unsigned>(gpu::limits().max_grid_x);
    // The launch on buffers that start at a 16-byte boundary, as cudaMalloc's do (only the
    // tensors' place in their 16-byte lines matters to it, so any such address stands for them):
    // the one the label describes.
    auto* const aligned = reinterpret_cast<std::uint8_t*>(std::uintptr_t{256});
    Args t;
    t.x = t.dy = t.mask_in = aligned;
    t.out = t.mask_out = aligned;
    aligned_ = kernel_args(t);
    blocks_ = grid_for(aligned_, s_, max_grid_);
  }

  void run(const Args& t) override {
    const KernelArgs a = kernel_args(t);
    variant_.kernel<<<grid_for(a, s_, max_grid_), kThreads, 0, gpu::stream()>>>(a);
    HOTOPS_CHECK_LAUNCH();
  }

  std::string label() const override {
    std::string l = std::string("hotops pointwise_kernel<") + (s_.op == Op::relu ? "relu" : "dropout") + ", " +
                    dtype_name(s_.dtype) + ", " + direction_name(s_.dir) + ">";
    if (s_.op == Op::dropout)
      l += s_.dir == Direction::fwd ? " (mask from a lowbias32 x2 counter hash)" : " (reads the uint8 mask)";
    l += aligned_.vectors > 0 ? ", 16-byte vectors, " + std::to_string(kUnroll) + " per input in flight per thread"
                              : std::string(", scalar accesses");
    return l + ", grid " + std::to_string(blocks_) + "x" + std::to_string(kThreads);
  }

 private:
  // The launch's arguments on the buffers of `t`: the tensors start `offset` elements into them.
  KernelArgs kernel_args(const Args& t) const {
    const bool bwd = s_.dir == Direction::bwd, dropout = s_.op == Op::dropout;
    const std::size_t off = static_cast<std::size_t>(s_.offset), eoff = off * dtype_size(s_.dtype);
    auto tensor = [&](const void* p) { return static_cast<const std::byte*>(p) + eoff; };
    const void* in0 = tensor(dropout && bwd ? t.dy : t.x);
    const void* in1 = !dropout && bwd ? tensor(t.dy) : nullptr;
    const std::uint8_t* mask_in = dropout && bwd ? t.mask_in + off : nullptr;
    std::uint8_t* mask_out = dropout && !bwd ? t.mask_out + off : nullptr;
    return args_for(s_, dropout_key(t.seed, s_.p), in0, in1, mask_in, static_cast<std::byte*>(t.out) + eoff, mask_out);
  }

  Shape s_;
  Variant variant_;
  KernelArgs aligned_{};  // the launch on 16-byte aligned buffers
  unsigned max_grid_ = 1, blocks_ = 1;
};

}  // namespace

std::unique_ptr<Plan> make_cuda_plan(const Shape& s) {
  if (s.op == Op::relu_dbias) return make_cuda_relu_dbias_plan(s);
  if (s.op == Op::relu_bias) return make_cuda_relu_bias_plan(s);
  return std::make_unique<CudaPointwise>(s);
}

void run_cuda_kernel_on_host(const Shape& s, const DropoutKey& k, const void* x, const void* dy,
                             const std::uint8_t* mask_in, void* out, std::uint8_t* mask_out, unsigned blocks) {
  const bool dropout_bwd = s.op == Op::dropout && s.dir == Direction::bwd;
  const void* in0 = dropout_bwd ? dy : x;
  const void* in1 = s.op == Op::relu && s.dir == Direction::bwd ? dy : nullptr;
  const KernelArgs a = args_for(s, k, in0, in1, mask_in, out, mask_out);
  const std::size_t nthreads = static_cast<std::size_t>(grid_for(a, s, blocks)) * kThreads;
  const Variant v = variant_for(s);
  for (std::size_t t = 0; t < nthreads; ++t) v.host(t, nthreads, a);
}

}  // namespace hotops::pointwise
