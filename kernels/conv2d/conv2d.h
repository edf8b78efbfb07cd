// The conv2d family: PyTorch's nn.Conv2d (cross-correlation, groups = 1) forward, backward-data
// and backward-weight (with the bias gradient), in NCHW or NHWC, on oneDNN (CPU) and cuDNN (CUDA).
// Names, the three directions' formulas and what the timed run contains: docs/ops.md, "conv2d".
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "hotops/buffer.h"
#include "hotops/op.h"
#include "hotops/op_family.h"

namespace hotops::conv2d {

enum class Layout { nchw, nhwc };

struct Shape {
  Direction dir = Direction::fwd;
  DType dtype = DType::f32;
  Layout layout = Layout::nchw;
  std::int64_t N = 1, C = 1, H = 1, W = 1, K = 1, R = 1, S = 1;
  std::int64_t stride_h = 1, stride_w = 1, pad_h = 0, pad_w = 0, dil_h = 1, dil_w = 1;
  bool bias = false;

  // Output size, as PyTorch computes it.
  std::int64_t P() const { return (H + 2 * pad_h - dil_h * (R - 1) - 1) / stride_h + 1; }
  std::int64_t Q() const { return (W + 2 * pad_w - dil_w * (S - 1) - 1) / stride_w + 1; }

  // Element offsets in the user's buffers.
  std::size_t x_at(std::int64_t n, std::int64_t c, std::int64_t h, std::int64_t w) const;
  std::size_t w_at(std::int64_t k, std::int64_t c, std::int64_t r, std::int64_t s) const;
  std::size_t y_at(std::int64_t n, std::int64_t k, std::int64_t p, std::int64_t q) const;
};

Shape shape_of(const Problem& p);  // throws hotops::Error on a malformed or empty problem

// Inputs in the user's layout, seeded from the problem name (every backend sees the same numbers).
struct Inputs {
  HostBuffer x;   // [N,C,H,W] or [N,H,W,C]   fwd, bwd_weight
  HostBuffer w;   // [K,C,R,S] or [K,R,S,C]   fwd, bwd_data
  HostBuffer b;   // [K]                      fwd with bias
  HostBuffer dy;  // [N,K,P,Q] or [N,P,Q,K]   bwd_data, bwd_weight
};
Inputs make_inputs(const Shape& s, std::uint64_t seed);

// The primary output of a direction (y, dx or dw, in the user's layout) and, for bwd_weight with
// a bias, db.
struct Outputs {
  HostBuffer primary;
  HostBuffer db;
};
Outputs make_outputs(const Shape& s);

// The reference: plain loops, double accumulation (reference.cpp). RefData holds the inputs as
// floats (exact for every dtype), so that sampled references over large problems stay fast.
struct RefData {
  std::vector<float> x, w, b, dy;
};
RefData ref_data(const Inputs& in);
double reference_primary(const Shape& s, const RefData& d, std::size_t idx);  // idx: user layout
double reference_db(const Shape& s, const RefData& d, std::int64_t k);
void reference(const Shape& s, const Inputs& in, Outputs& out);  // every element, for the tests

// Verifies outputs (sampled when large) against the reference.
Check verify(const Shape& s, const Inputs& in, const Outputs& out);

// Named layers from real models (shapes.cpp).
struct NamedShape {
  std::string name;  // e.g. "resnet50.res2_3x3"
  std::int64_t C, H, W, K, R, S, stride, pad;
  bool bias;
  std::vector<std::int64_t> batches;  // default batch sizes
};
const std::vector<NamedShape>& named_shapes();

HOTOPS_FAMILY_ENTRY_POINTS(make_cpu, cpu_unsupported_reason, make_cuda);

}  // namespace hotops::conv2d
