// model_bilstm on CUDA: cuDNN 9's RNN API for the BiLSTM, cublasLt for the dense head, the loss family's
// cross_entropy_dbias plan for its loss, CUB's radix sort
// for the embedding gradient; the step op by op, and its bf16 form:
// docs/models.md, "How each model step runs".
#include <cub/device/device_radix_sort.cuh>

#include <algorithm>
#include <cstring>
#include <memory>
#include <type_traits>
#include <string>
#include <vector>

#include "hotops/cublaslt_gemm.h"
#include "hotops/cuda_util.h"
#include "hotops/trace.h"
#include "kernels/lstm/lstm.h"
#include "kernels/model_bilstm/model_bilstm.h"
#include "kernels/models/cuda_step.cuh"

namespace hotops::model_bilstm {
namespace {

using models::cast_params;
using models::narrow;
using models::widen;
using models::kMaxClasses;
using models::StepState;
using gpu::warp_sum;
constexpr unsigned kWarpsPerBlock = 8;

// x[t, b, :] = embed[tokens[b, t], :] over n = t * B + b (T: x's storage, float or __nv_bfloat16,
// rounded), 4 elements at a time when kVec == 4 (E % 4 == 0); for train also keys[n] = tokens[b, t],
// positions[n] = n (the radix sort's input).
template <int kVec, class T>
__global__ void gather(const float* __restrict__ embed, const std::int32_t* __restrict__ tokens, T* __restrict__ x,
                       std::int32_t* __restrict__ keys, std::int32_t* __restrict__ positions, int T_, int B, int E) {
  const int per_row = E / kVec;
  const std::int64_t total = static_cast<std::int64_t>(T_) * B * per_row;
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t n = i / per_row;
    const int e = static_cast<int>(i % per_row);
    const int t = static_cast<int>(n / B), b = static_cast<int>(n % B);
    const std::int32_t v = tokens[static_cast<std::int64_t>(b) * T_ + t];
    const std::int64_t from = static_cast<std::int64_t>(v) * per_row + e, to = n * per_row + e;
    if constexpr (kVec == 1) {
      x[to] = narrow<T>(embed[from]);
    } else if constexpr (std::is_same<T, float>::value) {
      reinterpret_cast<float4*>(x)[to] = reinterpret_cast<const float4*>(embed)[from];
    } else {
      const float4 r = reinterpret_cast<const float4*>(embed)[from];
      __nv_bfloat162* out = reinterpret_cast<__nv_bfloat162*>(x) + 2 * to;
      out[0] = __floats2bfloat162_rn(r.x, r.y);
      out[1] = __floats2bfloat162_rn(r.z, r.w);
    }
    if (keys && e == 0) keys[n] = v, positions[n] = static_cast<std::int32_t>(n);
  }
}

// Elements [4 i, 4 i + 4) of p, widened to f32.
__device__ inline float4 load4(const float* p, std::int64_t i) { return reinterpret_cast<const float4*>(p)[i]; }
__device__ inline float4 load4(const __nv_bfloat16* p, std::int64_t i) {
  const __nv_bfloat162* q = reinterpret_cast<const __nv_bfloat162*>(p) + 2 * i;
  const float2 a = __bfloat1622float2(q[0]), b = __bfloat1622float2(q[1]);
  return make_float4(a.x, a.y, b.x, b.y);
}

// logits[b, c] = bias[c]: the start the two GEMMs add to.
__global__ void bias_rows(float* __restrict__ logits, const float* __restrict__ bias, int B, int C) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < B * C; i += gridDim.x * blockDim.x) logits[i] = bias[i % C];
}

// dE[token] = sum of dx[position] over the token's run in the sorted pairs, in position order (the
// sort is stable), summed in f32 (T: dx's storage). One warp per sorted index; only the warp at the
// start of a run works. dE rows of tokens absent from the batch were zeroed before.
template <int kVec, class T>
__global__ void embedding_grad(const std::int32_t* __restrict__ keys, const std::int32_t* __restrict__ positions,
                               const T* __restrict__ dx, float* __restrict__ dE, int N, int E) {
  const int i = blockIdx.x * kWarpsPerBlock + threadIdx.x / 32, lane = threadIdx.x % 32;
  if (i >= N) return;
  const std::int32_t v = keys[i];
  if (i > 0 && keys[i - 1] == v) return;
  const int per_row = E / kVec;
  for (int e = lane; e < per_row; e += 32) {
    if constexpr (kVec == 4) {
      float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
      for (int j = i; j < N && keys[j] == v; ++j) {
        const float4 g = load4(dx, static_cast<std::int64_t>(positions[j]) * per_row + e);
        acc.x += g.x, acc.y += g.y, acc.z += g.z, acc.w += g.w;
      }
      reinterpret_cast<float4*>(dE)[static_cast<std::int64_t>(v) * per_row + e] = acc;
    } else {
      float acc = 0.f;
      for (int j = i; j < N && keys[j] == v; ++j) acc += widen(dx[static_cast<std::int64_t>(positions[j]) * E + e]);
      dE[static_cast<std::int64_t>(v) * E + e] = acc;
    }
  }
}

