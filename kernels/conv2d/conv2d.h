// The conv2d family: PyTorch's nn.Conv2d (cross-correlation, any groups: depthwise at groups = C)
// forward, backward-data and backward-weight (with the bias gradient), in NCHW or NHWC, on oneDNN
// (CPU) and cuDNN (CUDA; a first layer's forward also hotops' direct kernel, cuda_direct.h).
// Names, the three directions' formulas and what the timed run contains: docs/ops.md, "conv2d".
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "hotops/buffer.h"
#include "hotops/op.h"
#include "hotops/op_family.h"
#include "hotops/plan.h"

namespace hotops::conv2d {

enum class Layout { nchw, nhwc };

// One convolution pass. A model fills the fields directly: the defaults are a 1x1 convolution with
// stride 1, no padding or dilation, no bias, on tensors in the user's layout.
struct Shape {
  Direction dir = Direction::fwd;  // fwd, bwd_data or bwd_weight
  DType dtype = DType::f32;
  Layout layout = Layout::nchw;  // of x, y and their gradients; weights OIHW (nchw) or OHWI (nhwc)
  std::int64_t N = 1, C = 1, H = 1, W = 1;  // the input: batch, channels, rows, columns
  std::int64_t K = 1, R = 1, S = 1;         // output channels, filter rows and columns
  std::int64_t stride_h = 1, stride_w = 1, pad_h = 0, pad_w = 0, dil_h = 1, dil_w = 1;  // as PyTorch's
  // PyTorch's groups: C and K split into `groups` equal parts, output channel k seeing only the input
  // channels of its part (k / (K / groups)); the filter is [K, C / groups, R, S]. groups = C = K is a
  // depthwise convolution (ConvNeXt's 7x7).
  std::int64_t groups = 1;
  bool bias = false;  // fwd adds b; bwd_weight also computes db
  // CPU only: x, w, dy and the pass's output (y, dx or dw) are in the layouts oneDNN chose for this
  // pass (onednn_bytes, to_onednn_layout), as a framework keeps them between layers, so a run is the
  // convolution alone. Off: they are in the user's layout, and a run also reorders them where
  // oneDNN's layouts differ. The bias and db are plain [K] either way; CUDA always takes the user's.
  bool onednn_layouts = false;
  // CPU only, for a model's layers (the defaults are what the benchmark runs):
  // `relu`: fwd with a ReLU post-op, y = max(conv + b, 0). The backward passes build their forward
  // hint with it too, as a training step's backward primitives come from its forward.
  bool relu = false;
  // `inference`: fwd is oneDNN's forward_inference (else forward_training).
  bool inference = false;
  // `f32_params` (bf16): the user's w, b, dw and db are f32 (a model's master parameters): the
  // primitive takes b and writes dw and db in f32, and w is reordered (cast) into its bf16 layout.
  bool f32_params = false;
  // Where the primitive takes x (dx) and y (dy): in a layout oneDNN picks (onednn: the caller's
  // buffers in it with onednn_layouts, else in `layout`, reordered by the run), or fixed in NCHW or
  // NHWC, taken from the caller's buffers as they are (the weights stay in `layout`'s order).
  enum class Pick { onednn, nchw, nhwc };
  Pick x_pick = Pick::onednn, y_pick = Pick::onednn;
  // `w_from_user` (with onednn_layouts): w (or dw) stays in the user's layout, and the run reorders
  // it into (or out of) the primitive's, e.g. bf16 weights cast from f32 master weights each step.
  bool w_from_user = false;
  // CUDA only: how the plan chooses its algorithm (cuda_cudnn.cu). `retime`: Find's first usable
  // results are timed again and the fastest kept (every benchmark and model step); off, Find's
  // fastest is taken as Find timed it (gpu::ConvPick). `tensor_ops_only` (bf16): only the
  // results that ran with tensor-op math, for a caller whose label promises tensor-op convolutions;
  // off, bf16 takes Find's result with whatever math it ran.
  bool retime = true;
  bool tensor_ops_only = false;

  // Output size, as PyTorch computes it.
  std::int64_t P() const { return (H + 2 * pad_h - dil_h * (R - 1) - 1) / stride_h + 1; }
  std::int64_t Q() const { return (W + 2 * pad_w - dil_w * (S - 1) - 1) / stride_w + 1; }
  // The input and output channels of one group.
  std::int64_t Cg() const { return C / groups; }
  std::int64_t Kg() const { return K / groups; }

  // Element offsets in the user's buffers; w_at's c is the channel within k's group (< Cg()).
  std::size_t x_at(std::int64_t n, std::int64_t c, std::int64_t h, std::int64_t w) const;
  std::size_t w_at(std::int64_t k, std::int64_t c, std::int64_t r, std::int64_t s) const;
  std::size_t y_at(std::int64_t n, std::int64_t k, std::int64_t p, std::int64_t q) const;
};

// The problem's shape (throws hotops::Error on a malformed or empty problem); on the CPU with
// onednn_layouts, as the benchmark times it.
Shape shape_of(const Problem& p);

// Inputs in the user's layout, seeded from the problem name (every backend sees the same numbers).
struct Inputs {
  HostBuffer x;   // [N,C,H,W] or [N,H,W,C]   fwd, bwd_weight
  HostBuffer w;   // [K,Cg,R,S] or [K,R,S,Cg] fwd, bwd_data (Cg = C / groups)
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
std::size_t primary_count(const Shape& s);  // the elements of the pass's output: y, dx or dw

// The reference: plain loops, double accumulation (reference.cpp). RefData reads the inputs as
// floats (exact for every dtype), so that sampled references over large problems stay fast: an f32
// input in place (the RefData lives no longer than the Inputs), another dtype converted once. A
// direction's unused inputs are null.
class RefData {
 public:
  explicit RefData(const Inputs& in);
  RefData(const RefData&) = delete;
  RefData& operator=(const RefData&) = delete;
  const float* x = nullptr;
  const float* w = nullptr;
  const float* b = nullptr;
  const float* dy = nullptr;

