// adamw on CUDA: one launch of one hand-written kernel for the whole parameter list. At setup the
// list becomes two device tables: the tensors (pointers of p, g, m, v and the bf16 p) and the chunks
// (tensor, start, count; chunks_of: at most kChunk = 16384 elements, split at multiples of kChunk).
// Block b does chunk b: the grid is exact, blocks come and go as their chunk is done, and every SM
// keeps loads in flight to the end. Each thread moves 16-byte vectors (4 f32 of p, m, v and g; the
// bf16 g and p as 8-byte halves), kVecs of each loaded before any is used, so that every thread has
// 112 bytes in flight; the at most 3 elements after a tensor's last whole vector are done one per
// thread. Tensors start on 256-byte boundaries (layout_of, as cudaMalloc and PyTorch's caching
// allocator place them), so every chunk's vectors are aligned; the setup checks it.
//
// The step count lives on the device, in a StepState that the kernel reads and advances, so that a
// CUDA graph of back-to-back runs takes steps 1, 2, 3, ... like a training loop (PyTorch's
// capturable and fused AdamW keep `step` as a device tensor for the same reason). The state holds
// the scalars of the step to take (lr / bc1, 1 / sqrt(bc2), ...), computed in double. Every block
// reads them, then its thread 0 takes a ticket (one atomicAdd per block, ~7000 for BERT-base); the
// block that takes the last ticket is the last to have read them, and it writes the count and the
// scalars of the next step and resets the ticket for the next launch. One launch per step, no host
// synchronisation: run() is one kernel launch and can be captured.
//
// The kernel's body is __host__ __device__ so that the tests run it on the host (adamw.h).
#include <cuda_bf16.h>

#include <cstdint>
#include <cstring>
#include <string>

#include "hotops/cuda_util.h"
#include "kernels/adamw/adamw.h"