// bf16: logits[b, c] = bf16(bias[c] + sum_k feat[b, k] W[k, c]), feat[b, k] = hT[k / H, b, k % H];
// bf16 operands, f32 accumulation, one rounding. One warp per sample, C <= kMaxClasses.
__global__ void dense_head_bf16(const __nv_bfloat16* __restrict__ hT, const __nv_bfloat16* __restrict__ W,
                                const __nv_bfloat16* __restrict__ bias, __nv_bfloat16* __restrict__ logits, int B, int H,
                                int C) {
  const int b = blockIdx.x * kWarpsPerBlock + threadIdx.x / 32, lane = threadIdx.x % 32;
  if (b >= B) return;
  float acc[kMaxClasses];
#pragma unroll
  for (int c = 0; c < kMaxClasses; ++c) acc[c] = 0.f;
  for (int k = lane; k < 2 * H; k += 32) {
    const float f = __bfloat162float(hT[(static_cast<std::int64_t>(k / H) * B + b) * H + k % H]);
#pragma unroll
    for (int c = 0; c < kMaxClasses; ++c)
      if (c < C) acc[c] += f * __bfloat162float(W[static_cast<std::int64_t>(k) * C + c]);
  }
#pragma unroll
  for (int c = 0; c < kMaxClasses; ++c) acc[c] = warp_sum(acc[c]);
  if (lane == 0)
    for (int c = 0; c < C; ++c)
      logits[static_cast<std::int64_t>(b) * C + c] = __float2bfloat16_rn(acc[c] + __bfloat162float(bias[c]));
}

// bf16: the dense layer's backward, bf16 operands with f32 accumulation, over 2H*C + B*2H outputs:
// dW[k, c] = sum_b feat[b, k] dz[b, c] (f32, into the gradients), dhT[k / H, b, k % H] =
// bf16(sum_c dz[b, c] W[k, c]).
__global__ void dense_bwd_bf16(const __nv_bfloat16* __restrict__ hT, const __nv_bfloat16* __restrict__ W,
                               const __nv_bfloat16* __restrict__ dz, float* __restrict__ dW,
                               __nv_bfloat16* __restrict__ dhT, int B, int H, int C) {
  const std::int64_t nw = static_cast<std::int64_t>(2) * H * C, total = nw + static_cast<std::int64_t>(B) * 2 * H;
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    if (i < nw) {
      const int k = static_cast<int>(i / C), c = static_cast<int>(i % C);
      const __nv_bfloat16* f = hT + static_cast<std::int64_t>(k / H) * B * H + k % H;
      float s = 0.f;
      for (int b = 0; b < B; ++b)
        s += __bfloat162float(f[static_cast<std::int64_t>(b) * H]) * __bfloat162float(dz[static_cast<std::int64_t>(b) * C + c]);
      dW[i] = s;
    } else {
      const std::int64_t j = i - nw;
      const int b = static_cast<int>(j / (2 * H)), k = static_cast<int>(j % (2 * H));
      float s = 0.f;
      for (int c = 0; c < C; ++c)
        s += __bfloat162float(dz[static_cast<std::int64_t>(b) * C + c]) * __bfloat162float(W[static_cast<std::int64_t>(k) * C + c]);
      dhT[(static_cast<std::int64_t>(k / H) * B + b) * H + k % H] = __float2bfloat16_rn(s);
    }
  }
}

// bf16: g = the bf16 dweights, widened (exact), n elements.
__global__ void widen_grads(const __nv_bfloat16* __restrict__ low, float* __restrict__ g, std::int64_t n) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x)
    g[i] = __bfloat162float(low[i]);
}

// D (m x n) = op(A) . op(B) + beta D, f32, column-major, packed (gpu::LtGemm: the heuristic's
// first algorithm, chosen at setup).
std::unique_ptr<gpu::BoundGemm> gemm(cublasOperation_t opa, cublasOperation_t opb, std::int64_t m, std::int64_t n,
                                     std::int64_t k, const float* A, const float* B, float* D, float beta) {
  gpu::GemmDesc d;
  d.opa = opa, d.opb = opb, d.m = m, d.n = n, d.k = k, d.beta = beta;
  return std::make_unique<gpu::BoundGemm>(d, "model_bilstm", A, B, D);
}

