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

}  // namespace hotops::gpu
