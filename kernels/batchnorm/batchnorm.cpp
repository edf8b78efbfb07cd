// The batchnorm family: problem names, work, inputs, verification, and the problem lists.
#include "kernels/batchnorm/batchnorm.h"

#include <algorithm>
#include <cmath>

#include "hotops/check.h"
#include "hotops/op_family.h"
#include "kernels/batchnorm/relu_maxpool.h"

namespace hotops::batchnorm {
namespace {

// A sum of n terms accumulated one by one in f32 has a relative error of about 2^-24 * sqrt(n)
// (a random walk of roundings; oneDNN's f32 mean over 2M values is off by about that much): 16
// times that.
double accumulation_bound(std::int64_t n) { return 16 * std::ldexp(1.0, -24) * std::sqrt(static_cast<double>(n)); }

constexpr Direction kDirections[] = {Direction::fwd, Direction::infer, Direction::bwd};
constexpr DType kDtypes[] = {DType::f32, DType::bf16};

// The op as the benchmark runs it: a PlanCase over the problem's inputs and outputs. The running
// statistics of fwd are in-out tensors: each verification starts them from the inputs' values.
struct Op : OpOf<Shape, Args, Inputs, Outputs> {
  static Shape shape(const Problem& p) { return shape_of(p); }
  static Args bind(const Shape& s, Io& io, Binder& b) {
    // Tensors the direction only reads but Args names writable (e.g. bwd's saved statistics).
    auto read = [&](const HostBuffer& h) { return const_cast<float*>(static_cast<const float*>(b.in(h))); };
    Inputs& in = io.in;
    Outputs& out = io.out;
    Args a;
    a.x = b.in(in.x);
    a.gamma = static_cast<const float*>(b.in(in.gamma));
    a.beta = static_cast<const float*>(b.in(in.beta));
    a.out = b.out(out.out);
    switch (s.dir) {
      case Direction::infer:
        a.running_mean = read(in.running_mean);
        a.running_var = read(in.running_var);
        break;
      case Direction::bwd:
        a.dy = b.in(in.dy);
        a.save_mean = read(in.save_mean);
        a.save_invstd = read(in.save_invstd);
        a.dgamma = static_cast<float*>(b.out(out.dgamma));
        a.dbeta = static_cast<float*>(b.out(out.dbeta));
        break;
      default:
        a.running_mean = static_cast<float*>(b.inout(in.running_mean, out.running_mean));
        a.running_var = static_cast<float*>(b.inout(in.running_var, out.running_var));
        a.save_mean = static_cast<float*>(b.out(out.save_mean));
        a.save_invstd = static_cast<float*>(b.out(out.save_invstd));
    }
    return a;
  }
};

// One (backend, impl) pair: the CPU, the hand-written CUDA kernel, cuDNN.
struct Variant {
  Backend backend;
  bool cudnn;
};

std::vector<Variant> variants() {
  // Every backend in every build (see kAllBackends): CUDA's hand-written kernels, and cuDNN.
  return {{Backend::cpu, false}, {Backend::cuda, false}, {Backend::cuda, true}};
}

std::vector<Arg> dims(const std::string& shape, Layout l, std::int64_t batch, std::int64_t C, std::int64_t H,
                      std::int64_t W) {
  std::vector<Arg> a{{"shape", shape}, {"layout", layout_name(l)}, {"batch", std::to_string(batch)},
                     {"C", std::to_string(C)}};
  if (l != Layout::nc) {
    a.push_back({"H", std::to_string(H)});
    a.push_back({"W", std::to_string(W)});
  }
  return a;
}

// Expands one shape into every variant x dtype x direction problem.
void expand(const std::vector<Arg>& args, std::vector<Problem>& out) {
  for (const Variant& v : variants())
    for (DType t : kDtypes)
      for (Direction d : kDirections) {
        Problem p{"batchnorm", v.backend, t, d, args};
        if (v.cudnn) p.args.push_back({"impl", "cudnn"});
        out.push_back(std::move(p));
      }
}

// The family's ops: batchnorm, and batchnorm_relu_maxpool and batchnorm_relu (relu_maxpool.h).
bool is_relu_maxpool(const Problem& p) { return relu_maxpool::is_op(p); }

std::unique_ptr<Case> make_case(const Problem& p) {
  return is_relu_maxpool(p) ? relu_maxpool::make_case(p) : make_plan_case<Op>(p);
}

std::string cpu_unsupported_reason(const Problem& p) { return is_relu_maxpool(p) ? "" : onednn_unsupported_reason(p); }

class BatchnormFamily final : public OpFamily {
 public:
  BatchnormFamily() : OpFamily("batchnorm", cpu_unsupported_reason, make_case, HOTOPS_CUDA_FACTORY(make_case)) {}

