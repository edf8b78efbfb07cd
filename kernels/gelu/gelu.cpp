// The gelu family (gelu, and gelu_dbias: gelu_dbias.h): problem names and shapes, work, inputs,
// verification and its bounds.
//
// Names: gelu/<backend>/<dtype>/<fwd|bwd>/shape:<model.layer>/batch:B/dims:BxCxHxW/approx:<none|tanh>
// for the activations of real models, gelu/.../shape:flat/elements:N/approx:... for the bandwidth
// sweep; on the CPU, the implementation that is not a dtype's default adds `impl:<onednn|hotops>`. gelu is elementwise, so only the element count matters to the op; dims are there to say
// which tensor of which model it is.
#include "kernels/gelu/gelu.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "hotops/check.h"
#include "hotops/elementwise.h"
#include "hotops/op_family.h"
#include "kernels/gelu/gelu_dbias.h"

namespace hotops::gelu {
namespace {

using elementwise::flat_args;
using elementwise::model_args;
using elementwise::NamedShape;

const std::vector<NamedShape>& named_shapes() {
  static const std::vector<NamedShape> shapes = {
      // BERT-base, sequence 128: the FFN's 3072-wide intermediate, gelu between ffn_up and ffn_down.
      {"bert.ffn", {128, 3072}, 32},
      // ViT-B/16 at 224x224: 197 tokens, the MLP's 3072-wide hidden layer.
      {"vit.mlp", {197, 3072}, 32},
      // The TensorFlow 2 comparison's Keras CNN (256x256x3 images, batch 64), conv outputs as PyTorch
      // holds them (NCHW); Keras names the layers conv2d, conv2d_1, ... The first at batch 16: at the
      // study's 64 it would
      // be 512 MiB in f32, twice the largest flat tensor.
      {"keras_cnn.conv2d", {32, 256, 256}, 16},
      {"keras_cnn.conv2d_1", {64, 85, 85}, 64},
      {"keras_cnn.conv2d_3", {128, 42, 42}, 64},
  };
  return shapes;
}

// The flat bandwidth sweep: 4 KiB, 1, 16, 64 and 256 MiB of f32 (half of that in bf16 and f16).
constexpr std::int64_t kFlatElements[] = {1 << 10, 1 << 18, 1 << 22, 1 << 24, 1 << 26};

constexpr Direction kDirections[] = {Direction::fwd, Direction::bwd};
constexpr DType kDTypes[] = {DType::f32, DType::bf16, DType::f16};
constexpr Approx kApprox[] = {Approx::none, Approx::tanh};

// The CPU implementation each dtype runs by default (its problems carry no `impl` arg), and whether
// the other one is benchmarked too, as the same problem plus `impl:<name>`: the one place to flip
// after measuring both. oneDNN 2.6 has no f16 gelu on the CPUs measured (AVX2; the AVX-512 + AMX
// Xeon), so f16 is hotops' alone.
struct CpuImplChoice {
  DType dtype;
  CpuImpl default_impl;
  bool other_too;
};
// Measured on the 16-core Xeon of the H100 host, 64M elements: in f32 the hand-written loop won
// 3 of 4 (fwd erf 81 vs 76 GB/s, fwd tanh 96 vs 46, bwd erf 115 vs 101; bwd tanh 86 vs 102). In bf16
// its AVX-512 version (cpu_avx512.cpp), looked up in a table of its results, reached 0.93 (fwd erf),
// 0.96 (fwd tanh), 1.11 (bwd erf) and 1.28 (bwd tanh) of the suite's copy bandwidth, oneDNN 0.47,
// 0.62, 0.53 and 0.58 in the same run (the arithmetic version alone: 0.36-0.59).
constexpr CpuImplChoice kCpuImpls[] = {
    {DType::f32, CpuImpl::hotops, true},
    {DType::bf16, CpuImpl::hotops, true},
    {DType::f16, CpuImpl::hotops, false},
};

const CpuImplChoice& cpu_impl_choice(DType t) {
  for (const CpuImplChoice& c : kCpuImpls)
    if (c.dtype == t) return c;
  throw Error(std::string("gelu: no CPU implementation for ") + dtype_name(t));
}

CpuImpl other(CpuImpl i) { return i == CpuImpl::onednn ? CpuImpl::hotops : CpuImpl::onednn; }

// The op as the benchmark runs it: a PlanCase over the problem's inputs and output.
struct Op : OpOf<Shape, Args, Inputs, HostBuffer> {
  static Shape shape(const Problem& p) { return shape_of(p); }
  static Args bind(const Shape& s, Io& io, Binder& b) {
    return {b.in(io.in.x), s.dir == Direction::bwd ? b.in(io.in.dy) : nullptr, b.out(io.out)};
  }
};

// The hand-written loops run on any x86-64 (gelu's on its baseline clone); oneDNN answers for itself.
std::string cpu_unsupported_reason(const Problem& p) {
  return p.op == "gelu" && cpu_impl_of(p) == CpuImpl::onednn ? onednn_unsupported_reason(p) : "";
}

std::unique_ptr<Case> make_case(const Problem& p) {
  return p.op == "gelu_dbias" ? dbias::make_case(p) : make_plan_case<Op>(p);
}

// The named shapes whose gelu is followed by a dense layer with a bias: gelu_dbias's problems.
std::vector<NamedShape> ffn_shapes() {
  std::vector<NamedShape> out;
  for (const NamedShape& ns : named_shapes())
    if (ns.name == "bert.ffn" || ns.name == "vit.mlp") out.push_back(ns);
  return out;
}

// Expands one shape (its args less `approx`) into every backend x dtype x direction x approx problem,
// and on the CPU each dtype's second implementation where it has one.
void expand(const std::vector<Arg>& args, std::vector<Problem>& out) {
  for (Backend be : kAllBackends)
    for (DType t : kDTypes)
      for (Direction d : kDirections)
        for (Approx a : kApprox) {
          Problem p{"gelu", be, t, d, args};
          p.args.push_back({"approx", approx_name(a)});
          if (be == Backend::cpu && cpu_impl_choice(t).other_too) {
            Problem alt = p;
            alt.args.push_back({"impl", cpu_impl_name(other(cpu_impl_choice(t).default_impl))});
            out.push_back(std::move(p));
            out.push_back(std::move(alt));
          } else {
            out.push_back(std::move(p));
          }
        }
}

// FLOPs per element: the arithmetic of PyTorch's formulas, each erf, tanh or exp counted as one.
//   fwd none  0.5*x*(1 + erf(x*sqrt(1/2)))                                      5
//   fwd tanh  0.5*x*(1 + tanh(k*(x + c*x^3)))                                   9
//   bwd none  dy*(cdf + x*pdf), cdf = 0.5*(1 + erf(x*sqrt(1/2))),
//             pdf = exp(-0.5*x^2)/sqrt(2*pi)                                   11
//   bwd tanh  dy*(0.5*(1 + t) + 0.5*x*(1 - t^2)*k*(1 + 3c*x^2)), t as in fwd   18
double flops_per_element(Direction d, Approx a) {
  if (d == Direction::fwd) return a == Approx::none ? 5 : 9;
  return a == Approx::none ? 11 : 18;
}

class GeluFamily final : public OpFamily {
 public:
  GeluFamily()
      : OpFamily("gelu", cpu_unsupported_reason, make_case, HOTOPS_CUDA_FACTORY(make_case)) {}

