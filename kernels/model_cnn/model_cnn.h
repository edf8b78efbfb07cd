// The model_cnn family: whole training and inference steps of the CPU-vs-GPU studies' convnets
// (model.keras_cnn, model.vgg_cifar), chained from hotops' building blocks: the conv2d, batchnorm
// (batchnorm_relu_maxpool, batchnorm_relu), matmul and maxpool families' plans + OpenMP loops on the CPU; cuDNN convolutions,
// cublasLt GEMMs, hand-written fused kernels for batch normalization, ReLU, max-pooling and dropout,
// the models family's softmax cross-entropy and flat AdamW on CUDA. The architectures, layouts,
// directions, bf16 mixed precision and the fixed dropout masks: docs/models.md, "The convnets"; the
// data-parallel train steps of the convnets without batch normalization: docs/scaling.md.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "hotops/buffer.h"
#include "hotops/op.h"
#include "kernels/adamw/adamw.h"
#include "kernels/models/models.h"
#include "kernels/pointwise/pointwise.h"

namespace hotops::model_cnn {

using models::ModelCase;
using models::Variant;

struct Conv {
  std::int64_t out;  // output channels (3x3 kernel, stride 1)
  bool same;         // padding 1 (Keras "same") or 0 ("valid")
};
struct Stage {
  std::vector<Conv> convs;  // each followed by [BN], ReLU
  std::int64_t pool;        // max-pool window and stride
  double dropout;           // after the pool
};
// A named architecture: keras_cnn and vgg_cifar are benchmarked, keras_test and vgg_test are the
// tests' tiny ones (the same structure at a few pixels and channels).
struct Arch {
  std::string name;
  std::int64_t H, W, C;  // input
  bool bn;               // every conv and the hidden dense layer followed by batch normalization
  std::vector<Stage> stages;
  std::int64_t hidden;  // dense -> [BN] -> ReLU -> dropout
  double hidden_dropout;
  std::int64_t classes;
  std::vector<std::int64_t> batches;  // benchmarked batch sizes (none for the test architectures)
  bool cuda_nchw = false;  // CudaLayout::measured's layout for this architecture (cuda_model_cnn.cu)
};
const std::vector<Arch>& archs();
const Arch& arch_named(const std::string& name);  // throws hotops::Error when unknown

constexpr double kBnEps = 1e-3;       // Keras' BatchNormalization epsilon
constexpr double kBnMomentum = 0.01;  // the weight of the batch statistics (Keras momentum 0.99)

// One conv layer, unrolled from the stages, with its input and output sizes.
struct ConvLayer {
  std::int64_t C, H, W;  // input
  std::int64_t K, P, Q;  // output
  std::int64_t pad;
  std::int64_t pool;     // > 0: the last conv of its stage, followed by max-pool `pool` and dropout
  std::int64_t PH, PW;   // the pooled size (pool > 0)
  double dropout;
  std::int64_t in_count() const { return H * W * C; }   // per sample
  std::int64_t out_count() const { return P * Q * K; }  // per sample
  std::int64_t pooled_count() const { return PH * PW * K; }
};
std::vector<ConvLayer> conv_layers(const Arch& a);
std::int64_t flat_width(const Arch& a);  // the flatten's width

struct Shape : models::StepKind {
  Arch arch;
  std::vector<ConvLayer> convs;
};
Shape shape_of(const Problem& p);

// The trainable parameters in one flat buffer, each tensor on a 256-byte boundary, padding zero; the
// gradients, AdamW's m and v in buffers of the same layout. Per conv layer: W [K][3][3][C], b [K],
// then (bn) gamma [K], beta [K]; dense 1: W [flat, hidden], b, (bn) gamma, beta; dense 2: W
// [hidden, classes], b. The running statistics (mean [K], var [K] per batch norm, conv layers then
// the dense one) lie in a second buffer, `stats`, that AdamW does not touch.
constexpr std::size_t kAlignFloats = 64;
struct Layer {
  std::size_t w = 0, b = 0, gamma = 0, beta = 0;  // parameter offsets (gamma/beta: bn only)
  std::size_t mean = 0, var = 0;                  // stats offsets (bn only)
};
struct ParamLayout {
  std::vector<Layer> conv;
  Layer dense1, dense2;
  std::size_t total = 0;        // floats, padding included
  std::int64_t parameters = 0;  // trainable, padding excluded
  std::size_t stats = 0;        // running statistics (floats, no padding)
  std::vector<std::pair<std::size_t, std::size_t>> tensors;  // (offset, count), layout order
  std::vector<std::string> names;
  std::vector<bool> zero_grad;  // a conv or dense bias before batch norm: gradient zero by construction
};
ParamLayout param_layout(const Arch& a);

inline adamw::Hyper hyper() { return models::hyper(); }

// The dropout layers: one per stage, then the hidden one. Keys from the problem's seed (not its
// backend): every backend draws the same masks.
std::vector<pointwise::DropoutKey> dropout_keys(const Arch& a, std::uint64_t seed);

// The learnable synthetic task and the start, pure functions of the seed: x uniform in [-1, 1);
// label = argmax of a fixed random linear teacher map of x; weights and biases uniform in
// +-1/sqrt(fan_in) (PyTorch's conv and linear init); batch-norm gamma in [0.9, 1.1), beta in [-0.1,
// 0.1), running mean in [-0.1, 0.1), running variance in [0.9, 1.1) (near Keras' 1, 0, 0, 1 and
// different per channel, so that a wrong channel shows); m = v = 0.
struct State {
  HostBuffer x;                      // [batch, H, W, C] in the problem's dtype (bf16: what the reference sees)
  std::vector<std::int32_t> labels;  // [batch]
  HostBuffer params, m, v, stats;
};
State make_state(const Shape& s, const ParamLayout& l, std::uint64_t seed);
// The same start, made once per process and shared by every way of running the step (the CPU's
// threads:T, CUDA's plain, e2e:1 and graph:1 runs: one step_seed), the last one kept; how many were
// made (for the tests).
std::shared_ptr<const State> seeded_state(const Shape& s, const ParamLayout& l, std::uint64_t seed);
std::size_t& seeded_states_made();

// Verification runs the step on a batch whose samples repeat with period `period` (sample b is sample
// b % period of the seeded batch, masks included through mask_period): the batch statistics, the loss
// and the gradients are then those of the `period` distinct samples, each weighted by how often it
// occurs, so the double reference runs `period` samples however large the batch. Sixteen distinct
// samples keep the hidden batch norm well conditioned: with four, a few of keras_cnn's 1024 hidden
// units had a batch deviation under a tenth of their mean (|z| rstd up to 30, where most are near 1),
// which magnifies bf16's rounding of z into ReLU decisions and gradients beyond any fair bound; with 16,
// |z| rstd stays under 8 (measured on the H100; docs/models.md).
constexpr std::int64_t kVerifyPeriod = 16;
std::int64_t verify_period(const Shape& s);
State verification_state(const Shape& s, const State& seeded);

// The implementation's own decisions for the reference's near-ties: per conv layer its post-ReLU
// output [batch, P, Q, K] and the hidden layer's [batch, hidden] (see model_cnn.cpp, verification),
// and the tie factor (reference.cpp's tie_bands turns it into each channel's band).
struct Hints {
  std::vector<const float*> conv;
  const float* hidden = nullptr;
  double band = 1e-4;
};

// The reference in double over `samples` distinct samples, sample q weighted by count[q] (the batch is
// their sum): logits of the distinct samples, and for train the loss, the flat gradients and the
// running statistics after the step. With keep_acts (train), also its own post-ReLU activations in
// Hints' layout, for a test to pose as an implementation that decided its ties.
struct Reference {
  std::vector<double> logits;  // [samples, classes]
  double loss = 0;
  std::vector<double> grad;
  // train: per gradient element, sqrt(n) times a bound of the sum of |terms| of the n-term sum over
  // the batch that makes it (Cauchy-Schwarz over the channel's values): the scale of what an f32
  // sum of those terms carries, in units of u (verify_outcome's allowance; 0 where the sum is short).
  std::vector<double> summed;
  std::vector<double> stats;
  std::vector<std::vector<float>> relu;  // keep_acts: per conv layer [samples, P, Q, K]
  std::vector<float> hidden;             // keep_acts: [samples, hidden]
};
Reference reference(const Shape& s, const ParamLayout& l, const std::vector<pointwise::DropoutKey>& keys,
                    const std::vector<double>& params, const std::vector<double>& stats, const std::vector<double>& x,
                    const std::vector<std::int32_t>& labels, const std::vector<std::int64_t>& count, bool train,
                    const Hints* hints = nullptr, bool keep_acts = false);

struct Outcome {
  HostBuffer logits;                 // infer: [batch, classes]
  float loss = 0;                    // train
  HostBuffer grads, params, stats;   // train: after the step
  // train, of the leading verify_period samples (the reference's; a longer buffer is read that far):
  std::vector<HostBuffer> relu;      // per conv layer, post-ReLU [samples, P, Q, K]
  HostBuffer hidden;                 // post-ReLU hidden [samples, hidden] (before dropout)
};
// `start` is verification_state(): compares one step from it with the reference.
Check verify_outcome(const Shape& s, const ParamLayout& l, const std::vector<pointwise::DropoutKey>& keys,
                     const State& start, const Outcome& out);

// How a CUDA train step computes a conv layer's input gradient: per layer at setup, whichever of
// cuDNN's backward data and the forward conv with the flipped filter timed faster (the default:
// forward_flip_is_faster), or forced to one of them (tests, so that both paths are verified at any
// shape). Process-wide, read when a case is made; the label names each layer's choice.
enum class DataGradPath { timed, backward_data, forward_flip };
void set_cuda_data_grad_path(DataGradPath p);
DataGradPath cuda_data_grad_path();

// DataGradPath::timed's choice from the two plans' times (conv2d::CudaChoice::ms): the flipped
// filter's forward conv only when it is faster than backward data beyond a near tie
// (gpu::kRetimeTie); on a near tie backward data, which needs no flipped copy of the filter, so
// that timings a few percent apart do not pick the path by process.
// CUDA builds only.
bool forward_flip_is_faster(float flip_ms, float data_ms);

// The layout of a CUDA step's conv activations (the flat parameters and the flatten keep the model's
// NHWC order whatever it is): NCHW, where cuDNN has f32 implicit-GEMM, Winograd and FFT kernels for all
// three passes (its NHWC f32 kernels are generic ones, several times slower at these models' shapes), or
// NHWC. `measured` takes NHWC for bf16 and the architecture's `cuda_nchw` for f32 (see
// cuda_model_cnn.cu's use_nchw for why); tests force each. Process-wide, read when a case is made; the label says which.
enum class CudaLayout { measured, nhwc, nchw };
void set_cuda_layout(CudaLayout l);
CudaLayout cuda_layout();

// [n][h][w][c] -> [n][c][h][w] on the host (or back, inverse), any dtype: the images into a backend's
// NCHW order at setup (outside the timing: the program holds its batch in the order its model takes),
// and the CUDA verification's activations back.
HostBuffer nhwc_to_nchw(const HostBuffer& x, std::int64_t N, std::int64_t H, std::int64_t W, std::int64_t C, bool inverse = false);

// Why a data-parallel step (gpus:G) of architecture `a` is not one hotops has ("" when it is): one
// with batch normalization, whose replicas would each normalise by their own shard's statistics
// (DDP without SyncBatchNorm), which is not a step over the global batch (docs/scaling.md).
std::string data_parallel_arch_reason(const Arch& a);

HOTOPS_MODEL_ENTRY_POINTS(cpu_unsupported_reason);

}  // namespace hotops::model_cnn
