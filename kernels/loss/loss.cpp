// The loss family (cross_entropy, mse: mse.h, and bce_logits: bce.h): problem names and shapes, work,
// inputs, verification and its bounds.
//
// Names: cross_entropy/<backend>/<dtype>/<fwd|bwd>/shape:<model>/batch:B/rows:R/classes:C, with
// R = B x the rows of one sample (1 for a classifier, 128 tokens for BERT's MLM head); test
// problems are cross_entropy/.../shape:test/rows:R/classes:C (no batch). cross_entropy_dbias: the same
// args, bwd only.
#include "kernels/loss/loss.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <utility>
#include <vector>

#include "hotops/check.h"
#include "hotops/op_family.h"
#include "kernels/loss/bce.h"
#include "kernels/loss/mse.h"

namespace hotops::loss {
namespace {

// The classifier head of a real model: rows_per_sample rows of `classes` logits per sample, at its
// default batches.
struct NamedShape {
  const char* name;
  std::int64_t rows_per_sample;
  std::int64_t classes;
  std::vector<std::int64_t> batches;
};

const std::vector<NamedShape>& named_shapes() {
  static const std::vector<NamedShape> shapes = {
      // The CPU-vs-GPU studies' classifier heads.
      {"mlp_tiny", 1, 2, {10, 4096}},       // the PyTorch tiny-MLP notebook: 2 classes
      {"mlp_mnist", 1, 10, {128}},          // an MNIST MLP: 10 digits
      {"classifierdl", 1, 2, {1024}},       // Spark NLP ClassifierDL, binary sentiment
      {"keras_cnn", 1, 4, {64}},            // Max Woolf's Keras CNN benchmark, 4 classes
      {"imagenet", 1, 1000, {256}},         // an ImageNet classifier (ResNet-50, ViT-B/16)
      {"lstm_textgen", 1, 57, {32, 128, 512}},  // Keras' lstm_text_generation.py: the next of 57 characters
      {"bert.mlm", 128, 30522, {8}},        // BERT-base masked-LM head: every token of 128, vocab 30522
  };
  return shapes;
}

// cross_entropy_dbias: the heads that the dense models and the BiLSTM train with their bias gradient.
const std::vector<NamedShape>& dbias_shapes() {
  static const std::vector<NamedShape> shapes = {
      {"mlp_tiny", 1, 2, {10, 4096}},   // the PyTorch tiny-MLP notebook's batch, and the sweep's largest
      {"mlp_mnist", 1, 10, {128}},      // Keras' mnist_mlp.py
      {"classifierdl", 1, 2, {1024}},   // Spark NLP ClassifierDL
      {"bilstm_imdb", 1, 2, {64}},      // the Keras IMDB BiLSTM's sentiment head
  };
  return shapes;
}

constexpr DType kDTypes[] = {DType::f32, DType::bf16};

void expand(const std::vector<Arg>& args, std::vector<Problem>& out) { expand_fwd_bwd("cross_entropy", args, out); }
void expand_dbias(const std::vector<Arg>& args, std::vector<Problem>& out) {
  for (Backend be : kAllBackends)
    for (DType t : kDTypes) out.push_back(Problem{"cross_entropy_dbias", be, t, Direction::bwd, args});
}
std::vector<Arg> head_args(const NamedShape& ns, std::int64_t b) {
  return {{"shape", ns.name},
          {"batch", std::to_string(b)},
          {"rows", std::to_string(b * ns.rows_per_sample)},
          {"classes", std::to_string(ns.classes)}};
}

// 64-bit mix (splitmix64's finaliser): the targets are a pure function of (seed, row).
std::uint64_t mix(std::uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// FLOPs per logit, each exp counted as one (the per-row log, the target's pick and the mean are
// O(rows) and not counted):
//   fwd 4: the max's compare, x - max, exp, the sum's add
//   bwd 4: x - lse, exp, minus the one-hot, times dloss / rows
constexpr double kFlopsPerLogit = 4;

// The op as the benchmark runs it: a PlanCase over the problem's inputs and outputs. The int64
// targets (cross_entropy_dbias: as int32) and the scalar dloss travel as buffers of their bytes,
// uploaded like any input on CUDA.
struct Op : OpOf<Shape, Args, Inputs, Outputs> {
  struct Io : OpOf::Io {
    HostBuffer target;  // in.target's bytes
    HostBuffer dloss;   // bwd: in.dloss, one f32
    HostBuffer labels;  // cross_entropy_dbias: in.target as int32
  };
  static Shape shape(const Problem& p) { return shape_of(p); }
  static Io io(const Shape& s, std::uint64_t seed) {
    const auto rows = static_cast<std::size_t>(s.rows);
    Io io{OpOf::io(s, seed), HostBuffer(DType::f32, 2 * rows), HostBuffer(DType::f32, 1), HostBuffer(DType::f32, rows)};
    std::memcpy(io.target.data(), io.in.target.data(), io.in.target.size() * sizeof(std::int64_t));
    for (std::size_t r = 0; r < rows; ++r) io.labels.as<std::int32_t>()[r] = static_cast<std::int32_t>(io.in.target[r]);
    io.dloss.set(0, io.in.dloss);
    return io;
  }
  static Args bind(const Shape& s, Io& io, Binder& b) {
    Args a;
    a.logits = b.in(io.in.logits);
    if (s.kind == Kind::cross_entropy_dbias) {
      a.labels = static_cast<const std::int32_t*>(b.indices(io.labels));
      a.loss = b.out(io.out.loss);
      a.dlogits = b.out(io.out.dlogits);
      a.db = static_cast<float*>(b.out(io.out.db));
      return a;
    }
    a.target = static_cast<const std::int64_t*>(b.indices(io.target));
    if (s.dir == Direction::fwd) {
      a.loss = b.out(io.out.loss);
      a.lse = b.out(io.out.lse);
    } else {
      a.saved_lse = b.in(io.in.lse);
      a.dloss = b.in(io.dloss);
      a.dlogits = b.out(io.out.dlogits);
    }
    return a;
  }
};

std::unique_ptr<Case> make_case(const Problem& p) {
  if (p.op == "mse") return mse::make_case(p);
  if (p.op == "bce_logits") return bce::make_case(p);
  return make_plan_case<Op>(p);
}

// The encoder layers' outputs, [batch x tokens, hidden], that their train steps' MSE loss reads: mse's
// problems, at the models' batches.
struct ModelOutput {
  const char* name;
  std::int64_t tokens, hidden;
  std::vector<std::int64_t> batches;
};
const std::vector<ModelOutput>& model_outputs() {
  static const std::vector<ModelOutput> shapes = {
      {"bert.layer", 128, 768, {8, 32}},     // model.bert_layer
      {"vit_b16.layer", 197, 768, {8, 32}},  // model.vit_layer
  };
  return shapes;
}
std::vector<Arg> mse_args(const std::string& shape, std::int64_t batch, std::int64_t tokens, std::int64_t hidden) {
  return {{"shape", shape}, {"batch", std::to_string(batch)}, {"tokens", std::to_string(tokens)}, {"hidden", std::to_string(hidden)}};
}

// The binary heads that bce_logits' problems are: `outputs` sigmoid logits a sample.
struct BinaryHead {
  const char* name;
  std::int64_t outputs;
  std::vector<std::int64_t> batches;
};
const std::vector<BinaryHead>& binary_heads() {
  static const std::vector<BinaryHead> shapes = {
      {"fasttext_imdb", 1, {32, 4096}},  // Keras' imdb_fasttext.py: Dense(1, sigmoid), batch 32; and a large batch
  };
  return shapes;
}
std::vector<Arg> bce_args(const std::string& shape, std::int64_t batch, std::int64_t outputs) {
  return {{"shape", shape}, {"batch", std::to_string(batch)}, {"outputs", std::to_string(outputs)}};
}

class LossFamily final : public OpFamily {
 public:
  // The hand-written CPU loops run everywhere: nothing to probe.
  LossFamily() : OpFamily("loss", nullptr, make_case, HOTOPS_CUDA_FACTORY(make_case)) {}

  std::vector<Problem> benchmark_problems(const std::vector<std::int64_t>& batches) const override {
    std::vector<Problem> out = per_shape_and_batch(
        named_shapes(), batches, [](const NamedShape& ns, std::int64_t b, std::vector<Problem>& o) { expand(head_args(ns, b), o); });
    for (Problem& p : per_shape_and_batch(dbias_shapes(), batches, [](const NamedShape& ns, std::int64_t b, std::vector<Problem>& o) {
           expand_dbias(head_args(ns, b), o);
         }))
      out.push_back(std::move(p));
    const std::vector<Problem> m = per_shape_and_batch(model_outputs(), batches, [](const ModelOutput& mo, std::int64_t b, std::vector<Problem>& o) {
      mse::expand(mse_args(mo.name, b, mo.tokens, mo.hidden), o);
    });
    out.insert(out.end(), m.begin(), m.end());
    const std::vector<Problem> b = per_shape_and_batch(binary_heads(), batches, [](const BinaryHead& h, std::int64_t n, std::vector<Problem>& o) {
      bce::expand(bce_args(h.name, n, h.outputs), o);
    });
    out.insert(out.end(), b.begin(), b.end());
    return out;
  }

  std::vector<Problem> test_problems() const override {
    // classes 1 (loss 0, gradient 0), 2 and 5 (a few active lanes), 33 (one past a warp, scalar
    // accesses), 1000 (16-byte vectors in both dtypes, a warp per row on CUDA), 3001 (odd, one block
    // per row on CUDA, scalar) and 4096 (one block per row, vectors).
    constexpr std::int64_t kShapes[][2] = {{3, 1}, {7, 2}, {5, 5}, {9, 33}, {4, 1000}, {3, 3001}, {2, 4096}};
    std::vector<Problem> out;
    for (const auto& rc : kShapes)
      expand({{"shape", "test"}, {"rows", std::to_string(rc[0])}, {"classes", std::to_string(rc[1])}}, out);
    // cross_entropy_dbias: one class; two; odd; the most CUDA takes; more rows than the CUDA block's
    // 512 threads (several rows a thread, the last round partial).
    constexpr std::int64_t kDbiasShapes[][2] = {{3, 1}, {7, 2}, {5, 5}, {9, 16}, {1100, 3}};
    for (const auto& rc : kDbiasShapes)
      expand_dbias({{"shape", "test"}, {"rows", std::to_string(rc[0])}, {"classes", std::to_string(rc[1])}}, out);
    // mse: 15 elements (below a warp; most of CUDA's blocks idle), and 74,496 (over 256 x 256: each
    // CUDA thread takes two elements or one).
    mse::expand(mse_args("test", 1, 3, 5), out);
    mse::expand(mse_args("test", 3, 97, 256), out);
    // bce_logits: one logit; several outputs a sample; more elements than a CUDA block's threads;
    // more than 256 blocks' (each thread of the loss takes one or two).
    for (const auto& bk : {std::pair<int, int>{1, 1}, {11, 3}, {1000, 1}, {70001, 1}})
      bce::expand(bce_args("test", bk.first, bk.second), out);
    return out;
  }

  Work work(const Problem& p) const override {
    if (p.op == "mse") return mse::work(p);
    if (p.op == "bce_logits") return bce::work(p);
    const Shape s = shape_of(p);
    const double n = static_cast<double>(s.elements()), rows = static_cast<double>(s.rows);
    const double e = static_cast<double>(dtype_size(s.dtype));
    Work w;
    w.flops = n * kFlopsPerLogit;
    // fwd: logits and int64 targets read, the f32 loss and f32 lse per row written;
    // bwd: logits, targets, lse and dloss read, dlogits written.
    w.bytes = s.dir == Direction::fwd ? n * e + rows * 8 + 4 + rows * 4 : n * e + rows * 8 + rows * 4 + 4 + n * e;
    if (s.kind == Kind::cross_entropy_dbias) {
      // fwd's 4 a logit, 4 for the gradient and 1 for db's sum; logits and int32 labels read, the
      // loss, dlogits and the f32 db written.
      w.flops = n * (2 * kFlopsPerLogit + 1);
      w.bytes = n * e + rows * 4 + 4 + n * e + static_cast<double>(s.classes) * 4;
    }
    w.items = p.batch() ? static_cast<double>(*p.batch()) : 1.0;
    return w;
  }
};

// The first guard element of `b` after its first n that is not NaN, as a failed check.
bool guard_written(const HostBuffer& b, std::size_t n, const char* what, Check& c) {
  for (std::size_t i = n; i < b.count(); ++i)
    if (!std::isnan(b.get(i))) {
      char buf[160];
      std::snprintf(buf, sizeof buf, "guard element %zu after the %zu %s outputs was written (%g)", i, n, what,
                    b.get(i));
      c.ok = false;
      c.message = buf;
      return true;
    }
  return false;
}

}  // namespace

Shape shape_of(const Problem& p) {
  HOTOPS_CHECK(p.op == "cross_entropy" || p.op == "cross_entropy_dbias",
               "loss has cross_entropy and cross_entropy_dbias only: " + p.name());
  Shape s = fwd_bwd_shape<Shape>(p, p.op);
  if (p.op == "cross_entropy_dbias") {
    HOTOPS_CHECK(s.dir == Direction::bwd, "cross_entropy_dbias is bwd only: " + p.name());
    s.kind = Kind::cross_entropy_dbias;
  }
  s.rows = p.get_int("rows");
  s.classes = p.get_int("classes");
  HOTOPS_CHECK(s.rows > 0 && s.classes > 0, "bad cross_entropy shape: " + p.name());
  if (p.batch())
    HOTOPS_CHECK(s.rows % *p.batch() == 0, "cross_entropy rows must be a multiple of the batch: " + p.name());
  return s;
}

Inputs make_inputs(const Shape& s, std::uint64_t seed) {
  Inputs in;
  in.logits = HostBuffer(s.dtype, s.elements() + kGuard);
  in.logits.fill_uniform(seed, 0, -4.f, 4.f);
  in.target.resize(static_cast<std::size_t>(s.rows));
  const std::uint64_t key = mix(seed ^ 0x7a26e75ull);
  for (std::size_t r = 0; r < in.target.size(); ++r)
    in.target[r] = static_cast<std::int64_t>(mix(key + r) % static_cast<std::uint64_t>(s.classes));
  if (s.dir == Direction::bwd && s.kind == Kind::cross_entropy) {
    std::vector<double> lse(static_cast<std::size_t>(s.rows));
    reference_fwd(s, in, lse.data());
    in.lse = HostBuffer(DType::f32, lse.size() + kGuard);
    for (std::size_t r = 0; r < in.lse.count(); ++r) in.lse.set(r, r < lse.size() ? lse[r] : 0.0);
  }
  return in;
}

Outputs make_outputs(const Shape& s) {
  Outputs out;
  if (s.kind == Kind::cross_entropy_dbias) {
    out.loss = HostBuffer(DType::f32, 1 + kGuard);
    out.dlogits = HostBuffer(s.dtype, s.elements() + kGuard);
    out.db = HostBuffer(DType::f32, static_cast<std::size_t>(s.classes) + kGuard);
  } else if (s.dir == Direction::fwd) {
    out.loss = HostBuffer(DType::f32, 1 + kGuard);
    out.lse = HostBuffer(DType::f32, static_cast<std::size_t>(s.rows) + kGuard);
  } else {
    out.dlogits = HostBuffer(s.dtype, s.elements() + kGuard);
  }
  return out;
}

void poison(Outputs& out) {
  for (HostBuffer* b : {&out.loss, &out.lse, &out.dlogits, &out.db})
    if (b->count()) b->poison();
}

// Bounds on |out - ref|, handed to compare() (whose metric is relative to rms(ref)) as k M / rms(ref).
// The logits are exact in the dtype (the reference reads the stored values), so the error is the
// f32 math, plus the output's rounding in bf16 (bwd only: loss and lse are f32 in both dtypes).
// u = 2^-24 (f32).
//   fwd, per row: lse = m + log(s): the max is exact; s sums C terms exp(x - m) in [0, 1] with s >= 1,
//        in 16 (CPU) or 32+ (CUDA) interleaved partial sums, so the longest f32 chain is C/16 adds:
//        |ds / s| <= (C/16 + a few) u worst case (1.1e-4 at C = 30522), about sqrt(C/16) u typically;
//        that is the absolute error of log(s), and m + log(s) and lse - x_t round by u of their
//        magnitude. The mean adds a sum over rows (double on the CPU; an f32 tree on CUDA,
//        log2(rows) u relative to the sum of |row losses|).
//        M = mean over rows of (|lse_r| + |x_{r,t_r}|) for the loss (>= |loss|, and > 0 even where
//        the loss is 0, at classes = 1), max |lse_r| for the lse. k = 1e-5: above the worst case of
//        the sum (1.1e-4 absolute against M >= 10.3 = log 30522 at the widest rows), far above the
//        typical error (1e-7 relative).
//   bwd: dx_j = dloss (exp(x_j - lse) - [j == t]) / rows. x_j - lse rounds by u |x_j - lse| (at most
//        about 8 + log C, so 20 u relative in the exp), expf errs by 2 ulp, the product by one:
//        |err_j| <= 25 u |dloss| / rows at most. M = |dloss| / rows (the largest |dx| is below it).
//        f32: k = 1e-5, a 6x margin over that 25 u = 1.5e-6;
//        bf16: the output rounds to nearest even, 2^-9 = 1.95e-3 relative, plus the f32 part: 4e-3.
// A wrong target index moves two outputs by about |dloss| / rows = M (over 250 times the bf16 bound),
// a missing / rows scales every output by rows, and a wrong row's lse moves the loss by O(1).
//   cross_entropy_dbias: the loss as fwd's (the CUDA block's f32 sum over rows chains rows/512 + 21
//        adds, 29 u at 4096 rows, within k); dlogits as bwd's, from the double lse, with dloss 1: the
//        kernels compute exp(x - max) / sum instead of exp(x - lse), 2 roundings more, within the
//        per-element check's 50 u below; db against the column sums of the op's own dlogits (what it
//        adds: checked against the reference above), f32 sums in chains of at most rows adds (CPU: down
//        the rows; CUDA: rows/512 per thread, then a 5-level warp tree and 16 warps):
//        |db - sum| <= gamma_rows sum |dlogits| with gamma_n = n u / (1 - n u); k = rows u and 1%.
//        A dropped row moves db by one dlogits element, about 1/rows of sum |dlogits| / classes.
double fwd_error_bound() { return 1e-5; }
double bwd_error_bound(DType t) { return t == DType::bf16 ? 4e-3 : 1e-5; }
double dbias_error_bound(const Shape& s) { return 1.01 * static_cast<double>(s.rows) * 0x1p-24; }

namespace {

// The mean loss against the reference (every row's lse into `lse`).
Check check_loss(const Shape& s, const Inputs& in, const HostBuffer& loss_out, std::vector<double>& lse) {
  const auto rows = static_cast<std::size_t>(s.rows), classes = static_cast<std::size_t>(s.classes);
  lse.resize(rows);
  const double loss = reference_fwd(s, in, lse.data());
  double mag = 0;
  for (std::size_t r = 0; r < rows; ++r)
    mag += std::fabs(lse[r]) + std::fabs(in.logits.get(r * classes + static_cast<std::size_t>(in.target[r])));
  mag /= static_cast<double>(rows);
  Check c = compare(loss_out, {0}, [&](std::size_t) { return loss; },
                    fwd_error_bound() * mag / (loss != 0 ? std::fabs(loss) : 1.0));
  if (!c.ok) c.message = "loss: " + c.message;
  return c;
}

// dlogits = dloss (exp(x - lse) - onehot) / rows on whole rows (all up to ~2^18 elements, else a
// sample of rows that keeps the first and last), each row's lse from `lse`.
Check check_dlogits(const Shape& s, const Inputs& in, const HostBuffer& dlogits, const std::vector<double>& lse) {
  const auto rows = static_cast<std::size_t>(s.rows), classes = static_cast<std::size_t>(s.classes);
  const std::size_t row_limit = std::max<std::size_t>(16, (std::size_t(1) << 18) / classes);
  const std::vector<std::size_t> sampled = sample_indices(rows, row_limit, 17);
  std::vector<std::int64_t> pos(rows, -1);
  std::vector<std::size_t> idx;
  idx.reserve(sampled.size() * classes);
  for (std::size_t k = 0; k < sampled.size(); ++k) {
    pos[sampled[k]] = static_cast<std::int64_t>(k);
    for (std::size_t j = 0; j < classes; ++j) idx.push_back(sampled[k] * classes + j);
  }
  const double scale = static_cast<double>(in.dloss) / static_cast<double>(rows);
  std::vector<double> ref(idx.size());
  double sumsq = 0;
  const auto nrows = static_cast<std::int64_t>(sampled.size());
#pragma omp parallel reduction(+ : sumsq)
  {
    std::vector<double> x(classes);
#pragma omp for
    for (std::int64_t k = 0; k < nrows; ++k) {
      const std::size_t r = sampled[static_cast<std::size_t>(k)], base = r * classes;
      double* d = ref.data() + static_cast<std::size_t>(k) * classes;
      for (std::size_t j = 0; j < classes; ++j) x[j] = in.logits.get(base + j);
      reference_bwd(x.data(), classes, in.target[r], lse[r], scale, d);
      for (std::size_t j = 0; j < classes; ++j) sumsq += d[j] * d[j];
    }
  }
  const double rms = std::sqrt(sumsq / static_cast<double>(idx.size()));
  const double mag = std::fabs(scale);
  const auto ref_at = [&](std::size_t i) {
    return ref[static_cast<std::size_t>(pos[i / classes]) * classes + i % classes];
  };
  Check c = compare(dlogits, idx, ref_at, bwd_error_bound(s.dtype) * mag / (rms > 0 ? rms : 1.0));
  if (!c.ok) return c;
  // Each element against its own size too. The bound above is relative to the largest output
  // (|dloss| / rows): at 30,522 classes a non-target gradient is about 1/C of that, so a kernel that
  // wrote every one of them as 0 would pass it. The derivation above is per element: the f32 math
  // errs by at most 25 u of the element itself, bf16's rounding by half an ulp, 2^-8 of it (bf16
  // keeps 8 significant bits); the target element, where p_t - 1 cancels, by 25 u of |dloss| / rows
  // at most, which the floor allows.
  const double rel = s.dtype == DType::bf16 ? 4e-3 : 3e-6, floor = 30 * 0x1p-24 * mag;
  for (std::size_t i : idx) {
    const double r = ref_at(i), o = dlogits.get(i);
    if (std::fabs(o - r) <= rel * std::fabs(r) + floor) continue;
    char buf[200];
    std::snprintf(buf, sizeof buf, "dlogits: element %zu (row %zu, class %zu) is %.9g, the reference %.9g: beyond %g of it", i,
                  i / classes, i % classes, o, r, rel);
    c.ok = false;
    c.message = buf;
    return c;
  }
  guard_written(dlogits, s.elements(), "dlogits", c);
  return c;
}

// cross_entropy_dbias's db against the column sums of its dlogits (see the bounds above).
Check check_dbias(const Shape& s, const Outputs& out) {
  const auto rows = static_cast<std::size_t>(s.rows), classes = static_cast<std::size_t>(s.classes);
  Check c;
  c.tol = dbias_error_bound(s);
  for (std::size_t j = 0; j < classes; ++j) {
    double sum = 0, terms = 0;
    for (std::size_t r = 0; r < rows; ++r) {
      const double d = out.dlogits.get(r * classes + j);
      sum += d, terms += std::fabs(d);
    }
    const double o = out.db.get(j), err = std::fabs(o - sum);
    if (terms > 0) c.max_err = std::max(c.max_err, err / terms);
    if (err <= c.tol * terms) continue;
    char buf[200];
    std::snprintf(buf, sizeof buf, "db: element %zu is %.9g, its dlogits' column sums to %.9g: beyond %g of their magnitudes' sum %g",
                  j, o, sum, c.tol, terms);
    c.ok = false;
    c.message = buf;
    return c;
  }
  c.checked = classes;
  guard_written(out.db, classes, "db", c);
  return c;
}

}  // namespace

Check verify(const Shape& s, const Inputs& in, const Outputs& out) {
  const auto rows = static_cast<std::size_t>(s.rows);
  std::vector<double> lse;
  if (s.kind == Kind::cross_entropy_dbias) {
    Check c = check_loss(s, in, out.loss, lse);
    if (!c.ok || guard_written(out.loss, 1, "loss", c)) return c;
    for (const Check& part : {check_dlogits(s, in, out.dlogits, lse), check_dbias(s, out)}) {
      if (!part.ok) return part;  // its message names the output
      c.checked += part.checked;
    }
    return c;
  }
  if (s.dir == Direction::fwd) {
    Check c = check_loss(s, in, out.loss, lse);
    if (!c.ok) return c;
    double lse_max = 0, lse_sumsq = 0;
    for (std::size_t r = 0; r < rows; ++r) {
      lse_max = std::max(lse_max, std::fabs(lse[r]));
      lse_sumsq += lse[r] * lse[r];
    }
    std::vector<std::size_t> all(rows);
    for (std::size_t r = 0; r < rows; ++r) all[r] = r;
    const double lse_rms = std::sqrt(lse_sumsq / static_cast<double>(rows));
    c.merge(compare(out.lse, all, [&](std::size_t r) { return lse[r]; },
                    fwd_error_bound() * lse_max / (lse_rms > 0 ? lse_rms : 1.0)),
            "lse");
    if (!c.ok) return c;
    if (guard_written(out.loss, 1, "loss", c) || guard_written(out.lse, rows, "lse", c)) return c;
    return c;
  }
  // bwd: from the lse the forward saved (f32).
  lse.resize(rows);
  for (std::size_t r = 0; r < rows; ++r) lse[r] = in.lse.get(r);
  return check_dlogits(s, in, out.dlogits, lse);
}

HOTOPS_DEFINE_FAMILY(LossFamily);

}  // namespace hotops::loss
