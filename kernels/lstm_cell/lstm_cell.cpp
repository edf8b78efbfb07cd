// The lstm_cell family: problem names and shapes, work, inputs, verification, CPU implementation choice.
//
// Names: lstm_cell/<cpu|cuda>/<f32|bf16|tf32>/<fwd|bwd>/shape:<name>/batch:B/input:I/hidden:H, plus
// `impl:<hotops|onednn>` on the CPU for the implementation that is not the default. x and h are
// given concatenated ([B, I+H], see lstm_cell.h): that is the input format, not a copy in the run.
#include "kernels/lstm_cell/lstm_cell.h"

#include <algorithm>
#include <cmath>

#include "hotops/check.h"
#include "hotops/op_family.h"

namespace hotops::lstm_cell {
namespace {

// A cell of a real model: input and hidden widths with the default batches.
struct NamedShape {
  std::string name;
  std::int64_t input, hidden;
  std::vector<std::int64_t> batches;
};

const std::vector<NamedShape>& named_shapes() {
  static const std::vector<NamedShape> shapes = {
      // DeepBench's LSTM training rows (hidden x minibatch; the input is as wide as the hidden state).
      {"deepbench.h512", 512, 512, {16, 128}},
      {"deepbench.h1024", 1024, 1024, {64}},
      {"deepbench.h2048", 2048, 2048, {32}},
      {"deepbench.h4096", 4096, 4096, {16}},
      // Max Woolf's Keras benchmarks: Keras' imdb_bidirectional_lstm example, 128-wide
      // embeddings into Bidirectional(LSTM(64)) at batch 32; each direction is this cell.
      {"imdb.bilstm", 128, 64, {32}},
  };
  return shapes;
}

constexpr Direction kDirections[] = {Direction::fwd, Direction::bwd};

std::vector<DType> dtypes_of(Backend b) {
  if (b == Backend::cpu) return {DType::f32, DType::bf16};
  return {DType::f32, DType::tf32, DType::bf16};
}

CpuImpl other(CpuImpl i) { return i == CpuImpl::hotops ? CpuImpl::onednn : CpuImpl::hotops; }

std::string cpu_unsupported_reason(const Problem& p) {
  return cpu_impl_of(p) == CpuImpl::onednn ? onednn_unsupported_reason(p) : hotops_unsupported_reason(p);
}

// The op as the benchmark runs it: a PlanCase over the seeded inputs and the direction's outputs
// (both CPU implementations compute on the same numbers: PlanCase's seed leaves out `impl`).
struct Op : OpOf<Shape, Args, Inputs, Outputs> {
  static Shape shape(const Problem& p) { return shape_of(p); }
  static Args bind(const Shape& s, Io& io, Binder& bd) {
    Args a;
    a.xh = bd.in(io.in.xh);
    a.W = bd.in(io.in.W);
    a.b = bd.in(io.in.b);
    a.c = bd.in(io.in.c);
    if (s.dir == Direction::fwd) {
      a.h_new = bd.out(io.out.h);
      a.c_new = bd.out(io.out.c);
      return a;
    }
    a.dh_new = bd.in(io.in.dh);
    a.dc_new = bd.in(io.in.dc);
    a.dxh = bd.out(io.out.dxh);
    a.dc = bd.out(io.out.dc);
    a.dW = bd.out(io.out.dW);
    a.db = bd.out(io.out.db);
    return a;
  }
};

std::vector<Arg> args_of(const std::string& name, std::int64_t batch, std::int64_t input, std::int64_t hidden) {
  return {{"shape", name},
          {"batch", std::to_string(batch)},
          {"input", std::to_string(input)},
          {"hidden", std::to_string(hidden)}};
}

// Every backend x dtype x direction of one shape, and on the CPU the second implementation.
void expand(const std::vector<Arg>& args, std::vector<Problem>& out) {
  for (Backend be : kAllBackends)
    for (DType t : dtypes_of(be))
      for (Direction d : kDirections) {
        out.push_back(Problem{"lstm_cell", be, t, d, args});
        if (be == Backend::cpu) {
          Problem alt{"lstm_cell", be, t, d, args};
          alt.args.push_back({"impl", cpu_impl_name(other(cpu_default(t, d)))});
          out.push_back(std::move(alt));
        }
      }
}

class LstmCellFamily final : public PlanFamily<Op> {
 public:
  LstmCellFamily() : PlanFamily("lstm_cell", cpu_unsupported_reason) {}

