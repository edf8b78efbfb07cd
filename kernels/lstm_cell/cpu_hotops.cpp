// lstm_cell on the CPU, hand-written over oneDNN: one oneDNN matmul for the gates of [x, h] and the
// concatenated W, then one OpenMP pointwise pass; bwd is one pointwise pass (dgates, dc and db) then
// two matmuls, d[x, h] = dgates . W and dW = dgates^T . [x, h]. The f32 pre-activation gates (no
// bias) that the fwd matmul writes are the state fwd saves for bwd. The pointwise loops are
// compiled three times (target_clones, as gelu's loop: x86-64-v4, x86-64-v3, baseline) and are
// branch-free, with their own exp, so that GCC vectorises them; math in f32.
#include <algorithm>
#include <array>
#include <utility>
#include <vector>
#include <cstring>

#include "hotops/check.h"
#include "hotops/cpu.h"
#include "hotops/cpu_vector.h"
#include "kernels/lstm_cell/cpu_gate_math.h"
#include "kernels/lstm_cell/lstm_cell.h"

namespace hotops::lstm_cell {
namespace kernel {

#define LSTM_INLINE HOTOPS_VECTOR_INLINE


// Storage <-> f32: f32 as is; bf16 as the high half, rounded to nearest even, NaN kept quiet.
using vec::load;
using vec::store;

using math::sigmoid;
using math::tanh_f32;

// The loops' pointers are __restrict__ (the family's outputs are never its inputs): without that
// promise GCC vectorised neither loop in any clone.

// fwd, one sample, columns [j0, j1): pre [4H] (f32, no bias) -> h', c'.
template <class T>
LSTM_INLINE void fwd_row(const float* __restrict__ pre, const T* __restrict__ bias, const T* __restrict__ c,
                         T* __restrict__ h_out, T* __restrict__ c_out, std::int64_t H, std::int64_t j0, std::int64_t j1) {
  for (std::int64_t j = j0; j < j1; ++j) {
    const float i = sigmoid(pre[j] + load(bias[j]));
    const float f = sigmoid(pre[H + j] + load(bias[H + j]));
    const float g = tanh_f32(pre[2 * H + j] + load(bias[2 * H + j]));
    const float o = sigmoid(pre[3 * H + j] + load(bias[3 * H + j]));
    const float cn = f * load(c[j]) + i * g;
    c_out[j] = store<T>(cn);
    h_out[j] = store<T>(o * tanh_f32(cn));
  }
}

// bwd, one sample, columns [j0, j1): the activations again from pre, then dgates [4H] (in T), dc,
// and the rounded dgates added to db's f32 accumulators (4 rows of kChunk, at j - j0).
template <class T>
LSTM_INLINE void bwd_row(const float* __restrict__ pre, const T* __restrict__ bias, const T* __restrict__ c,
                         const T* __restrict__ dh, const T* __restrict__ dc_in, T* __restrict__ dgates,
                         T* __restrict__ dc_out, float* __restrict__ db, std::int64_t db_stride, std::int64_t H,
                         std::int64_t j0, std::int64_t j1) {
  for (std::int64_t j = j0; j < j1; ++j) {
    const float i = sigmoid(pre[j] + load(bias[j]));
    const float f = sigmoid(pre[H + j] + load(bias[H + j]));
    const float g = tanh_f32(pre[2 * H + j] + load(bias[2 * H + j]));
    const float o = sigmoid(pre[3 * H + j] + load(bias[3 * H + j]));
    const float cv = load(c[j]), dhv = load(dh[j]);
    const float t = tanh_f32(f * cv + i * g);
    const float dct = load(dc_in[j]) + dhv * o * (1.f - t * t);
    const T di = store<T>(dct * g * i * (1.f - i)), df = store<T>(dct * cv * f * (1.f - f)),
            dg = store<T>(dct * i * (1.f - g * g)), d_o = store<T>(dhv * t * o * (1.f - o));
    dgates[j] = di, dgates[H + j] = df, dgates[2 * H + j] = dg, dgates[3 * H + j] = d_o;
    dc_out[j] = store<T>(dct * f);
  }
  // db in loops of their own: summed in the loop above, it kept GCC from vectorising it.
  for (std::int64_t q = 0; q < 4; ++q)
    for (std::int64_t j = j0; j < j1; ++j) db[q * db_stride + (j - j0)] += load(dgates[q * H + j]);
}

HOTOPS_CPU_CLONES void fwd_row_f32(const float* pre, const void* bias, const void* c, void* h, void* cn, std::int64_t H,
                                   std::int64_t j0, std::int64_t j1) {
  fwd_row(pre, static_cast<const float*>(bias), static_cast<const float*>(c), static_cast<float*>(h),
          static_cast<float*>(cn), H, j0, j1);
}
HOTOPS_CPU_CLONES void fwd_row_bf16(const float* pre, const void* bias, const void* c, void* h, void* cn, std::int64_t H,
                                    std::int64_t j0, std::int64_t j1) {
  using U = std::uint16_t;
  fwd_row(pre, static_cast<const U*>(bias), static_cast<const U*>(c), static_cast<U*>(h), static_cast<U*>(cn), H, j0,
          j1);
}
HOTOPS_CPU_CLONES void bwd_row_f32(const float* pre, const void* bias, const void* c, const void* dh, const void* dc,
                                   void* dgates, void* dc_out, float* db, std::int64_t db_stride, std::int64_t H,
                                   std::int64_t j0, std::int64_t j1) {
  bwd_row(pre, static_cast<const float*>(bias), static_cast<const float*>(c), static_cast<const float*>(dh),
          static_cast<const float*>(dc), static_cast<float*>(dgates), static_cast<float*>(dc_out), db, db_stride, H,
          j0, j1);
}
HOTOPS_CPU_CLONES void bwd_row_bf16(const float* pre, const void* bias, const void* c, const void* dh, const void* dc,
                                    void* dgates, void* dc_out, float* db, std::int64_t db_stride, std::int64_t H,
                                    std::int64_t j0, std::int64_t j1) {
  using U = std::uint16_t;
  bwd_row(pre, static_cast<const U*>(bias), static_cast<const U*>(c), static_cast<const U*>(dh),
          static_cast<const U*>(dc), static_cast<U*>(dgates), static_cast<U*>(dc_out), db, db_stride, H, j0, j1);
}

}  // namespace kernel

namespace {

using dnnl::memory;
using tag = memory::format_tag;

// Columns per pointwise work item: one 64-byte line of f32 per gate row; bwd also keeps db's
// accumulators of a chunk in registers / L1.
constexpr std::int64_t kChunk = 64;

// The matmuls of a direction (primitive descriptors only: building them is also the support probe).
struct Descriptors {
  dnnl::matmul::primitive_desc gates;  // pre[B, 4H] (f32) = xh[B, K] . W^T   (fwd; bwd makes its saved state)
  dnnl::matmul::primitive_desc dxh;    // dxh[B, K] = dgates[B, 4H] . W[4H, K]            (bwd)
  dnnl::matmul::primitive_desc dW;     // dW[4H, K] = dgates^T[4H, B] . xh[B, K]          (bwd)
};

Descriptors descriptors(const Shape& s) {
  const memory::dim B = s.B, K = s.K(), G = s.G();
  const memory::data_type t = cpu::dnnl_type(s.dtype);
  dnnl::engine& eng = cpu::engine();
  Descriptors p;
  const auto gates = HOTOPS_CHECK_DNNL(dnnl::matmul::desc(memory::desc({B, K}, t, tag::ab),
                                                          memory::desc({K, G}, t, memory::dims{1, K}),  // W^T
                                                          memory::desc({B, G}, memory::data_type::f32, tag::ab)));
  p.gates = HOTOPS_CHECK_DNNL(dnnl::matmul::primitive_desc(gates, eng));
  if (s.dir == Direction::bwd) {
    const auto dxh = HOTOPS_CHECK_DNNL(dnnl::matmul::desc(memory::desc({B, G}, t, tag::ab),
                                                          memory::desc({G, K}, t, tag::ab), memory::desc({B, K}, t, tag::ab)));
    p.dxh = HOTOPS_CHECK_DNNL(dnnl::matmul::primitive_desc(dxh, eng));
    const auto dW = HOTOPS_CHECK_DNNL(dnnl::matmul::desc(memory::desc({G, B}, t, memory::dims{1, G}),  // dgates^T
                                                         memory::desc({B, K}, t, tag::ab), memory::desc({G, K}, t, tag::ab)));
    p.dW = HOTOPS_CHECK_DNNL(dnnl::matmul::primitive_desc(dW, eng));
  }
  return p;
}

// Matmul operands: source, weights, destination.
std::vector<std::pair<int, memory::desc>> matmul_descs(const dnnl::matmul::primitive_desc& pd) {
  return {{DNNL_ARG_SRC, pd.src_desc()}, {DNNL_ARG_WEIGHTS, pd.weights_desc()}, {DNNL_ARG_DST, pd.dst_desc()}};
}

class HotopsCell final : public Plan {
 public:
  explicit HotopsCell(const Shape& s) : s_(s), d_(descriptors(s_)) {
    const auto B = static_cast<std::size_t>(s_.B), G = static_cast<std::size_t>(s_.G());
    pre_ = HostBuffer(DType::f32, B * G);
    gates_ = cpu::Primitive(dnnl::matmul(d_.gates), matmul_descs(d_.gates));
    if (s_.dir == Direction::bwd) {
      dgates_ = HostBuffer(s_.dtype, B * G);
      dxh_ = cpu::Primitive(dnnl::matmul(d_.dxh), matmul_descs(d_.dxh));
      dW_ = cpu::Primitive(dnnl::matmul(d_.dW), matmul_descs(d_.dW));
    }
  }