  std::vector<Problem> benchmark_problems(const std::vector<std::int64_t>& batches) const override {
    std::vector<Problem> out;
    for (const NamedShape& ns : named_shapes())
      for (Layout l : ns.layouts)
        for (std::int64_t b : batches.empty() ? ns.batches : batches)
          expand(dims(ns.name, l, b, ns.C, ns.H, ns.W), out);
    for (Problem& p : relu_maxpool::benchmark_problems(batches)) out.push_back(std::move(p));
    return out;
  }

  std::vector<Problem> test_problems() const override {
    // Odd sizes (scalar loads), vector-friendly sizes, and channels long enough for the CUDA
    // kernel to split them over several blocks; every layout.
    std::vector<Problem> out;
    expand(dims("test", Layout::nchw, 3, 5, 7, 9), out);
    expand(dims("test", Layout::nchw, 8, 3, 40, 40), out);
    expand(dims("test", Layout::nhwc, 2, 6, 5, 3), out);
    expand(dims("test", Layout::nhwc, 4, 16, 32, 32), out);
    expand(dims("test", Layout::nc, 7, 24, 1, 1), out);
    expand(dims("test", Layout::nc, 300, 1000, 1, 1), out);
    for (Problem& p : relu_maxpool::test_problems()) out.push_back(std::move(p));
    return out;
  }

  // FLOPs per element, as a folded-constant implementation does them (per-channel O(C) work left
  // out): fwd 5 (sum, sum of squares: 3; y = x*scale + shift: 2); infer 2 (x*scale + shift);
  // bwd 8 (sum dy: 1; sum dy*(x - mean): 3; dx = k1*dy + k2*x + k3: 4).
  // Bytes: each tensor once at the dtype's size, plus the f32 per-channel vectors.
  Work work(const Problem& p) const override {
    if (is_relu_maxpool(p)) return relu_maxpool::work(p);
    const Shape s = shape_of(p);
    const double n = static_cast<double>(s.count()), e = static_cast<double>(dtype_size(s.dtype));
    const double c4 = 4.0 * static_cast<double>(s.C);  // one f32 per-channel vector
    Work w;
    switch (s.dir) {
      case Direction::infer:
        w.flops = 2 * n;
        w.bytes = 2 * e * n + 4 * c4;  // x, y; gamma, beta, running mean and var
        break;
      case Direction::bwd:
        w.flops = 8 * n;
        w.bytes = 3 * e * n + 5 * c4;  // x, dy, dx; gamma, save_mean, save_invstd, dgamma, dbeta
        break;
      default:
        w.flops = 5 * n;
        w.bytes = 2 * e * n + 8 * c4;  // x, y; gamma, beta, running stats in and out, saved stats
    }
    w.items = static_cast<double>(s.N);
    return w;
  }