  std::vector<Problem> benchmark_problems(const std::vector<std::int64_t>& batches) const override {
    return per_shape_and_batch(named_shapes(), batches, [](const NamedShape& ns, std::int64_t b, std::vector<Problem>& out) {
      expand(args_of(ns.name, b, ns.input, ns.hidden), out);
    });
  }

  std::vector<Problem> test_problems() const override {
    // Odd everything (the CUDA kernels' scalar path), H a multiple of 4 (their vector path), one
    // sample, and a wide input.
    std::vector<Problem> out;
    expand(args_of("test", 3, 5, 7), out);
    expand(args_of("test", 2, 13, 8), out);
    expand(args_of("test", 1, 3, 12), out);
    expand(args_of("test", 9, 40, 36), out);
    return out;
  }

  Work work(const Problem& p) const override {
    const Shape s = shape_of(p);
    const double B = static_cast<double>(s.B), H = static_cast<double>(s.H), K = static_cast<double>(s.K());
    const double G = 4 * H, e = static_cast<double>(dtype_size(s.dtype));
    const double gemm = 2 * B * G * K;
    Work w;
    if (s.dir == Direction::fwd) {
      w.flops = gemm + B * H * kPointwiseFlopsFwd;
      w.bytes = e * (B * K + G * K + G + B * H) + e * 2 * B * H;  // xh, W, b, c in; h', c' out
    } else {
      // d[x,h] = dgates.W and dW = dgates^T.[x,h]; db is a column sum of dgates.
      w.flops = 2 * gemm + B * H * kPointwiseFlopsBwd + B * G;
      // xh, W, b, c, dh', dc' in; dxh, dc, dW, db out. The saved state is not counted: it is an
      // implementation's choice (a backward may recompute it from these inputs).
      w.bytes = e * (B * K + G * K + G + 3 * B * H) + e * (B * K + B * H + G * K + G);
    }
    w.items = B;
    return w;
  }
};

}  // namespace

// The CPU implementation that runs by default, per dtype and direction; the other is the same problem
// plus `impl:<name>`. Measured on the 16-core Xeon (AVX-512, AMX) of the H100 host, deepbench.h1024
// batch 64: f32 fwd hotops 1100 us vs oneDNN lstm_forward 1065 us (a tie), f32 bwd 2196 vs 4731 us;
// bf16 fwd 527 vs 295 us (oneDNN's brgemm LSTM wins), bf16 bwd hotops 1375 us (oneDNN 2.6 has no
// bf16 lstm_backward there). So oneDNN runs bf16 fwd, hotops everything else.
CpuImpl cpu_default(DType t, Direction d) {
  return t == DType::bf16 && d == Direction::fwd ? CpuImpl::onednn : CpuImpl::hotops;
}

std::unique_ptr<Plan> make_cpu_plan(const Shape& s) {
  return s.cpu_impl == CpuImpl::onednn ? make_cpu_onednn_plan(s) : make_cpu_hotops_plan(s);
}

std::unique_ptr<Plan> make_plan(const Shape& s, Backend b) {
  return plan_on_backend(b, s, make_cpu_plan, HOTOPS_CUDA_FACTORY(make_cuda_plan));
}

const char* cpu_impl_name(CpuImpl i) { return i == CpuImpl::hotops ? "hotops" : "onednn"; }

CpuImpl cpu_impl_of(const Problem& p) {
  if (!p.has("impl")) return cpu_default(p.dtype, p.dir);
  HOTOPS_CHECK(p.backend == Backend::cpu, "lstm_cell: `impl` names a CPU implementation: " + p.name());
  const std::string& v = p.get("impl");
  for (CpuImpl i : {CpuImpl::hotops, CpuImpl::onednn})
    if (v == cpu_impl_name(i)) return i;
  throw Error("lstm_cell: unknown impl '" + v + "' (hotops or onednn) in " + p.name());
}


Shape shape_of(const Problem& p) {
  HOTOPS_CHECK(p.dir == Direction::fwd || p.dir == Direction::bwd, "lstm_cell has fwd and bwd only: " + p.name());
  HOTOPS_CHECK(p.dtype != DType::f16, "lstm_cell has no f16: " + p.name());
  Shape s;
  s.dir = p.dir;
  s.dtype = p.dtype;
  s.B = p.get_int("batch");
  s.I = p.get_int("input");
  s.H = p.get_int("hidden");
  s.cpu_impl = cpu_impl_of(p);
  HOTOPS_CHECK(s.B > 0 && s.I > 0 && s.H > 0, "bad lstm_cell shape: " + p.name());
  return s;
}

Inputs make_inputs(const Shape& s, std::uint64_t seed) {
  const DType t = storage_of(s.dtype);
  const auto B = static_cast<std::size_t>(s.B), H = static_cast<std::size_t>(s.H),
             K = static_cast<std::size_t>(s.K()), G = 4 * H;
  const float k = 1.f / std::sqrt(static_cast<float>(s.H));
  Inputs in;
  in.xh = HostBuffer(t, B * K);
  in.W = HostBuffer(t, G * K);
  in.b = HostBuffer(t, G);
  in.c = HostBuffer(t, B * H);
  in.xh.fill_uniform(seed, 1);
  in.W.fill_uniform(seed, 2, -k, k);
  in.b.fill_uniform(seed, 3, -k, k);
  in.c.fill_uniform(seed, 4);
  if (s.dir == Direction::bwd) {
    in.dh = HostBuffer(t, B * H);
    in.dc = HostBuffer(t, B * H);
    in.dh.fill_uniform(seed, 5);
    in.dc.fill_uniform(seed, 6);
  }
  return in;
}

Outputs make_outputs(const Shape& s) {
  const DType t = storage_of(s.dtype);
  const auto B = static_cast<std::size_t>(s.B), H = static_cast<std::size_t>(s.H),
             K = static_cast<std::size_t>(s.K()), G = 4 * H;
  Outputs o;
  if (s.dir == Direction::fwd) {
    o.h = HostBuffer(t, B * H);
    o.c = HostBuffer(t, B * H);
  } else {
    o.dxh = HostBuffer(t, B * K);
    o.dc = HostBuffer(t, B * H);
    o.dW = HostBuffer(t, G * K);
    o.db = HostBuffer(t, G);
  }
  return o;
}

Check verify(const Shape& s, const Inputs& in, const Outputs& out) {
  // The forward reference is computed whole (one GEMM in double, B * 4H * K); dxh and dW elements
  // are dot products of length 4H and B, sampled on large problems.
  const std::size_t pointwise_limit = std::size_t(1) << 16, gemm_limit = 4096;
  // Each output's largest error within the dtype's tolerance, and its rms within a quarter of it:
  // rounding errors spread with an rms several times below their largest element, a wrong term spread
  // over every element does not.
  const double tol = tolerance(s.dtype), rms_tol = tol / 4;
  const RefInputs ri = ref_inputs(in);
  const RefForward f = reference_forward(s, ri);
  auto all_of = [&](const std::vector<double>& ref, const HostBuffer& o, std::uint64_t seed) {
    return compare(o, sample_indices(o.count(), pointwise_limit, seed), [&](std::size_t i) { return ref[i]; }, tol, rms_tol);
  };
  Check c;
  if (s.dir == Direction::fwd) {
    c.merge(all_of(f.h, out.h, 1), "h'");
    c.merge(all_of(f.c, out.c, 2), "c'");
    return c;
  }
  const RefBackward r = reference_backward(s, ri, f);
  c.merge(compare(out.dxh, sample_indices(out.dxh.count(), gemm_limit, 3),
                  [&](std::size_t i) { return reference_dxh(s, ri, r, i); }, tol, rms_tol),
          "dxh");
  c.merge(all_of(r.dc, out.dc, 4), "dc");
  c.merge(compare(out.dW, sample_indices(out.dW.count(), gemm_limit, 5),
                  [&](std::size_t i) { return reference_dW(s, ri, r, i); }, tol, rms_tol),
          "dW");
  c.merge(all_of(r.db, out.db, 6), "db");
  return c;
}

HOTOPS_DEFINE_FAMILY(LstmCellFamily);

}  // namespace hotops::lstm_cell
