// The pointwise family (relu, dropout): problem names and shapes, work, inputs, verification.
//
// Names: <relu|dropout>/<backend>/<f32|bf16>/<fwd|bwd>/shape:<model.layer>/batch:B/dims:BxCxHxW for
// the activations of real models, .../shape:flat/elements:N for the bandwidth sweep; dropout adds
// p:<probability>. Both ops are elementwise, so only the element count matters to them; dims are
// there to say which tensor of which model it is. relu_dbias/<backend>/<dtype>/bwd/shape:<model.layer>/
// batch:B/dims:BxN: a dense layer's [B, N] activations, N the bias's length; relu_bias the same, fwd.
// scale_residual (scale_residual.h): <backend>/<dtype>/<fwd|bwd>/shape:<model.layer>/batch:B/dims:BxHxWxC.
#include "kernels/pointwise/pointwise.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <iterator>

#include "hotops/check.h"
#include "hotops/elementwise.h"
#include "hotops/op_family.h"
#include "kernels/pointwise/scale_residual.h"

namespace hotops::pointwise {
namespace {

using elementwise::flat_args;
using elementwise::model_args;
using elementwise::NamedShape;

const std::vector<NamedShape>& named_shapes() {
  static const std::vector<NamedShape> shapes = {
      // Keras' mnist_mlp.py (Max Woolf's benchmarks): the 512-wide hidden layer, batch 128.
      {"mlp_mnist.hidden", {512}, 128},
      // The TensorFlow 2 comparison's Keras CNN (256x256x3 images), conv outputs in NCHW as in
      // kernels/gelu: the first at batch 16 (at the study's 64 it would be 512 MiB in f32), the
      // others at the study's 64.
      {"keras_cnn.conv2d", {32, 256, 256}, 16},
      {"keras_cnn.conv2d_1", {64, 85, 85}, 64},
      {"keras_cnn.conv2d_3", {128, 42, 42}, 64},
      // BERT-base, sequence 128: the FFN's 3072-wide intermediate.
      {"bert.ffn", {128, 3072}, 32},
  };
  return shapes;
}

// relu_dbias and relu_bias: the hidden layers of the dense models (kernels/models), at the batch
// their studies ran.
const std::vector<NamedShape>& dense_shapes() {
  static const std::vector<NamedShape> shapes = {
      // The PyTorch tiny-MLP notebook (13 -> 32 -> 16 -> 2), batch 10: its two hidden layers.
      {"mlp_tiny.hidden1", {32}, 10},
      {"mlp_tiny.hidden2", {16}, 10},
      // Keras' mnist_mlp.py: both 512-wide hidden layers, batch 128.
      {"mlp_mnist.hidden", {512}, 128},
      // Spark NLP ClassifierDL (768 -> 512 -> 2), batch 1024.
      {"classifierdl.hidden", {512}, 1024},
  };
  return shapes;
}

// scale_residual: ConvNeXt-T's layer scale and residual add (NHWC, channels last) at stage 1 (96
// channels, 56x56) and stage 3 (384, 14x14), at the batches of model.convnext_block.
const std::vector<NamedShape>& convnext_shapes() {
  static const std::vector<NamedShape> shapes = {
      {"convnext.s1", {56, 56, 96}, 8},
      {"convnext.s1", {56, 56, 96}, 32},
      {"convnext.s3", {14, 14, 384}, 8},
      {"convnext.s3", {14, 14, 384}, 32},
  };
  return shapes;
}

// The flat bandwidth sweep: 4 and 256 MiB of f32 (half of that in bf16).
constexpr std::int64_t kFlatElements[] = {1 << 20, 1 << 26};
// Dropout probabilities: 0.1 (BERT's hidden and attention dropout), 0.5 (the classic MLP's).
constexpr const char* kDropoutP[] = {"0.5", "0.1"};

constexpr Direction kDirections[] = {Direction::fwd, Direction::bwd};
constexpr DType kDTypes[] = {DType::f32, DType::bf16};

const char* op_name(Op o) {
  constexpr const char* kNames[] = {"relu", "dropout", "relu_dbias", "relu_bias"};
  return kNames[static_cast<int>(o)];
}

// Expands one shape into every backend x dtype x direction problem of op `o` (dropout: x p;
// relu_dbias: bwd only; relu_bias: fwd only).
void expand(Op o, const std::vector<Arg>& args, std::vector<Problem>& out) {
  for (Backend be : kAllBackends)
    for (DType t : kDTypes)
      for (Direction d : kDirections) {
        if ((o == Op::relu_dbias && d != Direction::bwd) || (o == Op::relu_bias && d != Direction::fwd)) continue;
        Problem p{op_name(o), be, t, d, args};
        if (o != Op::dropout) {
          out.push_back(std::move(p));
          continue;
        }
        for (const char* prob : kDropoutP) {
          Problem q = p;
          q.args.push_back({"p", prob});
          out.push_back(std::move(q));
        }
      }
}

void expand_both(const std::vector<Arg>& args, std::vector<Problem>& out) {
  expand(Op::relu, args, out);
  expand(Op::dropout, args, out);
}
void expand_dense(const std::vector<Arg>& args, std::vector<Problem>& out) {
  expand(Op::relu_dbias, args, out);
  expand(Op::relu_bias, args, out);
}

// The op as the benchmark runs it: a PlanCase over the problem's inputs and outputs. The dropout
// fwd mask starts as all kMaskPoison (an in-out tensor reset to it before the check), so that a
// byte the op fails to write, or writes outside the tensor, shows. relu_dbias also writes db.
struct PointwiseOp : OpOf<Shape, Args, Inputs, HostBuffer> {
  struct Io : OpOf::Io {
    HostBuffer unwritten_mask;  // dropout fwd: every byte kMaskPoison
    HostBuffer mask;            // dropout fwd: the mask the op draws
    HostBuffer db;              // relu_dbias
  };
  static bool writes_mask(const Shape& s) { return s.op == Op::dropout && s.dir == Direction::fwd; }
  static Shape shape(const Problem& p) { return shape_of(p); }
  static Io io(const Shape& s, std::uint64_t seed) {
    Io io{OpOf::io(s, seed), {}, {}, {}};
    if (writes_mask(s)) io.unwritten_mask = make_mask(s), io.mask = make_mask(s);
    if (s.op == Op::relu_dbias) io.db = make_dbias(s);
    return io;
  }
  static Args bind(const Shape& s, Io& io, Binder& b) {
    const bool bwd = s.dir == Direction::bwd, dropout = s.op == Op::dropout;
    Args a;
    if (!dropout || !bwd) a.x = b.in(io.in.x);
    if (bwd) a.dy = b.in(io.in.dy);
    if (dropout && bwd) a.mask_in = static_cast<const std::uint8_t*>(b.in(io.in.mask));
    a.out = b.out(io.out);
    if (writes_mask(s)) a.mask_out = static_cast<std::uint8_t*>(b.inout(io.unwritten_mask, io.mask));
    if (s.op == Op::relu_dbias) a.db = static_cast<float*>(b.out(io.db));
    if (s.op == Op::relu_bias) a.b = b.in(io.in.b);
    a.seed = io.in.seed;
    return a;
  }
  static Check check(const Shape& s, const Io& io) {
    Check c = verify(s, io.in, io.out, writes_mask(s) ? io.mask.as<std::uint8_t>() : nullptr);
    if (c.ok && s.op == Op::relu_dbias) c.merge(verify_dbias(s, io.in, io.db), "db");
    return c;
  }
};

// relu: oneDNN answers for itself; the other loops run on any x86-64.
std::string cpu_unsupported_reason(const Problem& p) {
  if (p.op == "scale_residual") return "";
  return shape_of(p).op == Op::relu ? relu_onednn_unsupported_reason(p) : "";
}

std::unique_ptr<Case> make_case(const Problem& p) {
  return p.op == "scale_residual" ? scale_residual::make_case(p) : make_plan_case<PointwiseOp>(p);
}

class PointwiseFamily final : public OpFamily {
 public:
  PointwiseFamily() : OpFamily("pointwise", cpu_unsupported_reason, make_case, HOTOPS_CUDA_FACTORY(make_case)) {}

