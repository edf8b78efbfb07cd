// Device-side helpers shared by hotops' hand-written CUDA kernels: f32 <-> storage conversions (bf16
// rounded to nearest even), VEC elements moved in one aligned access, and warp-wide reductions.
#pragma once
#include <cstdint>

#include <cuda_bf16.h>

namespace hotops::gpu {

__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }
template <class T> __device__ __forceinline__ T from_float(float v);
template <> __device__ __forceinline__ float from_float<float>(float v) { return v; }
template <> __device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }
// The f32 value that v reads back as once stored in T: what a kernel that sums its own stored output
// (a bias gradient of the tensor the next GEMMs read) adds.
template <class T> __device__ __forceinline__ float rounded(float v) { return to_float(from_float<T>(v)); }

// The same for kernels that hold bf16 as its bits: the f32 value of an element stored as float or
// as bf16 in a uint16_t, and the element of an f32 (bf16 rounded to nearest even).
template <class T>
struct Elem;
template <>
struct Elem<float> {
  __device__ static float load(float v) { return v; }
  __device__ static float store(float f) { return f; }
};
template <>
struct Elem<std::uint16_t> {
  __device__ static float load(std::uint16_t v) { return __uint_as_float(static_cast<unsigned>(v) << 16); }
  __device__ static std::uint16_t store(float f) { return __bfloat16_as_ushort(__float2bfloat16_rn(f)); }
};

// VEC elements in one aligned access (16 bytes at most).
template <class T, int VEC>
struct alignas(sizeof(T) * VEC) Pack {
  T v[VEC];
};

template <class T, int VEC>
__device__ __forceinline__ Pack<T, VEC> load_pack(const T* p) {
  return *reinterpret_cast<const Pack<T, VEC>*>(p);
}

// The f32 values of a pack's elements.
template <class T, int VEC>
__device__ __forceinline__ void unpack(const Pack<T, VEC>& pk, float (&out)[VEC]) {
#pragma unroll
  for (int i = 0; i < VEC; ++i) out[i] = to_float(pk.v[i]);
}

template <class T, int VEC>
__device__ __forceinline__ void load(const T* p, float (&out)[VEC]) {
  unpack(load_pack<T, VEC>(p), out);
}

template <class T, int VEC>
__device__ __forceinline__ void store(T* p, const float (&in)[VEC]) {
  Pack<T, VEC> pk;
#pragma unroll
  for (int i = 0; i < VEC; ++i) pk.v[i] = from_float<T>(in[i]);
  *reinterpret_cast<Pack<T, VEC>*>(p) = pk;
}

// The sum and the max over the 32 lanes of a warp, every lane getting the result (a butterfly of
// __shfl_xor_sync; lane 0 adds in the same order as a __shfl_down_sync tree). W < 32: over each
// aligned group of W lanes (W a power of two), every lane of the warp taking part.
template <int W = 32>
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = W / 2; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
template <int W = 32>
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = W / 2; o > 0; o /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Four elements of storage in one aligned access, float4 or 4 bf16 in 8 bytes (Quad<T>::type), and
// their f32 values; bf16 rounded to nearest even.
struct alignas(8) Bf16x4 {
  __nv_bfloat162 lo, hi;
};
template <class T> struct Quad;
template <> struct Quad<float> { using type = float4; };
template <> struct Quad<__nv_bfloat16> { using type = Bf16x4; };
__device__ inline float4 f32_of(float4 v) { return v; }
__device__ inline float4 f32_of(Bf16x4 v) {
  const float2 a = __bfloat1622float2(v.lo), b = __bfloat1622float2(v.hi);
  return make_float4(a.x, a.y, b.x, b.y);
}
template <class Q> __device__ inline Q stored4(float4 v);
template <> __device__ inline float4 stored4<float4>(float4 v) { return v; }
template <> __device__ inline Bf16x4 stored4<Bf16x4>(float4 v) {
  return Bf16x4{__floats2bfloat162_rn(v.x, v.y), __floats2bfloat162_rn(v.z, v.w)};
}

// c += a . b over one 16x8x16 tile of tensor-core math (mma.sync m16n8k16, bf16 operands, f32
// accumulation). Fragments (PTX ISA), lane = 4 g + t: A 16x16 row-major a[0] (g, 2t..2t+1), a[1]
// (g+8, 2t..), a[2] (g, 2t+8..), a[3] (g+8, 2t+8..); B 16x8 (k x n) b0 (k 2t..2t+1, n g), b1 (k
// 2t+8.., n g); C 16x8 c[0] c[1] (g, 2t..2t+1), c[2] c[3] (g+8, 2t..).
__device__ __forceinline__ void mma_bf16(float c[4], const unsigned a[4], unsigned b0, unsigned b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
// Two f32 rounded to bf16 in one register, lo in the low half: a fragment's pair of elements.
__device__ __forceinline__ unsigned pack_bf16x2(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const unsigned*>(&v);
}

// Asynchronous copies to shared memory (cp.async, sm_80 and later): 16 bytes from global memory,
// or 16 zero bytes where `valid` is false (src is then not read but must be an address); a commit
// closes the group of copies this thread issued since the last one, and wait_async_groups<N>
// returns when at most N of this thread's groups are still in flight.
__device__ __forceinline__ unsigned shared_address(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void copy16_async(void* dst, const void* src, bool valid = true) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(shared_address(dst)), "l"(src),
               "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void commit_async() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wait_async_groups() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

}  // namespace hotops::gpu
