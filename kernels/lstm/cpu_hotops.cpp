// lstm on the CPU, bf16: hotops' own layer, built from matmul plans and the cell's loops. oneDNN
// 2.6's bf16 LSTM was slower than its f32 one on the GPU host's Xeon (docs/models.md), and on CPUs
// with AVX-512 BF16 but no AMX it has no bf16 backward at some shapes.
//
// Forward: the input projections of every step and both directions as one GEMM, x [T*B, I] against
// W_ih [D*4H, I] (bf16, f32 sums and output); then step by step, each direction's recurrent product
// h_{t-1} [B, H] against its W_hh [4H, H] (a GEMM each), and the cells of both directions' samples
// in one pass of loops compiled per x86-64 level, which add both biases, keep c in f32 and round h
// to bf16 (the next step's GEMM reads it). Backward: the cells' backward step by step (the gate
// gradients rounded to bf16, the bias gradient summed in f32 from them), each direction's dh_{t-1}
// as a GEMM of them against W_hh; then dx, dW_ih and each direction's dW_hh as one GEMM each over
// every step.
//
// Weight space: PyTorch's W_ih | W_hh | b_ih | b_hh in bf16 (the CUDA kernels' layout); gradient
// space the same in f32, and dy, dhT, dcT, dx, dh0, dc0 in f32, as oneDNN's bf16 backward gives them.
#include <algorithm>
#include <array>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "hotops/check.h"
#include "hotops/cpu.h"
#include "hotops/cpu_vector.h"
#include "kernels/lstm/lstm.h"
#include "kernels/lstm_cell/cpu_gate_math.h"
#include "kernels/matmul/matmul.h"

