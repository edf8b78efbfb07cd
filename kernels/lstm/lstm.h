// The lstm family: torch.nn.LSTM over a whole sequence (one layer, uni- or bidirectional),
// forward and backward (backpropagation through time), on oneDNN (CPU) and on CUDA cuDNN's RNN API,
// or hotops' own recurrence kernels where they take the layer (cuda_hotops.cu).
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "hotops/buffer.h"
#include "hotops/op.h"
#include "hotops/op_family.h"
#include "hotops/plan.h"

namespace hotops::lstm {

// PyTorch's semantics and layouts (D = 1 or 2 directions; gate order i, f, g, o):
//   gates_t = W_ih x_t + b_ih + W_hh h_{t-1} + b_hh            [4H] per direction and sample
//   c_t = sigmoid(f) * c_{t-1} + sigmoid(i) * tanh(g),   h_t = sigmoid(o) * tanh(c_t)
// The backward direction runs t = T-1 .. 0 from its own h0, c0; y[t] = [h_fwd(t), h_bwd(t)].
//   x [T,B,I]  h0, c0, hT, cT [D,B,H]  y [T,B,D*H]
//   W_ih [D,4H,I]  W_hh [D,4H,H]  b_ih, b_hh [D,4H]
// bwd: given dy, dhT, dcT, the gradients dx [T,B,I], dh0, dc0 [D,B,H], dW_ih, dW_hh and
// db [D,4H] (db_ih = db_hh = db: both biases have the same gradient), summed over time and batch.
// A model fills it in directly: fwd is an inference layer, bwd a training layer (forward() then run()).
// Each backend has hotops' own layer and its library's: on CUDA hotops' recurrence kernels where they
// take the shape (cuda_takes_hotops), cuDNN otherwise; on the CPU hotops' layer of matmul plans and
// cell loops where it takes the shape (cpu_takes_hotops), oneDNN otherwise. `library` asks for the
// library's whatever the shape (`impl:cudnn`, `impl:onednn` in a name).
enum class Impl { best, library };
struct Shape {
  Direction dir = Direction::fwd;
  DType dtype = DType::f32;  // tf32: f32 storage, tensor-core math (CUDA only)
  std::int64_t T = 1, B = 1, I = 1, H = 1;
  bool bidirectional = false;
  // A model's mixed precision, where it differs from the op benchmark's bf16 (off there):
  bool f32_gradients = false;  // bf16 bwd on the CPU: oneDNN's gradients in f32, never bf16
  Impl impl = Impl::best;
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

// The bounds of verify: `max` on max|out - ref| / rms(ref) (tolerance_of), and `rms` on
// rms(out - ref) / rms(ref). Rounding errors spread with an rms several times below their largest
// element (oneDNN's bf16 LSTMs: 0.002 to 0.007 against a largest 0.03, at T = 3 to 200, the rms not
// growing with T), so the rms bound is the dtype's tolerance (twice that for a bf16 backward) over 4,
// whatever T: it fails a wrong term spread over every element, which stays under the per-element
// bound up to 0.23 of rms(ref) at T = 200.
struct Bounds {
  double max = 0, rms = 0;
};
Bounds bounds_of(const Shape& s);

// Verifies a backend's outputs against the reference (computed once over the whole problem and
// kept in `cache`); every output is compared at up to 1 << 16 sampled elements.
struct Reference {
  Forward f;
  Backward b;  // bwd only
};
Reference reference(const Shape& s, const Inputs& in);
struct ReferenceCache {
  std::shared_ptr<const Reference> ref;  // null until computed
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

// The tensors of one layer, in the layouts above, on the plan's backend (host or device memory).
// The weights are read from, and their gradients written to, the backend's own layout (a Layout's
// weight and gradient spaces): packing them is the caller's setup, not the layer's work.
struct Args {
  const void* x = nullptr;        // [T,B,I]
  const void* h0 = nullptr;       // [D,B,H]
  const void* c0 = nullptr;       // [D,B,H]
  const void* weights = nullptr;  // the weight space: W_ih, W_hh, b_ih, b_hh (Layout::pack)
  void* y = nullptr;              // [T,B,D*H]  fwd: the output; bwd: forward()'s, read by run()
  void* hT = nullptr;             // [D,B,H]    likewise
  void* cT = nullptr;             // [D,B,H]    likewise
  // bwd only, in the Layout's gradient dtype:
  const void* dy = nullptr;   // [T,B,D*H]
  const void* dhT = nullptr;  // [D,B,H]
  const void* dcT = nullptr;  // [D,B,H]
  void* dx = nullptr;         // [T,B,I]
  void* dh0 = nullptr;        // [D,B,H]
  void* dc0 = nullptr;        // [D,B,H]
  void* dweights = nullptr;   // the gradient space: dW_ih, dW_hh, db (Layout::unpack)
};

// The plan of one layer. fwd: run() is the inference forward. bwd: forward() is the training
// forward (y, hT, cT and the state the backward reads, kept in the plan) and run() the backward
// alone, as PyTorch's backward excludes the forward; run() on inputs that forward() has not seen
// (other pointers) runs forward() first. A caller that changes the inputs' values in place calls
// forward() again before run().
class Plan : public hotops::Plan<Args> {
 public:
  virtual void forward(const Args& a) = 0;
};
std::unique_ptr<Plan> make_cpu_plan(const Shape& s);   // hotops' layer where it takes s, else oneDNN
std::unique_ptr<Plan> make_cuda_plan(const Shape& s);  // hotops' kernels where they take s, else cuDNN
std::unique_ptr<Plan> make_plan(const Shape& s, Backend b);
// Whether make_cpu_plan runs hotops' layer for s (kernels/lstm/cpu_hotops.cpp): a bf16 training
// layer (bwd: its forward and backward), one direction, a hidden size up to kCpuHotopsMaxH, impl
// best. Measured against oneDNN's (docs/ops.md, "lstm"): a one-direction training step was faster
// with hotops' layer, a two-direction one was not (its directions' small per-step GEMMs run one
// after the other), nor was the forward alone, so inference layers and bidirectional ones stay on
// oneDNN. The layer itself takes both directions and inference (make_cpu_hotops_plan).
constexpr std::int64_t kCpuHotopsMaxH = 256;
bool cpu_takes_hotops(const Shape& s);
// The two CPU implementations, each with its own Layout and Masters (make_cpu_layout and
// make_cpu_masters pick as make_cpu_plan).
std::unique_ptr<Plan> make_onednn_plan(const Shape& s);
std::unique_ptr<Plan> make_cpu_hotops_plan(const Shape& s);
// Why this CPU cannot run hotops' layer for s ("" where it can): what its matmul plans say.
std::string cpu_hotops_unsupported_reason(const Shape& s);
// Whether make_cuda_plan runs hotops' recurrence kernels for s: bf16, a hidden size that is a
// multiple of 16 up to 128 (the recurrent weights of a direction held in the registers of one
// block), and impl best.
bool cuda_takes_hotops(const Shape& s);
// The two CUDA implementations, each with its own Layout (make_cuda_layout picks as make_cuda_plan).
std::unique_ptr<Plan> make_cudnn_plan(const Shape& s);
std::unique_ptr<Plan> make_hotops_plan(const Shape& s);

// Where a backend's plan keeps the weights and writes their gradients, and the host-side
// conversions from and to PyTorch's layouts (setup and verification, never inside a run).
class Layout {
 public:
  virtual ~Layout() = default;
  virtual std::size_t weight_bytes() const = 0;
  virtual std::size_t gradient_bytes() const = 0;  // bwd
  // The dtype of dy, dhT, dcT, dx, dh0, dc0 and the gradient space (oneDNN's bf16 backward: f32).
  virtual DType gradient_dtype() const = 0;
  // The weight space (weight_bytes) of PyTorch's W_ih, W_hh, b_ih, b_hh, in host memory.
  virtual HostBuffer pack(const HostBuffer& w_ih, const HostBuffer& w_hh, const HostBuffer& b_ih,
                          const HostBuffer& b_hh) const = 0;
  // A gradient space (gradient_bytes, host memory) as PyTorch's dW_ih, dW_hh, db into `out` (and
  // db2 where the backend has a gradient per bias).
  virtual void unpack(const HostBuffer& gradients, Outputs& out) const = 0;

