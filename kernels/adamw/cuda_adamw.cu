// The CUDA AdamW step (cuda_step) and the adamw family's CUDA plan: one launch of one grid-stride
// kernel over the flat arrays, 16-byte vectors per thread, the step's scalars read from device memory
// and, for the op's own plan, advanced by the launch's last block (docs/ops.md, "adamw", says how and
// why). The kernel's body is __host__ __device__ so that the tests run it on the host.
#include <cuda_bf16.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

#include "hotops/cuda_util.h"
#include "kernels/adamw/adamw.h"

namespace hotops::adamw {
namespace {

struct IeeeSqrt {
  __host__ __device__ float operator()(float x) const { return sqrtf(x); }
};

// Four consecutive bf16 values: 8 bytes.
struct alignas(8) Bf16x4 {
  std::uint16_t e[4];
};

__host__ __device__ inline float bf16_bits_to_float(std::uint16_t h) {
#ifdef __CUDA_ARCH__
  return __uint_as_float(static_cast<unsigned>(h) << 16);
#else
  return bf16_to_float(h);
#endif
}

__host__ __device__ inline Bf16x4 to_bf16x4(const float4& f) {
  Bf16x4 r;
#ifdef __CUDA_ARCH__
  const __nv_bfloat162 lo = __floats2bfloat162_rn(f.x, f.y), hi = __floats2bfloat162_rn(f.z, f.w);
  r.e[0] = __bfloat16_as_ushort(lo.x), r.e[1] = __bfloat16_as_ushort(lo.y);
  r.e[2] = __bfloat16_as_ushort(hi.x), r.e[3] = __bfloat16_as_ushort(hi.y);
#else
  r.e[0] = float_to_bf16(f.x), r.e[1] = float_to_bf16(f.y), r.e[2] = float_to_bf16(f.z), r.e[3] = float_to_bf16(f.w);
#endif
  return r;
}

// The gradient, read once: through the read-only path on the device.
template <bool kBf16>
__host__ __device__ inline float4 load_grad(const void* g, std::int64_t vec) {
  if constexpr (kBf16) {
    const Bf16x4* gv = static_cast<const Bf16x4*>(g) + vec;
#ifdef __CUDA_ARCH__
    const uint2 u = __ldg(reinterpret_cast<const uint2*>(gv));
    Bf16x4 b;
    memcpy(&b, &u, sizeof b);
#else
    const Bf16x4 b = *gv;
#endif
    return {bf16_bits_to_float(b.e[0]), bf16_bits_to_float(b.e[1]), bf16_bits_to_float(b.e[2]),
            bf16_bits_to_float(b.e[3])};
  } else {
#ifdef __CUDA_ARCH__
    return __ldg(static_cast<const float4*>(g) + vec);
#else
    return static_cast<const float4*>(g)[vec];
#endif
  }
}

// Thread `first` of a grid of `stride` threads: vectors first, first + stride, ..., then its element
// of the tail. kBf16: bf16 gradients; kP16: the updated parameters also rounded to bf16 into p16.
template <bool kBf16, bool kP16>
__host__ __device__ inline void flat_body(float* __restrict__ p, const void* __restrict__ g, float* __restrict__ m,
                                          float* __restrict__ v, std::uint16_t* __restrict__ p16, std::int64_t n,
                                          std::int64_t first, std::int64_t stride, const StepScalars& s) {
  float4* p4 = reinterpret_cast<float4*>(p);
  float4* m4 = reinterpret_cast<float4*>(m);
  float4* v4 = reinterpret_cast<float4*>(v);
  const std::int64_t n4 = n / 4;
  for (std::int64_t i = first; i < n4; i += stride) {
    float4 pv = p4[i], mv = m4[i], vv = v4[i];
    const float4 gv = load_grad<kBf16>(g, i);
    step_element(pv.x, gv.x, mv.x, vv.x, s, IeeeSqrt());
    step_element(pv.y, gv.y, mv.y, vv.y, s, IeeeSqrt());
    step_element(pv.z, gv.z, mv.z, vv.z, s, IeeeSqrt());
    step_element(pv.w, gv.w, mv.w, vv.w, s, IeeeSqrt());
    p4[i] = pv, m4[i] = mv, v4[i] = vv;
    if constexpr (kP16) reinterpret_cast<Bf16x4*>(p16)[i] = to_bf16x4(pv);
  }
  for (std::int64_t i = n4 * 4 + first; i < n; i += stride) {
    const float ge = kBf16 ? bf16_bits_to_float(static_cast<const std::uint16_t*>(g)[i]) : static_cast<const float*>(g)[i];
    step_element(p[i], ge, m[i], v[i], s, IeeeSqrt());
    if constexpr (kP16) p16[i] = to_bf16x4(float4{p[i], 0.f, 0.f, 0.f}).e[0];
  }
}

// kAdvance: the launch takes the step itself (DeviceStep's ticket); else another kernel advanced it.
template <bool kBf16, bool kP16, bool kAdvance>
__global__ void __launch_bounds__(kCudaThreads) adamw_kernel(float* __restrict__ p, const void* __restrict__ g,
                                                             float* __restrict__ m, float* __restrict__ v,
                                                             std::uint16_t* __restrict__ p16, std::int64_t n,
                                                             DeviceStep* __restrict__ state, Hyper h) {
  StepScalars s;
  if constexpr (kAdvance) {
    // Thread 0 reads the scalars for its block, before the block takes its ticket: one read of the
    // shared state a block (every thread reading it queued a large grid's loads on the same
    // addresses: mlp_mnist's bf16 train step, 670K parameters, took 15 us longer on the H200).
    __shared__ StepScalars block_s;
    if (threadIdx.x == 0) {
      const volatile StepScalars* next = &state->s;
      block_s = StepScalars{next->decay,           next->beta1, next->one_minus_beta1, next->beta2,
                            next->one_minus_beta2, next->eps,   next->step_size,       next->inv_sqrt_bc2};
    }
    __syncthreads();
    s = block_s;
    if (threadIdx.x == 0) {
      __threadfence();
      if (atomicAdd(&state->arrived, 1u) == gridDim.x - 1) {  // every block has read them: advance
        const std::int64_t taken = state->step + 1;
        state->step = taken;
        state->s = scalars_for(h, taken + 1);
        state->arrived = 0;
      }
    }
  } else {
    s = static_cast<const DeviceStep*>(state)->s;
  }
  flat_body<kBf16, kP16>(p, g, m, v, p16, n, blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x,
                   static_cast<std::int64_t>(gridDim.x) * blockDim.x, s);
}

// The grid over n elements: a thread a 16-byte vector, at most max_blocks and at most the blocks of
// this instance that the GPU holds at once (a grid of more leaves a second, partial wave striding
// over as much as the first: 1024 blocks where 40 registers a thread let an SM hold 6).
template <bool kBf16, bool kP16, bool kAdvance>
unsigned blocks_for(std::int64_t n, unsigned max_blocks) {
  static const unsigned wave = gpu::resident_blocks(adamw_kernel<kBf16, kP16, kAdvance>, kCudaThreads, kCudaMaxBlocks);
  const std::int64_t want = (n / 4 + kCudaThreads - 1) / kCudaThreads;
  return static_cast<unsigned>(std::max<std::int64_t>(1, std::min<std::int64_t>(want, std::min(max_blocks, wave))));
}

// Every array on the boundary of its 4-element vectors: 16 bytes for f32, 8 for bf16.
bool vector_aligned(const void* q, std::size_t element_bytes) {
  return reinterpret_cast<std::uintptr_t>(q) % (4 * element_bytes) == 0;
}

template <bool kBf16, bool kP16>
void launch(float* p, const void* g, float* m, float* v, std::uint16_t* p16, std::int64_t n, DeviceStep* state,
            const Hyper* advance, cudaStream_t stream, unsigned max_blocks) {
  for (const void* q : {static_cast<const void*>(p), static_cast<const void*>(m), static_cast<const void*>(v)})
    HOTOPS_CHECK(vector_aligned(q, sizeof(float)), "adamw: an array is not 16-byte aligned");
  HOTOPS_CHECK(vector_aligned(g, kBf16 ? 2 : 4) && (!kP16 || vector_aligned(p16, 2)),
               "adamw: a gradient or bf16 copy is not aligned to its 4-element vectors");
  if (advance != nullptr)
    adamw_kernel<kBf16, kP16, true><<<blocks_for<kBf16, kP16, true>(n, max_blocks), kCudaThreads, 0, stream>>>(p, g, m, v, p16, n,
                                                                                                          state, *advance);
  else
    adamw_kernel<kBf16, kP16, false><<<blocks_for<kBf16, kP16, false>(n, max_blocks), kCudaThreads, 0, stream>>>(
        p, g, m, v, p16, n, state, Hyper{});
  HOTOPS_CHECK_LAUNCH();
}

class CudaAdamw final : public Plan {
 public:
  explicit CudaAdamw(const Shape& s) : s_(s), span_(static_cast<std::int64_t>(layout_of(s_.sizes).span)) {}

