// The maxpool family: nn.MaxPool2d (kernel k x k, stride s, zero padding p, floor mode) over an
// [N, C, H, W] tensor stored NCHW or NHWC. fwd computes y from x (on the CPU also oneDNN's
// workspace, the argmax of each window, as a training forward must); bwd computes dx from dy and
// what the forward saved: oneDNN's workspace on the CPU, x and y on cuDNN.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "hotops/buffer.h"
#include "hotops/op.h"
#include "hotops/op_family.h"
#include "hotops/plan.h"

namespace hotops::maxpool {

enum class Layout { nchw, nhwc };

// One pooling pass; a model fills the fields directly.
struct Shape {
  Direction dir = Direction::fwd;  // fwd or bwd
  DType dtype = DType::f32;
  Layout layout = Layout::nchw;
  std::int64_t N = 1, C = 1, H = 1, W = 1;  // input
  std::int64_t k = 1, s = 1, pad = 0;
  // CPU only, for a model's layers (the default is what the benchmark runs): fwd is oneDNN's
  // forward_inference, which writes no workspace (Args::workspace unused).
  bool inference = false;
  std::int64_t OH() const { return (H + 2 * pad - k) / s + 1; }
  std::int64_t OW() const { return (W + 2 * pad - k) / s + 1; }
  std::size_t in_elements() const { return static_cast<std::size_t>(N * C * H * W); }
  std::size_t out_elements() const { return static_cast<std::size_t>(N * C * OH() * OW()); }
  // Offset of element (n, c, h, w) of a tensor of spatial size hh x ww in this layout.
  std::size_t offset(std::int64_t n, std::int64_t c, std::int64_t h, std::int64_t w, std::int64_t hh,
                     std::int64_t ww) const {
    const std::int64_t o = layout == Layout::nchw ? ((n * C + c) * hh + h) * ww + w : ((n * hh + h) * ww + w) * C + c;
    return static_cast<std::size_t>(o);
  }
};

Shape shape_of(const Problem& p);

// Inputs, seeded from the problem name so every backend sees the same numbers.
//   x: no two elements of any k x k window are equal, so the argmax, and with it y and dx, has one
//      right answer whatever an implementation does with ties: x = (m k^2 + (h mod k) k + (w mod k))
//      scaled by a power of two, m a seeded random integer (levels chosen so x is exact in the dtype).
//   dy (bwd): uniform in [-1, 1).
struct Inputs {
  HostBuffer x;
  HostBuffer dy;  // bwd
};
Inputs make_inputs(const Shape& s, std::uint64_t seed);
HostBuffer make_output(const Shape& s);  // y (fwd) or dx (bwd)

// The reference, one element at a time (double; exact here). The argmax of output (n, c, oh, ow)
// as the input (h, w) (the first maximum in row-major window order), its value, and dx at one input
// element: the sum of the dy of every window whose argmax it is.
void reference_argmax(const Shape& s, const HostBuffer& x, std::int64_t n, std::int64_t c, std::int64_t oh,
                      std::int64_t ow, std::int64_t* h, std::int64_t* w);
double reference_fwd(const Shape& s, const HostBuffer& x, std::size_t out_index);
double reference_bwd(const Shape& s, const HostBuffer& x, const HostBuffer& dy, std::size_t in_index);

// fwd: exact match required (a max is exact); bwd: tolerance(dtype) (a sum of up to
// ceil(k / s)^2 dy in f32, then rounded to the dtype; exact for non-overlapping windows).
Check verify(const Shape& s, const Inputs& in, const HostBuffer& out);

// The tensors of one pass, in the shape's layout: host memory on the CPU, device memory on CUDA.
// The backward reads what its forward saved, which differs by backend: oneDNN's workspace on the
// CPU, x and y on cuDNN.
struct Args {
  const void* x = nullptr;   // fwd; bwd on CUDA: the forward's input [N,C,H,W]
  const void* y = nullptr;   // bwd on CUDA: the forward's output [N,C,OH,OW]
  const void* dy = nullptr;  // bwd: [N,C,OH,OW]
  void* out = nullptr;       // y (fwd) or dx (bwd)
  // CPU: the argmax of each window, cpu_workspace_bytes(shape); the forward writes it, the backward
  // reads it. Unused on CUDA.
  void* workspace = nullptr;
};
HOTOPS_PLAN_FACTORIES(Shape, Args);  // CPU: oneDNN; CUDA: cuDNN
std::size_t cpu_workspace_bytes(const Shape& s);

std::string onednn_unsupported_reason(const Problem& p);
const Family& family();

}  // namespace hotops::maxpool
