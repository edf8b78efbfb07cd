// The layernorm family (layernorm, and layernorm_dbias: layernorm_dbias.h): problem names, work,
// inputs, verification, and the problem lists.
#include "kernels/layernorm/layernorm.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "hotops/check.h"
#include "hotops/op_family.h"
#include "hotops/plan.h"
#include "kernels/layernorm/layernorm_dbias.h"

namespace hotops::layernorm {

// A sum of n terms accumulated in f32 has a relative error of about 2^-24 * sqrt(n) (a random walk
// of roundings): 16 times that.
double accumulation_bound(std::int64_t n) { return 16 * std::ldexp(1.0, -24) * std::sqrt(static_cast<double>(n)); }
double sum_tolerance(std::int64_t n) { return std::max(tolerance(DType::f32), accumulation_bound(n)); }
// y and dx: the dtype's rounding of the output, plus the f32 row sums (over H values) that the
// statistics (fwd) or the two dx coefficients (bwd) come from, amplified by |xhat| (< 1.8 for these
// inputs) and the |mean|/std of a row: 4 times the sum bound.
double out_tolerance(const Shape& s) { return std::max(tolerance(s.dtype), 4 * accumulation_bound(s.hidden)); }

namespace {

constexpr Direction kDirections[] = {Direction::fwd, Direction::bwd};
constexpr DType kDtypes[] = {DType::f32, DType::bf16};
constexpr double kEps = 1e-5;  // torch.nn.LayerNorm's default

// Layers of real models: [batch * tokens, hidden] activations normalised over hidden.
struct NamedShape {
  const char* name;
  std::int64_t tokens, hidden;
};
constexpr NamedShape kShapes[] = {
    {"bert.layer", 128, 768},  // BERT-base, sequence length 128
    {"vit_b16.layer", 197, 768},  // ViT-B/16 at 224x224: 196 patches + the class token
};
constexpr std::int64_t kDefaultBatches[] = {1, 32};

// ConvNeXt-T's LayerNorm over the channels of each pixel (NHWC rows, eps 1e-6) after a block's
// depthwise convolution: stage 1 (56x56 pixels, 96 channels) and stage 3 (14x14, 384), batch 8 and 32.
constexpr NamedShape kConvnextShapes[] = {
    {"convnext.s1", 56 * 56, 96},
    {"convnext.s3", 14 * 14, 384},
};
constexpr std::int64_t kConvnextBatches[] = {8, 32};
constexpr double kConvnextEps = 1e-6;

// eps as Python prints it ("1e-05"), so that names read like the torch module's repr.
std::string eps_text(double eps) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", eps);
  return buf;
}

std::vector<Arg> args_of(const std::string& shape, std::int64_t batch, std::int64_t tokens, std::int64_t hidden,
                         double eps = kEps) {
  return {{"shape", shape},
          {"batch", std::to_string(batch)},
          {"tokens", std::to_string(tokens)},
          {"hidden", std::to_string(hidden)},
          {"eps", eps_text(eps)}};
}

void expand(const std::string& shape, std::int64_t batch, std::int64_t tokens, std::int64_t hidden,
            std::vector<Problem>& out, double eps = kEps) {
  const std::vector<Arg> args = args_of(shape, batch, tokens, hidden, eps);
  for (Backend b : kAllBackends)
    for (DType t : kDtypes)
      for (Direction d : kDirections) out.push_back(Problem{"layernorm", b, t, d, args});
}

// oneDNN answers for the layernorm op; layernorm_dbias's loop runs on any CPU.
std::string cpu_unsupported_reason(const Problem& p) {
  return p.op == "layernorm_dbias" ? "" : onednn_unsupported_reason(p);
}

std::unique_ptr<Case> make_case(const Problem& p);

// The op as the benchmark runs it: a PlanCase over the problem's inputs and outputs.
struct Op : OpOf<Shape, Args, Inputs, Outputs> {
  static Shape shape(const Problem& p) { return shape_of(p); }
  static Args bind(const Shape& s, Io& io, Binder& b) {
    Args a;
    a.x = b.in(io.in.x);
    a.gamma = b.in(io.in.gamma);
    a.beta = b.in(io.in.beta);
    if (s.dir == Direction::fwd) {
      a.y = b.out(io.out.out);
      a.mean = b.out(io.out.mean);
      a.rstd = b.out(io.out.rstd);
      return a;
    }
    a.dy = b.in(io.in.dy);
    a.saved_mean = b.in(io.in.mean);
    a.saved_rstd = b.in(io.in.rstd);
    a.dx = b.out(io.out.out);
    a.dgamma = b.out(io.out.dgamma);
    a.dbeta = b.out(io.out.dbeta);
    return a;
  }
};

class LayernormFamily final : public OpFamily {
 public:
  LayernormFamily()
      : OpFamily("layernorm", cpu_unsupported_reason, make_case, HOTOPS_CUDA_FACTORY(make_case)) {}