  // fwd: the step. bwd: the saved state, this implementation's fwd GEMM.
  void forward(const Args& a) override {
    gates_.run({a.xh, a.W, pre_.data()});
    if (s_.dir == Direction::fwd) {
      pointwise_fwd(a);
      return;
    }
    seen_ = {a.xh, a.W};
  }

  void run(const Args& a) override {
    if (s_.dir == Direction::fwd) return forward(a);
    if (seen_ != Seen{a.xh, a.W}) forward(a);
    pointwise_bwd(a);
    dxh_.run({dgates_.data(), a.W, a.dxh});
    dW_.run({dgates_.data(), a.xh, a.dW});
  }

  std::string label() const override {
    std::string l = "hotops: oneDNN matmul " + std::string(d_.gates.impl_info_str());
    if (s_.dir == Direction::bwd)
      l += " (dxh " + std::string(d_.dxh.impl_info_str()) + ", dW " + d_.dW.impl_info_str() + ")";
    return l + " + OpenMP pointwise loop (" + vec::clone_name() + "), x,h given as one [B, I+H], " +
           std::to_string(cpu::threads()) + " threads";
  }

 private:
  // The tensors of the last fwd GEMM: what pre holds.
  using Seen = std::array<const void*, 2>;

  void pointwise_fwd(const Args& a) {
    const std::int64_t B = s_.B, H = s_.H, G = s_.G(), chunks = (H + kChunk - 1) / kChunk;
    const bool bf16 = s_.dtype == DType::bf16;
    const std::size_t e = dtype_size(s_.dtype);
    const auto* pre = pre_.as<float>();
    const auto* c = static_cast<const std::byte*>(a.c);
    auto* h_out = static_cast<std::byte*>(a.h_new);
    auto* c_out = static_cast<std::byte*>(a.c_new);
    const std::int64_t items = B * chunks;
#pragma omp parallel for schedule(static) num_threads(cpu::threads()) if (items > 1)
    for (std::int64_t it = 0; it < items; ++it) {
      const std::int64_t b = it / chunks, j0 = (it % chunks) * kChunk, j1 = std::min(H, j0 + kChunk);
      const std::size_t at = static_cast<std::size_t>(b * H) * e;
      (bf16 ? kernel::fwd_row_bf16 : kernel::fwd_row_f32)(pre + b * G, a.b, c + at, h_out + at, c_out + at,
                                                            H, j0, j1);
    }
  }

