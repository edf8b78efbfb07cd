// The model_convnext family: the blocks, names, work, the op families' shapes of a step, the seeded
// start and verification.
//
// Names: model.convnext_block/<cpu|cuda>/<f32|bf16>/<infer|train>/shape:<convnext.s1|convnext.s3>/batch:B,
// then at most one variant:
//   threads:T  CPU, T OpenMP threads (oneDNN follows OpenMP) instead of all of them;
//   e2e:1      CUDA, host time of a step as a program pays it: x (and for train the target) copied from
//              pageable host memory, the launches, y (infer) or the loss (train) copied back, sync.
// Without a variant a CUDA step is device time with the inputs already on the device.
#include "kernels/model_convnext/model_convnext.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "hotops/check.h"
#include "kernels/models/data_parallel.h"

namespace hotops::model_convnext {
namespace {

constexpr double kAdamwFlopsPerParam = 14;  // adamw.cpp's count
constexpr const char* kModel = "convnext_block";

models::StepArgs step_args(const Problem& p) {
  models::StepArgs a = models::step_args(p, "model_convnext", false, true);
  HOTOPS_CHECK(a.model == kModel, "model_convnext: not a ConvNeXt block problem: " + p.name());
  return a;
}

std::string cpu_reason(const Problem& p) {
  const std::string threads = models::threads_reason(step_args(p));
  if (!threads.empty() || p.dtype != DType::bf16) return threads;
  return cpu_bf16_reason();
}

// Every step problem of one block at one batch, in f32 and bf16, its shape named first.
void expand(const Arch& a, std::int64_t batch, const std::vector<int>& thread_sweep, std::vector<Problem>& out) {
  std::vector<Problem> steps;
  models::expand_step_problems(kModel, batch, thread_sweep, false, steps, true);
  for (Problem& p : steps) {
    p.args.insert(p.args.begin(), Arg{"shape", a.name});
    out.push_back(std::move(p));
  }
}

class ConvnextFamily final : public models::DataParallelModelFamily<BlockCase> {
 public:
  ConvnextFamily() : DataParallelModelFamily("model_convnext", cpu_reason, make_cpu, HOTOPS_CUDA_FACTORY(make_cuda)) {}

  std::vector<Problem> benchmark_problems(const std::vector<std::int64_t>& batches) const override {
    std::vector<Arch> benchmarked;
    for (const Arch& a : archs())
      if (!a.batches.empty()) benchmarked.push_back(a);
    // The single-GPU and CPU steps, then the data-parallel train steps at the same per-GPU batches.
    std::vector<Problem> out = per_shape_and_batch(benchmarked, batches, [](const Arch& a, std::int64_t b, std::vector<Problem>& o) {
      expand(a, b, {1, 8}, o);
    });
    for (const Problem& p : per_shape_and_batch(benchmarked, batches, [](const Arch& a, std::int64_t b, std::vector<Problem>& o) {
           models::add_data_parallel_problems(kModel, b, o, {{"shape", a.name}});
         }))
      out.push_back(p);
    return out;
  }

  std::vector<Problem> test_problems() const override {
    // The tiny block at batch 1 and 3 (3 runs the periodic verification batch): every backend,
    // direction, dtype and variant; both stages at batch 1 (their reference is a few seconds on 2 cores).
    std::vector<Problem> out;
    expand(arch_named("convnext.test"), 1, {2}, out);
    expand(arch_named("convnext.test"), 3, {}, out);
    expand(arch_named("convnext.s3"), 1, {}, out);
    std::vector<Problem> s1;
    expand(arch_named("convnext.s1"), 1, {}, s1);
    for (Problem& p : s1)
      if (p.args.size() == 2) out.push_back(std::move(p));  // s1: the plain steps only (shape, batch)
    // The data-parallel step on a communicator of one process: its whole path on one GPU.
    models::add_data_parallel_test_problems(kModel, 3, out, {{"shape", "convnext.test"}});
    return out;
  }