  // Where the weight space is a plain array of the storage dtype's elements (cuDNN's), the element
  // each of PyTorch's W_ih, W_hh, b_ih, b_hh elements (in their layouts above) sits at, the same in
  // the gradient space: for a caller that keeps the space's elements itself (a bf16 space's f32
  // masters). Empty where the space is no such array (oneDNN's, whose bias holds b_ih + b_hh).
  struct Positions {
    std::vector<std::size_t> w_ih, w_hh, b_ih, b_hh;
  };
  virtual Positions positions() const { return {}; }
};
// The weight space of hotops' own layers (CPU and CUDA): PyTorch's W_ih, W_hh, b_ih, b_hh one
// after another in bf16, each tensor in its layout above; the gradient space the same in the
// `gradients` dtype (bf16 on CUDA, f32 on the CPU), db in both bias slots. Positions: every element
// where PyTorch has it, counted from the start.
struct TorchOffsets {  // where each tensor starts, in elements
  std::size_t w_ih = 0, w_hh = 0, b_ih = 0, b_hh = 0, total = 0;
  explicit TorchOffsets(const Shape& s);
};
std::unique_ptr<Layout> make_torch_layout(const Shape& s, DType gradients);
std::unique_ptr<Layout> make_cpu_layout(const Shape& s);
std::unique_ptr<Layout> make_onednn_layout(const Shape& s);
std::unique_ptr<Layout> make_cpu_hotops_layout(const Shape& s);
std::unique_ptr<Layout> make_cuda_layout(const Shape& s);
std::unique_ptr<Layout> make_layout(const Shape& s, Backend b);
std::unique_ptr<Layout> make_cudnn_layout(const Shape& s);
std::unique_ptr<Layout> make_hotops_layout(const Shape& s);

// A caller whose f32 master weights stay in PyTorch's layouts (its optimizer updates them there)
// while oneDNN's weight space is in the formats the primitives chose: the weight space packed from
// the masters (the weights reordered, to bf16 for a bf16 layer; the bias b_ih + b_hh) and the
// gradient space unpacked into PyTorch's f32 layouts (db into both bias gradients), each step, on
// host memory, complete on return. The reorders are made once, at construction.
struct MasterArgs {
  const float* w_ih = nullptr;  // pack: [D,4H,I]
  const float* w_hh = nullptr;  // pack: [D,4H,H]
  const float* b_ih = nullptr;  // pack: [D,4H]
  const float* b_hh = nullptr;  // pack: [D,4H]
  void* weights = nullptr;      // pack: the weight space
  const void* dweights = nullptr;  // unpack: the gradient space
  float* dw_ih = nullptr;          // unpack: [D,4H,I]
  float* dw_hh = nullptr;          // unpack: [D,4H,H]
  float* db_ih = nullptr;          // unpack: [D,4H]
  float* db_hh = nullptr;          // unpack: [D,4H]
};
class Masters {
 public:
  virtual ~Masters() = default;
  virtual void pack(const MasterArgs& a) = 0;
  virtual void unpack(const MasterArgs& a) = 0;  // bwd layers
};
std::unique_ptr<Masters> make_cpu_masters(const Shape& s);
std::unique_ptr<Masters> make_onednn_masters(const Shape& s);
std::unique_ptr<Masters> make_cpu_hotops_masters(const Shape& s);

std::string cpu_unsupported_reason(const Problem& p);
const Family& family();

}  // namespace hotops::lstm
