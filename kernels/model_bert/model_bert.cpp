// The model_bert family: the layers, names, work, the seeded start and verification.
//
// Names: model.<bert_layer|vit_layer>/<cpu|cuda>/<f32|bf16>/<infer|train>/batch:B, then at most one variant:
//   threads:T  CPU, T OpenMP threads (oneDNN follows OpenMP) instead of all of them;
//   e2e:1      CUDA, host time of a step as a program pays it: x (and for train the target) copied from
//              pageable host memory, the launches, y (infer) or the loss (train) copied back, sync.
// Without a variant a CUDA step is device time with the inputs already on the device.
#include "kernels/model_bert/model_bert.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>

#include "hotops/check.h"
#include "kernels/models/data_parallel.h"

namespace hotops::model_bert {
namespace {

constexpr double kAdamwFlopsPerParam = 14;  // adamw.cpp's count

models::StepArgs step_args(const Problem& p) { return models::step_args(p, "model_bert", false, true); }

std::string cpu_reason(const Problem& p) {
  const std::string threads = models::threads_reason(step_args(p));
  if (!threads.empty() || p.dtype != DType::bf16) return threads;
  return cpu_bf16_reason();
}

// Every step problem of one layer at one batch, in f32 and bf16.
void expand(const std::string& layer, std::int64_t batch, const std::vector<int>& thread_sweep, std::vector<Problem>& out) {
  models::expand_step_problems(layer, batch, thread_sweep, false, out, true);
}

class BertFamily final : public models::DataParallelModelFamily<LayerCase> {
 public:
  BertFamily() : DataParallelModelFamily("model_bert", cpu_reason, make_cpu, HOTOPS_CUDA_FACTORY(make_cuda)) {}

  // The single-GPU and CPU steps, then the data-parallel train steps at the same per-GPU batches.
  std::vector<Problem> benchmark_problems(const std::vector<std::int64_t>& batches) const override {
    std::vector<Problem> out = models::step_problems(archs(), batches, {1, 8}, /*has_graph=*/false);
    for (const Problem& p : models::data_parallel_problems(archs(), batches)) out.push_back(p);
    return out;
  }

  std::vector<Problem> test_problems() const override {
    // Batch 1 and 3 (3 runs the periodic verification batch): every op, backend, direction, variant.
    std::vector<Problem> out;
    expand("bert_layer", 1, {2}, out);
    expand("bert_layer", 3, {}, out);
    expand("vit_layer", 1, {}, out);
    // The data-parallel step on a communicator of one process: its whole path on one GPU.
    models::add_data_parallel_test_problems("bert_layer", 3, out);
    models::add_data_parallel_test_problems("vit_layer", 1, out);
    return out;
  }

