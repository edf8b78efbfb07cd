// The model_bert family: one transformer encoder layer (model.bert_layer: BERT-base, post-LN;
// model.vit_layer: ViT-B/16, pre-LN), a whole training or inference step, chained from GEMMs and
// hand-written kernels, on the CPU (oneDNN matmuls, the attention family's plan + OpenMP loops) and on
// CUDA (cublasLt GEMMs, the attention family's plan + hand-written kernels). The layer's math, the
// directions, bf16 mixed precision and the flat parameter layout: docs/models.md, "The encoder layers".
// The architecture is parametric (Arch) so that the tests can use tiny widths.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "hotops/buffer.h"
#include "hotops/op.h"
#include "kernels/adamw/adamw.h"
#include "kernels/attention/attention.h"
#include "kernels/gelu/gelu.h"
#include "kernels/gelu/gelu_dbias.h"
#include "kernels/layernorm/layernorm.h"
#include "kernels/layernorm/layernorm_dbias.h"
#include "kernels/loss/mse.h"
#include "kernels/matmul/bias_grad.h"
#include "kernels/matmul/matmul.h"
#include "kernels/models/models.h"
#include "kernels/models/regression.h"

namespace hotops::model_bert {

struct Arch {
  std::string name;
  std::int64_t seq, hidden, heads, ffn;
  bool pre_ln;
  double ln_eps;
  std::vector<std::int64_t> batches;  // benchmarked
  std::int64_t head_dim() const { return hidden / heads; }
};
const std::vector<Arch>& archs();
const Arch& arch_named(const std::string& name);  // throws hotops::Error when unknown

// How a step is run and timed, as for the other model steps (kernels/models/models.h); this family
// has no graph variant (its plain CUDA step is capturable already). e2e moves the input and the
// target host to device from pageable memory and y or the loss back.
using models::Variant;

struct Shape : models::StepKind {
  Arch arch;
  std::int64_t tokens() const { return batch * arch.seq; }
};
Shape shape_of(const Problem& p);

// The multi-head attention of a step (fwd) or its gradient (bwd) on the heads of the step's QKV
// buffer, in the step's dtype: the attention family's plan runs it.
attention::Shape self_attention(const Shape& s, Direction d);

// A dense layer of a step, y[tokens, out] = x[tokens, in] . W[in, out] + b, with W and b where the
// flat layout keeps them (W row-major [in, out], so not transposed), in the step's dtype; with
// `residual`, a skip connection added to y through the GEMM (the matmul family's Shape::residual).
// The matmul family's plan runs it (addmm fwd), its algorithm timed at setup on CUDA.
matmul::Shape dense_layer(const Shape& s, std::int64_t in, std::int64_t out, bool residual);
// Its gradients, without the bias's (see bias_gradient): dx = dy . W^T
// (bwd_data; with `residual`, a gradient added through the GEMM) or dW = x^T . dy (bwd_weight, stored
// f32 in either dtype, beside the f32 master parameters): the matmul family's mm plans.
matmul::Shape dense_grad(const Shape& s, Direction d, std::int64_t in, std::int64_t out, bool residual);
// A dense layer's bias gradient where no fused op computes it (bert: the QKV's; vit: the QKV's and
// the FFN's second), the column sums of its output gradient [tokens, out] in the step's dtype: the
// matmul family's bias_grad plan runs it.
matmul::bias_grad::Shape bias_gradient(const Shape& s, std::int64_t out);

// The FFN's GELU (erf) over [tokens, ffn] in the step's dtype, forward: the gelu family's plan runs it.
gelu::Shape ffn_gelu(const Shape& s);
// Its backward fused with the FFN's first bias gradient, over [tokens, ffn]: the gelu_dbias op's plan
// runs it (in place over the gradient).
gelu::dbias::Shape ffn_gelu_bwd(const Shape& s);

// LayerNorm over the hidden width of each of a step's tokens, in the step's dtype (gamma and beta
// f32); the layernorm family's plan runs it.
layernorm::Shape token_layernorm(const Shape& s, Direction d);
// Its backward with the residual gradient and the next dense layer's bias gradient (each where the
// step passes it): the layernorm_dbias op's plan runs it.
layernorm::dbias::Shape token_layernorm_bwd(const Shape& s);

// The train step's loss over its output [tokens, hidden] in the step's dtype: the mse op's plan runs it.
loss::mse::Shape output_mse(const Shape& s);

using models::kAlignFloats;
struct ParamLayout {
  std::size_t wqkv, bqkv, wo, bo, ln1g, ln1b, w1, b1, w2, b2, ln2g, ln2b;
  std::size_t total = 0;        // floats, padding included
  std::int64_t parameters = 0;  // padding excluded
  // (offset, count) of every tensor, in layout order, and their names
  std::vector<std::pair<std::size_t, std::size_t>> tensors;
  std::vector<std::string> names;
};
ParamLayout param_layout(const Arch& a);

inline adamw::Hyper hyper() { return adamw::Hyper{}; }

// The seeded start, a pure function of the seed and the shape: x and the target uniform in [-1, 1)
// (in the problem's dtype: bf16 values for bf16), [batch, seq, hidden]; weights and biases uniform in
// +-1/sqrt(fan_in) (nn.Linear's init), LayerNorm gamma 1, beta 0, all f32 for either dtype; m = v = 0.
using State = models::regression::State;
State make_state(const Shape& s, const ParamLayout& l, std::uint64_t seed);

// Verification's periodic batch (kernels/models/regression.h), built from the seeded start.
using models::regression::kVerifyPeriod;
State verification_state(const Shape& s, const State& seeded);

// The reference in double over `batch` samples: y, and for backward the loss and the flat gradients;
// Rounding::bf16 rounds what the bf16 implementations round (the GEMMs' weights and biases and every
// stored activation and activation gradient) to bf16.
using models::regression::Reference;
using models::regression::Rounding;
Reference reference(const Arch& a, const ParamLayout& l, const std::vector<double>& params, const std::vector<double>& x,
                    const std::vector<double>& target, std::int64_t batch, bool backward,
                    Rounding rounding = Rounding::none);

using models::regression::Outcome;  // y: [batch, seq, hidden]
// `start` is verification_state(): compares one step from it with the reference, within the bounds
// of the shape's dtype (model_bert.cpp derives them).
Check verify_outcome(const Shape& s, const ParamLayout& l, const State& start, const Outcome& out);

using LayerCase = models::ModelCase;  // last_loss(): the loss of the last train step

std::unique_ptr<LayerCase> make_cpu(const Problem& p);
using models::regression::cpu_bf16_reason;
#ifdef HOTOPS_HAVE_CUDA
std::unique_ptr<LayerCase> make_cuda(const Problem& p);
#endif

const Family& family();

}  // namespace hotops::model_bert
