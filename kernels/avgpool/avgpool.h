// The global_avgpool family: the mean over every position of each (sample, channel), as Keras'
// GlobalAveragePooling1D over a sequence [batch, T, dim] (imdb_fasttext.py) and PyTorch's
// AdaptiveAvgPool2d(1) + flatten over an image (NCHW or NHWC) do it:
//   fwd: y[n, c] = Σ_l x[n, l, c] / L,   bwd: dx[n, l, c] = dy[n, c] / L.
// An input is [N, L, C] with L the positions averaged: T tokens, or H·W pixels. Layout `nlc` puts the
// channels last ([batch, T, dim], NHWC), `ncl` the positions last (NCHW). y and dy are [N, C].
// CPU: oneDNN's average pooling (pooling_avg_exclude_padding, no padding) over a 1-D window the whole
// of L. CUDA: hand-written kernels, deterministic (fixed-order sums, no atomics).
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "hotops/buffer.h"
#include "hotops/op.h"
#include "hotops/op_family.h"
#include "hotops/plan.h"

namespace hotops::avgpool {

enum class Layout { nlc, ncl };

// One pass; a model fills the fields directly.
struct Shape {
  Direction dir = Direction::fwd;  // fwd or bwd
  DType dtype = DType::f32;        // of x, y, dy and dx
  Layout layout = Layout::nlc;
  std::int64_t N = 1, L = 1, C = 1;  // samples, positions averaged, channels
  std::size_t in_elements() const { return static_cast<std::size_t>(N * L * C); }
  std::size_t out_elements() const { return static_cast<std::size_t>(N * C); }
  // Offset of x[n, l, c] (or dx's) in the layout.
  std::size_t x_at(std::int64_t n, std::int64_t l, std::int64_t c) const {
    return static_cast<std::size_t>(layout == Layout::nlc ? (n * L + l) * C + c : (n * C + c) * L + l);
  }
};

Shape shape_of(const Problem& p);

// x (fwd) or dy (bwd), uniform in [-1, 1) in the dtype, seeded from the problem name.
struct Inputs {
  HostBuffer x;   // fwd
  HostBuffer dy;  // bwd
};
Inputs make_inputs(const Shape& s, std::uint64_t seed);
HostBuffer make_output(const Shape& s);  // y [N, C] (fwd) or dx (bwd), in the layout

// The reference in double: one element of y (index n·C + c), or of dx (an offset in the layout).
double reference_fwd(const Shape& s, const HostBuffer& x, std::size_t out_index);
double reference_bwd(const Shape& s, const HostBuffer& dy, std::size_t in_index);

// Each element within its own bound (avgpool.cpp derives them).
Check verify(const Shape& s, const Inputs& in, const HostBuffer& out);

// The tensors of one pass: host memory on the CPU, device memory on CUDA.
struct Args {
  const void* x = nullptr;   // fwd: [N, L, C] or [N, C, L]
  const void* dy = nullptr;  // bwd: [N, C]
  void* out = nullptr;       // y [N, C] (fwd) or dx (bwd)
};
HOTOPS_PLAN_FACTORIES(Shape, Args);  // CPU: oneDNN pooling (ncl: hotops' loops where oneDNN's is simple); CUDA: hotops' kernels

// hotops' CPU loops for the ncl layout (cpu_loops.cpp), which make_cpu_plan makes where oneDNN's
// implementation of the pass, `onednn_impl` (named in the label), is its simple one.
std::unique_ptr<Plan> make_cpu_loops_plan(const Shape& s, const std::string& onednn_impl);

std::string onednn_unsupported_reason(const Problem& p);
const Family& family();

}  // namespace hotops::avgpool
