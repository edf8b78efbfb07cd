// batchnorm_relu_maxpool: problem names, shapes, inputs, work and verification.
//
// Names: batchnorm_relu_maxpool/<cpu|cuda>/<f32|bf16>/<fwd|infer|bwd>/shape:<model.layer>/layout:<nhwc|nchw>/
// batch:N/C:C/H:H/W:W/pool:k/dropout:p, H and W those of z (the conv's output); layout:nchw names end
// /pooled:<nchw|nhwc>, the pooled tensors' layout. batchnorm_relu/<cpu|cuda>/<f32|bf16>/<fwd|infer|bwd>/
// shape:<model.layer>/layout:<nc|nhwc|nchw>/batch:N/C:C[/H:H/W:W]/dropout:p (nc: a dense layer's
// [N, C]; nchw: no dropout). Either ends /bn:0 for a layer without batch norm (the bias alone).
#include "kernels/batchnorm/relu_maxpool.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "hotops/check.h"
#include "hotops/op_family.h"
#include "kernels/batchnorm/batchnorm.h"

namespace hotops::batchnorm::relu_maxpool {
namespace {

// A buffer of n bytes (a HostBuffer counts 4-byte elements).
HostBuffer bytes(std::int64_t n) { return HostBuffer(DType::f32, static_cast<std::size_t>((n + 3) / 4)); }

// The op as the benchmark runs it. fwd's running statistics are in-out tensors.
struct Op {
  using Shape = relu_maxpool::Shape;
  using Args = relu_maxpool::Args;
  struct Io {
    Inputs in;
    Outputs out;
  };
  static Shape shape(const Problem& p) { return shape_of(p); }
  static Io io(const Shape& s, std::uint64_t seed) { return {make_inputs(s, seed), make_outputs(s)}; }
  static std::unique_ptr<Plan> plan(const Shape& s, Backend b) { return make_plan(s, b); }
  static Check check(const Shape& s, const Io& io) { return verify(s, io.in, io.out); }
  static Args bind(const Shape& s, Io& io, Binder& b) {
    auto read = [&](const HostBuffer& h) { return const_cast<float*>(static_cast<const float*>(b.in(h))); };
    auto write = [&](HostBuffer& h) { return static_cast<float*>(b.out(h)); };
    Inputs& in = io.in;
    Outputs& out = io.out;
    Args a;
    a.z = b.in(in.z);
    a.gamma = static_cast<const float*>(b.in(in.gamma));
    if (s.drops()) a.period = static_cast<const int*>(b.indices(in.period));
    if (s.dir == Direction::bwd) {
      a.dout = b.in(in.dout);
      if (s.pool) a.arg = static_cast<std::uint8_t*>(const_cast<void*>(b.indices(in.arg)));
      a.scale = read(in.scale), a.shift = read(in.shift), a.mean = read(in.mean), a.rstd = read(in.rstd);
      a.dz = b.out(out.dz);
      a.dgamma = write(out.dgamma), a.dbeta = write(out.dbeta), a.dbias = write(out.dbias);
      return a;
    }
    a.beta = static_cast<const float*>(b.in(in.beta));
    a.bias = static_cast<const float*>(b.in(in.bias));
    a.out = b.out(out.out);
    if (s.pool) a.arg = static_cast<std::uint8_t*>(b.out(out.arg));
    a.scale = write(out.scale), a.shift = write(out.shift);
    if (s.dir == Direction::infer) {
      a.running_mean = read(in.running_mean), a.running_var = read(in.running_var);
      return a;
    }
    a.mean = write(out.mean), a.rstd = write(out.rstd);
    a.running_mean = static_cast<float*>(b.inout(in.running_mean, out.running_mean));
    a.running_var = static_cast<float*>(b.inout(in.running_var, out.running_var));
    return a;
  }
};

// pooled: with layout nchw, the pooled tensors' layout.
std::vector<Arg> dims(const std::string& shape, Layout layout, std::int64_t batch, std::int64_t C, std::int64_t H, std::int64_t W,
                      std::int64_t k, const char* dropout, Layout pooled = Layout::nchw) {
  std::vector<Arg> a{{"shape", shape},          {"layout", layout_name(layout)}, {"batch", std::to_string(batch)},
                     {"C", std::to_string(C)},  {"H", std::to_string(H)},        {"W", std::to_string(W)},
                     {"pool", std::to_string(k)}, {"dropout", dropout}};
  if (layout == Layout::nchw) a.push_back({"pooled", layout_name(pooled)});
  return a;
}

// batchnorm_relu's: nc has no H and W.
std::vector<Arg> relu_dims(const std::string& shape, Layout layout, std::int64_t batch, std::int64_t C, std::int64_t H, std::int64_t W,
                           const char* dropout) {
  std::vector<Arg> a{{"shape", shape}, {"layout", layout_name(layout)}, {"batch", std::to_string(batch)}, {"C", std::to_string(C)}};
  if (layout != Layout::nc) a.push_back({"H", std::to_string(H)}), a.push_back({"W", std::to_string(W)});
  a.push_back({"dropout", dropout});
  return a;
}

void expand(const std::vector<Arg>& args, std::vector<Problem>& out, const char* op = kOp) {
  for (Backend b : {Backend::cpu, Backend::cuda})
    for (DType t : {DType::f32, DType::bf16})
      for (Direction d : {Direction::fwd, Direction::infer, Direction::bwd}) out.push_back(Problem{op, b, t, d, args});
}

// The keras_cnn layers whose conv is followed by batch norm, ReLU, a pool and dropout (model_cnn's
// keras_cnn: its first conv, pool 3; the last conv of its second and third stages, pool 2), at the
// batchnorm family's keras_cnn shapes of the same size (z's C, H, W); and vgg_cifar's, the bias
// without batch norm (`bn:0`; the last conv of each stage, pool 2, at its study's batch 128). NCHW
// (the f32 CUDA step's layout) pools the last layer into NHWC, the order the flatten reads.
struct Layer {
  const char* name;
  std::int64_t C, H, W, k;
  const char* dropout;
  Layout nchw_pooled;
  std::int64_t batch = 32;
  bool bn = true;
};
constexpr Layer kLayers[] = {
    {"keras_cnn.bn0", 32, 256, 256, 3, "0.25", Layout::nchw},
    {"keras_cnn.bn1", 64, 85, 85, 2, "0.25", Layout::nchw},
    {"keras_cnn.bn3", 128, 42, 42, 2, "0.25", Layout::nhwc},
    {"vgg_cifar.conv1", 32, 30, 30, 2, "0.25", Layout::nchw, 128, false},
    {"vgg_cifar.conv3", 64, 13, 13, 2, "0.25", Layout::nhwc, 128, false},
};

// The keras_cnn layers whose batch norm and ReLU no pool follows, batchnorm_relu's: the dense layer's
// (dropout 0.5; the batchnorm family's batches), and the convs that another conv follows (conv2d_1 and
// conv2d_3, the batchnorm family's keras_cnn.bn1 and bn3) in NHWC and NCHW; and vgg_cifar's, the
// bias without batch norm (`bn:0`): its dense layer (dropout 0.5) and the first conv of each stage.
struct ReluLayer {
  const char* name;
  Layout layout;
  std::int64_t C, H, W;
  const char* dropout;
  std::vector<std::int64_t> batches;
  bool bn = true;
};
const std::vector<ReluLayer>& relu_layers() {
  static const std::vector<ReluLayer> layers = {
      {"keras_cnn.dense_bn", Layout::nc, 1024, 1, 1, "0.5", {32, 1024}},
      {"keras_cnn.bn1", Layout::nhwc, 64, 85, 85, "0", {32}},
      {"keras_cnn.bn3", Layout::nhwc, 128, 42, 42, "0", {32}},
      {"keras_cnn.bn1", Layout::nchw, 64, 85, 85, "0", {32}},
      {"keras_cnn.bn3", Layout::nchw, 128, 42, 42, "0", {32}},
      {"vgg_cifar.dense", Layout::nc, 512, 1, 1, "0.5", {128}, false},
      {"vgg_cifar.conv0", Layout::nhwc, 32, 32, 32, "0", {128}, false},
      {"vgg_cifar.conv2", Layout::nhwc, 64, 15, 15, "0", {128}, false},
      {"vgg_cifar.conv0", Layout::nchw, 32, 32, 32, "0", {128}, false},
      {"vgg_cifar.conv2", Layout::nchw, 64, 15, 15, "0", {128}, false},
  };
  return layers;
}

// A layer without batch norm: `bn:0` after the rest.
std::vector<Arg> with_bn(std::vector<Arg> a, bool bn) {
  if (!bn) a.push_back({"bn", "0"});
  return a;
}

Layout layout_arg(const Problem& p, const std::string& key) {
  const std::string& l = p.get(key);
  if (l == "nhwc") return Layout::nhwc;
  if (l == "nchw") return Layout::nchw;
  if (l == "nc" && p.op == kReluOp && key == "layout") return Layout::nc;
  throw Error(p.op + " takes " + key + " nhwc or nchw" + (p.op == kReluOp ? " or nc" : "") + ", not '" + l + "': " + p.name());
}

}  // namespace

Shape shape_of(const Problem& p) {
  HOTOPS_CHECK(is_op(p), std::string("not a ") + kOp + " or " + kReluOp + " problem: " + p.name());
  HOTOPS_CHECK(p.dtype == DType::f32 || p.dtype == DType::bf16, p.op + " has f32 and bf16 only: " + p.name());
  Shape s;
  s.pool = p.op == kOp;
  s.layout = layout_arg(p, "layout");
  s.pooled_layout = s.pool && s.layout == Layout::nchw ? layout_arg(p, "pooled") : s.layout;
  s.dir = p.dir;
  s.dtype = p.dtype;
  s.N = p.get_int("batch"), s.C = p.get_int("C");
  if (s.layout != Layout::nc) s.H = p.get_int("H"), s.W = p.get_int("W");
  s.k = s.pool ? p.get_int("pool") : 1;
  s.dropout = std::stod(p.get("dropout"));
  if (p.has("bn")) {
    HOTOPS_CHECK(p.get("bn") == "0", p.op + " takes bn:0 (the bias alone) or no bn arg (batch norm): " + p.name());
    s.bn = false;
  }
  HOTOPS_CHECK(s.pool || s.layout != Layout::nchw || s.dropout == 0, std::string(kReluOp) + " takes no dropout in NCHW: " + p.name());
  HOTOPS_CHECK(s.N > 0 && s.C > 0 && s.k > 0 && s.PH() > 0 && s.PW() > 0, p.op + ": bad dimensions in " + p.name());
  HOTOPS_CHECK(s.dropout >= 0 && s.dropout < 1, p.op + " needs 0 <= dropout < 1: " + p.name());
  // Every backend of the same problem draws the same mask.
  Problem q = p;
  q.backend = Backend::cpu;
  s.key = pointwise::dropout_key(q.seed(), s.dropout);
  return s;
}

Inputs make_inputs(const Shape& s, std::uint64_t seed) {
  const auto C = static_cast<std::size_t>(s.C);
  // z, gamma, beta and the running statistics as the batchnorm op seeds them (each channel its own
  // mean and spread), from its inputs of the same size and layout.
  batchnorm::Shape b;
  b.dir = s.dir == Direction::bwd ? Direction::fwd : s.dir;
  b.dtype = s.dtype, b.layout = s.layout, b.N = s.N, b.C = s.C, b.H = s.H, b.W = s.W;
  batchnorm::Inputs bi = batchnorm::make_inputs(b, seed);
  Inputs in;
  in.z = std::move(bi.x);
  in.gamma = std::move(bi.gamma);
  in.beta = std::move(bi.beta);
  in.bias = HostBuffer(DType::f32, C);
  in.bias.fill_uniform(seed, 9, -0.5f, 0.5f);
  in.running_mean = std::move(bi.running_mean);
  in.running_var = std::move(bi.running_var);
  in.period = HostBuffer(DType::f32, 1);
  *in.period.as<int>() = static_cast<int>(s.N);
  if (s.dir != Direction::bwd) return in;

  // The saved affine and statistics are those a training forward pass of z leaves, in f32.
  Shape fwd = s;
  fwd.dir = Direction::fwd;
  {
    const Reference r(fwd, in);
    for (HostBuffer* h : {&in.scale, &in.shift, &in.mean, &in.rstd}) *h = HostBuffer(DType::f32, C);
    for (std::size_t c = 0; c < C; ++c) {
      in.scale.set(c, r.scale[c]), in.shift.set(c, r.shift[c]);
      in.mean.set(c, s.bn ? r.mean[c] : 0.0), in.rstd.set(c, s.bn ? r.rstd[c] : 0.0);
    }
  }
  // No ReLU near-ties: an element whose z scale + shift is within 1e-5 of its terms' size (where f32
  // with or without a fused multiply-add could round to either side of zero) moves off the tie.
  // (Each element is its own: the loops here run in parallel.)
  const std::int64_t lines = s.z_lines();
#pragma omp parallel for schedule(static) if (s.count() > (1 << 16))
  for (std::int64_t r = 0; r < lines; ++r)
    for_z_lines(s, r, r + 1, [&](std::int64_t i, std::int64_t ch, std::int64_t, std::int64_t, std::int64_t) {
      const auto c = static_cast<std::size_t>(ch), k = static_cast<std::size_t>(i);
      for (int tries = 0; tries < 8; ++tries) {
        const double zs = in.z.get(k) * in.scale.get(c), y = zs + in.shift.get(c);
        if (std::fabs(y) > 1e-5 * (std::fabs(zs) + std::fabs(in.shift.get(c)))) break;
        in.z.set(k, in.z.get(k) + 0.01 / in.scale.get(c));
      }
    });
  in.dout = HostBuffer(s.dtype, static_cast<std::size_t>(s.pooled()));
  in.dout.fill_uniform(seed, 10);
  if (!s.pool) return in;
  // The argmax bytes fwd would write: the first maximum of relu(z scale + shift) in the window.
  in.arg = bytes(s.pooled());
  auto* arg = in.arg.as<std::uint8_t>();
  const Reference r(fwd, in);
  const std::int64_t PH = s.PH(), PW = s.PW();
  const bool nchw = s.layout == Layout::nchw;
#pragma omp parallel for collapse(2) schedule(static) if (s.pooled() > (1 << 14))
  for (std::int64_t n = 0; n < s.N; ++n)
    for (std::int64_t ph = 0; ph < PH; ++ph)
      for (std::int64_t pw = 0, j = (n * PH + ph) * PW * s.C; pw < PW; ++pw)
        for (std::int64_t c = 0; c < s.C; ++c, ++j) {
          double best = -1;
          for (std::int64_t q = 0; q < s.k * s.k; ++q) {
            const std::int64_t h = ph * s.k + q / s.k, w = pw * s.k + q % s.k;
            const double y = r.pre_at(nchw ? ((n * s.C + c) * s.H + h) * s.W + w : ((n * s.H + h) * s.W + w) * s.C + c, c);
            if (y > best) best = y, arg[s.pooled_index(j)] = static_cast<std::uint8_t>(q);
          }
        }
  return in;
}

Outputs make_outputs(const Shape& s) {
  const auto C = static_cast<std::size_t>(s.C);
  Outputs o;
  if (s.dir == Direction::bwd) {
    o.dz = HostBuffer(s.dtype, static_cast<std::size_t>(s.count()));
    for (HostBuffer* h : {&o.dgamma, &o.dbeta, &o.dbias}) *h = HostBuffer(DType::f32, C);
    return o;
  }
  o.out = HostBuffer(s.dtype, static_cast<std::size_t>(s.pooled()));
  if (s.pool) o.arg = bytes(s.pooled());
  for (HostBuffer* h : {&o.scale, &o.shift}) *h = HostBuffer(DType::f32, C);
  if (s.dir == Direction::fwd)
    for (HostBuffer* h : {&o.mean, &o.rstd, &o.running_mean, &o.running_var}) *h = HostBuffer(DType::f32, C);
  return o;
}

namespace {

// The argmax bytes: each names a window element (< k^2) whose relu(z scale + shift), by the
// reference, equals the window's maximum within `tol` (rms-relative, as compare): a near-tie may
// pick either element.
Check check_arg(const Shape& s, const Reference& ref, const HostBuffer& arg, double tol) {
  const auto* a = arg.as<std::uint8_t>();
  const std::vector<std::size_t> idx = sample_indices(static_cast<std::size_t>(s.pooled()), std::size_t(1) << 18, 5);
  double sumsq = 0;
  for (std::size_t j : idx) sumsq += std::pow(ref.pooled(s.pooled_order(static_cast<std::int64_t>(j))), 2);
  const double rms = std::max(std::sqrt(sumsq / static_cast<double>(idx.size())), 1e-30);
  Check c;
  c.tol = tol, c.checked = idx.size();
  for (std::size_t j : idx) {
    const std::int64_t jj = s.pooled_order(static_cast<std::int64_t>(j)), q = a[j];
    const double e = q < s.k * s.k ? std::fabs(ref.pre(ref.window_start(jj) + ((q / s.k) * s.W + q % s.k) * s.C) - ref.pooled(jj)) / rms
                                   : std::numeric_limits<double>::infinity();
    if (!(e <= tol)) {
      c.ok = false, c.max_err = e;
      c.message = "argmax byte " + std::to_string(q) + " at pooled element " + std::to_string(j) + " is not its window's maximum";
      return c;
    }
    c.max_err = std::max(c.max_err, e);
  }
  return c;
}

}  // namespace

Check verify(const Shape& s, const Inputs& in, const Outputs& out) {
  const Reference ref(s, in);
  const std::size_t limit = std::size_t(1) << 18;
  // The statistics are f32 partial sums over N H W values added in double (sum_tolerance); their
  // error reaches y through (z - mean) rstd, amplified by at most |mean|/std + max|xhat| (< 3.5 for
  // these inputs, as batchnorm's); the pool and ReLU pick values and add no error. dz depends on its
  // sums only through dbeta/M and dgamma/M, small next to dy.
  const std::int64_t n = s.N * s.H * s.W;
  const double stat_tol = sum_tolerance(n);
  const double tol = s.dir == Direction::fwd ? std::max(tolerance(s.dtype), 4 * stat_tol) : tolerance(s.dtype);
  auto per_channel = [&](const HostBuffer& b, const std::vector<double>& r, double t) {
    return compare(b, sample_indices(b.count(), b.count(), 0), [&](std::size_t c) { return r[c]; }, t);
  };
  Check all;
  if (s.dir == Direction::bwd) {
    all.merge(compare(out.dz, sample_indices(out.dz.count(), limit, 7), [&](std::size_t i) { return ref.dz(s.z_order(static_cast<std::int64_t>(i))); }, tol),
              "dz");
    all.merge(per_channel(out.dbias, ref.dbias, stat_tol), "dbias");
    if (s.bn) {
      all.merge(per_channel(out.dgamma, ref.dgamma, stat_tol), "dgamma");
      all.merge(per_channel(out.dbeta, ref.dbeta, stat_tol), "dbeta");
    }
    return all;
  }
  all.merge(compare(out.out, sample_indices(out.out.count(), limit, 7), [&](std::size_t j) { return ref.out(s.pooled_order(static_cast<std::int64_t>(j))); }, tol),
            "y");
  if (s.pool) all.merge(check_arg(s, ref, out.arg, tol), "arg");
  const double affine_tol = s.dir == Direction::fwd ? 4 * stat_tol : tolerance(DType::f32);
  all.merge(per_channel(out.scale, ref.scale, affine_tol), "scale");
  all.merge(per_channel(out.shift, ref.shift, affine_tol), "shift");
  if (s.dir == Direction::fwd && s.bn) {
    all.merge(per_channel(out.mean, ref.mean, stat_tol), "mean");
    all.merge(per_channel(out.rstd, ref.rstd, stat_tol), "rstd");
    all.merge(per_channel(out.running_mean, ref.running_mean, stat_tol), "running_mean");
    all.merge(per_channel(out.running_var, ref.running_var, stat_tol), "running_var");
  }
  return all;
}

std::vector<Problem> benchmark_problems(const std::vector<std::int64_t>& batches) {
  std::vector<Problem> out;
  for (Layout layout : {Layout::nhwc, Layout::nchw})
    for (const Layer& l : kLayers)
      for (std::int64_t b : batches.empty() ? std::vector<std::int64_t>{l.batch} : batches)
        expand(with_bn(dims(l.name, layout, b, l.C, l.H, l.W, l.k, l.dropout, l.nchw_pooled), l.bn), out);
  for (const ReluLayer& l : relu_layers())
    for (std::int64_t b : batches.empty() ? l.batches : batches)
      expand(with_bn(relu_dims(l.name, l.layout, b, l.C, l.H, l.W, l.dropout), l.bn), out, kReluOp);
  return out;
}

std::vector<Problem> test_problems() {
  // A pool of 3 that crops a row and a column, no dropout; a pool of 2 over odd sizes with
  // dropout; a wide layer whose channels fill the CUDA kernels' rows differently. NCHW: the pools
  // into either pooled layout, and channels that are no multiple of 4.
  std::vector<Problem> out;
  expand(dims("test", Layout::nhwc, 3, 8, 11, 10, 3, "0"), out);
  expand(dims("test", Layout::nhwc, 4, 16, 9, 7, 2, "0.25"), out);
  expand(dims("test", Layout::nhwc, 2, 128, 6, 6, 2, "0.5"), out);
  expand(dims("test", Layout::nchw, 3, 8, 11, 10, 3, "0.25", Layout::nchw), out);
  expand(dims("test", Layout::nchw, 4, 6, 9, 7, 2, "0.25", Layout::nhwc), out);
  // batchnorm_relu: a dense layer with dropout, NHWC with dropout over each sample's elements, NCHW.
  expand(relu_dims("test", Layout::nc, 7, 32, 1, 1, "0.5"), out, kReluOp);
  expand(relu_dims("test", Layout::nhwc, 3, 8, 5, 3, "0.25"), out, kReluOp);
  expand(relu_dims("test", Layout::nchw, 3, 6, 5, 3, "0"), out, kReluOp);
  // Without batch norm (the conv's bias alone), each op; NHWC with a pool of 4 (the CUDA backward's
  // kernel for any pool size) that crops a row and two columns.
  expand(with_bn(dims("test", Layout::nchw, 3, 8, 7, 9, 2, "0.25", Layout::nhwc), false), out);
  expand(with_bn(dims("test", Layout::nhwc, 2, 8, 9, 10, 4, "0.25"), false), out);
  expand(with_bn(relu_dims("test", Layout::nhwc, 2, 8, 4, 3, "0.25"), false), out, kReluOp);
  return out;
}

// FLOPs per element of z: fwd 7 (sum, sum of squares: 3; z scale + shift: 2; the ReLU and the
// window's compare: 2); infer 4; bwd 8 (the masked dy's two sums: 3 where it reaches; dz = A dy +
// b0 + c0 (z - mean) rstd: 5); without the pool, fwd and infer 1 fewer (no compare); without batch
// norm, fwd 3 fewer (no sums). Dropout's 2 per
// pooled element. Bytes: each tensor once at its size (the argmax bytes only with the pool).
Work work(const Problem& p) {
  const Shape s = shape_of(p);
  const double n = static_cast<double>(s.count()), m = static_cast<double>(s.pooled());
  const double e = static_cast<double>(dtype_size(s.dtype)), c4 = 4.0 * static_cast<double>(s.C);
  const double drop = s.drops() ? 2 * m : 0, cmp = s.pool ? n : 0, pm = (e + (s.pool ? 1 : 0)) * m;
  const double stats = s.bn ? 3 * n : 0;  // fwd's sums
  Work w;
  switch (s.dir) {
    case Direction::infer:
      w.flops = 3 * n + cmp;
      w.bytes = e * n + pm + 7 * c4;  // z; out, arg; gamma, beta, bias, running stats, scale, shift
      break;
    case Direction::bwd:
      w.flops = 8 * n + drop;
      w.bytes = 2 * e * n + pm + 8 * c4;  // z, dz; dout, arg; gamma, saved four, three gradients
      break;
    default:
      w.flops = 3 * n + stats + cmp + drop;
      w.bytes = e * n + pm + 11 * c4;  // z; out, arg; gamma, beta, bias, running in/out, four saved
  }
  w.items = static_cast<double>(s.N);
  return w;
}

std::string cuda_unsupported_reason(const Shape& s) {
  const std::string op = s.pool ? kOp : kReluOp;
  if (s.k > 15) return op + " on CUDA takes pools up to 15, not " + std::to_string(s.k);
  // The NCHW kernels take a channel a block (or an element a thread); the NHWC ones give each thread
  // 4 channels and a block's 256 threads whole rows of them.
  if (s.layout == Layout::nchw) return "";
  if (s.C % 4 != 0 || s.C > 1024 || 256 % (s.C / 4) != 0)
    return op + " on CUDA takes C = 4 x a power of two up to 1024 (NHWC), not " + std::to_string(s.C);
  return "";
}

std::unique_ptr<Case> make_case(const Problem& p) {
  if (p.backend == Backend::cuda) {
    const std::string why = cuda_unsupported_reason(shape_of(p));
    if (!why.empty()) throw Error(why, ErrorKind::unsupported);
  }
  return make_plan_case<Op>(p);
}

}  // namespace hotops::batchnorm::relu_maxpool