 private:
  const float* floats(const HostBuffer& h);
  std::vector<std::vector<float>> converted_;
};
double reference_primary(const Shape& s, const RefData& d, std::size_t idx);  // idx: user layout
double reference_db(const Shape& s, const RefData& d, std::int64_t k);
// The whole weight gradient (dw in user layout, w_at's order) and, with a bias, db: one pass over x
// and dy, each image's sums in an array of its own (the images in parallel), then added image by
// image, so that every element is the same for any thread count. For an NHWC gradient of few
// weights this is far cheaper than a sample of reference_primary's sums, each of which reads one
// channel of every pixel, a cache line for each.
struct WeightGrads {
  std::vector<double> dw, db;
};
WeightGrads reference_weight_grads(const Shape& s, const RefData& d);
void reference(const Shape& s, const Inputs& in, Outputs& out);  // every element, for the tests

// The reference at the elements verify() checks: the output (y, dx or dw) at idx, db at db_idx, and
// their bound. A function of the shape and the seeded inputs alone.
struct Sampled {
  std::size_t count = 0;  // the output's elements
  std::vector<std::size_t> idx, db_idx;
  std::vector<double> ref, db_ref;
  double tol = 0;
};
Sampled sampled_reference(const Shape& s, const Inputs& in);

// Verifies outputs (sampled when large) against the reference. With a `key` (what the inputs are
// made of: the problem's seed and shape), the sampled reference is computed once for the entries
// of a problem, its CPU and CUDA ones (shared_reference).
Check verify(const Shape& s, const Inputs& in, const Outputs& out, const std::string& key = "");

// Named layers from real models (shapes.cpp).
struct NamedShape {
  std::string name;  // e.g. "resnet50.res2_3x3"
  std::int64_t C, H, W, K, R, S, stride, pad;
  bool bias;
  std::vector<std::int64_t> batches;  // default batch sizes
  // Also listed fwd with its ReLU fused (relu:1, NHWC, CPU): a convnet step's conv + bias + ReLU.
  bool relu = false;
  std::int64_t groups = 1;  // named `groups:` where not 1
};
const std::vector<NamedShape>& named_shapes();

// The tensors of one pass, each in the layout the Shape says (the user's, or oneDNN's on the CPU
// with onednn_layouts). On the CPU host memory, on CUDA device memory.
struct Args {
  const void* x = nullptr;   // fwd, bwd_weight: the input [N,C,H,W]
  const void* w = nullptr;   // fwd, bwd_data: the filter [K,C/groups,R,S]
  const void* b = nullptr;   // fwd with bias: [K]
  const void* dy = nullptr;  // bwd_data, bwd_weight: the output's gradient [N,K,P,Q]
  void* out = nullptr;       // y [N,K,P,Q] (fwd), dx [N,C,H,W] (bwd_data) or dw [K,C/groups,R,S] (bwd_weight)
  void* db = nullptr;        // bwd_weight with bias: [K]
};
HOTOPS_PLAN_FACTORIES(Shape, Args);  // CPU: oneDNN, or the depthwise loops below; CUDA: cuDNN, the algorithm searched when it is built

// The CPU weight gradient of a depthwise convolution (groups = C = K) wider than 3 columns, on the
// caller's NHWC tensors (x_pick and y_pick nhwc, no onednn_layouts), dilation 1: hotops' loops
// (cpu_depthwise.cpp), where oneDNN 2.6 has no depthwise kernel (ConvNeXt's 7x7). make_cpu_plan
// makes it for such a shape; shape_of gives the CPU benchmark such a shape for such a problem.
bool cpu_depthwise_loops_take(const Shape& s);
std::unique_ptr<Plan> make_cpu_depthwise_plan(const Shape& s);

// What a CUDA plan's search chose: the cudnnConvolution*Algo_t of its pass (or hotops' direct kernel
// for a first layer's forward, where it timed faster), the workspace it keeps
// and the time it was chosen by (ms a call: its re-timing where the search re-timed, else
// cudnnFind's), for a caller that names the algorithm or chooses between two ways of computing one
// gradient (model_cnn: backward data, or a forward convolution with the flipped filter). Throws
// hotops::Error for a plan that is not a CUDA conv2d plan.
struct CudaChoice {
  int algo = -1;  // kCudaDirectAlgo: hotops' direct kernel (cuda_direct.h), no workspace
  std::size_t workspace = 0;
  float ms = 0;
};
constexpr int kCudaDirectAlgo = -1;
CudaChoice cuda_choice(const Plan& p);
// Runs a CUDA plan on the caller's workspace (at least cuda_choice(p).workspace bytes, kept alive while
// the plan runs) instead of its own, which it frees: plans that never run at once can share one
// (model_cnn's layers share the largest their passes need, as a framework's caching allocator does).
void use_cuda_workspace(Plan& p, void* workspace, std::size_t bytes);

// oneDNN's layouts of a CPU pass (Shape::onednn_layouts): each tensor's size in bytes in the layout
// the pass's primitive chose (it may pad channels), and the reorders between it and the user's.
enum class Tensor { x, w, y };  // y: y or dy; x and w: also their gradients
std::size_t onednn_bytes(const Shape& s, Tensor t);
void to_onednn_layout(const Shape& s, Tensor t, const void* user, void* onednn);
void to_user_layout(const Shape& s, Tensor t, const void* onednn, void* user);

std::string cpu_unsupported_reason(const Problem& p);
const Family& family();

}  // namespace hotops::conv2d
