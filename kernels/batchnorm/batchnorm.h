// The batchnorm family: batch normalisation with PyTorch's semantics, 2-D (NCHW, NHWC) and 1-D
// ([batch, C], after a dense layer), in three directions, on oneDNN (CPU), a hand-written CUDA
// kernel and cuDNN (CUDA, `impl:cudnn`). The formulas of fwd, infer and bwd: docs/ops.md, "batchnorm".
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "hotops/buffer.h"
#include "hotops/op.h"
#include "hotops/plan.h"

namespace hotops::batchnorm {

constexpr double kEps = 1e-5;
constexpr double kMomentum = 0.1;

// nc is the 1-D case: [batch, C], which is NHWC with H = W = 1 in memory.
enum class Layout { nchw, nhwc, nc };
const char* layout_name(Layout l);

struct Shape {
  Direction dir = Direction::fwd;  // fwd (training), infer or bwd
  DType dtype = DType::f32;
  Layout layout = Layout::nchw;
  std::int64_t N = 1, C = 1, H = 1, W = 1;
  bool cudnn = false;  // CUDA: cuDNN (`impl:cudnn`) rather than hotops' kernels

  std::int64_t count() const { return N * C * H * W; }
  std::int64_t per_channel() const { return N * H * W; }  // the n each channel's statistics run over
  bool channels_last() const { return layout != Layout::nchw; }
  // The channel of flat element i.
  std::int64_t channel_of(std::int64_t i) const { return channels_last() ? i % C : (i / (H * W)) % C; }
};

Shape shape_of(const Problem& p);

// Which CUDA implementation a problem names: the hand-written kernel (no `impl` arg) or cuDNN.
bool wants_cudnn(const Problem& p);


// Inputs, seeded; which buffers exist depends on the direction.
struct Inputs {
  HostBuffer x;                           // all: [N,C,H,W] in the layout, the dtype
  HostBuffer dy;                          // bwd
  HostBuffer gamma, beta;                 // all: [C] f32 (bwd reads gamma only)
  HostBuffer running_mean, running_var;   // fwd (initial values, updated by the op), infer
  HostBuffer save_mean, save_invstd;      // bwd: the statistics of x, as fwd saves them
};
Inputs make_inputs(const Shape& s, std::uint64_t seed);

struct Outputs {
  HostBuffer out;                          // y (fwd, infer) or dx (bwd)
  HostBuffer save_mean, save_invstd;       // fwd
  HostBuffer running_mean, running_var;    // fwd: the updated running statistics
  HostBuffer dgamma, dbeta;                // bwd
};
Outputs make_outputs(const Shape& s);

// The reference, double accumulation: the per-channel passes are done at construction, then any
// element of `out` is O(1).
class Reference {
 public:
  Reference(const Shape& s, const Inputs& in);
  double out(std::int64_t i) const;  // y or dx
  std::vector<double> save_mean, save_invstd, running_mean, running_var;  // fwd
  std::vector<double> dgamma, dbeta;                                      // bwd

 private:
  const Shape& s_;
  const Inputs& in_;
  std::vector<double> a_, b_, k_;  // per channel: out = a*x + b (fwd, infer); a*dy + b*x + k (bwd)
};

// Every element, for the tests.
void reference(const Shape& s, const Inputs& in, Outputs& out);

// The bound on max|out - ref| / rms(ref) for a per-channel sum over n values accumulated in f32.
double sum_tolerance(std::int64_t n);

// Verifies every output of the direction (out sampled when large) against the reference.
Check verify(const Shape& s, const Inputs& in, const Outputs& out);

// Named shapes from real models (see shapes.cpp).
struct NamedShape {
  std::string name;                    // e.g. "resnet50.layer1"
  std::vector<Layout> layouts;
  std::int64_t C, H, W;                // H = W = 1 for the 1-D layout
  std::vector<std::int64_t> batches;   // default batch sizes
};
const std::vector<NamedShape>& named_shapes();

// The tensors of one batchnorm. x, dy and out are [N, C, H, W] in the shape's layout and dtype;
// the others are [C] f32. A direction leaves the tensors it does not use null.
struct Args {
  const void* x = nullptr;        // all
  const void* dy = nullptr;       // bwd
  const float* gamma = nullptr;   // all
  const float* beta = nullptr;    // all (bwd: oneDNN's backward takes it, though dx does not depend on it)
  float* running_mean = nullptr;  // fwd: updated in place (momentum kMomentum); infer: read
  float* running_var = nullptr;   // fwd: updated in place with the unbiased batch variance; infer: read
  float* save_mean = nullptr;     // fwd: the batch mean, written; bwd: read (as fwd saved it)
  float* save_invstd = nullptr;   // fwd: 1/sqrt(biased batch variance + kEps), written; bwd: read
  void* out = nullptr;            // y (fwd, infer) or dx (bwd)
  float* dgamma = nullptr;        // bwd
  float* dbeta = nullptr;         // bwd
};
HOTOPS_PLAN_FACTORIES(Shape, Args);  // CPU: oneDNN; CUDA: hotops' kernels, or cuDNN where s.cudnn
#ifdef HOTOPS_HAVE_CUDA
std::unique_ptr<Plan> make_kernels_plan(const Shape& s);  // hotops' kernels
std::unique_ptr<Plan> make_cudnn_plan(const Shape& s);    // cuDNN
#endif

std::string onednn_unsupported_reason(const Problem& p);

const Family& family();

}  // namespace hotops::batchnorm
