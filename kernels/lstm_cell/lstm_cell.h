// The lstm_cell family: one time step of torch.nn.LSTMCell, forward and backward, on the CPU (a
// oneDNN matmul plus a hand-written OpenMP pointwise loop, or oneDNN's LSTM primitive as `impl:`)
// and on CUDA (one cublasLt GEMM plus one hand-written pointwise kernel per step).
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "hotops/buffer.h"
#include "hotops/op.h"
#include "hotops/plan.h"

namespace hotops::lstm_cell {

// One problem. With K = I + H and PyTorch's gate order i, f, g, o along the 4H rows:
//   gates = [x, h] · W^T + b          W = [W_ih | W_hh] : [4H, K],  b = b_ih + b_hh : [4H]
//   i, f, o = sigmoid(gates_{i,f,o}),  g = tanh(gates_g)
//   c' = f * c + i * g,                h' = o * tanh(c')
// Input format (every backend): x and h given concatenated, one row-major [B, K] buffer `xh`
// (x in columns [0, I), h in [I, K)), as an LSTM layer keeps them; W stored concatenated as
// PyTorch's cuDNN path does (flatten_parameters). bwd returns d[x, h] in the same [B, K] form.
//   fwd  in: xh, W, b, c                  out: h', c'
//   bwd  in: xh, W, b, c, dh', dc'        out: dxh [B, K], dc [B, H], dW [4H, K], db [4H]
// The state fwd saves for bwd is each implementation's own (the f32 pre-activation gates for
// hotops' CPU and CUDA code, oneDNN's workspace for its LSTM primitive); a bwd plan makes it with
// its implementation's own fwd, outside its timed run (see Plan).
//
// The CPU implementations (see lstm_cell.cpp's cpu_default for the default and what was measured).
enum class CpuImpl { hotops, onednn };
const char* cpu_impl_name(CpuImpl i);
CpuImpl cpu_default(DType t, Direction d);

// A model fills it in directly (cpu_impl: cpu_default(dtype, dir) for the measured best).
struct Shape {
  Direction dir = Direction::fwd;
  DType dtype = DType::f32;  // f32, bf16 (storage, f32 math), tf32 (CUDA: f32 storage, tf32 GEMMs)
  std::int64_t B = 1, I = 1, H = 1;
  CpuImpl cpu_impl = CpuImpl::hotops;  // the CPU plan's implementation
  std::int64_t K() const { return I + H; }
  std::int64_t G() const { return 4 * H; }
};
Shape shape_of(const Problem& p);

// Inputs, seeded from the problem name less its backend and `impl`, so every implementation
// computes on the same numbers. W and b are uniform in +-1/sqrt(H) (PyTorch's init), the rest in
// [-1, 1).
struct Inputs {
  HostBuffer xh, W, b, c;
  HostBuffer dh, dc;  // bwd: dh', dc'
};
Inputs make_inputs(const Shape& s, std::uint64_t seed);

// The outputs of a direction, in the storage dtype.
struct Outputs {
  HostBuffer h, c;                // fwd: h', c'
  HostBuffer dxh, dc, dW, db;     // bwd
};
Outputs make_outputs(const Shape& s);

// The reference, in double. A View reads a HostBuffer or a double array element by element, so
// the unit tests can run the same code on double inputs (finite differences need them).
struct View {
  const void* data = nullptr;
  enum class Kind { f32, bf16, f64 } kind = Kind::f64;
  double operator[](std::size_t i) const;
};
View view(const HostBuffer& b);
View view(const std::vector<double>& v);

struct RefInputs {
  View xh, W, b, c, dh, dc;
};
RefInputs ref_inputs(const Inputs& in);

struct RefForward {
  std::vector<double> act;     // [B, 4H]: i, f, g, o after their activations
  std::vector<double> h, c;    // [B, H]: h', c'
};
RefForward reference_forward(const Shape& s, const RefInputs& in);

struct RefBackward {
  std::vector<double> dgates;  // [B, 4H]: dL/d(gates) before the activations
  std::vector<double> dc;      // [B, H]
  std::vector<double> db;      // [4H]
};
RefBackward reference_backward(const Shape& s, const RefInputs& in, const RefForward& fwd);
// One element of dxh [B, K] or dW [4H, K] (each a dot product: large problems are sampled).
double reference_dxh(const Shape& s, const RefInputs& in, const RefBackward& bwd, std::size_t idx);
double reference_dW(const Shape& s, const RefInputs& in, const RefBackward& bwd, std::size_t idx);

// Verifies every output of a direction (sampled when large) against the reference.
Check verify(const Shape& s, const Inputs& in, const Outputs& out);

// FLOPs of the pointwise part per element of [B, H], each sigmoid or tanh counted as one:
//   fwd: 4 bias adds, 5 activations, c' = f*c + i*g (3), h' = o*tanh(c') (1)                 = 13
//   bwd, from the activations: c' (3), t = tanh(c') (1), do = dh'*t (1),
//        dc_total = dc' + dh'*o*(1 - t^2) (5), di, df, dg, dc (4), the four activation
//        derivatives (3 each)                                                               = 26
// plus, in bwd, the column sum db (4H adds per sample).
constexpr double kPointwiseFlopsFwd = 13;
constexpr double kPointwiseFlopsBwd = 26;

CpuImpl cpu_impl_of(const Problem& p);

// The tensors of one step, in the layouts above, on the plan's backend (host or device memory).
struct Args {
  const void* xh = nullptr;  // [B, K]: x, h
  const void* W = nullptr;   // [4H, K]: W_ih | W_hh
  const void* b = nullptr;   // [4H]: b_ih + b_hh
  const void* c = nullptr;   // [B, H]
  void* h_new = nullptr;     // fwd: h' [B, H]
  void* c_new = nullptr;     // fwd: c' [B, H]
  const void* dh_new = nullptr;  // bwd: dh' [B, H]
  const void* dc_new = nullptr;  // bwd: dc' [B, H]
  void* dxh = nullptr;       // bwd: d[x, h] [B, K]
  void* dc = nullptr;        // bwd: dc [B, H]
  void* dW = nullptr;        // bwd: [4H, K]
  void* db = nullptr;        // bwd: [4H]
};

// The plan of one step. What a plan keeps of its inputs (bwd: the saved forward state; oneDNN's LSTM:
// W and b in its own formats) it makes on the first run on those tensors (other pointers of xh, W,
// b, c), outside the work a run is timed for; forward() makes it again, for a caller that changed
// their values in place. fwd: forward() then runs the step.
class Plan : public hotops::Plan<Args> {
 public:
  virtual void forward(const Args& a) = 0;
};
std::unique_ptr<Plan> make_cpu_plan(const Shape& s);   // the shape's cpu_impl
std::unique_ptr<Plan> make_cuda_plan(const Shape& s);  // cublasLt + hotops' kernels
std::unique_ptr<Plan> make_plan(const Shape& s, Backend b);
std::unique_ptr<Plan> make_cpu_hotops_plan(const Shape& s);
std::unique_ptr<Plan> make_cpu_onednn_plan(const Shape& s);

std::string hotops_unsupported_reason(const Problem& p);
std::string onednn_unsupported_reason(const Problem& p);

const Family& family();

}  // namespace hotops::lstm_cell
