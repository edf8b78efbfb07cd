// batchnorm_relu_maxpool: the batchnorm family's fused op of a convnet layer (Keras' convnets, NHWC or
// NCHW): y = relu(BN(z)), max-pooled over k x k windows with stride k (the rows and columns a window does
// not fill are cropped), then dropout; and its backward to dz, dgamma, dbeta. fwd normalises with
// the batch statistics (Keras' training mode) and updates the running ones; infer uses the running
// ones. batchnorm_relu is the same op without the pool (Shape::pool false: a dense layer's, or a conv's
// that another conv follows), its dropout over each sample's elements. The formulas: docs/ops.md,
// "batchnorm_relu_maxpool" and "batchnorm_relu".
#pragma once
#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "hotops/buffer.h"
#include "hotops/op.h"
#include "hotops/plan.h"
#include "kernels/batchnorm/batchnorm.h"
#include "kernels/pointwise/pointwise.h"

namespace hotops::batchnorm::relu_maxpool {

constexpr double kKerasEps = 1e-3;       // Keras' BatchNormalization epsilon
constexpr double kKerasMomentum = 0.01;  // the weight of the batch statistics (Keras momentum 0.99)

struct Shape {
  Direction dir = Direction::fwd;  // fwd (training), infer or bwd
  DType dtype = DType::f32;        // z, the pooled output and their gradients; the rest f32
  std::int64_t N = 1, C = 4, H = 1, W = 1;  // z: N samples of C channels of H x W
  bool pool = true;                // false: batchnorm_relu (k = 1, no argmax bytes)
  std::int64_t k = 2;              // the pool's window and stride
  double dropout = 0;              // fwd and bwd: the rate after the pool (0: none); infer: none
  pointwise::DropoutKey key;       // the dropout mask's key
  // false: the affine is the conv's bias alone (a layer without batch normalization)
  bool bn = true;
  double eps = kKerasEps, momentum = kKerasMomentum;
  // z's (and dz's) storage: nhwc, or nchw (each channel's H x W plane contiguous). The pooled output,
  // its gradient and argmax bytes: pooled_layout, the same as z's or, from nchw z, nhwc (the order a
  // flatten after the last pool reads).
  Layout layout = Layout::nhwc, pooled_layout = Layout::nhwc;

  std::int64_t PH() const { return H / k; }
  std::int64_t PW() const { return W / k; }
  std::int64_t count() const { return N * H * W * C; }
  std::int64_t pooled() const { return N * PH() * PW() * C; }
  bool drops() const { return dir != Direction::infer && dropout > 0; }

  // Storage index of z's element i and of pooled element j, each counted in NHWC order (n, h, w, c);
  // and back, from a storage index to the NHWC-order one.
  std::int64_t z_index(std::int64_t i) const { return reorder(i, layout, H, W, true); }
  std::int64_t pooled_index(std::int64_t j) const { return reorder(j, pooled_layout, PH(), PW(), true); }
  std::int64_t z_order(std::int64_t i) const { return reorder(i, layout, H, W, false); }
  std::int64_t pooled_order(std::int64_t j) const { return reorder(j, pooled_layout, PH(), PW(), false); }
  // z's lines (for_z_lines): N H rows of W x C elements in NHWC, N C H rows of W in NCHW.
  std::int64_t z_lines() const { return layout == Layout::nchw ? N * C * H : N * H; }

 private:
  // NHWC-order index -> storage index in layout l (to_storage), or back, over planes of h x w.
  std::int64_t reorder(std::int64_t i, Layout l, std::int64_t h, std::int64_t w, bool to_storage) const {
    if (l != Layout::nchw) return i;
    const std::int64_t plane = h * w;
    if (to_storage) return (i / (plane * C) * C + i % C) * plane + (i / C) % plane;  // (n, c, hw)
    return (i / (plane * C) * plane + i % plane) * C + (i / plane) % C;              // (n, hw, c)
  }
};

Shape shape_of(const Problem& p);

// f(k, c, n, h, w) for each element of z's lines [r0, r1) (Shape::z_lines), in storage order: k its
// storage index, c its channel, (n, h, w) its place. What a pass over z splits among threads.
template <class F>
void for_z_lines(const Shape& s, std::int64_t r0, std::int64_t r1, F&& f) {
  for (std::int64_t r = r0; r < r1; ++r) {
    const std::int64_t h = r % s.H;
    if (s.layout == Layout::nchw) {
      const std::int64_t c = (r / s.H) % s.C, n = r / (s.H * s.C);
      for (std::int64_t w = 0; w < s.W; ++w) f(r * s.W + w, c, n, h, w);
    } else {
      const std::int64_t n = r / s.H;
      for (std::int64_t w = 0, k = r * s.W * s.C; w < s.W; ++w)
        for (std::int64_t c = 0; c < s.C; ++c, ++k) f(k, c, n, h, w);
    }
  }
}

// Inputs, seeded; which buffers exist depends on the direction.
struct Inputs {
  HostBuffer z;                          // all: [N, H, W, C], the conv's output without its bias
  HostBuffer gamma, beta, bias;          // [C] f32 (bwd reads gamma only)
  HostBuffer running_mean, running_var;  // fwd (initial values, updated), infer
  HostBuffer period;                     // fwd, bwd: one int32, the dropout mask's sample period
  HostBuffer dout;                       // bwd: the gradient of the pooled output
  HostBuffer arg;                        // bwd, pool: the argmax byte of each pooled element, as fwd wrote it
  HostBuffer scale, shift, mean, rstd;   // bwd: [C] f32, as fwd saved them
};
Inputs make_inputs(const Shape& s, std::uint64_t seed);

struct Outputs {
  HostBuffer out, arg;                   // fwd, infer: pooled [N, PH, PW, C] and its argmax bytes (pool)
  HostBuffer scale, shift, mean, rstd;   // fwd, infer: the affine (y = z scale + shift); fwd: the statistics
  HostBuffer running_mean, running_var;  // fwd: the updated running statistics
  HostBuffer dz, dgamma, dbeta, dbias;   // bwd
};
Outputs make_outputs(const Shape& s);

// The reference, double: per-channel passes at construction, then any output element is O(1).
// Element indices count in NHWC order whatever the storage (Shape::z_index, pooled_index).
class Reference {
 public:
  Reference(const Shape& s, const Inputs& in);
  double pre(std::int64_t i) const;     // relu(z scale + shift) at z's element i (fwd, infer)
  // ... at z's storage index k, of channel c (inline: input generation calls it at every element)
  double pre_at(std::int64_t k, std::int64_t c) const {
    const auto cc = static_cast<std::size_t>(c);
    return std::max(in_.z.get(static_cast<std::size_t>(k)) * scale[cc] + shift[cc], 0.0);
  }
  double out(std::int64_t j) const;     // pooled element j after dropout (fwd, infer)
  double pooled(std::int64_t j) const;  // its window's maximum, before dropout
  double dz(std::int64_t i) const;      // bwd
  std::int64_t window_start(std::int64_t j) const;  // z's index of pooled element j's window corner
  std::vector<double> scale, shift, mean, rstd, running_mean, running_var;  // fwd, infer
  std::vector<double> dgamma, dbeta, dbias;                                 // bwd