  std::vector<Problem> benchmark_problems(const std::vector<std::int64_t>& batches) const override {
    std::vector<Problem> out;
    for (const NamedShape& ns : kShapes) {
      const std::vector<std::int64_t> bs =
          batches.empty() ? std::vector<std::int64_t>(std::begin(kDefaultBatches), std::end(kDefaultBatches)) : batches;
      for (std::int64_t b : bs) expand(ns.name, b, ns.tokens, ns.hidden, out);
    }
    // layernorm_dbias as the models run it: BERT's (post-LN) without a residual gradient, ViT's
    // (pre-LN: the second LayerNorm's skip connection) with one.
    for (const NamedShape& ns : kShapes) {
      const std::vector<std::int64_t> bs =
          batches.empty() ? std::vector<std::int64_t>(std::begin(kDefaultBatches), std::end(kDefaultBatches)) : batches;
      for (std::int64_t b : bs)
        dbias::expand(args_of(ns.name, b, ns.tokens, ns.hidden), std::string(ns.name) == "vit_b16.layer", out);
    }
    for (const NamedShape& ns : kConvnextShapes) {
      const std::vector<std::int64_t> bs =
          batches.empty() ? std::vector<std::int64_t>(std::begin(kConvnextBatches), std::end(kConvnextBatches)) : batches;
      for (std::int64_t b : bs) expand(ns.name, b, ns.tokens, ns.hidden, out, kConvnextEps);
    }
    return out;
  }

  std::vector<Problem> test_problems() const override {
    // Odd hidden sizes (scalar loads; 5 is below a warp), the models' 768 (16-byte vectors), 256
    // with enough rows that the column reduction has several row blocks, and 1031, too long for the
    // CUDA kernels' register cache of a row. ConvNeXt's 96 channels with its eps of 1e-6.
    std::vector<Problem> out;
    expand("test", 3, 7, 5, out);
    expand("test", 2, 5, 33, out);
    expand("test", 2, 3, 768, out);
    expand("test", 5, 97, 256, out);
    expand("test", 1, 3, 1031, out);
    expand("test", 2, 49, 96, out, kConvnextEps);
    // layernorm_dbias, with and without dres: a row below a warp; more rows (1067) than the CUDA
    // kernel's warps, so that warps take several rows and blocks unequal shares; the models' 768.
    for (bool dres : {false, true}) {
      dbias::expand(args_of("test", 3, 7, 5), dres, out);
      dbias::expand(args_of("test", 11, 97, 256), dres, out);
    }
    dbias::expand(args_of("test", 2, 3, 768), true, out);
    return out;
  }

  // FLOPs per element of x: fwd 8 (sum: 1; sum of (x - mean)^2: 3; y = (x - mean)*rstd*gamma + beta:
  // 4); bwd 13 (xhat: 2; g = gamma*dy: 1; sum g: 1; sum g*xhat: 2; dgamma += dy*xhat: 2; dbeta += dy:
  // 1; dx = rstd*(g - c1 - xhat*c2): 4). Per-row O(1) work is left out.
  // Bytes: each tensor once: x, y (fwd) or x, dy, dx (bwd) at the dtype's size; gamma, beta (fwd) or
  // gamma, dgamma, dbeta (bwd) as f32 [H]; mean and rstd as f32 [rows], written (fwd) or read (bwd).
  Work work(const Problem& p) const override {
    if (p.op == "layernorm_dbias") return dbias::work(p);
    const Shape s = shape_of(p);
    const double n = static_cast<double>(s.count()), e = static_cast<double>(dtype_size(s.dtype));
    const double h4 = 4.0 * static_cast<double>(s.hidden), r4 = 4.0 * static_cast<double>(s.rows());
    Work w;
    if (s.dir == Direction::bwd) {
      w.flops = 13 * n;
      w.bytes = 3 * e * n + 3 * h4 + 2 * r4;
    } else {
      w.flops = 8 * n;
      w.bytes = 2 * e * n + 2 * h4 + 2 * r4;
    }
    w.items = static_cast<double>(s.batch);
    return w;
  }

  std::string unsupported_reason(const Problem& p) const override {
    if (p.op == "layernorm_dbias") {
      if (p.backend == Backend::cuda && dbias::shape_of(p).hidden > dbias::kCudaMaxHidden)
        return "layernorm_dbias on CUDA takes hidden <= " + std::to_string(dbias::kCudaMaxHidden) + " (a row in a warp's registers)";
      return OpFamily::unsupported_reason(p);
    }
    const Shape s = shape_of(p);
    if (s.dtype != DType::f32 && s.dtype != DType::bf16)
      return std::string("layernorm is benchmarked in f32 and bf16, not ") + dtype_name(s.dtype);
    if (s.dir != Direction::fwd && s.dir != Direction::bwd)
      return std::string("layernorm has fwd and bwd, not ") + direction_name(s.dir);
    return OpFamily::unsupported_reason(p);
  }
};

std::unique_ptr<Case> make_case(const Problem& p) {
  return p.op == "layernorm_dbias" ? dbias::make_case(p) : make_plan_case<Op>(p);
}

}  // namespace