  void pointwise_bwd(const Args& a) {
    const std::int64_t B = s_.B, H = s_.H, G = s_.G(), chunks = (H + kChunk - 1) / kChunk;
    const bool bf16 = s_.dtype == DType::bf16;
    const std::size_t e = dtype_size(s_.dtype);
    const auto* pre = pre_.as<float>();
    const auto* c = static_cast<const std::byte*>(a.c);
    const auto* dh = static_cast<const std::byte*>(a.dh_new);
    const auto* dc = static_cast<const std::byte*>(a.dc_new);
    auto* dgates = static_cast<std::byte*>(dgates_.data());
    auto* dc_out = static_cast<std::byte*>(a.dc);
    auto* db_out = static_cast<std::byte*>(a.db);
    // One chunk of columns per work item, every sample: db's columns belong to one thread each.
#pragma omp parallel for schedule(static) num_threads(cpu::threads()) if (chunks > 1)
    for (std::int64_t ch = 0; ch < chunks; ++ch) {
      const std::int64_t j0 = ch * kChunk, j1 = std::min(H, j0 + kChunk);
      float db[4 * kChunk] = {};
      for (std::int64_t b = 0; b < B; ++b) {
        const std::size_t at = static_cast<std::size_t>(b * H) * e;
        (bf16 ? kernel::bwd_row_bf16 : kernel::bwd_row_f32)(pre + b * G, a.b, c + at, dh + at, dc + at,
                                                              dgates + static_cast<std::size_t>(b * G) * e,
                                                              dc_out + at, db, kChunk, H, j0, j1);
      }
      for (std::int64_t q = 0; q < 4; ++q)
        for (std::int64_t j = j0; j < j1; ++j) {
          const float v = db[q * kChunk + (j - j0)];
          const std::size_t at = static_cast<std::size_t>(q * H + j);
          if (bf16)
            reinterpret_cast<std::uint16_t*>(db_out)[at] = vec::f32_to_bf16(v);
          else
            reinterpret_cast<float*>(db_out)[at] = v;
        }
    }
  }

  Shape s_;
  Descriptors d_;
  HostBuffer pre_, dgates_;  // the saved state (f32 pre-activation gates, no bias); bwd's dgates
  cpu::Primitive gates_, dxh_, dW_;
  Seen seen_{};
};

}  // namespace

std::string hotops_unsupported_reason(const Problem& p) {
  return cpu::onednn_unsupported_reason([&] { descriptors(shape_of(p)); },
                                        std::string(dtype_name(p.dtype)) + " matmul");
}

std::unique_ptr<Plan> make_cpu_hotops_plan(const Shape& s) { return std::make_unique<HotopsCell>(s); }

}  // namespace hotops::lstm_cell