namespace hotops::adamw {
namespace {

#ifdef __CUDA_ARCH__
#define ADAMW_UNROLL _Pragma("unroll")
#else
#define ADAMW_UNROLL
#endif

constexpr unsigned kThreads = 256;
constexpr int kVecs = 2;  // vectors per stream per thread in flight: 4 streams x 2 x 16 bytes (f32)

// One tensor of the list as the kernel sees it.
struct TensorPtrs {
  float* p;             // f32 parameters (bf16 dtype: the f32 master)
  const void* g;        // f32 or bf16
  float* m;
  float* v;
  std::uint16_t* p16;   // bf16 dtype: the bf16 parameters; else null
};

// The optimizer's step count on the device, and the scalars of the step to take next.
struct StepState {
  std::int64_t step;       // steps taken
  unsigned arrived;        // blocks of the current launch that have read `next`
  unsigned pad;
  StepScalars next;        // scalars of step `step + 1`
};

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

__host__ __device__ inline void step_vec(float4& p, const float4& g, float4& m, float4& v, const StepScalars& s) {
  step_element(p.x, g.x, m.x, v.x, s, IeeeSqrt());
  step_element(p.y, g.y, m.y, v.y, s, IeeeSqrt());
  step_element(p.z, g.z, m.z, v.z, s, IeeeSqrt());
  step_element(p.w, g.w, m.w, v.w, s, IeeeSqrt());
}

// Thread `tid` of `nthreads` in the block that does chunk `c` of tensor `t`.
template <bool kBf16>
__host__ __device__ void chunk_body(const TensorPtrs& t, const Chunk& c, unsigned tid, unsigned nthreads,
                                    const StepScalars& s) {
  float4* __restrict__ p = reinterpret_cast<float4*>(t.p + c.start);
  float4* __restrict__ m = reinterpret_cast<float4*>(t.m + c.start);
  float4* __restrict__ v = reinterpret_cast<float4*>(t.v + c.start);
  const void* g = kBf16 ? static_cast<const void*>(static_cast<const std::uint16_t*>(t.g) + c.start)
                        : static_cast<const void*>(static_cast<const float*>(t.g) + c.start);
  Bf16x4* p16 = kBf16 ? reinterpret_cast<Bf16x4*>(t.p16 + c.start) : nullptr;
  const std::int64_t vectors = c.count / 4;

  for (std::int64_t i = tid; i < vectors; i += kVecs * static_cast<std::int64_t>(nthreads)) {
    if (i + (kVecs - 1) * static_cast<std::int64_t>(nthreads) < vectors) {
      float4 ps[kVecs], gs[kVecs], ms[kVecs], vs[kVecs];
ADAMW_UNROLL
      for (int k = 0; k < kVecs; ++k) {
        const std::int64_t j = i + k * static_cast<std::int64_t>(nthreads);
        ps[k] = p[j], gs[k] = load_grad<kBf16>(g, j), ms[k] = m[j], vs[k] = v[j];
      }
ADAMW_UNROLL
      for (int k = 0; k < kVecs; ++k) {
        const std::int64_t j = i + k * static_cast<std::int64_t>(nthreads);
        step_vec(ps[k], gs[k], ms[k], vs[k], s);
        p[j] = ps[k], m[j] = ms[k], v[j] = vs[k];
        if constexpr (kBf16) p16[j] = to_bf16x4(ps[k]);
      }
    } else {
      for (std::int64_t j = i; j < vectors; j += nthreads) {
        float4 pj = p[j], mj = m[j], vj = v[j];
        step_vec(pj, load_grad<kBf16>(g, j), mj, vj, s);
        p[j] = pj, m[j] = mj, v[j] = vj;
        if constexpr (kBf16) p16[j] = to_bf16x4(pj);
      }
    }
  }

  // The tail: the last 0 to 3 elements of a tensor's last chunk.
  for (std::int64_t i = vectors * 4 + tid; i < c.count; i += nthreads) {
    float* pe = t.p + c.start + i;
    float* me = t.m + c.start + i;
    float* ve = t.v + c.start + i;
    const float ge = kBf16 ? bf16_bits_to_float(static_cast<const std::uint16_t*>(t.g)[c.start + i])
                           : static_cast<const float*>(t.g)[c.start + i];
    step_element(*pe, ge, *me, *ve, s, IeeeSqrt());
    if constexpr (kBf16) {
      const float4 f{*pe, 0.f, 0.f, 0.f};
      t.p16[c.start + i] = to_bf16x4(f).e[0];
    }
  }
}

template <bool kBf16>
__global__ void __launch_bounds__(kThreads) adamw_kernel(const TensorPtrs* __restrict__ tensors,
                                                         const Chunk* __restrict__ chunks, Hyper h,
                                                         StepState* state) {
  // Every thread reads the scalars before its block takes its ticket (the barrier orders them).
  const volatile StepScalars* next = &state->next;
  const StepScalars s{next->decay,           next->beta1, next->one_minus_beta1, next->beta2,
                      next->one_minus_beta2, next->eps,   next->step_size,       next->inv_sqrt_bc2};
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();
    if (atomicAdd(&state->arrived, 1u) == gridDim.x - 1) {  // every block has read them: advance
      const std::int64_t taken = state->step + 1;
      state->step = taken;
      state->next = scalars_for(h, taken + 1);
      state->arrived = 0;
    }
  }
  const Chunk c = chunks[blockIdx.x];
  chunk_body<kBf16>(tensors[c.tensor], c, threadIdx.x, blockDim.x, s);
}

std::vector<TensorPtrs> tensor_table(const Shape& s, const Layout& l, float* p, const void* g, float* m, float* v,
                                     std::uint16_t* p16) {
  std::vector<TensorPtrs> t;
  const std::size_t gsize = dtype_size(s.dtype);
  for (std::size_t i = 0; i < s.sizes.size(); ++i) {
    const std::size_t o = l.offset[i];
    t.push_back({p + o, static_cast<const std::byte*>(g) + o * gsize, m + o, v + o, p16 ? p16 + o : nullptr});
    // The vectors are aligned when every tensor starts on a 16-byte boundary (chunks start at
    // multiples of kChunk elements within it).
    for (const void* q : {static_cast<const void*>(t.back().p), t.back().g, static_cast<const void*>(t.back().m),
                          static_cast<const void*>(t.back().v), static_cast<const void*>(t.back().p16)})
      HOTOPS_CHECK(reinterpret_cast<std::uintptr_t>(q) % 16 == 0, "adamw: a tensor is not 16-byte aligned");
  }
  return t;
}

template <class T>
gpu::DeviceBuffer upload_table(const std::vector<T>& table) {
  gpu::DeviceBuffer d(table.size() * sizeof(T));
  HOTOPS_CHECK_CUDA(cudaMemcpyAsync(d.get(), table.data(), d.bytes(), cudaMemcpyHostToDevice, gpu::stream()));
  HOTOPS_CHECK_CUDA(cudaStreamSynchronize(gpu::stream()));
  return d;
}

class CudaAdamw final : public Case {
 public:
  explicit CudaAdamw(const Problem& p)
      : s_(shape_of(p)), layout_(layout_of(s_.sizes)), st_(make_state(s_, layout_)), seed_(p.seed()) {
    const std::vector<Chunk> chunks = chunks_of(s_.sizes);
    HOTOPS_CHECK(chunks.size() < (std::size_t{1} << 31), "adamw: too many chunks for one grid");
    blocks_ = static_cast<unsigned>(chunks.size());
    restore(s_, st_, seed_);
    p_ = gpu::DeviceBuffer(st_.p);
    g_ = gpu::DeviceBuffer(st_.g);
    m_ = gpu::DeviceBuffer(st_.m);
    v_ = gpu::DeviceBuffer(st_.v);
    const bool bf16 = s_.dtype == DType::bf16;
    if (bf16) p16_ = gpu::DeviceBuffer(st_.p16);
    tensors_ = upload_table(tensor_table(s_, layout_, p_.as<float>(), g_.get(), m_.as<float>(), v_.as<float>(),
                                         bf16 ? p16_.as<std::uint16_t>() : nullptr));
    chunks_ = upload_table(chunks);
    state_ = gpu::DeviceBuffer(sizeof(StepState));
    reset_step();
    HOTOPS_CHECK_CUDA(cudaStreamSynchronize(gpu::stream()));
  }