  std::vector<Problem> benchmark_problems(const std::vector<std::int64_t>& batches) const override {
    std::vector<Problem> out = elementwise::benchmark_problems(named_shapes(), kFlatElements, batches, expand_both);
    for (Problem& p : elementwise::benchmark_problems(dense_shapes(), std::vector<std::int64_t>{}, batches, expand_dense))
      out.push_back(std::move(p));
    // scale_residual: each shape at its own batch, or at each asked batch (the shapes repeat per batch).
    std::vector<NamedShape> convnext;
    for (const NamedShape& ns : convnext_shapes())
      if (batches.empty() || std::none_of(convnext.begin(), convnext.end(), [&](const NamedShape& c) { return c.name == ns.name; }))
        convnext.push_back(ns);
    for (Problem& p : elementwise::benchmark_problems(convnext, std::vector<std::int64_t>{}, batches, scale_residual::expand))
      out.push_back(std::move(p));
    return out;
  }

  std::vector<Problem> test_problems() const override {
    // One element; less than one 16-byte vector; an odd size off a 16-byte boundary (head, vectors
    // and tail); a model-style name; enough elements for many vectors per CUDA thread and several
    // OpenMP chunks.
    std::vector<Problem> out;
    expand_both(flat_args(1), out);
    expand_both(flat_args(5), out);
    expand_both(flat_args(1027, 3), out);
    expand_both(model_args("test", 2, {3, 37}), out);
    expand_both(flat_args(100003), out);
    // relu_dbias, relu_bias: one element; a row and column tile in part; two CUDA column tiles and
    // row splits, the tensor off a 16-byte boundary; three of each, the last partial.
    expand_dense(model_args("test", 1, {1}), out);
    expand_dense(model_args("test", 2, {3, 37}), out);
    std::vector<Arg> offset = model_args("test", 100, {33});
    offset.push_back({"offset", "3"});
    expand_dense(offset, out);
    expand_dense(model_args("test", 130, {70}), out);
    // scale_residual: one element; a partial column tile; three column tiles by three row splits,
    // the last partial; more rows than one CPU chunk.
    scale_residual::expand(model_args("test", 1, {1}), out);
    scale_residual::expand(model_args("test", 2, {3, 37}), out);
    scale_residual::expand(model_args("test", 130, {70}), out);
    scale_residual::expand(model_args("test", 2, {300, 8}), out);
    return out;
  }