  // FLOPs, the standard count: the forward's two Linear layers 2 * rows * (C * 4C) each and the
  // depthwise convolution 2 * rows * C * 49; LayerNorm, GELU, the layer scale, biases and the loss are
  // not counted. train: 3x the forward (the step computes no gradient for its input, but it is
  // counted, as is standard) + AdamW's 14 per parameter.
  // Bytes, the fewest a step must move: infer reads the parameters and x and writes y; train reads x
  // and the target and reads and writes the parameters, m and v (6 x 4 bytes per parameter). The
  // parameters are f32 in either dtype (bf16's masters); x, y and the target take the dtype's size.
  Work one_gpu_work(const Problem& p) const override {
    const Shape s = shape_of(p);
    const double R = static_cast<double>(s.rows()), C = static_cast<double>(s.arch.C);
    const double fwd = 2 * R * (2 * C * 4 * C) + 2 * R * C * static_cast<double>(kKernel * kKernel);
    const double P = static_cast<double>(param_layout(s.arch).parameters);
    const double act = static_cast<double>(dtype_size(s.dtype)) * R * C, B = static_cast<double>(s.batch);
    if (!s.train()) return {fwd, 4 * P + 2 * act, B};
    return {3 * fwd + kAdamwFlopsPerParam * P, 6 * 4 * P + 2 * act, B};
  }
};

}  // namespace

const std::vector<Arch>& archs() {
  static const std::vector<Arch> all = {
      // ConvNeXt-Tiny (the PySpark profiling study's ConvNeXt) at 224x224: stage 1, 96 channels at 56x56
      // (3 blocks), and stage 3, 384 channels at 14x14 (9 blocks, most of the network's time).
      {"convnext.s1", 96, 56, 56, {8, 32}},
      {"convnext.s3", 384, 14, 14, {8, 32}},
      // The tests': the same block at 8 channels and 5x6 positions (the 7x7 filter overhangs every edge).
      {"convnext.test", 8, 5, 6, {}},
  };
  return all;
}

const Arch& arch_named(const std::string& name) { return models::entry_named(archs(), name, "model_convnext: unknown shape "); }

Shape shape_of(const Problem& p) {
  const models::StepArgs a = step_args(p);
  Shape s;
  s.arch = arch_named(p.get("shape"));
  models::copy_step_args(a, s);
  return s;
}

conv2d::Shape dwconv(const Shape& s, Direction d) {
  conv2d::Shape c;
  c.dir = d;
  c.dtype = s.dtype;
  c.layout = conv2d::Layout::nhwc;
  c.N = s.batch, c.C = c.K = c.groups = s.arch.C, c.H = s.arch.H, c.W = s.arch.W;
  c.R = c.S = kKernel;
  c.pad_h = c.pad_w = kPad;
  c.bias = d == Direction::fwd;
  // CPU: the caller's NHWC buffers as they are, the f32 master weights (bf16 casts them in each run);
  // inference: oneDNN's forward_inference.
  c.f32_params = true;
  c.x_pick = c.y_pick = conv2d::Shape::Pick::nhwc;
  c.inference = !s.train();
  return c;
}

matmul::Shape linear(const Shape& s, std::int64_t in, std::int64_t out) {
  matmul::Shape m;
  m.op = matmul::Op::addmm;
  m.dir = Direction::fwd;
  m.dtype = s.dtype;
  m.M = s.rows(), m.N = out, m.K = in;
  return m;
}

matmul::Shape linear_grad(const Shape& s, Direction d, std::int64_t in, std::int64_t out) {
  matmul::Shape m = linear(s, in, out);
  m.op = matmul::Op::mm;
  m.dir = d;
  m.f32_out = d == Direction::bwd_weight;
  return m;
}

gelu::Shape mlp_gelu(const Shape& s) {
  gelu::Shape g;
  g.dir = Direction::fwd;
  g.dtype = s.dtype;
  g.approx = gelu::Approx::none;
  g.elements = s.rows() * s.arch.hidden();
  return g;
}

gelu::dbias::Shape mlp_gelu_bwd(const Shape& s) {
  gelu::dbias::Shape g;
  g.dtype = s.dtype;
  g.rows = s.rows(), g.cols = s.arch.hidden();
  return g;
}

layernorm::Shape channel_layernorm(const Shape& s) {
  layernorm::Shape ln;
  ln.dir = Direction::fwd;
  ln.dtype = s.dtype;
  ln.batch = s.batch, ln.tokens = s.arch.positions(), ln.hidden = s.arch.C;
  ln.eps = kLnEps;
  return ln;
}

layernorm::dbias::Shape channel_layernorm_bwd(const Shape& s) {
  layernorm::dbias::Shape ln;
  ln.dtype = s.dtype;
  ln.batch = s.batch, ln.tokens = s.arch.positions(), ln.hidden = s.arch.C;
  ln.eps = kLnEps;
  return ln;
}

pointwise::scale_residual::Shape layer_scale(const Shape& s, Direction d) {
  pointwise::scale_residual::Shape r;
  r.dir = d;
  r.dtype = s.dtype;
  r.rows = s.rows(), r.cols = s.arch.C;
  return r;
}

loss::mse::Shape output_mse(const Shape& s) {
  loss::mse::Shape m;
  m.dtype = s.dtype;
  m.batch = s.batch, m.tokens = s.arch.positions(), m.hidden = s.arch.C;
  return m;
}

ParamLayout param_layout(const Arch& a) {
  ParamLayout l;
  const std::int64_t C = a.C, F = a.hidden();
  auto place = [&](const char* name, std::int64_t n) {
    const std::size_t at = models::place_aligned(l.total, l.parameters, n);
    l.tensors.emplace_back(at, static_cast<std::size_t>(n));
    l.names.emplace_back(name);
    return at;
  };
  l.dw_w = place("dwconv.weight", C * kKernel * kKernel);
  l.dw_b = place("dwconv.bias", C);
  l.ln_g = place("norm.gamma", C);
  l.ln_b = place("norm.beta", C);
  l.w1 = place("pwconv1.weight", C * F);
  l.b1 = place("pwconv1.bias", F);
  l.w2 = place("pwconv2.weight", F * C);
  l.b2 = place("pwconv2.bias", C);
  l.ls = place("layer_scale.gamma", C);
  return l;
}

State make_state(const Shape& s, const ParamLayout& l, std::uint64_t seed) {
  State st = models::regression::seeded_start(s.dtype, static_cast<std::size_t>(s.rows() * s.arch.C), l.total, seed);
  const std::int64_t C = s.arch.C, F = s.arch.hidden(), K2 = kKernel * kKernel;
  // Per tensor in layout order: the uniform bound's fan-in, or for the LayerNorm and the layer scale
  // (0) their own start.
  const std::int64_t fan_in[] = {K2, K2, 0, 0, C, C, F, F, 0};
  for (std::size_t k = 0; k < l.tensors.size(); ++k) {
    const auto [at, cnt] = l.tensors[k];
    const auto count = static_cast<std::int64_t>(cnt);
    if (fan_in[k] > 0) {
      const float bound = static_cast<float>(1 / std::sqrt(static_cast<double>(fan_in[k])));
      models::fill_uniform_at(st.params, at, count, seed, 100 + k, -bound, bound);
    } else if (at == l.ls) {
      models::fill_uniform_at(st.params, at, count, seed, 100 + k, 0.5f, 1.5f);
    } else {
      std::fill_n(st.params.as<float>() + at, cnt, at == l.ln_g ? 1.f : 0.f);
    }
  }
  return st;
}

State verification_state(const Shape& s, const State& seeded) {
  return models::regression::periodic_start(seeded, s.dtype, static_cast<std::size_t>(s.arch.positions() * s.arch.C), s.batch);
}

// Bounds (one step from the verification start, optimizer step 1), as model_bert's encoder layers:
// - y: max|out - ref| / rms(ref) <= 1e-4: f32 sums of up to 4C = 1536 products (the second Linear), 49
//   (the convolution) and C (the LayerNorm), each off by a few f32 ulps of its terms; a wrong tap,
//   channel or missing term is 1e-2 or more.
// - loss: relative 1e-4.
// - gradients, per tensor, max|out - ref| / rms(ref) <= 1e-3: sums over the batch's N·H·W positions of
//   products carried back through the Linear layers, GELU and the LayerNorm.
// - the step: as models.cpp, AdamW's first step from the gradients the implementation computed; p - p0
//   in units of lr within 1e-3.
// bf16, against the same exact reference, the encoder layers' bounds (model_bert.cpp derives them: the
//   block chains fewer stored-bf16 steps than an encoder layer, and no softmax): y rms 1e-2, max 5e-2;
//   gradients rms 2e-2, max 0.3; loss relative 1e-3. The tests model a correct bf16 step (the reference
//   with Rounding::bf16) and show that it passes with margin, and that slips a bf16 step could make
//   (a missing bias, a transposed weight) fail.
// (models::regression::bounds.)
Check verify_outcome(const Shape& s, const ParamLayout& l, const State& start, const Outcome& out) {
  const Arch& a = s.arch;
  return models::regression::verify_step(
      "convnext_block:" + a.name, s.dtype, s.dir, s.batch, static_cast<std::size_t>(a.positions() * a.C), l, start, out,
      [&](const std::vector<double>& p0, const std::vector<double>& x, const std::vector<double>& target) {
        return reference(a, l, p0, x, target, 1, s.train());
      });
}

HOTOPS_DEFINE_FAMILY(ConvnextFamily);

}  // namespace hotops::model_convnext