  std::string unsupported_reason(const Problem& p) const override {
    if (is_relu_maxpool(p)) {
      const relu_maxpool::Shape s = relu_maxpool::shape_of(p);
      if (s.dir == Direction::fwd && s.bn && s.N * s.H * s.W < 2)
        return "training batchnorm needs more than one value per channel (the unbiased variance divides by n - 1)";
      return OpFamily::unsupported_reason(p);
    }
    const Shape s = shape_of(p);
    if (s.dtype != DType::f32 && s.dtype != DType::bf16)
      return std::string("batchnorm is benchmarked in f32 and bf16, not ") + dtype_name(s.dtype);
    if (s.dir == Direction::fwd && s.per_channel() < 2)
      return "training batchnorm needs more than one value per channel (the unbiased variance divides by n - 1)";
    return OpFamily::unsupported_reason(p);
  }
};

}  // namespace

#ifdef HOTOPS_HAVE_CUDA
// The CUDA benchmark is hotops' kernels; `impl:cudnn` names cuDNN's version of the same problem.
std::unique_ptr<Plan> make_cuda_plan(const Shape& s) { return s.cudnn ? make_cudnn_plan(s) : make_kernels_plan(s); }
#endif

const char* layout_name(Layout l) {
  switch (l) {
    case Layout::nchw: return "nchw";
    case Layout::nhwc: return "nhwc";
    case Layout::nc: return "nc";
  }
  return "?";
}

Shape shape_of(const Problem& p) {
  Shape s;
  s.dir = p.dir;
  s.dtype = p.dtype;
  const std::string& l = p.get("layout");
  if (l == "nchw") s.layout = Layout::nchw;
  else if (l == "nhwc") s.layout = Layout::nhwc;
  else if (l == "nc") s.layout = Layout::nc;
  else throw Error("batchnorm: unknown layout '" + l + "' in " + p.name());
  s.N = p.get_int("batch");
  s.C = p.get_int("C");
  if (s.layout != Layout::nc) {
    s.H = p.get_int("H");
    s.W = p.get_int("W");
  }
  HOTOPS_CHECK(s.N > 0 && s.C > 0 && s.H > 0 && s.W > 0, "batchnorm dimensions must be positive: " + p.name());
  s.cudnn = wants_cudnn(p);
  return s;
}

bool wants_cudnn(const Problem& p) {
  if (!p.has("impl")) return false;
  HOTOPS_CHECK(p.get("impl") == "cudnn", "batchnorm: unknown impl '" + p.get("impl") + "' in " + p.name());
  return true;
}


Inputs make_inputs(const Shape& s, std::uint64_t seed) {
  const auto C = static_cast<std::size_t>(s.C);
  Inputs in;
  in.x = HostBuffer(s.dtype, static_cast<std::size_t>(s.count()));
  in.gamma = HostBuffer(DType::f32, C);
  in.beta = HostBuffer(DType::f32, C);
  in.gamma.fill_uniform(seed, 3, 0.5f, 1.5f);
  in.beta.fill_uniform(seed, 4, -0.5f, 0.5f);

  // x = offset[c] + spread[c] * u, u uniform in [-1, 1): every channel has its own mean and
  // variance, so that statistics taken over the wrong elements cannot pass verification. |mean|/std
  // stays below about 1.7, as in a network's activations.
  HostBuffer offset(DType::f32, C), spread(DType::f32, C);
  offset.fill_uniform(seed, 5, -0.5f, 0.5f);
  spread.fill_uniform(seed, 6, 0.5f, 1.5f);
  in.x.fill_uniform(seed, 1);
  const std::int64_t n = s.count();
#pragma omp parallel for schedule(static) if (n > (1 << 16))
  for (std::int64_t i = 0; i < n; ++i) {
    const auto c = static_cast<std::size_t>(s.channel_of(i));
    const auto k = static_cast<std::size_t>(i);
    in.x.set(k, offset.get(c) + spread.get(c) * in.x.get(k));
  }

  if (s.dir != Direction::bwd) {
    in.running_mean = HostBuffer(DType::f32, C);
    in.running_var = HostBuffer(DType::f32, C);
    in.running_mean.fill_uniform(seed, 7, -0.5f, 0.5f);
    in.running_var.fill_uniform(seed, 8, 0.5f, 1.5f);
  } else {
    in.dy = HostBuffer(s.dtype, static_cast<std::size_t>(s.count()));
    in.dy.fill_uniform(seed, 2);
    // The saved statistics are those a training forward pass of this x leaves behind.
    Shape fwd = s;
    fwd.dir = Direction::fwd;
    Inputs f;
    f.x = std::move(in.x);
    f.gamma = HostBuffer(DType::f32, C);
    f.beta = HostBuffer(DType::f32, C);
    f.running_mean = HostBuffer(DType::f32, C);
    f.running_var = HostBuffer(DType::f32, C);
    {
      const Reference r(fwd, f);
      in.save_mean = HostBuffer(DType::f32, C);
      in.save_invstd = HostBuffer(DType::f32, C);
      for (std::size_t c = 0; c < C; ++c) {
        in.save_mean.set(c, r.save_mean[c]);
        in.save_invstd.set(c, r.save_invstd[c]);
      }
    }
    in.x = std::move(f.x);
  }
  return in;
}

Outputs make_outputs(const Shape& s) {
  const auto C = static_cast<std::size_t>(s.C);
  Outputs o;
  o.out = HostBuffer(s.dtype, static_cast<std::size_t>(s.count()));
  if (s.dir == Direction::fwd) {
    o.save_mean = HostBuffer(DType::f32, C);
    o.save_invstd = HostBuffer(DType::f32, C);
    o.running_mean = HostBuffer(DType::f32, C);
    o.running_var = HostBuffer(DType::f32, C);
  }
  if (s.dir == Direction::bwd) {
    o.dgamma = HostBuffer(DType::f32, C);
    o.dbeta = HostBuffer(DType::f32, C);
  }
  return o;
}

double sum_tolerance(std::int64_t n) {
  // Never less than the f32 bound. A wrong channel or index is O(1).
  return std::max(tolerance(DType::f32), accumulation_bound(n));
}

Check verify(const Shape& s, const Inputs& in, const Outputs& out) {
  const Reference ref(s, in);
  // Each sampled element is O(1) once the reference's per-channel passes are done.
  const std::size_t limit = std::size_t(1) << 18;
  // The statistics are f32 sums over n values in every dtype (see sum_tolerance). Their error
  // reaches y through (x - mean) * invstd, amplified by at most |mean|/std + max|xhat| (< 3.5 for
  // these inputs: |mean|/std < 1.8, |xhat| <= sqrt 3); dx depends on its sums only through
  // dbeta/n and dgamma/n, which are small next to dy.
  const double stat_tol = sum_tolerance(s.per_channel());
  const double tol =
      s.dir == Direction::fwd ? std::max(tolerance(s.dtype), 4 * accumulation_bound(s.per_channel())) : tolerance(s.dtype);
  auto per_channel = [&](const HostBuffer& b, const std::vector<double>& r, double t) {
    return compare(b, sample_indices(b.count(), b.count(), 0), [&](std::size_t c) { return r[c]; }, t);
  };
  Check all;
  all.merge(compare(out.out, sample_indices(out.out.count(), limit, 7),
                    [&](std::size_t i) { return ref.out(static_cast<std::int64_t>(i)); }, tol),
            s.dir == Direction::bwd ? "dx" : "y");
  if (s.dir == Direction::fwd) {
    all.merge(per_channel(out.save_mean, ref.save_mean, stat_tol), "save_mean");
    all.merge(per_channel(out.save_invstd, ref.save_invstd, stat_tol), "save_invstd");
    all.merge(per_channel(out.running_mean, ref.running_mean, stat_tol), "running_mean");
    all.merge(per_channel(out.running_var, ref.running_var, stat_tol), "running_var");
  }
  if (s.dir == Direction::bwd) {
    all.merge(per_channel(out.dgamma, ref.dgamma, stat_tol), "dgamma");
    all.merge(per_channel(out.dbeta, ref.dbeta, stat_tol), "dbeta");
  }
  return all;
}

HOTOPS_DEFINE_FAMILY(BatchnormFamily);

}  // namespace hotops::batchnorm