  void run() override {
    const auto* t = tensors_.as<const TensorPtrs>();
    const auto* c = chunks_.as<const Chunk>();
    auto* st = state_.as<StepState>();
    if (s_.dtype == DType::bf16)
      adamw_kernel<true><<<blocks_, kThreads, 0, gpu::stream()>>>(t, c, s_.hyper, st);
    else
      adamw_kernel<false><<<blocks_, kThreads, 0, gpu::stream()>>>(t, c, s_.hyper, st);
    HOTOPS_CHECK_LAUNCH();
  }

  Check verify() override {
    restore(s_, st_, seed_);
    const Snapshot snap = snapshot(s_, layout_, st_, seed_);
    p_.upload(st_.p);
    g_.upload(st_.g);
    m_.upload(st_.m);
    v_.upload(st_.v);
    if (s_.dtype == DType::bf16) p16_.poison();
    reset_step();
    for (int i = 0; i < kVerifySteps; ++i) run();
    p_.download(st_.p);
    m_.download(st_.m);
    v_.download(st_.v);
    if (s_.dtype == DType::bf16) p16_.download(st_.p16);
    StepState after{};
    HOTOPS_CHECK_CUDA(cudaMemcpyAsync(&after, state_.get(), sizeof after, cudaMemcpyDeviceToHost, gpu::stream()));
    HOTOPS_CHECK_CUDA(cudaStreamSynchronize(gpu::stream()));
    Check c = check(s_, snap, st_, kVerifySteps);
    if (after.step != kVerifySteps) {
      Check bad;
      bad.ok = false;
      bad.message = "the device step count is " + std::to_string(after.step) + " after " +
                    std::to_string(kVerifySteps) + " runs";
      c.merge(bad, "step");
    }
    return c;
  }

  std::string label() const override {
    return "hotops multi-tensor adamw, " + describe(s_) + ", 1 launch: adamw_kernel<" + dtype_name(s_.dtype) +
           "> grid " + std::to_string(blocks_) + "x" + std::to_string(kThreads) + " over chunks of <= " +
           std::to_string(kChunk) + ", 16-byte vectors, " + std::to_string(kVecs) +
           " per stream in flight per thread, step count on the device";
  }

 private:
  // Step count 0, the scalars of step 1 next; on the stream, before the runs it is for.
  void reset_step() {
    reset_ = StepState{0, 0, 0, scalars_for(s_.hyper, 1)};
    HOTOPS_CHECK_CUDA(cudaMemcpyAsync(state_.get(), &reset_, sizeof reset_, cudaMemcpyHostToDevice, gpu::stream()));
  }

  Shape s_;
  Layout layout_;
  State st_;
  std::uint64_t seed_;
  unsigned blocks_ = 1;
  gpu::DeviceBuffer p_, g_, m_, v_, p16_, tensors_, chunks_, state_;
  StepState reset_{};  // the source of reset_step's copy, alive until it is done
};

}  // namespace

std::unique_ptr<Case> make_cuda(const Problem& p) { return std::make_unique<CudaAdamw>(p); }

void run_cuda_kernel_on_host(const Shape& s, State& st, std::int64_t t) {
  const Layout l = layout_of(s.sizes);
  const bool bf16 = s.dtype == DType::bf16;
  const std::vector<TensorPtrs> tensors =
      tensor_table(s, l, st.p.as<float>(), st.g.data(), st.m.as<float>(), st.v.as<float>(),
                   bf16 ? st.p16.as<std::uint16_t>() : nullptr);
  const StepScalars sc = scalars_for(s.hyper, t);
  for (const Chunk& c : chunks_of(s.sizes))
    for (unsigned tid = 0; tid < kThreads; ++tid) {
      if (bf16) chunk_body<true>(tensors[static_cast<std::size_t>(c.tensor)], c, tid, kThreads, sc);
      else chunk_body<false>(tensors[static_cast<std::size_t>(c.tensor)], c, tid, kThreads, sc);
    }
}

}  // namespace hotops::adamw