  void run(const Args& a) override {
    if (s_.dtype == DType::bf16)
      cuda_step(a.p, static_cast<const std::uint16_t*>(a.g), a.m, a.v, a.p16, span_, a.step, &s_.hyper, gpu::stream());
    else
      cuda_step(a.p, static_cast<const float*>(a.g), a.m, a.v, span_, a.step, &s_.hyper, gpu::stream());
  }

  std::string label() const override {
    const unsigned blocks = s_.dtype == DType::bf16 ? blocks_for<true, true, true>(span_, kCudaMaxBlocks)
                                                    : blocks_for<false, false, true>(span_, kCudaMaxBlocks);
    return "hotops flat adamw, " + describe(s_) + ", 1 launch: adamw_kernel<" + dtype_name(s_.dtype) + "> grid " +
           std::to_string(blocks) + "x" + std::to_string(kCudaThreads) + " striding over " + std::to_string(span_) +
           " elements (padding included) in 16-byte vectors, step count on the device";
  }

 private:
  Shape s_;
  std::int64_t span_;  // elements of the flat pass
};

}  // namespace

void cuda_step(float* p, const float* g, float* m, float* v, std::int64_t n, DeviceStep* state, const Hyper* advance,
               cudaStream_t stream, unsigned max_blocks) {
  launch<false, false>(p, g, m, v, nullptr, n, state, advance, stream, max_blocks);
}

void cuda_step(float* p, const float* g, float* m, float* v, std::uint16_t* p16, std::int64_t n, DeviceStep* state,
               const Hyper* advance, cudaStream_t stream, unsigned max_blocks) {
  if (p16 == nullptr) return launch<false, false>(p, g, m, v, nullptr, n, state, advance, stream, max_blocks);
  launch<false, true>(p, g, m, v, p16, n, state, advance, stream, max_blocks);
}

void cuda_step(float* p, const std::uint16_t* g, float* m, float* v, std::uint16_t* p16, std::int64_t n,
               DeviceStep* state, const Hyper* advance, cudaStream_t stream, unsigned max_blocks) {
  launch<true, true>(p, g, m, v, p16, n, state, advance, stream, max_blocks);
}

Check check_device_step(const DeviceStep* state, std::int64_t steps) {
  DeviceStep after{};
  HOTOPS_CHECK_CUDA(cudaMemcpyAsync(&after, state, sizeof after, cudaMemcpyDeviceToHost, gpu::stream()));
  HOTOPS_CHECK_CUDA(cudaStreamSynchronize(gpu::stream()));
  return check_step(after, steps);
}

std::unique_ptr<Plan> make_cuda_plan(const Shape& s) { return std::make_unique<CudaAdamw>(s); }

void run_cuda_kernel_on_host(const Shape& s, State& st, std::int64_t t, unsigned blocks, std::size_t begin, std::size_t end) {
  const Layout l = layout_of(s.sizes);
  if (end == 0) end = l.span;
  HOTOPS_CHECK(begin % 4 == 0 && begin <= end && end <= l.span, "adamw: a range of the flat pass off its vectors or beyond it");
  const StepScalars sc = scalars_for(s.hyper, t);
  const auto n = static_cast<std::int64_t>(end - begin), threads = static_cast<std::int64_t>(blocks) * kCudaThreads;
  const std::size_t gbytes = begin * dtype_size(s.dtype);
  float *p = st.p.as<float>() + begin, *m = st.m.as<float>() + begin, *v = st.v.as<float>() + begin;
  const void* g = static_cast<const std::byte*>(st.g.data()) + gbytes;
  for (std::int64_t tid = 0; tid < threads; ++tid) {
    if (s.dtype == DType::bf16)
      flat_body<true, true>(p, g, m, v, st.p16.as<std::uint16_t>() + begin, n, tid, threads, sc);
    else if (st.p16.count() != 0)
      flat_body<false, true>(p, g, m, v, st.p16.as<std::uint16_t>() + begin, n, tid, threads, sc);
    else
      flat_body<false, false>(p, g, m, v, nullptr, n, tid, threads, sc);
  }
}

}  // namespace hotops::adamw
