// The lstm family: problem names, shapes, work, inputs and verification against the reference.
#include "kernels/lstm/lstm.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "hotops/check.h"
#include "hotops/op_family.h"
#include "hotops/verify.h"

namespace hotops::lstm {
namespace {

// The dtypes each backend runs: tf32 is a tensor-core mode that only the CUDA backend has.
std::vector<DType> dtypes_of(Backend b) {
  if (b == Backend::cpu) return {DType::f32, DType::bf16};
  return {DType::f32, DType::tf32, DType::bf16};
}

std::vector<Arg> args_of(const std::string& shape, std::int64_t B, std::int64_t T, std::int64_t I, std::int64_t H,
                         bool bi) {
  return {{"shape", shape},          {"batch", std::to_string(B)},  {"T", std::to_string(T)},
          {"input", std::to_string(I)}, {"hidden", std::to_string(H)}, {"dir", bi ? "bi" : "uni"}};
}

// Every backend x dtype x direction of one layer, and where hotops' own layer takes it, the
// library's as the same problem plus `impl:cudnn` (CUDA) or `impl:onednn` (CPU).
void expand(const std::vector<Arg>& args, std::vector<Problem>& out) {
  for (Backend be : kAllBackends)
    for (DType t : dtypes_of(be))
      for (Direction d : {Direction::fwd, Direction::bwd}) {
        Problem p{"lstm", be, t, d, args};
        out.push_back(p);
        const Shape s = shape_of(p);
        if (be == Backend::cuda ? cuda_takes_hotops(s) : cpu_takes_hotops(s)) {
          p.args.push_back({"impl", be == Backend::cuda ? "cudnn" : "onednn"});
          out.push_back(std::move(p));
        }
      }
}

// A copy of `b` in dtype `t` (the values are exact in both).
HostBuffer as_dtype(const HostBuffer& b, DType t) {
  if (b.dtype() == t) return b;
  HostBuffer out(t, b.count());
  for (std::size_t i = 0; i < b.count(); ++i) out.set(i, b.get(i));
  return out;
}

// References kept for the process (shared_reference): as many as a family lists between a
// problem's CPU and CUDA entries, and one more.
constexpr std::size_t kKeptReferences = 6;

// The op as the benchmark runs it: a PlanCase over the seeded inputs, the weights packed into the
// backend's weight space at setup, and (bwd) the gradient space unpacked for the check.
struct Op {
  struct Shape {
    lstm::Shape s;
    Backend backend = Backend::cpu;
  };
  using Args = lstm::Args;
  struct Io {
    std::unique_ptr<Layout> layout;
    Inputs in;
    HostBuffer weights;
    HostBuffer dy, dhT, dcT;   // bwd: the inputs' gradients in the layout's gradient dtype
    HostBuffer gradients;      // bwd: the gradient space
    Outputs out;
    ReferenceCache cache;
    std::string reference_key;  // the seed and the shape: what the inputs, and so the reference, are made of
  };
  static Shape shape(const Problem& p) { return {shape_of(p), p.backend}; }
  static Io io(const Shape& sh, std::uint64_t seed) {
    const lstm::Shape& s = sh.s;
    Io io;
    io.reference_key = "lstm/" + std::to_string(seed) + "/" + dtype_name(s.dtype) + "/" + direction_name(s.dir);
    for (const std::int64_t v : {s.T, s.B, s.I, s.H, s.D()}) io.reference_key += "/" + std::to_string(v);
    io.layout = make_layout(s, sh.backend);
    io.in = make_inputs(s, seed);
    io.weights = io.layout->pack(io.in.w_ih, io.in.w_hh, io.in.b_ih, io.in.b_hh);
    const DType t = storage_of(s.dtype);
    const auto T = static_cast<std::size_t>(s.T), B = static_cast<std::size_t>(s.B), I = static_cast<std::size_t>(s.I),
               H = static_cast<std::size_t>(s.H), D = static_cast<std::size_t>(s.D());
    if (s.dir == Direction::fwd) {
      io.out.y = HostBuffer(t, T * B * D * H);
      io.out.hT = HostBuffer(t, D * B * H);
      io.out.cT = HostBuffer(t, D * B * H);
      return io;
    }
    const DType g = io.layout->gradient_dtype();
    io.dy = as_dtype(io.in.dy, g);
    io.dhT = as_dtype(io.in.dhT, g);
    io.dcT = as_dtype(io.in.dcT, g);
    io.out.dx = HostBuffer(g, T * B * I);
    io.out.dh0 = HostBuffer(g, D * B * H);
    io.out.dc0 = HostBuffer(g, D * B * H);
    io.gradients = HostBuffer(DType::f32, (io.layout->gradient_bytes() + 3) / 4);
    return io;
  }
  static Args bind(const Shape& sh, Io& io, Binder& b) {
    const lstm::Shape& s = sh.s;
    Args a;
    a.x = b.in(io.in.x);
    a.h0 = b.in(io.in.h0);
    a.c0 = b.in(io.in.c0);
    a.weights = b.in(io.weights);
    if (s.dir == Direction::fwd) {
      a.y = b.out(io.out.y);
      a.hT = b.out(io.out.hT);
      a.cT = b.out(io.out.cT);
      return a;
    }
    // The training forward's outputs: the backward's inputs, not checked here.
    const std::size_t e = dtype_size(storage_of(s.dtype));
    a.y = b.scratch(static_cast<std::size_t>(s.T * s.B * s.D() * s.H) * e);
    a.hT = b.scratch(io.in.h0.bytes());
    a.cT = b.scratch(io.in.c0.bytes());
    a.dy = b.in(io.dy);
    a.dhT = b.in(io.dhT);
    a.dcT = b.in(io.dcT);
    a.dx = b.out(io.out.dx);
    a.dh0 = b.out(io.out.dh0);
    a.dc0 = b.out(io.out.dc0);
    a.dweights = b.out(io.gradients);
    return a;
  }
  static std::unique_ptr<hotops::Plan<Args>> plan(const Shape& sh, Backend b) { return make_plan(sh.s, b); }
  // bwd: the training forward again before each checked backward, since a backward changes the
  // state that the forward saved (cuDNN's reserve space), as a training step has it.
  static void before_check(const Shape& sh, Io&, hotops::Plan<Args>& plan, const Args& a) {
    if (sh.s.dir != Direction::fwd) dynamic_cast<lstm::Plan&>(plan).forward(a);
  }
  static Check check(const Shape& sh, Io& io) {
    if (sh.s.dir != Direction::fwd) io.layout->unpack(io.gradients, io.out);
    // One reference for the CPU and CUDA entries of a problem (their seeded inputs are the same),
    // which a family lists four to six entries apart (a shape's dtypes and directions on the CPU,
    // then on CUDA): the last kKeptReferences are kept.
    if (!io.cache.ref)
      io.cache.ref = shared_reference<Reference>(io.reference_key, [&] { return reference(sh.s, io.in); }, kKeptReferences);
    return verify(sh.s, io.in, io.out, io.cache);
  }
};

class LstmFamily final : public PlanFamily<Op> {
 public:
  LstmFamily() : PlanFamily("lstm", cpu_unsupported_reason) {}