namespace hotops::lstm {

using bf16 = std::uint16_t;

namespace kernel {

using lstm_cell::math::sigmoid;
using lstm_cell::math::tanh_f32;
using vec::load;
using vec::store;

// The forward cell over one sample's H units: the gates' pre-activations are the projection `pre`
// plus the recurrent product `rec` plus both biases; c (f32) is read and written in place; h goes
// to y and, where the next step reads it, to h_next. Training keeps c_{t-1} and the activated gates
// (over `pre`).
struct Row {
  float* pre;          // [4H] the input projection; training: the activated gates i, f, g, o
  const float* rec;    // [4H] h_{t-1} . W_hh^T
  const bf16* b_ih;    // [4H]
  const bf16* b_hh;    // [4H]
  float* c;            // [H]  c_{t-1} in, c_t out
  float* c_prev;       // [H]  training: c_{t-1} kept; else null
  bf16* y;             // [H]
  bf16* h_next;        // [H]  null at the direction's last step
};

// The loop itself: __restrict__ parameters, so that GCC vectorises it (restrict-qualified locals
// copied from a Row did not carry the promise into the clones).
template <bool Training>
HOTOPS_VECTOR_INLINE void forward_loop(float* __restrict__ pre, const float* __restrict__ rec,
                                       const bf16* __restrict__ b_ih, const bf16* __restrict__ b_hh,
                                       float* __restrict__ c, float* __restrict__ c_prev, bf16* __restrict__ y,
                                       std::int64_t H) {
  for (std::int64_t u = 0; u < H; ++u) {
    const float i = sigmoid(pre[u] + rec[u] + load(b_ih[u]) + load(b_hh[u]));
    const float f = sigmoid(pre[H + u] + rec[H + u] + load(b_ih[H + u]) + load(b_hh[H + u]));
    const float g = tanh_f32(pre[2 * H + u] + rec[2 * H + u] + load(b_ih[2 * H + u]) + load(b_hh[2 * H + u]));
    const float o = sigmoid(pre[3 * H + u] + rec[3 * H + u] + load(b_ih[3 * H + u]) + load(b_hh[3 * H + u]));
    const float cp = c[u], cn = f * cp + i * g;
    c[u] = cn;
    y[u] = store<bf16>(o * tanh_f32(cn));
    if constexpr (Training) {
      c_prev[u] = cp;
      pre[u] = i, pre[H + u] = f, pre[2 * H + u] = g, pre[3 * H + u] = o;
    }
  }
}
template <bool Training>
HOTOPS_VECTOR_INLINE void forward_row(const Row& r, std::int64_t H) {
  forward_loop<Training>(r.pre, r.rec, r.b_ih, r.b_hh, r.c, r.c_prev, r.y, H);
  if (r.h_next) std::copy_n(r.y, H, r.h_next);
}
HOTOPS_CPU_CLONES void forward_row_infer(const Row& r, std::int64_t H) { forward_row<false>(r, H); }
HOTOPS_CPU_CLONES void forward_row_train(const Row& r, std::int64_t H) { forward_row<true>(r, H); }

// The backward cell over one sample's H units, from the activated gates and c_{t-1}: dh is dy's
// row plus the recurrent dh; dc is read and written in place (dc_t in, dc_{t-1} out); the gate
// gradients go out rounded to bf16 (to dg and, where given, dg2) and are summed into db (f32).
struct RowBack {
  const float* gates;  // [4H] i, f, g, o
  const float* c_prev; // [H]
  const float* dy;     // [H]
  const float* dh;     // [H]
  float* dc;           // [H]
  bf16* dg;            // [4H]
  bf16* dg2;           // [4H] or null
  float* db;           // [4H]
};

HOTOPS_VECTOR_INLINE void backward_loop(const float* __restrict__ gates, const float* __restrict__ c_prev,
                                        const float* __restrict__ dy, const float* __restrict__ dh,
                                        float* __restrict__ dc, bf16* __restrict__ dg, float* __restrict__ db,
                                        std::int64_t H) {
  for (std::int64_t u = 0; u < H; ++u) {
    const float i = gates[u], f = gates[H + u], g = gates[2 * H + u], o = gates[3 * H + u];
    const float cp = c_prev[u], t = tanh_f32(f * cp + i * g);
    const float dhv = dy[u] + dh[u];
    const float dcv = dc[u] + dhv * o * (1.f - t * t);
    const bf16 di = store<bf16>(dcv * g * i * (1.f - i)), df = store<bf16>(dcv * cp * f * (1.f - f)),
               dgg = store<bf16>(dcv * i * (1.f - g * g)), d_o = store<bf16>(dhv * t * o * (1.f - o));
    dc[u] = dcv * f;
    dg[u] = di, dg[H + u] = df, dg[2 * H + u] = dgg, dg[3 * H + u] = d_o;
  }
  // A loop of its own: summed in the loop above, db kept GCC from vectorising it.
  for (std::int64_t j = 0; j < 4 * H; ++j) db[j] += load(dg[j]);
}
HOTOPS_CPU_CLONES void backward_row(const RowBack& r, std::int64_t H) {
  backward_loop(r.gates, r.c_prev, r.dy, r.dh, r.dc, r.dg, r.db, H);
  if (r.dg2) std::copy_n(r.dg, 4 * H, r.dg2);
}

}  // namespace kernel

namespace {

// f32 masters in PyTorch's layouts: the space is their bf16 copy; the gradients come back as they are.
class HotopsCpuMasters final : public Masters {
 public:
  explicit HotopsCpuMasters(const Shape& s) : o_(s) {}

  void pack(const MasterArgs& a) override {
    auto* space = static_cast<bf16*>(a.weights);
    const auto put = [&](const float* from, std::size_t at, std::size_t end) {
      for (std::size_t i = at; i < end; ++i) space[i] = vec::f32_to_bf16(from[i - at]);
    };
    put(a.w_ih, o_.w_ih, o_.w_hh), put(a.w_hh, o_.w_hh, o_.b_ih), put(a.b_ih, o_.b_ih, o_.b_hh), put(a.b_hh, o_.b_hh, o_.total);
  }

  void unpack(const MasterArgs& a) override {
    const auto* g = static_cast<const float*>(a.dweights);
    std::copy(g + o_.w_ih, g + o_.w_hh, a.dw_ih);
    std::copy(g + o_.w_hh, g + o_.b_ih, a.dw_hh);
    std::copy(g + o_.b_ih, g + o_.b_hh, a.db_ih);
    std::copy(g + o_.b_hh, g + o_.total, a.db_hh);
  }

