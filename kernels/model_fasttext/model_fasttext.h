// The model_fasttext family: whole training and inference steps of Keras' imdb_fasttext.py (a bag of
// word embeddings averaged over the review, then one sigmoid unit), composed of the op families'
// plans only: embedding (gather, and its gradient from the tokens grouped by row), global_avgpool
// (nlc: [batch, T, dim]), matmul (the Dense(1) layer as addmm, its gradients as mm), loss bce_logits
// and the one AdamW of each backend (adamw::cpu_step, adamw::cuda_step). The model, where it departs
// from Keras' script, the embedding gradient's grouping and bf16: docs/models.md, "The fastText
// classifier"; its data-parallel train steps (gpus:G): docs/scaling.md.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "hotops/buffer.h"
#include "hotops/op.h"
#include "kernels/avgpool/avgpool.h"
#include "kernels/embedding/embedding.h"
#include "kernels/loss/bce.h"
#include "kernels/matmul/matmul.h"
#include "kernels/models/data_parallel.h"
#include "kernels/models/models.h"

namespace hotops::model_fasttext {

using models::ModelCase;
using models::Variant;

// A named configuration: a vocabulary of V words embedded in E dimensions, reviews of T tokens.
struct Config {
  std::string name;
  std::int64_t V, E, T;
  std::vector<std::int64_t> batches;  // benchmarked batch sizes (none for the test configuration)
};
const std::vector<Config>& configs();        // the benchmarked ones: fasttext_imdb
const Config& config_named(const std::string& name);  // fasttext_imdb, or the tests' tiny fasttext_test

struct Shape : models::StepKind {
  Config cfg;
  std::int64_t tokens() const { return batch * cfg.T; }
};
Shape shape_of(const Problem& p);

// The parameters in one flat buffer, each tensor on a 256-byte boundary, padding zero (the gradients,
// AdamW's m and v in buffers of the same layout: the optimizer is one flat pass):
//   embed [V, E] row-major; dense W [E, 1]; dense b [1]
struct Layout {
  std::size_t embed = 0, dense_w = 0, dense_b = 0;
  std::size_t total = 0;        // floats, padding included
  std::int64_t parameters = 0;  // padding excluded
};
Layout layout_of(const Config& c);

// The op families' shapes of the step (every backend builds its plans from these):
//   embedding      fwd: emb [B·T, E] = embed[tokens]; bwd: dembed from demb, the tokens grouped by row
//   pool           global_avgpool nlc over [B, T, E]: pooled [B, E]; bwd: demb = dpooled / T
//   dense          addmm fwd, logits [B, 1] = pooled . W + b (M = B, K = E, N = 1)
//   dense_wgrad    mm bwd_weight, dW = pooled^T . dlogits, written f32
//   dense_bgrad    mm bwd_weight with K = 1, db = ones^T . dlogits (the bias gradient as oneDNN's addmm
//                  computes it: a GEMV with a column of ones), written f32
//   dense_dgrad    mm bwd_data, dpooled = dlogits . W^T
//   bce            bce_logits over B logits: fwd the mean loss, bwd dlogits
embedding::Shape embedding_shape(const Shape& s, Direction d);
avgpool::Shape pool_shape(const Shape& s, Direction d);
matmul::Shape dense_shape(const Shape& s);
matmul::Shape dense_wgrad_shape(const Shape& s);
matmul::Shape dense_bgrad_shape(const Shape& s);
matmul::Shape dense_dgrad_shape(const Shape& s);
loss::bce::Shape bce_shape(const Shape& s, Direction d);

// The learnable task and the starting point, pure functions of the seed: tokens uniform in [0, V);
// label 1 when the review's words score above 0 in sum, each word's score a fixed uniform draw in
// [-1, 1) (the same for every batch and seed), else 0. Parameters: the embedding uniform in [-1, 1)
// (PyTorch's nn.Embedding draws N(0, 1)), dense W and b uniform in +-1/sqrt(E) (nn.Linear's init, as
// every model's dense layers); m = v = 0.
struct State {
  std::vector<std::int64_t> tokens;  // [B, T], the embedding's int64 indices (PyTorch's long)
  HostBuffer labels;                 // [B] f32, 0 or 1: bce_logits' targets
  HostBuffer params, m, v;           // flat, Layout
};
State make_state(const Shape& s, const Layout& l, std::uint64_t seed);

// A data-parallel replica's shard of a seeded start of the global batch (models::BatchReplica): rank
// r's samples r x batch .. (r + 1) x batch - 1 of `global`'s tokens (`T` a sample) and labels. The
// parameters and moments are `out`'s own (the same on every rank); the step groups the shard's
// tokens by row itself.
struct SampleShard {
  void operator()(State& out, const State& global, std::size_t T, const models::Replica& r, std::int64_t batch) const;
};

// The reference in double: pooled, logits, and for train the loss and the flat gradients, with, per
// gradient element, the sum of its terms' squares (what the rounding errors of its sum grow with).
// `bf16_rounding` (the tests' model of a correct bf16 step) rounds to bf16 what a bf16 step stores
// bf16: the parameters it casts, pooled, the logits, dlogits, dpooled and demb.
struct Reference {
  std::vector<double> pooled;  // [B, E]
  std::vector<double> pooled_rss;  // [B, E]: sqrt(sum over the positions of x^2) / T
  std::vector<double> logits;  // [B]
  double loss = 0;
  std::vector<double> grad;           // flat, train only
  std::vector<double> grad_terms_sq;  // flat, train only
};
Reference reference(const Config& c, const Layout& l, const std::vector<double>& params,
                    const std::vector<std::int64_t>& tokens, const HostBuffer& labels, std::int64_t batch, bool backward,
                    bool bf16_rounding = false);

// What one run produced, in host memory.
struct Outcome {
  HostBuffer pooled, logits;  // in the dtype
  float loss = 0;             // train
  HostBuffer grads, params;   // train: the gradients and the parameters after the step (f32)
};
// One step from the seeded start against the reference (bounds: model_fasttext.cpp).
Check verify_outcome(const Shape& s, const Layout& l, const State& start, const Outcome& out);

// Why the CPU cannot run the problem ("" when it can): threads beyond the cores, or for bf16 oneDNN's
// refusal of a bf16 matmul or average pooling the step needs.
HOTOPS_MODEL_ENTRY_POINTS(cpu_unsupported_reason);

}  // namespace hotops::model_fasttext