  std::vector<Problem> benchmark_problems(const std::vector<std::int64_t>& batches) const override {
    return per_shape_and_batch(named_shapes(), batches, [](const NamedShape& ns, std::int64_t b, std::vector<Problem>& out) {
      expand(args_of(ns.name, b, ns.T, ns.I, ns.H, ns.bidirectional), out);
    });
  }

  std::vector<Problem> test_problems() const override {
    // Tiny and odd: T = 3 steps, I != H (5 vs 7), batch 2 and 3, both directions of the layer.
    std::vector<Problem> out;
    expand(args_of("test", 2, 3, 5, 7, false), out);
    expand(args_of("test", 3, 3, 5, 7, true), out);
    // Hidden sizes that hotops' CUDA kernels take, a batch that leaves the last block of 8 samples
    // part empty, and an input width off the GEMMs' 16-byte alignment.
    expand(args_of("test.h16", 11, 4, 6, 16, true), out);
    expand(args_of("test.h32", 9, 5, 3, 32, false), out);
    return out;
  }

  // FLOPs per step and direction: the two GEMMs, 2 * B * 4H * (I + H), plus the pointwise cell,
  // counted as 17 per (sample, unit): 8 bias adds (b_ih and b_hh), 5 nonlinearities at one FLOP
  // each, c = f*c + i*g (3) and h = o*tanh(c) (1). bwd: twice the GEMM FLOPs (dx/dh and dW_ih/dW_hh)
  // plus twice the pointwise count for the gate gradients, plus the db reduction (4H per sample).
  // Bytes: each input read once, each output written once; no saved activations (the reserve space
  // or workspace is the library's choice).
  Work work(const Problem& p) const override {
    const Shape s = shape_of(p);
    const double T = static_cast<double>(s.T), B = static_cast<double>(s.B), I = static_cast<double>(s.I),
                 H = static_cast<double>(s.H), D = static_cast<double>(s.D());
    const double e = static_cast<double>(dtype_size(storage_of(s.dtype)));
    const double gemm = 2 * B * 4 * H * (I + H), pointwise = 17 * B * H;
    const double weights = D * (4 * H * (I + H) + 2 * 4 * H), state = D * B * H;
    Work w;
    if (s.dir == Direction::fwd) {
      w.flops = T * D * (gemm + pointwise);
      w.bytes = e * (T * B * I + 2 * state + weights + T * B * D * H + 2 * state);
    } else {
      w.flops = T * D * (2 * gemm + 2 * pointwise + 4 * H * B);
      // reads x, h0, c0, weights, y, dy, dhT, dcT; writes dx, dh0, dc0, dW_ih, dW_hh, db
      w.bytes = e * (T * B * I + 2 * state + weights + 2 * T * B * D * H + 2 * state) +
                e * (T * B * I + 2 * state + D * 4 * H * (I + H) + D * 4 * H);
    }
    w.items = B;
    return w;
  }
};

// Compares one output with its reference vector at sampled indices.
Check compare_all(const HostBuffer& out, const std::vector<double>& ref, const Bounds& b, std::uint64_t seed) {
  HOTOPS_CHECK(out.count() == ref.size(), "lstm: output and reference sizes differ");
  return compare(out, sample_indices(out.count(), std::size_t(1) << 16, seed), [&](std::size_t i) { return ref[i]; },
                 b.max, b.rms);
}

}  // namespace

TorchOffsets::TorchOffsets(const Shape& s) {
  const auto G = static_cast<std::size_t>(4 * s.H), D = static_cast<std::size_t>(s.D());
  w_hh = D * G * static_cast<std::size_t>(s.I);
  b_ih = w_hh + D * G * static_cast<std::size_t>(s.H);
  b_hh = b_ih + D * G;
  total = b_hh + D * G;
}

namespace {

class TorchLayout final : public Layout {
 public:
  TorchLayout(const Shape& s, DType gradients) : o_(s), g_(gradients) {}
  std::size_t weight_bytes() const override { return o_.total * dtype_size(DType::bf16); }
  std::size_t gradient_bytes() const override { return o_.total * dtype_size(g_); }
  DType gradient_dtype() const override { return g_; }