int dim(std::int64_t v) {
  HOTOPS_CHECK(v <= 0x7fffffff, "model_bilstm: a dimension does not fit an int");
  return static_cast<int>(v);
}

std::size_t aligned(std::size_t n) { return (n + kAlignFloats - 1) / kAlignFloats * kAlignFloats; }

unsigned blocks_for(std::int64_t work, unsigned threads, std::int64_t cap = 4096) {
  return static_cast<unsigned>(std::max<std::int64_t>(1, std::min<std::int64_t>((work + threads - 1) / threads, cap)));
}

class CudaBilstm final : public ModelCase {
 public:
  explicit CudaBilstm(const Problem& p)
      : s_(shape_of(p)), c_(s_.cfg), l_(layout_of(c_)), st_(make_state(s_, l_, models::step_seed(p))), es_(s_.bf16() ? 2 : 4) {
    HOTOPS_CHECK(c_.C <= kMaxClasses, "model_bilstm: the CUDA loss kernel takes at most 16 classes");
    const std::int64_t Tn = c_.T, B = s_.batch, E = c_.E, H = c_.H, C = c_.C, N = Tn * B;
    HOTOPS_CHECK(N * std::max(E, 2 * H) < (std::int64_t{1} << 31), "model_bilstm: batch too large");
    // The BiLSTM as kernels/lstm's problem (bf16: bf16 data on tensor ops with f32 compute, the
    // lstm entries' math): the plan's cuDNN descriptors and algorithm, and where its weight space
    // keeps PyTorch's tensors (the f32 masters mirror the space element for element).
    lstm::Shape ls;
    ls.dir = s_.train() ? Direction::bwd : Direction::fwd;
    ls.dtype = s_.dtype;
    ls.T = Tn, ls.B = B, ls.I = E, ls.H = H;
    ls.bidirectional = true;
    rnn_ = lstm::make_cuda_plan(ls);
    {
      const std::unique_ptr<lstm::Layout> layout = lstm::make_cuda_layout(ls);
      w_bytes_ = layout->weight_bytes();
      positions_ = layout->positions();
    }
    // The device layout: embed | cuDNN weight space (its elements, as f32 masters for bf16) | dense W | dense b.
    w_elems_ = w_bytes_ / es_;
    embed_ = 0;
    lstm_ = aligned(static_cast<std::size_t>(c_.V * E));
    dense_w_ = lstm_ + aligned(w_elems_);
    dense_b_ = dense_w_ + aligned(static_cast<std::size_t>(2 * H * C));
    total_ = dense_b_ + aligned(static_cast<std::size_t>(C));
    params_ = gpu::DeviceBuffer(total_ * sizeof(float));
    HOTOPS_CHECK_CUDA(cudaMemsetAsync(params_.get(), 0, params_.bytes(), gpu::stream()));
    if (s_.bf16()) {  // the step's bf16 copy of [lstm_, total_): the weight space, dense W and b
      low_ = gpu::DeviceBuffer((total_ - lstm_) * sizeof(__nv_bfloat16));
      HOTOPS_CHECK_CUDA(cudaMemsetAsync(low_.get(), 0, low_.bytes(), gpu::stream()));
    }
    params_.upload(to_device(st_.params));

    tokens_ = gpu::DeviceBuffer(st_.tokens.size() * sizeof(std::int32_t));
    labels_ = gpu::DeviceBuffer(st_.labels.size() * sizeof(std::int32_t));
    upload_batch();
    x_ = gpu::DeviceBuffer(static_cast<std::size_t>(N * E) * es_);
    y_ = gpu::DeviceBuffer(static_cast<std::size_t>(N * 2 * H) * es_);
    hT_ = gpu::DeviceBuffer(static_cast<std::size_t>(2 * B * H) * es_);
    logits_ = gpu::DeviceBuffer(static_cast<std::size_t>(B * C) * es_);
    if (!s_.bf16())
      for (int d = 0; d < 2; ++d)  // logits^T [C, B] += W_d^T [C, H] . hT_d^T [H, B]
        fwd_.push_back(gemm(CUBLAS_OP_N, CUBLAS_OP_N, C, B, H, param(dense_w_) + d * H * C,
                            hT_.as<float>() + d * B * H, logits_.as<float>(), 1.f));
    if (s_.train()) {
      const std::size_t pbytes = total_ * sizeof(float);
      grads_ = gpu::DeviceBuffer(pbytes);
      m_ = gpu::DeviceBuffer(pbytes);
      v_ = gpu::DeviceBuffer(pbytes);
      HOTOPS_CHECK_CUDA(cudaMemsetAsync(grads_.get(), 0, pbytes, gpu::stream()));  // the padding stays zero
      loss_ = gpu::DeviceBuffer(sizeof(float));
      state_ = gpu::DeviceBuffer(sizeof(StepState));
      dlogits_ = gpu::DeviceBuffer(logits_.bytes());
      dhT_ = gpu::DeviceBuffer(hT_.bytes());
      dy_ = gpu::DeviceBuffer(y_.bytes());
      HOTOPS_CHECK_CUDA(cudaMemsetAsync(dy_.get(), 0, dy_.bytes(), gpu::stream()));  // only hT feeds the head
      dx_ = gpu::DeviceBuffer(x_.bytes());
      if (s_.bf16()) dw_low_ = gpu::DeviceBuffer(w_bytes_);
      lstm_args_.dy = dy_.get(), lstm_args_.dhT = dhT_.get(), lstm_args_.dx = dx_.get();
      lstm_args_.dweights = s_.bf16() ? dw_low_.get() : static_cast<void*>(grads_.as<float>() + lstm_);
      const std::size_t pairs = static_cast<std::size_t>(N) * sizeof(std::int32_t);
      keys_in_ = gpu::DeviceBuffer(pairs), keys_out_ = gpu::DeviceBuffer(pairs);
      pos_in_ = gpu::DeviceBuffer(pairs), pos_out_ = gpu::DeviceBuffer(pairs);
      while ((std::int64_t{1} << key_bits_) < c_.V) ++key_bits_;
      HOTOPS_CHECK_CUDA(cub::DeviceRadixSort::SortPairs(nullptr, sort_bytes_, keys_in_.as<std::int32_t>(),
                                                        keys_out_.as<std::int32_t>(), pos_in_.as<std::int32_t>(),
                                                        pos_out_.as<std::int32_t>(), static_cast<int>(N), 0, key_bits_,
                                                        gpu::stream()));
      sort_temp_ = gpu::DeviceBuffer(std::max<std::size_t>(sort_bytes_, 16));
      for (int d = 0; d < 2 && !s_.bf16(); ++d) {
        // dW_d^T [C, H] = dlogits^T [C, B] . hT_d [B, H]
        wgrad_.push_back(gemm(CUBLAS_OP_N, CUBLAS_OP_T, C, H, B, dlogits_.as<float>(),
                                                hT_.as<float>() + d * B * H, grads_.as<float>() + dense_w_ + d * H * C, 0.f));
        // dhT_d^T [H, B] = W_d [H, C] . dlogits^T [C, B]
        dgrad_.push_back(gemm(CUBLAS_OP_T, CUBLAS_OP_N, H, B, C, param(dense_w_) + d * H * C,
                                                dlogits_.as<float>(), dhT_.as<float>() + d * B * H, 0.f));
      }
      xent_ = loss::make_cuda_plan(loss::dbias_shape(s_.dtype, B, C));
      restart_optimizer();
    }
    // Zero initial states (h0, c0 null), cT not kept; dy zero, dcT null (zero), dh0 and dc0 not asked for.
    lstm_args_.x = x_.get(), lstm_args_.weights = weights(), lstm_args_.y = y_.get(), lstm_args_.hT = hT_.get();
    if (s_.variant == Variant::e2e && !s_.train()) logits_host_ = HostBuffer(s_.dtype, static_cast<std::size_t>(B * C));
    gpu::cublaslt();
    gpu::cublas_workspace();
    // One step outside any capture first, so that whatever the libraries set up lazily on a first call
    // exists before a capture; then back to the seeded start.
    device_step();
    HOTOPS_CHECK_CUDA(cudaStreamSynchronize(gpu::stream()));
    params_.upload(to_device(st_.params));
    if (s_.train()) restart_optimizer();
    HOTOPS_CHECK_CUDA(cudaStreamSynchronize(gpu::stream()));
    if (s_.variant == Variant::graph) {
      std::string why;
      if (!graph_.capture([this] { device_step(); }, &why))
        throw Error("model_bilstm: the step could not be captured into a CUDA graph (cuDNN RNN calls): " + why,
                    ErrorKind::unsupported);
    } else if (s_.variant == Variant::plain) {
      // Whether the harness may put the plain step into its graphs (cuDNN does not document capture
      // of its RNN calls): tried once, the trial graph dropped. bf16 keeps it and replays it (see
      // replays()): cuDNN's bf16 RNN calls are host-bound.
      std::string why;
      capturable_ = graph_.capture([this] { device_step(); }, &why);
      if (!replays()) graph_.reset();
    }
    HOTOPS_CHECK_CUDA(cudaStreamSynchronize(gpu::stream()));
  }