  // FLOPs: relu one compare (or select) per element; dropout two per element (the mask test and
  // the scaling multiply), the family's fixed convention; relu_dbias two (the select, the sum's add),
  // relu_bias two (the add, the max).
  // Bytes, each tensor once: relu fwd x + y, bwd x + dy + dx; dropout fwd x + y + the uint8 mask
  // it writes, bwd dy + mask + dx; relu_dbias x + dy + dx and the f32 db; relu_bias x + y and b.
  Work work(const Problem& p) const override {
    if (p.op == "scale_residual") return scale_residual::work(p);
    const Shape s = shape_of(p);
    const double n = static_cast<double>(s.elements), e = static_cast<double>(dtype_size(s.dtype));
    Work w;
    if (s.op == Op::relu) {
      w.flops = n;
      w.bytes = n * e * (s.dir == Direction::fwd ? 2 : 3);
    } else if (s.op == Op::relu_dbias) {
      w.flops = 2 * n;
      w.bytes = n * e * 3 + static_cast<double>(s.cols) * 4;
    } else if (s.op == Op::relu_bias) {
      w.flops = 2 * n;
      w.bytes = n * e * 2 + static_cast<double>(s.cols) * e;
    } else {
      w.flops = 2 * n;
      w.bytes = n * (2 * e + 1);
    }
    w.items = p.batch() ? static_cast<double>(*p.batch()) : 1.0;
    return w;
  }
};

}  // namespace

std::unique_ptr<Plan> make_cpu_plan(const Shape& s) {
  if (s.op == Op::relu_dbias) return make_cpu_relu_dbias_plan(s);
  if (s.op == Op::relu_bias) return make_cpu_relu_bias_plan(s);
  return s.op == Op::relu ? make_cpu_relu_plan(s) : make_cpu_dropout_plan(s);
}

Shape shape_of(const Problem& p) {
  Shape s = fwd_bwd_shape<Shape>(p, p.op);
  const std::string names[] = {"relu", "dropout", "relu_dbias", "relu_bias"};
  const auto* name = std::find(std::begin(names), std::end(names), p.op);
  HOTOPS_CHECK(name != std::end(names), "pointwise has relu, dropout, relu_dbias and relu_bias only: " + p.name());
  s.op = static_cast<Op>(name - std::begin(names));
  const elementwise::Extent e = elementwise::extent_of(p);
  s.elements = e.elements;
  s.offset = e.offset;
  if (s.op == Op::relu_dbias || s.op == Op::relu_bias) {
    const Direction dir = s.op == Op::relu_dbias ? Direction::bwd : Direction::fwd;
    HOTOPS_CHECK(s.dir == dir && p.has("dims"), p.op + " is " + direction_name(dir) + " over named dims: " + p.name());
    const std::string& dims = p.get("dims");
    s.cols = std::stoll(dims.substr(dims.rfind('x') + 1));
    HOTOPS_CHECK(s.cols > 0 && s.elements % s.cols == 0, "bad " + p.op + " dims: " + p.name());
  }
  if (s.op == Op::dropout) {
    s.p = std::stod(p.get("p"));
    HOTOPS_CHECK(s.p >= 0 && s.p < 1, "dropout needs 0 <= p < 1: " + p.name());
  }
  return s;
}

std::size_t buffer_count(const Shape& s) { return static_cast<std::size_t>(s.offset + s.elements) + kGuard; }

DropoutKey dropout_key(std::uint64_t seed, double p) {
  DropoutKey k;
  k.k0 = static_cast<std::uint32_t>(seed);
  k.k1 = static_cast<std::uint32_t>(seed >> 32);
  k.threshold = static_cast<std::uint32_t>(std::llround(p * 16777216.0));  // p * 2^24
  k.scale = static_cast<float>(1.0 / (1.0 - p));
  return k;
}

// The problem's seed is the same on every backend; the constant (splitmix64's increment) keeps the
// mask's key apart from the seed of x and dy.
std::uint64_t dropout_seed(std::uint64_t seed) { return seed ^ 0x9e3779b97f4a7c15ull; }

DropoutKey dropout_key(const Problem& p) { return dropout_key(dropout_seed(p.seed()), shape_of(p).p); }

Inputs make_inputs(const Shape& s, std::uint64_t seed) {
  Inputs in;
  const bool bwd = s.dir == Direction::bwd;
  if (s.op != Op::dropout || !bwd) {
    in.x = HostBuffer(s.dtype, buffer_count(s));
    in.x.fill_uniform(seed, 0);
  }
  if (bwd) {
    in.dy = HostBuffer(s.dtype, buffer_count(s));
    in.dy.fill_uniform(seed, 1);
  }
  if (s.op == Op::relu_bias) {
    in.b = HostBuffer(s.dtype, static_cast<std::size_t>(s.cols) + kGuard);
    in.b.fill_uniform(seed, 2);
  }
  if (s.op == Op::dropout) {
    in.seed = dropout_seed(seed);
    in.key = dropout_key(in.seed, s.p);
    if (bwd) {
      in.mask = make_mask(s);
      auto* mask = in.mask.as<std::uint8_t>();
      std::fill(mask, mask + buffer_count(s), std::uint8_t{1});
      for (std::int64_t i = 0; i < s.elements; ++i)
        mask[static_cast<std::size_t>(s.offset + i)] = dropout_keep(in.key, static_cast<std::uint64_t>(i));
    }
  }
  return in;
}

HostBuffer make_output(const Shape& s) { return HostBuffer(s.dtype, buffer_count(s)); }

HostBuffer make_dbias(const Shape& s) { return HostBuffer(DType::f32, static_cast<std::size_t>(s.cols) + kGuard); }

HostBuffer make_mask(const Shape& s) {
  HostBuffer m(DType::f32, (buffer_count(s) + 3) / 4);
  std::fill(m.as<std::uint8_t>(), m.as<std::uint8_t>() + m.bytes(), kMaskPoison);
  return m;
}

Check verify(const Shape& s, const Inputs& in, const HostBuffer& out, const std::uint8_t* mask) {
  const auto n = static_cast<std::size_t>(s.elements), off = static_cast<std::size_t>(s.offset);
  // The reference is a compare or a hash per element, so the sample can be large; both ends are
  // always in it, where a vectorised kernel handles its unaligned head and its tail.
  const std::size_t limit = std::size_t(1) << 20;
  std::vector<std::size_t> idx = sample_indices(n, limit, 29);
  if (n > limit)
    for (std::size_t i = 0; i < 64; ++i) idx.push_back(i), idx.push_back(n - 1 - i);
  std::vector<std::size_t> at(idx);
  for (std::size_t& i : at) i += off;
  // Exact: tolerance 0 (see reference()).
  Check c = compare(out, at, [&](std::size_t i) { return reference(s, in, i - off); }, 0.0);
  if (!c.ok) return c;
  char buf[200];
  auto fail = [&](const char* what) {
    c.ok = false;
    c.message = what;
    return c;
  };
  for (std::size_t i = 0; i < out.count(); ++i) {
    if (i == off) i += n;  // skip the output itself
    if (i < out.count() && !std::isnan(out.get(i))) {
      std::snprintf(buf, sizeof buf, "element %zu, outside the %zu outputs at offset %zu, was written (%g)", i, n,
                    off, out.get(i));
      return fail(buf);
    }
  }
  if (!mask) return c;
  // Each sampled mask element against the reference's draw on every thread; the first that differs named.
  std::vector<char> differs(idx.size());
#pragma omp parallel for schedule(static)
  for (std::int64_t j = 0; j < static_cast<std::int64_t>(idx.size()); ++j) {
    const std::size_t i = idx[static_cast<std::size_t>(j)];
    differs[static_cast<std::size_t>(j)] = mask[off + i] != (reference_keep(s, in, i) ? 1 : 0);
  }
  for (std::size_t j = 0; j < idx.size(); ++j) {
    if (!differs[j]) continue;
    const std::size_t i = idx[j];
    std::snprintf(buf, sizeof buf, "mask element %zu is %u, the reference draws %u", i, unsigned{mask[off + i]},
                  reference_keep(s, in, i) ? 1u : 0u);
    return fail(buf);
  }
  for (std::size_t i = 0; i < buffer_count(s); ++i) {
    if (i == off) i += n;
    if (i < buffer_count(s) && mask[i] != kMaskPoison) {
      std::snprintf(buf, sizeof buf, "mask byte %zu, outside the %zu elements at offset %zu, was written (%u)", i, n,
                    off, unsigned{mask[i]});
      return fail(buf);
    }
  }
  c.checked += idx.size();
  return c;
}

// relu_dbias's db: the f32 sum of exact terms (dx is dy or 0, exact in f32, bf16 widened exactly).
// Every implementation sums a column in chains no longer than its rows (the CPU loop runs down the
// rows; the CUDA kernel sums 8 rows per thread, 8 threads per block and then the blocks down the
// batch), so |db - ref| <= gamma_{rows} sum |terms| with gamma_n = n u / (1 - n u), u = 2^-24: k is
// rows x u with 1% for the denominator. A dropped or doubled row moves db by one term, |dy| of up to
// 1, against a bound of rows^2 u / 4 on average (2.5e-4 at 130 rows, 0.016 at classifierdl's 1024).
double dbias_error_bound(const Shape& s) { return 1.01 * static_cast<double>(s.rows()) * 0x1p-24; }

Check verify_dbias(const Shape& s, const Inputs& in, const HostBuffer& db) {
  std::vector<double> ref, terms;
  reference_dbias(s, in, ref, terms);
  Check c;
  c.tol = dbias_error_bound(s);
  char buf[200];
  // The cols elements against the reference, then the guard after them: still poisoned.
  for (std::size_t j = 0; j < db.count(); ++j) {
    const double o = db.get(j);
    if (j >= ref.size()) {
      if (std::isnan(o)) continue;
      std::snprintf(buf, sizeof buf, "db guard element %zu, after the %zu outputs, was written (%g)", j, ref.size(), o);
    } else {
      const double err = std::fabs(o - ref[j]);
      if (terms[j] > 0) c.max_err = std::max(c.max_err, err / terms[j]);
      if (err <= c.tol * terms[j]) continue;
      std::snprintf(buf, sizeof buf, "db element %zu is %.9g, the reference %.9g: beyond %g of its terms' sum %g", j, o,
                    ref[j], c.tol, terms[j]);
    }
    c.ok = false;
    c.message = buf;
    return c;
  }
  c.checked = ref.size();
  return c;
}

HOTOPS_DEFINE_FAMILY(PointwiseFamily);

}  // namespace hotops::pointwise