  HostBuffer pack(const HostBuffer& w_ih, const HostBuffer& w_hh, const HostBuffer& b_ih,
                  const HostBuffer& b_hh) const override {
    HostBuffer space(DType::bf16, o_.total);
    const auto put = [&](const HostBuffer& t, std::size_t at) {
      for (std::size_t i = 0; i < t.count(); ++i) space.set(at + i, t.get(i));
    };
    put(w_ih, o_.w_ih), put(w_hh, o_.w_hh), put(b_ih, o_.b_ih), put(b_hh, o_.b_hh);
    return space;
  }

  void unpack(const HostBuffer& gradients, Outputs& out) const override {
    const std::size_t e = dtype_size(g_);
    const auto take = [&](std::size_t at, std::size_t end) {
      HostBuffer t(g_, end - at);
      std::memcpy(t.data(), static_cast<const char*>(gradients.data()) + at * e, t.bytes());
      return t;
    };
    out.dw_ih = take(o_.w_ih, o_.w_hh);
    out.dw_hh = take(o_.w_hh, o_.b_ih);
    out.db = take(o_.b_ih, o_.b_hh);
    out.db2 = take(o_.b_hh, o_.total);
  }

  Positions positions() const override {
    Positions p;
    const auto run = [](std::vector<std::size_t>& v, std::size_t from, std::size_t to) {
      for (std::size_t i = from; i < to; ++i) v.push_back(i);
    };
    run(p.w_ih, o_.w_ih, o_.w_hh), run(p.w_hh, o_.w_hh, o_.b_ih), run(p.b_ih, o_.b_ih, o_.b_hh), run(p.b_hh, o_.b_hh, o_.total);
    return p;
  }