 private:
  TorchOffsets o_;
};

// A Linear layer's GEMM (y = a W^T, W [N, K]) in bf16 with f32 sums and an f32 output.
matmul::Shape linear(Direction dir, std::int64_t M, std::int64_t N, std::int64_t K) {
  matmul::Shape m;
  m.op = matmul::Op::mm, m.dir = dir, m.dtype = DType::bf16;
  m.M = M, m.N = N, m.K = K;
  m.trans_b = true;
  m.f32_out = true;
  return m;
}

class HotopsCpuLstm final : public Plan {
 public:
  explicit HotopsCpuLstm(const Shape& s) : s_(s), o_(s) {
    HOTOPS_CHECK(s.dtype == DType::bf16 && s.H <= kCpuHotopsMaxH, "lstm: hotops' CPU layer is bf16, hidden up to 256");
    const std::int64_t T = s.T, B = s.B, I = s.I, H = s.H, D = s.D(), G = 4 * H;
    const auto rows = static_cast<std::size_t>(T * B), state = static_cast<std::size_t>(D * T * B * H);
    gates_ = HostBuffer(DType::f32, rows * static_cast<std::size_t>(D * G));
    rec_ = HostBuffer(DType::f32, static_cast<std::size_t>(D * B * G));
    c_ = HostBuffer(DType::f32, static_cast<std::size_t>(D * B * H));
    hprev_ = HostBuffer(DType::bf16, state);
    project_ = matmul::make_cpu_plan(linear(Direction::fwd, T * B, D * G, I));
    step_ = matmul::make_cpu_plan(linear(Direction::fwd, B, G, H));
    label_ = "hotops LSTM: the input projections one GEMM (" + project_->label() + "), each step's h . W_hh^T (" +
             step_->label() + "), the cell in loops (" + vec::clone_name() + ")";
    if (!training()) return;
    cprev_ = HostBuffer(DType::f32, state);
    dg_ = HostBuffer(DType::bf16, rows * static_cast<std::size_t>(D * G));
    if (D > 1) dg_dir_ = HostBuffer(DType::bf16, rows * static_cast<std::size_t>(D * G));
    dh_ = HostBuffer(DType::f32, static_cast<std::size_t>(D * B * H));
    dc_ = HostBuffer(DType::f32, static_cast<std::size_t>(D * B * H));
    db_ = HostBuffer(DType::f32, static_cast<std::size_t>(cpu::threads() * D * G));
    back_ = matmul::make_cpu_plan(linear(Direction::bwd_data, B, G, H));
    dx_ = matmul::make_cpu_plan(linear(Direction::bwd_data, T * B, D * G, I));
    dw_ih_ = matmul::make_cpu_plan(linear(Direction::bwd_weight, T * B, D * G, I));
    dw_hh_ = matmul::make_cpu_plan(linear(Direction::bwd_weight, T * B, G, H));
    label_ += "; backward: the cell step by step, each step's dh . W_hh (" + back_->label() + "), then dx (" +
              dx_->label() + "), dW_ih (" + dw_ih_->label() + "), dW_hh a direction (" + dw_hh_->label() +
              "); the TRAINING forward that saves the gates runs at setup, not timed";
  }

