// The model_convnext family: one ConvNeXt block (model.convnext_block: ConvNeXt-Tiny's, at its stage 1
// and stage 3 widths), a whole training or inference step, chained from the op families' plans: the
// depthwise 7x7 convolution (conv2d, groups = channels), LayerNorm over channels (layernorm), the two
// Linear layers (matmul addmm / mm), GELU (gelu, gelu_dbias), the layer scale with the residual add
// (pointwise scale_residual), the MSE loss (loss mse) and one flat AdamW pass (adamw), on the CPU
// (oneDNN + OpenMP loops) and on CUDA (cuDNN, cublasLt + hotops kernels). Everything is NHWC, so the
// LayerNorm and the Linear layers work on rows of C channels with no transposes. The block's math,
// the directions, bf16 mixed precision and the flat parameter layout: docs/models.md, "The ConvNeXt block".
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "hotops/buffer.h"
#include "hotops/op.h"
#include "kernels/adamw/adamw.h"
#include "kernels/conv2d/conv2d.h"
#include "kernels/gelu/gelu.h"
#include "kernels/gelu/gelu_dbias.h"
#include "kernels/layernorm/layernorm.h"
#include "kernels/layernorm/layernorm_dbias.h"
#include "kernels/loss/mse.h"
#include "kernels/matmul/matmul.h"
#include "kernels/models/models.h"
#include "kernels/models/regression.h"
#include "kernels/pointwise/scale_residual.h"

namespace hotops::model_convnext {

// One block's widths: C channels at H x W (the MLP's hidden width is 4C, the kernel 7x7, padding 3).
// The name is the `shape:` arg of the step's name (the conv2d and layernorm families' shapes of the
// same stage carry the same prefix); the tests add tiny ones.
struct Arch {
  std::string name;
  std::int64_t C, H, W;
  std::vector<std::int64_t> batches;  // benchmarked (none for the tests' architectures)
  std::int64_t hidden() const { return 4 * C; }
  std::int64_t positions() const { return H * W; }  // rows of C per sample
};
constexpr std::int64_t kKernel = 7, kPad = 3;
constexpr double kLnEps = 1e-6;
const std::vector<Arch>& archs();
const Arch& arch_named(const std::string& name);  // throws hotops::Error when unknown

// How a step is run and timed, as for the other model steps (kernels/models/models.h); as model_bert,
// this family has no graph variant (its plain CUDA step is capturable already). e2e moves the input and
// the target host to device from pageable memory and y or the loss back.
using models::Variant;

// bf16: bf16 activations and GEMM/conv operands, f32 masters.
struct Shape : models::StepKind {
  Arch arch;
  std::int64_t rows() const { return batch * arch.positions(); }  // N·H·W
};
// model.convnext_block/<backend>/<dtype>/<infer|train>/shape:<arch>/batch:B[/variant].
Shape shape_of(const Problem& p);

// The op families' shapes of a step's parts, each in the step's dtype over its N·H·W rows:
// the depthwise convolution's pass `d` (fwd with its bias, bwd_weight without: the bias gradient comes
// from the LayerNorm backward's column sums), NHWC, filter [C, 7, 7, 1] (OHWI);
conv2d::Shape dwconv(const Shape& s, Direction d);
// a Linear layer y = x . W + b (addmm fwd, W [in, out] row-major) and its gradients (mm bwd_data, and
// bwd_weight written f32 beside the f32 masters);
matmul::Shape linear(const Shape& s, std::int64_t in, std::int64_t out);
matmul::Shape linear_grad(const Shape& s, Direction d, std::int64_t in, std::int64_t out);
// GELU (erf) over [rows, 4C] and its backward with the first Linear's bias gradient;
gelu::Shape mlp_gelu(const Shape& s);
gelu::dbias::Shape mlp_gelu_bwd(const Shape& s);
// LayerNorm over C (eps 1e-6) and its backward with the convolution's bias gradient;
layernorm::Shape channel_layernorm(const Shape& s);
layernorm::dbias::Shape channel_layernorm_bwd(const Shape& s);
// the layer scale and residual add over [rows, C] (fwd; bwd with the second Linear's bias gradient);
pointwise::scale_residual::Shape layer_scale(const Shape& s, Direction d);
// the train step's loss over y.
loss::mse::Shape output_mse(const Shape& s);

using models::kAlignFloats;
struct ParamLayout {
  std::size_t dw_w, dw_b, ln_g, ln_b, w1, b1, w2, b2, ls;
  std::size_t total = 0;        // floats, padding included
  std::int64_t parameters = 0;  // padding excluded
  std::vector<std::pair<std::size_t, std::size_t>> tensors;  // (offset, count), layout order
  std::vector<std::string> names;
};
ParamLayout param_layout(const Arch& a);

inline adamw::Hyper hyper() { return adamw::Hyper{}; }

// The seeded start, a pure function of the seed and the shape: x and the target uniform in [-1, 1)
// (in the problem's dtype), [batch, H, W, C]; the convolution's weights and bias and the Linear layers'
// uniform in +-1/sqrt(fan_in) (PyTorch's init; fan_in 49 for the depthwise filter); LayerNorm gamma 1,
// beta 0; the layer scale gamma uniform in [0.5, 1.5) per channel (ConvNeXt starts it at 1e-6, which
// would scale every gradient but its own by 1e-6 and leave y = x to 6 digits: a step that dropped the
// whole branch would pass; at ~1 the branch and each channel's scale show). All f32; m = v = 0.
using State = models::regression::State;  // x and the target: [batch, H, W, C]
State make_state(const Shape& s, const ParamLayout& l, std::uint64_t seed);

// Verification's periodic batch (kernels/models/regression.h: nothing in the block mixes samples, the
// LayerNorm is per position), built from the seeded start.
using models::regression::kVerifyPeriod;
State verification_state(const Shape& s, const State& seeded);

// The reference in double over `batch` samples (x and target [batch, H, W, C]): y, and for backward the
// loss and the flat gradients; Rounding::bf16 models a correct bf16 step.
using models::regression::Reference;
using models::regression::Rounding;
Reference reference(const Arch& a, const ParamLayout& l, const std::vector<double>& params, const std::vector<double>& x,
                    const std::vector<double>& target, std::int64_t batch, bool backward,
                    Rounding rounding = Rounding::none);

using models::regression::Outcome;  // y: [batch, H, W, C]
// `start` is verification_state(): compares one step from it with the reference, within the bounds
// of the shape's dtype (model_convnext.cpp says why the encoder layers' bounds fit).
Check verify_outcome(const Shape& s, const ParamLayout& l, const State& start, const Outcome& out);

using BlockCase = models::ModelCase;  // last_loss(): the loss of the last train step

std::unique_ptr<BlockCase> make_cpu(const Problem& p);
using models::regression::cpu_bf16_reason;
#ifdef HOTOPS_HAVE_CUDA
std::unique_ptr<BlockCase> make_cuda(const Problem& p);
#endif

const Family& family();

}  // namespace hotops::model_convnext