 private:
  TorchOffsets o_;
  DType g_;
};

}  // namespace

std::unique_ptr<Layout> make_torch_layout(const Shape& s, DType gradients) {
  return std::make_unique<TorchLayout>(s, gradients);
}

std::unique_ptr<Plan> make_plan(const Shape& s, Backend b) {
  return plan_on_backend(b, s, make_cpu_plan, HOTOPS_CUDA_FACTORY(make_cuda_plan));
}

std::unique_ptr<Layout> make_layout(const Shape& s, Backend b) {
  return plan_on_backend(b, s, make_cpu_layout, HOTOPS_CUDA_FACTORY(make_cuda_layout));
}

Shape shape_of(const Problem& p) {
  Shape s;
  s.dir = p.dir;
  s.dtype = p.dtype;
  s.T = p.get_int("T");
  s.B = p.get_int("batch");
  s.I = p.get_int("input");
  s.H = p.get_int("hidden");
  const std::string& dir = p.get("dir");
  HOTOPS_CHECK(dir == "uni" || dir == "bi", "lstm: dir must be uni or bi, not " + dir);
  s.bidirectional = dir == "bi";
  if (p.has("impl")) {
    const char* library = p.backend == Backend::cuda ? "cudnn" : "onednn";
    HOTOPS_CHECK(p.get("impl") == library,
                 std::string("lstm: `impl` names the backend's library, ") + library + ": " + p.name());
    s.impl = Impl::library;
  }
  return s;
}

bool cuda_takes_hotops(const Shape& s) {
  return s.impl == Impl::best && s.dtype == DType::bf16 && s.H % 16 == 0 && s.H >= 16 && s.H <= 128;
}

Inputs make_inputs(const Shape& s, std::uint64_t seed) {
  const auto T = static_cast<std::size_t>(s.T), B = static_cast<std::size_t>(s.B), I = static_cast<std::size_t>(s.I),
             H = static_cast<std::size_t>(s.H), D = static_cast<std::size_t>(s.D());
  const DType t = storage_of(s.dtype);
  const float k = 1.0f / std::sqrt(static_cast<float>(s.H));
  Inputs in;
  in.x = HostBuffer(t, T * B * I);
  in.h0 = HostBuffer(t, D * B * H);
  in.c0 = HostBuffer(t, D * B * H);
  in.w_ih = HostBuffer(t, D * 4 * H * I);
  in.w_hh = HostBuffer(t, D * 4 * H * H);
  in.b_ih = HostBuffer(t, D * 4 * H);
  in.b_hh = HostBuffer(t, D * 4 * H);
  in.x.fill_uniform(seed, 1);
  in.h0.fill_uniform(seed, 2);
  in.c0.fill_uniform(seed, 3);
  in.w_ih.fill_uniform(seed, 4, -k, k);
  in.w_hh.fill_uniform(seed, 5, -k, k);
  in.b_ih.fill_uniform(seed, 6, -k, k);
  in.b_hh.fill_uniform(seed, 7, -k, k);
  if (s.dir != Direction::fwd) {
    in.dy = HostBuffer(t, T * B * D * H);
    in.dhT = HostBuffer(t, D * B * H);
    in.dcT = HostBuffer(t, D * B * H);
    in.dy.fill_uniform(seed, 8);
    in.dhT.fill_uniform(seed, 9);
    in.dcT.fill_uniform(seed, 10);
  }
  return in;
}

double tolerance_of(const Shape& s) {
  const double steps = std::max(1.0, std::sqrt(static_cast<double>(s.T) / 25.0));
  // A bf16 backward rounds twice per step what the forward rounds once: the saved activations and the
  // gate gradients are both bf16 GEMM operands, and the weight gradients sum T x B such products.
  // cuDNN's bf16 dW_hh at deepbench.h1024 batch 64 (T 25) measured 0.046, over the forward bound 0.04.
  const double bwd16 = s.dtype == DType::bf16 && s.dir != Direction::fwd ? 2.0 : 1.0;
  return tolerance(s.dtype) * steps * bwd16;
}

Bounds bounds_of(const Shape& s) {
  const double bwd16 = s.dtype == DType::bf16 && s.dir != Direction::fwd ? 2.0 : 1.0;
  return {tolerance_of(s), tolerance(s.dtype) * bwd16 / 4};
}

Reference reference(const Shape& s, const Inputs& in) {
  const RefInputs d = to_double(in);
  Reference r;
  r.f = reference_forward(s, d);
  if (s.dir != Direction::fwd) r.b = reference_backward(s, d, r.f);
  return r;
}

Check verify(const Shape& s, const Inputs& in, const Outputs& out, ReferenceCache& cache) {
  if (!cache.ref) cache.ref = std::make_shared<const Reference>(reference(s, in));
  const Reference& ref = *cache.ref;
  const Bounds tol = bounds_of(s);
  Check all;
  if (s.dir == Direction::fwd) {
    all.merge(compare_all(out.y, ref.f.y, tol, 1), "y");
    all.merge(compare_all(out.hT, ref.f.hT, tol, 2), "hT");
    all.merge(compare_all(out.cT, ref.f.cT, tol, 3), "cT");
    return all;
  }
  const Backward& r = ref.b;
  all.merge(compare_all(out.dx, r.dx, tol, 4), "dx");
  all.merge(compare_all(out.dh0, r.dh0, tol, 5), "dh0");
  all.merge(compare_all(out.dc0, r.dc0, tol, 6), "dc0");
  all.merge(compare_all(out.dw_ih, r.dw_ih, tol, 7), "dW_ih");
  all.merge(compare_all(out.dw_hh, r.dw_hh, tol, 8), "dW_hh");
  all.merge(compare_all(out.db, r.db, tol, 9), "db");
  if (out.db2.count()) all.merge(compare_all(out.db2, r.db, tol, 10), "db_hh");
  return all;
}

const std::vector<NamedShape>& named_shapes() {
  using V = std::vector<std::int64_t>;
  // DeepBench's LSTM training rows (one layer, input = hidden) covering T = 25, 50 and 150, and
  // the IMDb bidirectional LSTM of Max Woolf's Keras benchmarks (embedding 128, LSTM 128, reviews
  // cut to 200 words); Keras' lstm_text_generation.py: LSTM(128) over 40 one-hot characters of a
  // 57-symbol alphabet, batch 128 (the one-hot input is a dense [T, B, 57] tensor here).
  static const std::vector<NamedShape> shapes = {
      {"deepbench.h512", 25, 512, 512, false, V{16, 32}},
      {"deepbench.h1024", 25, 1024, 1024, false, V{64}},
      {"deepbench.h1024", 50, 1024, 1024, false, V{32}},
      {"deepbench.h1536", 50, 1536, 1536, false, V{16}},
      {"deepbench.h2048", 25, 2048, 2048, false, V{16}},
      {"deepbench.h256", 150, 256, 256, false, V{32}},
      {"imdb.bilstm", 200, 128, 128, true, V{64}},
      {"textgen", 40, 57, 128, false, V{128}},
  };
  return shapes;
}

HOTOPS_DEFINE_FAMILY(LstmFamily);

}  // namespace hotops::lstm