  // FLOPs, the standard count: forward GEMMs 2 * tokens * (4 h^2 + 2 h f) + attention
  // 2 * 2 * batch * heads * seq^2 * head_dim; softmax, GELU, LayerNorm, biases and the loss are not
  // counted. train: 3x the forward + AdamW's 14 per parameter.
  // Bytes, the fewest a step must move: infer reads the parameters and x and writes y; train reads x
  // and the target and reads and writes the parameters, m and v (6 x 4 bytes per parameter). The
  // parameters are f32 in either dtype (bf16's masters); x, y and the target take the dtype's size.
  Work one_gpu_work(const Problem& p) const override {
    const Shape s = shape_of(p);
    const Arch& a = s.arch;
    const double T = static_cast<double>(s.tokens()), h = static_cast<double>(a.hidden), f = static_cast<double>(a.ffn);
    const double S = static_cast<double>(a.seq), B = static_cast<double>(s.batch);
    const double fwd = 2 * T * (4 * h * h + 2 * h * f) + 4 * B * static_cast<double>(a.heads) * S * S * static_cast<double>(a.head_dim());
    const double P = static_cast<double>(param_layout(a).parameters);
    const double act = static_cast<double>(dtype_size(s.dtype)) * T * h;
    if (!s.train()) return {fwd, 4 * P + 2 * act, B};
    return {3 * fwd + kAdamwFlopsPerParam * P, 6 * 4 * P + 2 * act, B};
  }

};

}  // namespace

const std::vector<Arch>& archs() {
  static const std::vector<Arch> all = {
      // The PySpark profiling study's RoBERTa-base (BERT-base) fine-tuning, sequence length 128.
      {"bert_layer", 128, 768, 12, 3072, false, 1e-12, {8, 32}},
      // ViT-B/16 at 224x224: 196 patches + the class token.
      {"vit_layer", 197, 768, 12, 3072, true, 1e-6, {8, 32}},
  };
  return all;
}

const Arch& arch_named(const std::string& name) { return models::entry_named(archs(), name, "model_bert: unknown layer "); }

attention::Shape self_attention(const Shape& s, Direction d) {
  attention::Shape a;
  a.dir = d;
  a.dtype = s.dtype;
  a.batch = s.batch, a.seq = s.arch.seq, a.heads = s.arch.heads, a.head_dim = s.arch.head_dim();
  return a;
}

matmul::Shape dense_layer(const Shape& s, std::int64_t in, std::int64_t out, bool residual) {
  matmul::Shape m;
  m.op = matmul::Op::addmm;
  m.dir = Direction::fwd;
  m.dtype = s.dtype;
  m.M = s.tokens(), m.N = out, m.K = in;
  m.residual = residual;
  return m;
}

matmul::Shape dense_grad(const Shape& s, Direction d, std::int64_t in, std::int64_t out, bool residual) {
  matmul::Shape m = dense_layer(s, in, out, residual);
  m.op = matmul::Op::mm;
  m.dir = d;
  m.f32_out = d == Direction::bwd_weight;
  return m;
}

gelu::Shape ffn_gelu(const Shape& s) {
  gelu::Shape g;
  g.dir = Direction::fwd;
  g.dtype = s.dtype;
  g.approx = gelu::Approx::none;
  g.elements = s.tokens() * s.arch.ffn;
  return g;
}

matmul::bias_grad::Shape bias_gradient(const Shape& s, std::int64_t out) {
  matmul::bias_grad::Shape b;
  b.dtype = s.dtype;
  b.rows = s.tokens(), b.cols = out;
  return b;
}

gelu::dbias::Shape ffn_gelu_bwd(const Shape& s) {
  gelu::dbias::Shape g;
  g.dtype = s.dtype;
  g.rows = s.tokens(), g.cols = s.arch.ffn;
  return g;
}

layernorm::Shape token_layernorm(const Shape& s, Direction d) {
  layernorm::Shape ln;
  ln.dir = d;
  ln.dtype = s.dtype;
  ln.batch = s.batch, ln.tokens = s.arch.seq, ln.hidden = s.arch.hidden;
  ln.eps = s.arch.ln_eps;
  return ln;
}

layernorm::dbias::Shape token_layernorm_bwd(const Shape& s) {
  layernorm::dbias::Shape ln;
  ln.dtype = s.dtype;
  ln.batch = s.batch, ln.tokens = s.arch.seq, ln.hidden = s.arch.hidden;
  ln.eps = s.arch.ln_eps;
  return ln;
}

loss::mse::Shape output_mse(const Shape& s) {
  loss::mse::Shape m;
  m.dtype = s.dtype;
  m.batch = s.batch, m.tokens = s.arch.seq, m.hidden = s.arch.hidden;
  return m;
}

Shape shape_of(const Problem& p) {
  const models::StepArgs a = step_args(p);
  Shape s;
  s.arch = arch_named(a.model);
  models::copy_step_args(a, s);
  return s;
}

ParamLayout param_layout(const Arch& a) {
  ParamLayout l;
  const std::int64_t h = a.hidden, f = a.ffn;
  auto place = [&](const char* name, std::int64_t n) {
    const std::size_t at = models::place_aligned(l.total, l.parameters, n);
    l.tensors.emplace_back(at, static_cast<std::size_t>(n));
    l.names.emplace_back(name);
    return at;
  };
  l.wqkv = place("Wqkv", h * 3 * h);
  l.bqkv = place("bqkv", 3 * h);
  l.wo = place("Wo", h * h);
  l.bo = place("bo", h);
  l.ln1g = place("ln1.gamma", h);
  l.ln1b = place("ln1.beta", h);
  l.w1 = place("W1", h * f);
  l.b1 = place("b1", f);
  l.w2 = place("W2", f * h);
  l.b2 = place("b2", h);
  l.ln2g = place("ln2.gamma", h);
  l.ln2b = place("ln2.beta", h);
  return l;
}

State make_state(const Shape& s, const ParamLayout& l, std::uint64_t seed) {
  State st = models::regression::seeded_start(s.dtype, static_cast<std::size_t>(s.tokens() * s.arch.hidden), l.total, seed);
  const std::int64_t h = s.arch.hidden, f = s.arch.ffn;
  const std::int64_t fan_in[] = {h, h, h, h, 0, 0, h, h, f, f, 0, 0};
  for (std::size_t k = 0; k < l.tensors.size(); ++k) {
    float* at = st.params.as<float>() + l.tensors[k].first;
    const std::size_t cnt = l.tensors[k].second;
    if (fan_in[k] == 0) {  // LayerNorm: gamma 1, beta 0
      std::fill_n(at, cnt, l.names[k].find("gamma") != std::string::npos ? 1.f : 0.f);
      continue;
    }
    const float bound = static_cast<float>(1 / std::sqrt(static_cast<double>(fan_in[k])));
    models::fill_uniform_at(st.params, l.tensors[k].first, static_cast<std::int64_t>(cnt), seed, 100 + k, -bound, bound);
  }
  return st;
}

State verification_state(const Shape& s, const State& seeded) {
  return models::regression::periodic_start(seeded, s.dtype, static_cast<std::size_t>(s.arch.seq * s.arch.hidden), s.batch);
}

// Bounds (one step from the verification start, optimizer step 1), with what the CPU showed:
// - y: max|out - ref| / rms(ref) <= 1e-4 (seen 5e-7..8e-7): f32 GEMMs with sums of up to 3072 terms
//   and LayerNorms; a wrong index, head, scale or a missing term is 1e-2 or more.
// - loss: relative 1e-4 (seen 2e-9).
// - gradients, per tensor, max|out - ref| / rms(ref) <= 1e-3 (seen up to 1.1e-5, in bqkv): sums over
//   the batch's tokens of products carried back through LN, FFN, softmax. (The key bias's gradient is
//   zero in exact arithmetic, as softmax ignores a shift per row; it is checked inside bqkv against the
//   rms of the whole tensor.)
// - the step: as models.cpp, the reference takes AdamW's step from the gradients the implementation
//   computed (first step ~ lr * sign(g)); p - p0 in units of lr, bound 1e-3 (seen 7.3e-5: half an f32
//   ulp of a LayerNorm gamma of 1 is 6e-5 lr; a wrong step count or bias correction is O(0.1)).
// bf16, against the same exact reference. Each stored bf16 value carries a relative error up to 2^-9
// (2e-3; rms ~ 2^-9 / sqrt(3) = 1.1e-3), independent from element to element; a GEMM output sums K
// such products (K up to 3072), so its error is ~ 1e-3 of the output's rms (the independent errors
// add in quadrature, as the terms do), plus 2^-9 for its own rounding; a layer chains ~8 such steps
// forward and as many backward, and the softmax backward's p (dP - sum dP p) cancels, multiplying dP's
// error. The reference with Rounding::bf16 (the same rounding in double: a model of a correct bf16
// step, see the tests) measures that at batch 1: rms(out - ref) / rms(ref) 2.6e-3..3.2e-3 for y,
// 2e-3..6.3e-3 for the gradients (the largest in Wqkv's, through the softmax backward); the max,
// a tail over up to 2.4M elements, 1.4e-2..2e-2 for y, up to 0.116 for the gradients (dWqkv); the
// loss 2.4e-5 relative. Larger batches average more tokens into each gradient, which does not widen
// these. So, bf16:
// - y: rms <= 1e-2, max <= 5e-2 (3x and 2.5x the modelled error);
// - gradients: rms <= 2e-2, max <= 0.3 (3x and 2.6x);
// - loss: relative 1e-3 (40x: the mean of 10^5 squared errors averages the rounding away);
// - the step: unchanged (it is f32 arithmetic on the f32 masters from the implementation's gradients).
// The rms bound is what catches a systematic slip, which shifts every element where the rounding
// errors cancel: modelled at batch 1, a missing attention output bias (a small one: nn.Linear's init
// gives it 2% of the activations' rms) makes y's rms error 0.037 (3.7x its bound) and LN2 beta's
// gradient's 0.27 (13x); a transposed Wo makes y's 0.053..0.070 and Wqkv's gradient's 1.4 (70x).
// (models::regression::bounds, which the model_convnext block shares.)
Check verify_outcome(const Shape& s, const ParamLayout& l, const State& start, const Outcome& out) {
  const Arch& a = s.arch;
  return models::regression::verify_step(
      a.name, s.dtype, s.dir, s.batch, static_cast<std::size_t>(a.seq * a.hidden), l, start, out,
      [&](const std::vector<double>& p0, const std::vector<double>& x, const std::vector<double>& target) {
        return reference(a, l, p0, x, target, 1, s.train());
      });
}

HOTOPS_DEFINE_FAMILY(BertFamily);

}  // namespace hotops::model_bert