  std::vector<Problem> benchmark_problems(const std::vector<std::int64_t>& batches) const override {
    std::vector<Problem> out = elementwise::benchmark_problems(named_shapes(), kFlatElements, batches, expand);
    const std::vector<Problem> fused = elementwise::benchmark_problems(ffn_shapes(), std::vector<std::int64_t>{}, batches, dbias::expand);
    out.insert(out.end(), fused.begin(), fused.end());
    return out;
  }

  std::vector<Problem> test_problems() const override {
    // Less than one 16-byte vector; an odd size off a 16-byte boundary (head, vectors and tail);
    // a model-style name; enough elements for several vectors per CUDA thread.
    std::vector<Problem> out;
    expand(flat_args(5), out);
    expand(flat_args(1027, 3), out);
    expand(model_args("test", 2, {3, 37}), out);
    expand(flat_args(100003), out);
    // Large enough for the CPU loop to stream its output past the caches (cpu::kStreamMinBytes in
    // every dtype), off a 16-byte boundary.
    expand(flat_args((1 << 24) + 5, 3), out);
    // gelu_dbias: rows over several 32-row blocks with a partial last one; 275 vectors of 4 columns,
    // more than one block of threads.
    dbias::expand(model_args("test", 3, {37, 20}), out);
    dbias::expand(model_args("test", 1, {70, 1100}), out);
    return out;
  }