  void forward(const Args& a) override {
    const std::int64_t T = s_.T, B = s_.B, H = s_.H, D = s_.D(), G = 4 * H;
    const auto* w = static_cast<const bf16*>(a.weights);
    matmul::Args p;
    p.a = a.x, p.b = w + o_.w_ih, p.out = gates_.data();
    project_->run(p);
    auto* y = static_cast<bf16*>(a.y);
    float* gates = gates_.as<float>();
    float* c = c_.as<float>();  // [D, B, H]
    bf16* hprev = hprev_.as<bf16>();  // [D, T, B, H]: the state each step reads, in time order
    // The time a direction's n-th step is at.
    const auto step_time = [T](std::int64_t d, std::int64_t n) { return d == 0 ? n : T - 1 - n; };
    for (std::int64_t d = 0; d < D; ++d) {
      const auto* h0 = static_cast<const bf16*>(a.h0) + d * B * H;
      const auto* c0 = static_cast<const bf16*>(a.c0) + d * B * H;
      std::copy(h0, h0 + B * H, hprev + (d * T + step_time(d, 0)) * B * H);
      for (std::int64_t i = 0; i < B * H; ++i) c[d * B * H + i] = bf16_to_float(c0[i]);
    }
    // Step n of every direction together: each direction's product, then one pass of the cells.
    for (std::int64_t n = 0; n < T; ++n) {
      for (std::int64_t d = 0; d < D; ++d) {
        matmul::Args r;
        r.a = hprev + (d * T + step_time(d, n)) * B * H, r.b = w + o_.w_hh + d * G * H, r.out = rec_.as<float>() + d * B * G;
        step_->run(r);
      }
      const bool last = n + 1 == T;
      cpu::in_shares(cpu::threads(), D * B, [&](std::int64_t r0, std::int64_t r1) {
        for (std::int64_t row_at = r0; row_at < r1; ++row_at) {
          const std::int64_t d = row_at / B, b = row_at % B, t = step_time(d, n);
          kernel::Row row;
          row.pre = gates + ((t * B + b) * D + d) * G;
          row.rec = rec_.as<float>() + row_at * G;
          row.b_ih = w + o_.b_ih + d * G, row.b_hh = w + o_.b_hh + d * G;
          row.c = c + row_at * H;
          row.c_prev = training() ? cprev_.as<float>() + ((d * T + t) * B + b) * H : nullptr;
          row.y = y + (t * B + b) * D * H + d * H;
          row.h_next = last ? nullptr : hprev + (d * T + step_time(d, n + 1)) * B * H + b * H;
          (training() ? kernel::forward_row_train : kernel::forward_row_infer)(row, H);
        }
      });
    }
    for (std::int64_t d = 0; d < D; ++d) {
      const std::int64_t t_last = step_time(d, T - 1);
      auto* hT = static_cast<bf16*>(a.hT) + d * B * H;
      auto* cT = static_cast<bf16*>(a.cT) + d * B * H;
      for (std::int64_t b = 0; b < B; ++b) std::copy_n(y + (t_last * B + b) * D * H + d * H, H, hT + b * H);
      for (std::int64_t i = 0; i < B * H; ++i) cT[i] = vec::f32_to_bf16(c[d * B * H + i]);
    }
    if (training()) seen_ = {a.x, a.h0, a.c0, a.weights, a.y, a.hT, a.cT};
  }