  void run() override {
    // An instrumented pass runs the step eagerly, to see its ops.
    const bool eager = trace::active() != nullptr;
    if (s_.variant == Variant::plain) return replays() && !eager ? graph_.launch() : device_step();
    trace::op("copy_h2d");
    upload_batch();
    if (s_.variant == Variant::graph && !eager) graph_.launch();
    else device_step();
    trace::op("copy_d2h");
    if (s_.train())
      HOTOPS_CHECK_CUDA(cudaMemcpyAsync(&loss_host_, loss_.get(), sizeof(float), cudaMemcpyDeviceToHost, gpu::stream()));
    else
      HOTOPS_CHECK_CUDA(cudaMemcpyAsync(logits_host_.data(), logits_.get(), logits_host_.bytes(), cudaMemcpyDeviceToHost,
                                        gpu::stream()));
    HOTOPS_CHECK_CUDA(cudaStreamSynchronize(gpu::stream()));
  }

  Check verify() override {
    params_.upload(to_device(st_.params));
    logits_.poison();
    if (s_.train()) {
      restart_optimizer();
      // Poison the tensors, keep the padding zero.
      poison(grads_.as<float>() + embed_, c_.V * c_.E);
      poison(grads_.as<float>() + lstm_, static_cast<std::int64_t>(w_elems_));
      poison(grads_.as<float>() + dense_w_, 2 * c_.H * c_.C);
      poison(grads_.as<float>() + dense_b_, c_.C);
    }
    run();
    HOTOPS_CHECK_CUDA(cudaStreamSynchronize(gpu::stream()));
    Outcome o;
    if (!s_.train() || s_.bf16()) {  // bf16 train checks the step's logits too (model_bilstm.cpp)
      o.logits = HostBuffer(s_.dtype, static_cast<std::size_t>(s_.batch * c_.C));
      logits_.download(o.logits);
      if (!s_.train()) return verify_outcome(s_, l_, st_, o);
    }
    o.loss = static_cast<float>(last_loss());
    HostBuffer g(DType::f32, total_), p(DType::f32, total_);
    grads_.download(g);
    params_.download(p);
    o.grads = to_canonical(g);
    o.params = to_canonical(p);
    Check c = verify_outcome(s_, l_, st_, o);
    c.merge(adamw::check_device_step(state_.as<const StepState>(), 1), "step");
    return c;
  }

