// The lstm family: torch.nn.LSTM over a whole sequence (one layer, uni- or bidirectional),
// forward and backward (backpropagation through time), on oneDNN (CPU) and cuDNN's RNN API (CUDA).
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "hotops/buffer.h"
#include "hotops/op.h"
#include "hotops/op_family.h"

namespace hotops::lstm {

// PyTorch's semantics and layouts (D = 1 or 2 directions; gate order i, f, g, o):
//   gates_t = W_ih x_t + b_ih + W_hh h_{t-1} + b_hh            [4H] per direction and sample
//   c_t = sigmoid(f) * c_{t-1} + sigmoid(i) * tanh(g),   h_t = sigmoid(o) * tanh(c_t)
// The backward direction runs t = T-1 .. 0 from its own h0, c0; y[t] = [h_fwd(t), h_bwd(t)].
//   x [T,B,I]  h0, c0, hT, cT [D,B,H]  y [T,B,D*H]
//   W_ih [D,4H,I]  W_hh [D,4H,H]  b_ih, b_hh [D,4H]
// bwd: given dy, dhT, dcT, the gradients dx [T,B,I], dh0, dc0 [D,B,H], dW_ih, dW_hh and
// db [D,4H] (db_ih = db_hh = db: both biases have the same gradient), summed over time and batch.
struct Shape {
  Direction dir = Direction::fwd;
  DType dtype = DType::f32;  // tf32: f32 storage, tensor-core math (CUDA only)
  std::int64_t T = 1, B = 1, I = 1, H = 1;
  bool bidirectional = false;
  std::int64_t D() const { return bidirectional ? 2 : 1; }
};

Shape shape_of(const Problem& p);

// Inputs in the storage dtype, seeded from the problem name so every backend sees the same numbers.
// Weights and biases are uniform in [-1/sqrt(H), 1/sqrt(H)) (PyTorch's LSTM init), the rest in [-1, 1).
struct Inputs {
  HostBuffer x, h0, c0, w_ih, w_hh, b_ih, b_hh;
  HostBuffer dy, dhT, dcT;  // bwd only
};
Inputs make_inputs(const Shape& s, std::uint64_t seed);

// What a backend hands back for verification; unused buffers stay empty. Any dtype: a backend
// may return its gradients in f32 (oneDNN's bf16 backward does).
struct Outputs {
  HostBuffer y, hT, cT;                          // fwd
  HostBuffer dx, dh0, dc0, dw_ih, dw_hh, db;     // bwd
  HostBuffer db2;                                // bwd, cuDNN: the b_hh gradient (must equal db)
};

// The reference in double over the whole problem (element layouts as above).
struct Forward {
  std::vector<double> y, hT, cT;
  // Saved for the backward pass, per direction d, step t (in that direction's time), sample, unit:
  std::vector<double> gates;  // [D,T,B,4H] after the nonlinearities (i, f, g, o)
  std::vector<double> c;      // [D,T+1,B,H] c_0 .. c_T in that direction's order
  std::vector<double> h;      // [D,T+1,B,H]
};
struct Backward {
  std::vector<double> dx, dh0, dc0, dw_ih, dw_hh, db;
};
// The inputs as doubles (exact copies of the stored values; the tests perturb them).
struct RefInputs {
  std::vector<double> x, h0, c0, w_ih, w_hh, b_ih, b_hh, dy, dhT, dcT;
};
RefInputs to_double(const Inputs& in);
Forward reference_forward(const Shape& s, const RefInputs& in);
Backward reference_backward(const Shape& s, const RefInputs& in, const Forward& f);

// The verification bound on max|out - ref| / rms(ref): tolerance(dtype) up to T = 25 (one GEMM's
// rounding per step, as in matmul), growing as sqrt(T / 25) beyond: the recurrence carries each
// step's rounding error forward through c (damped by the forget gate, which can be near 1), so in
// the worst case they add up as a random walk over the steps.
double tolerance_of(const Shape& s);

// Verifies a backend's outputs against the reference (computed once over the whole problem and
// cached in `cache`); every output is compared at up to 1 << 16 sampled elements.
struct ReferenceCache {
  bool have = false;
  Forward f;
  Backward b;
};
Check verify(const Shape& s, const Inputs& in, const Outputs& out, ReferenceCache& cache);

// Named shapes: the DeepBench LSTM training rows and Keras' IMDb bidirectional LSTM.
struct NamedShape {
  std::string name;
  std::int64_t T, I, H;
  bool bidirectional;
  std::vector<std::int64_t> batches;
};
const std::vector<NamedShape>& named_shapes();

HOTOPS_FAMILY_ENTRY_POINTS(make_cpu, cpu_unsupported_reason, make_cuda);

}  // namespace hotops::lstm