 private:
  double z(std::int64_t i) const;     // z's element i
  double keep(std::int64_t j) const;  // pooled element j's dropout factor
  double dy(std::int64_t i) const;    // bwd: the gradient reaching z's element i through pool and ReLU
  // ... from its storage index k, channel c and place (n, h, w)
  double dy(std::int64_t k, std::int64_t c, std::int64_t n, std::int64_t h, std::int64_t w) const;
  const Shape& s_;
  const Inputs& in_;
  std::vector<double> a_, b0_, c0_;  // bwd: dz = a dy + b0 + c0 xhat
};

Check verify(const Shape& s, const Inputs& in, const Outputs& out);

// The tensors of one run, in the shape's layouts. z, out, dout and dz are the shape's dtype; arg one
// byte a pooled element; the rest [C] f32. A direction leaves the tensors it does not use null.
struct Args {
  const void* z = nullptr;            // all
  const float* gamma = nullptr;       // bn: fwd, infer, bwd
  const float* beta = nullptr;        // bn: fwd, infer
  const float* bias = nullptr;        // fwd, infer: the conv's bias (the running mean is of z + bias)
  float* running_mean = nullptr;      // bn: fwd updated in place; infer read
  float* running_var = nullptr;       // bn: fwd updated in place (the unbiased batch variance); infer read
  const int* period = nullptr;        // dropout: sample n draws the mask of sample (first_sample + n) % *period
  std::int64_t first_sample = 0;      // dropout: the position of sample 0 in the batch the masks are drawn for
                                      // (a data-parallel replica's shard of a global batch: rank x its batch)
  void* out = nullptr;                // fwd, infer
  std::uint8_t* arg = nullptr;        // pool: fwd, infer written (r * k + t in the window); bwd read
  float* scale = nullptr;             // fwd, infer written; bwd read
  float* shift = nullptr;             // fwd, infer written; bwd read
  float* mean = nullptr;              // bn: fwd written (of z), bwd read
  float* rstd = nullptr;              // bn: fwd written (1 / sqrt(biased variance + eps)), bwd read
  const void* dout = nullptr;         // bwd
  void* dz = nullptr;                 // bwd
  float* dgamma = nullptr;            // bn: bwd
  float* dbeta = nullptr;             // bn: bwd
  float* dbias = nullptr;             // bwd: zero with batch norm (it removes the bias)
};
HOTOPS_PLAN_FACTORIES(Shape, Args);  // CPU: OpenMP loops; CUDA: hotops' fused kernels

// relu(z scale + shift) at every element of z, f32, in z's layout (no pool, no dropout): the values the
// CPU plan's forward compares, by its own expression (a model's verification reads the ReLU and pool
// decisions its step took from them).
void cpu_activation(const Shape& s, const void* z, const float* scale, const float* shift, float* out);

// Whether `s` is one the CUDA kernels take (k <= 15; NHWC: C / 4 divides their 256 threads): "" or why not.
std::string cuda_unsupported_reason(const Shape& s);

// The family's problems of this op (benchmark and test), and its work.
std::vector<Problem> benchmark_problems(const std::vector<std::int64_t>& batches);
std::vector<Problem> test_problems();
Work work(const Problem& p);
std::unique_ptr<Case> make_case(const Problem& p);

constexpr const char* kOp = "batchnorm_relu_maxpool";
constexpr const char* kReluOp = "batchnorm_relu";  // the op without the pool
// Whether p is one of the two ops.
inline bool is_op(const Problem& p) { return p.op == kOp || p.op == kReluOp; }

}  // namespace hotops::batchnorm::relu_maxpool