  std::string label() const override {
    if (s_.bf16()) return label_bf16();
    std::string l = std::string("cuDNN RNN ") + rnn_algo() + " bidirectional LSTM " +
                    (s_.train() ? "Forward TRAINING + BackwardData_v8 + BackwardWeights_v8" : "Forward INFERENCE") +
                    ", FMA math, double bias (kernels/lstm's plan); hotops gather; cublasLt f32 dense head (2 GEMMs";
    if (s_.train())
      l += " fwd, 4 bwd); cross_entropy_dbias plan, CUB stable radix sort + warp-per-token embedding grad, AdamW 1 launch";
    else
      l += ")";
    if (s_.variant == Variant::plain && !capturable_) l += "; not graph-capturable (capture failed at setup): launched one by one";
    if (s_.variant == Variant::e2e) l += "; e2e: pageable H2D of the tokens (and labels), launches, D2H, sync";
    if (s_.variant == Variant::graph) l += "; graph: pageable H2D of tokens and labels, 1 CUDA graph, D2H loss, sync";
    return l;
  }

  std::string label_bf16() const {
    std::string l = std::string("bf16 autocast (f32 master weights, hotops cast_params of the LSTM and dense weights each "
                                "step); cuDNN RNN ") +
                    rnn_algo() + " bidirectional LSTM " +
                    (s_.train() ? "Forward TRAINING + BackwardData_v8 + BackwardWeights_v8" : "Forward INFERENCE") +
                    ", bf16 data on tensor ops, f32 math precision (bf16 products are exact in f32), double "
                    "bias (kernels/lstm's plan); hotops gather to bf16; hotops bf16 dense head (f32 accumulation, bf16 logits)";
    if (s_.train())
      l += "; cross_entropy_dbias plan (f32 math, bf16 dlogits), hotops bf16 dense bwd (dW f32, dhT bf16), bf16 dweights "
           "widened, CUB stable radix sort + warp-per-token embedding grad (f32 sums), AdamW 1 launch";
    if (s_.variant == Variant::plain && !capturable_) l += "; not graph-capturable (capture failed at setup): launched one by one";
    if (replays())
      l += "; replayed as the CUDA graph captured at setup (cuDNN's bf16 RNN calls cost 5-14 ms of host time a step: "
           "e2e:1 shows it)";
    if (s_.variant == Variant::e2e) l += "; e2e: pageable H2D of the tokens (and labels), launches one by one (cuDNN's bf16 RNN calls are host-bound), D2H, sync";
    if (s_.variant == Variant::graph) l += "; graph: pageable H2D of tokens and labels, 1 CUDA graph, D2H loss, sync";
    return l;
  }

