// The model_bilstm family: whole training and inference steps of the LSTM models whose last hidden
// state feeds a dense softmax head: Max Woolf's IMDb bidirectional LSTM classifier (Keras'
// imdb_bidirectional_lstm.py: an embedding, two directions, 2 classes) and Keras'
// lstm_text_generation.py (one-hot characters, one direction, the next of 57 characters). Chained from
// the op families' plans (embedding, lstm, matmul, loss, copy, AdamW) on the CPU (oneDNN lstm_forward /
// lstm_backward + hotops' loops) and on CUDA (cuDNN's RNN API + hotops' kernels, CUB's radix sort
// inside the embedding gradient). The models, where they depart from Keras' scripts, the directions
// and bf16 mixed precision: docs/models.md, "The BiLSTM" and "The character LSTM"; their data-parallel
// train steps (gpus:G): docs/scaling.md.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "hotops/buffer.h"
#include "hotops/op.h"
#include "kernels/embedding/embedding.h"
#include "kernels/loss/loss.h"
#include "kernels/matmul/bias_grad.h"
#include "kernels/matmul/matmul.h"
#include "kernels/models/data_parallel.h"
#include "kernels/models/models.h"

namespace hotops::model_bilstm {

using models::ModelCase;
using models::Variant;

// A named configuration: bilstm_imdb and lstm_textgen are benchmarked, bilstm_test and textgen_test
// are the tests' tiny ones. An embedding of V words in E dimensions feeds the LSTM, or (one_hot) the
// batch is the one-hot [T, B, E] tensor of E = V symbols itself, as Keras' lstm_text_generation.py
// hands it (no embedding). D directions of H units; C classes.
struct Config {
  std::string name;
  std::int64_t V, E, H, T, C;
  std::vector<std::int64_t> batches;  // benchmarked batch sizes (none for the test configurations)
  std::int64_t D = 2;                 // LSTM directions: 2 (bidirectional) or 1
  bool one_hot = false;
  std::int64_t embed_count() const { return one_hot ? 0 : V * E; }  // the embedding's parameters
  // The loss: cross_entropy_dbias (loss, dlogits and the dense bias gradient in one plan) where its
  // CUDA kernel takes the classes; otherwise cross_entropy fwd and bwd and matmul's bias_grad.
  bool fused_loss() const;
};
const std::vector<Config>& configs();
const Config& config_named(const std::string& name);  // throws hotops::Error when unknown

struct Shape : models::StepKind {
  Config cfg;
};
Shape shape_of(const Problem& p);

// The parameters in one flat buffer, each tensor on a 256-byte boundary, padding zero (the gradients,
// AdamW's m and v in buffers of the same layout, so the optimizer step is one flat pass). This is the
// canonical (PyTorch) layout of the reference and the CPU; the CUDA case keeps the LSTM's tensors in
// cuDNN's weight space instead (see cuda_model_bilstm.cu) and converts for verification.
//   embed [V, E] (none when one_hot); w_ih [D, 4H, E]; w_hh [D, 4H, H]; b_ih, b_hh [D, 4H];
//   dense_w [D H, C]; dense_b [C]
using models::kAlignFloats;
struct Layout {
  std::size_t embed = 0, w_ih = 0, w_hh = 0, b_ih = 0, b_hh = 0, dense_w = 0, dense_b = 0;
  std::size_t total = 0;        // floats, padding included
  std::int64_t parameters = 0;  // padding excluded
};
Layout layout_of(const Config& c);

// The parameter tensors with a gradient, as (name, offset, count) in the Layout: the embedding's (not
// one_hot), the LSTM's, the dense head's.
struct Tensor {
  const char* name;
  std::size_t at;
  std::int64_t count;
};
std::vector<Tensor> gradient_tensors(const Config& c, const Layout& l);

// The learnable task and the starting point, pure functions of the seed:
// tokens uniform in [0, V). Two classes (bilstm): label = 1 when the review holds more than floor(T /
// 10) tokens of a fixed random tenth of the vocabulary (the same subset for every batch size and
// seed), else 0. More classes (textgen): the next character is a fixed random function of the last
// one (the same for every batch size and seed). Parameters: embedding uniform in [-1, 1) (PyTorch's
// N(0, 1) has the same order), LSTM weights and biases uniform in +-1/sqrt(H) (PyTorch's LSTM init),
// dense W and b in +-1/sqrt(D H) (nn.Linear); m = v = 0.
struct State {
  std::vector<std::int64_t> tokens;  // [B, T], as a data loader hands them (int64: nn.Embedding's indices)
  HostBuffer x;                      // one_hot: the batch, [T, B, E] one-hot of the tokens, in the dtype
  std::vector<std::int32_t> labels;  // [B]
  std::vector<std::int64_t> targets; // [B], the labels as int64 (cross_entropy's targets)
  HostBuffer params, m, v;           // flat, canonical Layout
};
State make_state(const Shape& s, const Layout& l, std::uint64_t seed);

// A data-parallel replica's shard of a seeded start of the global batch (models::BatchReplica):
// rank r's samples r x batch .. (r + 1) x batch - 1 of `global`'s tokens (`T` a sample), labels and
// targets, and (one_hot) those samples' rows of every time step of x [T, B, E]. The parameters and
// moments are `out`'s own (the same on every rank).
struct SampleShard {
  void operator()(State& out, const State& global, std::size_t T, const models::Replica& r, std::int64_t batch) const;
};

// The reference in double (kernels/lstm's reference_forward / reference_backward for the BiLSTM):
// logits, and for train the loss and the canonical flat gradients. Verification uses the exact one.
// `bf16_rounding` (the tests' model of a correct bf16 step) rounds to bf16, in double, what a bf16 step
// stores bf16 outside the LSTM: the parameters it casts, the embedding rows (x), hT, the logits,
// dlogits, dhT, dx and the LSTM's weight gradients (cuDNN's bf16 weight space); the LSTM's own
// per-step rounding is not modelled (kernels/lstm bounds that).
struct Reference {
  std::vector<double> logits;  // [B, C]
  double loss = 0;
  std::vector<double> grad;    // flat, train only
};
Reference reference(const Config& c, const Layout& l, const std::vector<double>& params,
                    const std::vector<std::int64_t>& tokens, const std::vector<std::int32_t>& labels, std::int64_t batch,
                    bool backward, bool bf16_rounding = false);

// What one run produced, in host memory, in the canonical layout.
struct Outcome {
  HostBuffer logits;        // infer; bf16 train too (checked as infer's). f32 or bf16
  float loss = 0;           // train
  HostBuffer grads, params; // train: the gradients and the parameters after the step
};
// One step from the seeded start against the reference (bounds: see model_bilstm.cpp).
Check verify_outcome(const Shape& s, const Layout& l, const State& start, const Outcome& out);

// The step's ops as their families' problems (the same plans run it on both backends):
//   the lookup: embedding fwd, time-major x [T, B, E] from the f32 table (bf16 x in bf16);
//   its gradient: embedding bwd from dx in `dx` (the LSTM's: f32 on the CPU, the dtype on CUDA);
//   the dense head: addmm fwd over hT [D, B, H] read as [B, D H] (matmul's a_blocks D), mm bwd_weight
//   (dW f32) and mm bwd_data (dhT in `dh`);
//   the loss (not fused_loss): cross_entropy fwd (loss, lse) and bwd (dlogits), and bias_grad (db).
embedding::Shape embedding_shape(const Shape& s, Direction d, DType dx);
matmul::Shape head_shape(const Shape& s, Direction d, DType dh = DType::f32);
loss::Shape loss_shape(const Shape& s, Direction d);
matmul::bias_grad::Shape bias_grad_shape(const Shape& s);

HOTOPS_MODEL_ENTRY_POINTS(cpu_unsupported_reason);

}  // namespace hotops::model_bilstm