  void run(const Args& a) override {
    if (!training()) return forward(a);
    if (seen_ != Seen{a.x, a.h0, a.c0, a.weights, a.y, a.hT, a.cT}) forward(a);
    HOTOPS_CHECK(a.dy && a.dhT && a.dcT, "lstm: hotops' CPU layer needs dy, dhT and dcT");
    const std::int64_t T = s_.T, B = s_.B, H = s_.H, D = s_.D(), G = 4 * H;
    const auto* w = static_cast<const bf16*>(a.weights);
    auto* dw = static_cast<float*>(a.dweights);
    const auto* dy = static_cast<const float*>(a.dy);
    float* dh = dh_.as<float>();
    float* dc = dc_.as<float>();
    bf16* dg = dg_.as<bf16>();
    const int team = cpu::threads();
    if (db_.count() < static_cast<std::size_t>(team * D * G)) db_ = HostBuffer(DType::f32, static_cast<std::size_t>(team * D * G));
    float* db = db_.as<float>();  // [team, D, 4H]: each thread's sums
    std::fill(db, db + team * D * G, 0.f);
    // The packed gate gradients of direction d, [T, B, 4H]: dg itself for one direction.
    const auto dg_of = [&](std::int64_t d) { return D == 1 ? dg : dg_dir_.as<bf16>() + d * T * B * G; };
    // The time a direction's n-th step of the backward is at (its forward's steps in reverse).
    const auto step_time = [T](std::int64_t d, std::int64_t n) { return d == 0 ? T - 1 - n : n; };
    std::copy_n(static_cast<const float*>(a.dhT), D * B * H, dh);  // [D, B, H]
    std::copy_n(static_cast<const float*>(a.dcT), D * B * H, dc);
    for (std::int64_t n = 0; n < T; ++n) {
      cpu::in_shares(team, D * B, [&](std::int64_t r0, std::int64_t r1) {
        float* sums = db + static_cast<std::int64_t>(omp_get_thread_num()) * D * G;
        for (std::int64_t row = r0; row < r1; ++row) {
          const std::int64_t d = row / B, b = row % B, t = step_time(d, n);
          kernel::RowBack r;
          r.gates = gates_.as<float>() + ((t * B + b) * D + d) * G;
          r.c_prev = cprev_.as<float>() + ((d * T + t) * B + b) * H;
          r.dy = dy + (t * B + b) * D * H + d * H;
          r.dh = dh + row * H;
          r.dc = dc + row * H;
          r.dg = dg + ((t * B + b) * D + d) * G;
          r.dg2 = D == 1 ? nullptr : dg_of(d) + (t * B + b) * G;
          r.db = sums + d * G;
          kernel::backward_row(r, H);
        }
      });
      for (std::int64_t d = 0; d < D; ++d) {
        matmul::Args m;
        m.dout = dg_of(d) + step_time(d, n) * B * G, m.b = w + o_.w_hh + d * G * H, m.out = dh + d * B * H;
        back_->run(m);
      }
    }
    std::copy_n(dh, D * B * H, static_cast<float*>(a.dh0));
    std::copy_n(dc, D * B * H, static_cast<float*>(a.dc0));
    for (std::int64_t d = 0; d < D; ++d) {
      matmul::Args m;
      m.a = hprev_.as<bf16>() + d * T * B * H, m.dout = dg_of(d), m.out = dw + o_.w_hh + d * G * H;
      dw_hh_->run(m);
    }
    matmul::Args m;
    m.dout = dg, m.b = w + o_.w_ih, m.out = a.dx;
    dx_->run(m);
    m = matmul::Args{};
    m.a = a.x, m.dout = dg, m.out = dw + o_.w_ih;
    dw_ih_->run(m);
    for (std::int64_t j = 0; j < D * G; ++j) {
      float sum = 0;
      for (int k = 0; k < team; ++k) sum += db[k * D * G + j];
      dw[o_.b_ih + j] = dw[o_.b_hh + j] = sum;
    }
  }

  std::string label() const override { return cpu::with_threads(label_); }

 private:
  using Seen = std::array<const void*, 7>;
  bool training() const { return s_.dir != Direction::fwd; }

  Shape s_;
  TorchOffsets o_;
  // gates_ [T, B, D, 4H]: the projections, then (training) the activated gates; rec_ one step's
  // recurrent product; c_ the cell; hprev_ [D, T, B, H] and cprev_ the state each step read.
  HostBuffer gates_, rec_, c_, hprev_, cprev_;
  // dg_ [T, B, D, 4H] the gate gradients; dg_dir_ [D, T, B, 4H] the same by direction (two
  // directions); dh_, dc_ the recurrent gradients; db_ the threads' bias-gradient sums.
  HostBuffer dg_, dg_dir_, dh_, dc_, db_;
  std::unique_ptr<matmul::Plan> project_, step_, back_, dx_, dw_ih_, dw_hh_;
  std::string label_;
  Seen seen_{};
};

}  // namespace

bool cpu_takes_hotops(const Shape& s) {
  return s.impl == Impl::best && s.dtype == DType::bf16 && s.dir == Direction::bwd && !s.bidirectional &&
         s.H <= kCpuHotopsMaxH;
}
std::string cpu_hotops_unsupported_reason(const Shape& s) {
  // The forward's two GEMMs; the backward's are the same products' other directions.
  std::string why = matmul::cpu_unsupported_reason(linear(Direction::fwd, s.B, 4 * s.H, s.H));
  if (why.empty()) why = matmul::cpu_unsupported_reason(linear(Direction::fwd, s.T * s.B, s.D() * 4 * s.H, s.I));
  return why;
}
std::unique_ptr<Plan> make_cpu_hotops_plan(const Shape& s) { return std::make_unique<HotopsCpuLstm>(s); }
std::unique_ptr<Layout> make_cpu_hotops_layout(const Shape& s) { return make_torch_layout(s, DType::f32); }
std::unique_ptr<Masters> make_cpu_hotops_masters(const Shape& s) { return std::make_unique<HotopsCpuMasters>(s); }

}  // namespace hotops::lstm