  // The harness may capture a plain f32 step into its graphs; a plain bf16 step already is one.
  bool capturable() const override { return s_.variant == Variant::plain && capturable_ && !replays(); }
  // Whether a plain step replays the graph captured at setup: bf16 does, where the capture worked.
  // cuDNN 9.14's bf16 RNN calls take 5-14 ms of host time per step on the H100 host, whatever the
  // algorithm, math type or states (tools/cudnn_rnn_bf16_probe.cu; f32's take under 0.4 ms), far more
  // than their GPU work: launched one by one, the device time would be the host's enqueueing. The
  // replayed graph is the same device work; e2e:1 still launches one by one and shows the host cost.
  bool replays() const { return s_.bf16() && s_.variant == Variant::plain && capturable_; }
  bool host_timed() const override { return s_.variant != Variant::plain; }

  double last_loss() override {
    HOTOPS_CHECK(s_.train(), "model_bilstm: an infer case has no loss");
    float l = 0;
    HOTOPS_CHECK_CUDA(cudaMemcpyAsync(&l, loss_.get(), sizeof l, cudaMemcpyDeviceToHost, gpu::stream()));
    HOTOPS_CHECK_CUDA(cudaStreamSynchronize(gpu::stream()));
    return l;
  }

 private:
  const float* param(std::size_t offset) const { return params_.as<float>() + offset; }
  // bf16: the step's copy of the master at `offset` (in [lstm_, total_)).
  __nv_bfloat16* low(std::size_t offset) const { return low_.as<__nv_bfloat16>() + (offset - lstm_); }
  // cuDNN's weight space: the f32 masters' LSTM region, or its bf16 copy.
  void* weights() const {
    return s_.bf16() ? static_cast<void*>(low(lstm_)) : static_cast<void*>(params_.as<float>() + lstm_);
  }

  static void poison(float* at, std::int64_t n) {
    HOTOPS_CHECK_CUDA(cudaMemsetAsync(at, 0xFF, static_cast<std::size_t>(n) * sizeof(float), gpu::stream()));
  }

  void upload_batch() {
    HOTOPS_CHECK_CUDA(cudaMemcpyAsync(tokens_.get(), st_.tokens.data(), tokens_.bytes(), cudaMemcpyHostToDevice, gpu::stream()));
    if (s_.train())
      HOTOPS_CHECK_CUDA(cudaMemcpyAsync(labels_.get(), st_.labels.data(), labels_.bytes(), cudaMemcpyHostToDevice, gpu::stream()));
  }

  void restart_optimizer() {
    HOTOPS_CHECK_CUDA(cudaMemsetAsync(m_.get(), 0, m_.bytes(), gpu::stream()));
    HOTOPS_CHECK_CUDA(cudaMemsetAsync(v_.get(), 0, v_.bytes(), gpu::stream()));
    HOTOPS_CHECK_CUDA(cudaMemsetAsync(state_.get(), 0, sizeof(StepState), gpu::stream()));  // no step taken: the loss plan advances it
  }

  // The algorithm the LSTM plan runs: its label names it ("cuDNN RNN <algo> LSTM ...").
  std::string rnn_algo() const {
    const std::string l = rnn_->label(), from = "cuDNN RNN ";
    const std::size_t at = l.find(from), end = l.find(" LSTM");
    return at == std::string::npos || end == std::string::npos ? "?" : l.substr(at + from.size(), end - at - from.size());
  }