  Work work(const Problem& p) const override {
    if (p.op == "gelu_dbias") return dbias::work(p);
    const Shape s = shape_of(p);
    const double n = static_cast<double>(s.elements), e = static_cast<double>(dtype_size(s.dtype));
    Work w;
    w.flops = n * flops_per_element(s.dir, s.approx);
    w.bytes = n * e * (s.dir == Direction::fwd ? 2 : 3);  // x (+ dy) read, y or dx written
    w.items = p.batch() ? static_cast<double>(*p.batch()) : 1.0;
    return w;
  }
};

}  // namespace

const char* approx_name(Approx a) { return a == Approx::none ? "none" : "tanh"; }

const char* cpu_impl_name(CpuImpl i) { return i == CpuImpl::onednn ? "onednn" : "hotops"; }

CpuImpl default_cpu_impl(DType t) { return cpu_impl_choice(t).default_impl; }

CpuImpl cpu_impl_of(const Shape& s) { return s.impl.value_or(default_cpu_impl(s.dtype)); }

std::unique_ptr<Plan> make_cpu_plan(const Shape& s) {
  return cpu_impl_of(s) == CpuImpl::onednn ? make_cpu_onednn_plan(s) : make_cpu_hotops_plan(s);
}

CpuImpl cpu_impl_of(const Problem& p) {
  if (!p.has("impl")) return default_cpu_impl(p.dtype);
  HOTOPS_CHECK(p.backend == Backend::cpu, "gelu: `impl` names a CPU implementation: " + p.name());
  const std::string& v = p.get("impl");
  for (CpuImpl i : {CpuImpl::onednn, CpuImpl::hotops})
    if (v == cpu_impl_name(i)) return i;
  throw Error("gelu: unknown impl '" + v + "' (onednn or hotops) in " + p.name());
}

Shape shape_of(const Problem& p) {
  HOTOPS_CHECK(p.dir == Direction::fwd || p.dir == Direction::bwd, "gelu has fwd and bwd only: " + p.name());
  HOTOPS_CHECK(p.dtype != DType::tf32, "gelu has no tf32: " + p.name());
  Shape s;
  s.dir = p.dir;
  s.dtype = p.dtype;
  const std::string& a = p.get("approx");
  HOTOPS_CHECK(a == "none" || a == "tanh", "approx must be none or tanh: " + p.name());
  s.approx = a == "none" ? Approx::none : Approx::tanh;
  const elementwise::Extent e = elementwise::extent_of(p);
  s.elements = e.elements;
  s.offset = e.offset;
  if (p.has("impl")) s.impl = cpu_impl_of(p);
  return s;
}

std::size_t buffer_count(const Shape& s) { return static_cast<std::size_t>(s.offset + s.elements) + kGuard; }

Inputs make_inputs(const Shape& s, std::uint64_t seed) {
  Inputs in;
  in.x = HostBuffer(s.dtype, buffer_count(s));
  in.x.fill_uniform(seed, 0, -5.f, 5.f);
  if (s.dir == Direction::bwd) {
    in.dy = HostBuffer(s.dtype, buffer_count(s));
    in.dy.fill_uniform(seed, 1);
  }
  return in;
}

HostBuffer make_output(const Shape& s) { return HostBuffer(s.dtype, buffer_count(s)); }

// The error metric is compare()'s max|out - ref| / rms(ref), with rms(ref) floored (see verify) at
// the rms over the input distribution: 2.0 for y (x in [-5, 5)), 0.4 for dx (dy in [-1, 1) too).
// Inputs are exact in every dtype (rounded when made), so the error is the f32 math plus the final
// rounding of each output, at most u * |ref| with u the unit roundoff (2^-24 f32, 2^-8 bf16, 2^-11
// f16). Relative to the floor that is below u * max|ref| / floor = 2.5 u (fwd: 5 / 2) or 2.9 u (bwd:
// 1.13 / 0.4), so 3 u bounds the rounding of 16-bit outputs: bf16 1.2e-2, f16 1.5e-3.
// In f32 the rounding is 2e-7 and the math dominates, measured on oneDNN (jit:avx2):
//   fwd 1.8e-7 (erf), 2.4e-7 (tanh)                         -> 1e-6
//   bwd erf 5.9e-7: the erf and exp approximations' few 1e-7 absolute, over rms(dx) = 0.41 -> 2e-6
//   bwd tanh 1.9e-6: PyTorch's formula cancels in 1 - t^2 and 1 + t as |t| -> 1; one ulp of 1 times
//   0.5 |x| sqrt(2/pi) (1 + 3 * 0.044715 x^2) is 1e-6 absolute at |x| = 5, 2.4e-6 over the floor  -> 4e-6
// All of them stay far below erf versus tanh (2.3e-4 apart relative to rms) and any formula slip.
double error_bound(const Shape& s) {
  switch (s.dtype) {
    case DType::bf16: return 1.2e-2;
    case DType::f16: return 1.5e-3;
    default:
      if (s.dir == Direction::fwd) return 1e-6;
      return s.approx == Approx::none ? 2e-6 : 4e-6;
  }
}

Check verify(const Shape& s, const Inputs& in, const HostBuffer& out) {
  const auto n = static_cast<std::size_t>(s.elements), off = static_cast<std::size_t>(s.offset);
  // The reference is a few flops per element, so the sample can be large; both ends are always in
  // it, where a vectorised kernel handles its unaligned head and its tail.
  const std::size_t limit = std::size_t(1) << 18;
  std::vector<std::size_t> idx = sample_indices(n, limit, 13);
  if (n > limit)
    for (std::size_t i = 0; i < 64; ++i) idx.push_back(i), idx.push_back(n - 1 - i);
  for (std::size_t& i : idx) i += off;
  const bool bwd = s.dir == Direction::bwd;
  auto ref = [&](std::size_t i) { return reference(s.approx, s.dir, in.x.get(i), bwd ? in.dy.get(i) : 0.0); };
  // A few elements, or ones with x all negative, can have a tiny rms(ref) that would make the
  // metric meaningless: the bound is taken relative to max(rms(ref), floor) instead, by scaling
  // the tolerance passed to compare() (which reports that scaled value).
  std::vector<double> r(idx.size());
#pragma omp parallel for schedule(static)
  for (std::int64_t j = 0; j < static_cast<std::int64_t>(idx.size()); ++j) r[static_cast<std::size_t>(j)] = ref(idx[static_cast<std::size_t>(j)]);
  double sumsq = 0;
  for (double v : r) sumsq += v * v;
  const double rms = std::sqrt(sumsq / static_cast<double>(idx.size()));
  const double rms_floor = bwd ? 0.4 : 2.0;
  const double tol = error_bound(s) * (rms < rms_floor ? rms_floor / std::max(rms, 1e-300) : 1.0);
  Check c = compare(out, idx, ref, tol);
  if (!c.ok) return c;
  for (std::size_t i = 0; i < out.count(); ++i) {
    if (i == off) i += n;  // skip the output itself
    if (i < out.count() && !std::isnan(out.get(i))) {
      char buf[160];
      std::snprintf(buf, sizeof buf, "element %zu, outside the %zu outputs at offset %zu, was written (%g)", i, n,
                    off, out.get(i));
      c.ok = false;
      c.message = buf;
      return c;
    }
  }
  return c;
}

HOTOPS_DEFINE_FAMILY(GeluFamily);

}  // namespace hotops::gelu