Shape shape_of(const Problem& p) {
  Shape s;
  s.dir = p.dir;
  s.dtype = p.dtype;
  s.batch = p.get_int("batch");
  s.tokens = p.get_int("tokens");
  s.hidden = p.get_int("hidden");
  try {
    s.eps = std::stod(p.get("eps"));
  } catch (const std::exception&) {
    throw Error("layernorm: eps '" + p.get("eps") + "' is not a number in " + p.name());
  }
  HOTOPS_CHECK(s.batch > 0 && s.tokens > 0 && s.hidden > 0 && s.eps > 0,
               "layernorm dimensions and eps must be positive: " + p.name());
  return s;
}

Inputs make_inputs(const Shape& s, std::uint64_t seed) {
  const auto R = static_cast<std::size_t>(s.rows()), H = static_cast<std::size_t>(s.hidden);
  Inputs in;
  in.x = HostBuffer(s.dtype, R * H);
  in.gamma = HostBuffer(DType::f32, H);
  in.beta = HostBuffer(DType::f32, H);
  in.gamma.fill_uniform(seed, 3, 0.5f, 1.5f);
  in.beta.fill_uniform(seed, 4, -0.5f, 0.5f);

  // x = offset[r] + spread[r] * u, u uniform in [-1, 1): every row has its own mean and variance, so
  // that statistics taken over the wrong elements cannot pass verification.
  HostBuffer offset(DType::f32, R), spread(DType::f32, R);
  offset.fill_uniform(seed, 5, -0.5f, 0.5f);
  spread.fill_uniform(seed, 6, 0.5f, 1.5f);
  in.x.fill_uniform(seed, 1);
  const auto n = static_cast<std::int64_t>(R * H);
#pragma omp parallel for schedule(static) if (n > (1 << 16))
  for (std::int64_t i = 0; i < n; ++i) {
    const auto k = static_cast<std::size_t>(i), r = k / H;
    in.x.set(k, offset.get(r) + spread.get(r) * in.x.get(k));
  }

  if (s.dir == Direction::bwd) {
    in.dy = HostBuffer(s.dtype, R * H);
    in.dy.fill_uniform(seed, 2);
    // The saved statistics are those a forward pass of this x leaves behind, rounded to f32.
    Shape fwd = s;
    fwd.dir = Direction::fwd;
    const Reference r(fwd, in);
    in.mean = HostBuffer(DType::f32, R);
    in.rstd = HostBuffer(DType::f32, R);
    for (std::size_t i = 0; i < R; ++i) {
      in.mean.set(i, r.mean[i]);
      in.rstd.set(i, r.rstd[i]);
    }
  }
  return in;
}

Outputs make_outputs(const Shape& s) {
  const auto R = static_cast<std::size_t>(s.rows()), H = static_cast<std::size_t>(s.hidden);
  Outputs o;
  o.out = HostBuffer(s.dtype, R * H);
  if (s.dir == Direction::fwd) {
    o.mean = HostBuffer(DType::f32, R);
    o.rstd = HostBuffer(DType::f32, R);
  } else {
    o.dgamma = HostBuffer(DType::f32, H);
    o.dbeta = HostBuffer(DType::f32, H);
  }
  return o;
}

Check verify(const Shape& s, const Inputs& in, const Outputs& out) {
  const Reference ref(s, in);
  const std::size_t limit = std::size_t(1) << 18;
  // y and dx: out_tolerance. mean and rstd are f32 row sums over H; dgamma and dbeta are f32 column
  // sums over the rows.
  const double tol = out_tolerance(s);
  auto vec = [&](const HostBuffer& b, const std::vector<double>& r, double t) {
    return compare(b, sample_indices(b.count(), limit, 11), [&](std::size_t i) { return r[i]; }, t);
  };
  Check all;
  all.merge(compare(out.out, sample_indices(out.out.count(), limit, 7),
                    [&](std::size_t i) { return ref.out(static_cast<std::int64_t>(i)); }, tol),
            s.dir == Direction::bwd ? "dx" : "y");
  if (s.dir == Direction::fwd) {
    all.merge(vec(out.mean, ref.mean, sum_tolerance(s.hidden)), "mean");
    all.merge(vec(out.rstd, ref.rstd, sum_tolerance(s.hidden)), "rstd");
  } else {
    all.merge(vec(out.dgamma, ref.dgamma, sum_tolerance(s.rows())), "dgamma");
    all.merge(vec(out.dbeta, ref.dbeta, sum_tolerance(s.rows())), "dbeta");
  }
  return all;
}

HOTOPS_DEFINE_FAMILY(LayernormFamily);

}  // namespace hotops::layernorm