  // Between the canonical flat layout (model_bilstm.h) and the device's, either way.
  void convert(HostBuffer& canonical, HostBuffer& device, bool to_dev) const {
    float* can = canonical.as<float>();
    float* dev = device.as<float>();
    const auto move = [&](std::size_t c_at, std::size_t d_at, std::size_t n) {
      if (to_dev) std::copy_n(can + c_at, n, dev + d_at);
      else std::copy_n(dev + d_at, n, can + c_at);
    };
    move(l_.embed, embed_, static_cast<std::size_t>(c_.V * c_.E));
    move(l_.dense_w, dense_w_, static_cast<std::size_t>(2 * c_.H * c_.C));
    move(l_.dense_b, dense_b_, static_cast<std::size_t>(c_.C));
    const std::pair<std::size_t, const std::vector<std::size_t>*> tensors[] = {
        {l_.w_ih, &positions_.w_ih}, {l_.w_hh, &positions_.w_hh}, {l_.b_ih, &positions_.b_ih}, {l_.b_hh, &positions_.b_hh}};
    for (const auto& [at, where] : tensors)
      for (std::size_t i = 0; i < where->size(); ++i) move(at + i, lstm_ + (*where)[i], 1);
  }
  HostBuffer to_device(const HostBuffer& canonical) const {
    HostBuffer dev(DType::f32, total_), can = canonical;
    std::fill_n(dev.as<float>(), total_, 0.f);
    convert(can, dev, true);
    return dev;
  }
  HostBuffer to_canonical(HostBuffer& device) const {
    HostBuffer can(DType::f32, l_.total);
    std::fill_n(can.as<float>(), l_.total, 0.f);
    convert(can, device, false);
    return can;
  }

  void device_step() {
    if (!s_.bf16()) return device_step_on<float>();
    const auto n4 = static_cast<std::int64_t>((total_ - lstm_) / 4);
    trace::op("cast");
    cast_params<<<blocks_for(n4, 256, 1024), 256, 0, gpu::stream()>>>(params_.as<const float4>() + lstm_ / 4,
                                                                      low_.as<__nv_bfloat162>(), n4);
    HOTOPS_CHECK_LAUNCH();
    device_step_on<__nv_bfloat16>();
  }

  // The step on activation storage T: float, or __nv_bfloat16 after the cast of the weights.
  template <class T>
  void device_step_on() {
    constexpr bool kBf16 = !std::is_same<T, float>::value;
    const std::int64_t Tn = c_.T, B = s_.batch, E = c_.E, H = c_.H, C = c_.C, N = Tn * B;
    cudaStream_t st = gpu::stream();
    std::int32_t* keys = s_.train() ? keys_in_.as<std::int32_t>() : nullptr;
    std::int32_t* pos = s_.train() ? pos_in_.as<std::int32_t>() : nullptr;
    trace::op("embedding");
    if (E % 4 == 0)
      gather<4, T><<<blocks_for(N * E / 4, 256), 256, 0, st>>>(param(embed_), tokens_.as<const std::int32_t>(), x_.as<T>(),
                                                               keys, pos, dim(Tn), dim(B), dim(E));
    else
      gather<1, T><<<blocks_for(N * E, 256), 256, 0, st>>>(param(embed_), tokens_.as<const std::int32_t>(), x_.as<T>(),
                                                           keys, pos, dim(Tn), dim(B), dim(E));
    HOTOPS_CHECK_LAUNCH();
    trace::op("lstm");
    if (s_.train()) rnn_->forward(lstm_args_);
    else rnn_->run(lstm_args_);
    trace::op("addmm");
    if constexpr (kBf16) {
      dense_head_bf16<<<static_cast<unsigned>((B + kWarpsPerBlock - 1) / kWarpsPerBlock), 32 * kWarpsPerBlock, 0, st>>>(
          hT_.as<const __nv_bfloat16>(), low(dense_w_), low(dense_b_), logits_.as<__nv_bfloat16>(), dim(B), dim(H), dim(C));
      HOTOPS_CHECK_LAUNCH();
    } else {
      bias_rows<<<blocks_for(B * C, 256, 64), 256, 0, st>>>(logits_.as<float>(), param(dense_b_), dim(B), dim(C));
      HOTOPS_CHECK_LAUNCH();
      for (const auto& g : fwd_) g->run();
    }
    if (!s_.train()) return;

    trace::op("cross_entropy");
    loss::Args xa;
    xa.logits = logits_.get(), xa.labels = labels_.as<const std::int32_t>(), xa.dlogits = dlogits_.get();
    xa.loss = loss_.get(), xa.db = grads_.as<float>() + dense_b_;
    xa.advance = state_.as<StepState>(), xa.hyper = &hyper_;
    xent_->run(xa);
    trace::op("mm");
    if constexpr (kBf16) {
      dense_bwd_bf16<<<blocks_for(2 * H * C + B * 2 * H, 256, 1024), 256, 0, st>>>(
          hT_.as<const __nv_bfloat16>(), low(dense_w_), dlogits_.as<const __nv_bfloat16>(), grads_.as<float>() + dense_w_,
          dhT_.as<__nv_bfloat16>(), dim(B), dim(H), dim(C));
      HOTOPS_CHECK_LAUNCH();
    } else {
      for (const auto& g : wgrad_) g->run();
      for (const auto& g : dgrad_) g->run();
    }

    trace::op("lstm_bwd");  // the dweights zeroed, BackwardData, BackwardWeights (ADD)
    rnn_->run(lstm_args_);
    if constexpr (kBf16) {
      const auto n = static_cast<std::int64_t>(w_elems_);
      widen_grads<<<blocks_for(n, 256, 1024), 256, 0, st>>>(dw_low_.as<const __nv_bfloat16>(), grads_.as<float>() + lstm_, n);
      HOTOPS_CHECK_LAUNCH();
    }

    trace::op("embedding_bwd");
    float* dE = grads_.as<float>() + embed_;
    HOTOPS_CHECK_CUDA(cudaMemsetAsync(dE, 0, static_cast<std::size_t>(c_.V * E) * sizeof(float), st));
    std::size_t sort_bytes = sort_bytes_;
    HOTOPS_CHECK_CUDA(cub::DeviceRadixSort::SortPairs(sort_temp_.get(), sort_bytes, keys_in_.as<std::int32_t>(),
                                                      keys_out_.as<std::int32_t>(), pos_in_.as<std::int32_t>(),
                                                      pos_out_.as<std::int32_t>(), dim(N), 0, key_bits_, st));
    const unsigned grad_blocks = static_cast<unsigned>((N + kWarpsPerBlock - 1) / kWarpsPerBlock);
    if (E % 4 == 0)
      embedding_grad<4, T><<<grad_blocks, 32 * kWarpsPerBlock, 0, st>>>(keys_out_.as<const std::int32_t>(), pos_out_.as<const std::int32_t>(),
                                                                        dx_.as<const T>(), dE, dim(N), dim(E));
    else
      embedding_grad<1, T><<<grad_blocks, 32 * kWarpsPerBlock, 0, st>>>(keys_out_.as<const std::int32_t>(), pos_out_.as<const std::int32_t>(),
                                                                        dx_.as<const T>(), dE, dim(N), dim(E));
    HOTOPS_CHECK_LAUNCH();

    trace::op("adamw");
    adamw::cuda_step(params_.as<float>(), grads_.as<const float>(), m_.as<float>(), v_.as<float>(),
                     static_cast<std::int64_t>(total_), state_.as<StepState>(), nullptr, st);
  }

  Shape s_;
  Config c_;
  Layout l_;  // the canonical layout
  State st_;  // the seeded start, and the batch in pageable host memory for the e2e variants
  std::size_t es_;  // the LSTM's data element size: 4 (f32) or 2 (bf16)
  std::size_t embed_ = 0, lstm_ = 0, dense_w_ = 0, dense_b_ = 0, total_ = 0;  // the device layout, floats
  std::size_t w_elems_ = 0;  // cuDNN's weight space, in elements
  std::unique_ptr<lstm::Plan> rnn_;  // the BiLSTM on cuDNN's weight space (the masters' LSTM region)
  lstm::Args lstm_args_;
  lstm::Layout::Positions positions_;  // PyTorch's LSTM tensors in that space, for the conversions
  std::size_t w_bytes_ = 0, sort_bytes_ = 0;
  int key_bits_ = 1;
  gpu::DeviceBuffer params_, grads_, m_, v_, tokens_, labels_, x_, y_, hT_, logits_;
  gpu::DeviceBuffer loss_, state_, dlogits_, dhT_, dy_, dx_, keys_in_, keys_out_, pos_in_, pos_out_, sort_temp_;
  gpu::DeviceBuffer low_, dw_low_;  // bf16: the step's copy of the weights, cuDNN's bf16 dweights
  std::vector<std::unique_ptr<gpu::BoundGemm>> fwd_, wgrad_, dgrad_;
  std::unique_ptr<loss::Plan> xent_;                          // train: the head's loss and gradients
  adamw::Hyper hyper_ = models::hyper();                      // AdamW's, as the loss plan advances the step count
  HostBuffer logits_host_;
  float loss_host_ = 0;
  bool capturable_ = false;
  gpu::StepGraph graph_;  // graph:1
};

}  // namespace

std::unique_ptr<ModelCase> make_cuda(const Problem& p) { return std::make_unique<CudaBilstm>(p); }

}  // namespace hotops::model_bilstm
