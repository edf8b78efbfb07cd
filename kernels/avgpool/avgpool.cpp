// The global_avgpool family: problem names and shapes, work, inputs and verification.
//
// Names: global_avgpool/<backend>/<f32|bf16>/<fwd|bwd>/shape:<model.layer>/batch:N/L:<positions>/
// C:<channels>/layout:<nlc|ncl>; test problems have shape:test and no batch arg (N is `N:`).
#include "kernels/avgpool/avgpool.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "hotops/check.h"
#include "hotops/op_family.h"

namespace hotops::avgpool {
namespace {

struct NamedShape {
  const char* name;
  std::int64_t L, C;
  const char* layouts[2];  // the layouts it is listed in (nullptr: none more)
  std::int64_t batch;
};

const std::vector<NamedShape>& named_shapes() {
  static const std::vector<NamedShape> shapes = {
      // Keras' imdb_fasttext.py: GlobalAveragePooling1D over 400 tokens of 50-dim embeddings, batch 32.
      {"fasttext_imdb", 400, 50, {"nlc", nullptr}, 32},
      // ResNet-50's head: the mean over 7x7 of 2048 channels, batch 32, NCHW and NHWC.
      {"resnet50.avgpool", 49, 2048, {"ncl", "nlc"}, 32},
  };
  return shapes;
}


std::vector<Arg> args_of(const char* shape, const char* batch_key, std::int64_t n, std::int64_t L, std::int64_t C,
                         const char* layout) {
  return {{"shape", shape}, {batch_key, std::to_string(n)}, {"L", std::to_string(L)}, {"C", std::to_string(C)},
          {"layout", layout}};
}

void expand(const std::vector<Arg>& args, std::vector<Problem>& out) { expand_fwd_bwd("global_avgpool", args, out); }

struct Op : OpOf<Shape, Args, Inputs, HostBuffer> {
  static Shape shape(const Problem& p) { return shape_of(p); }
  static Args bind(const Shape& s, Io& io, Binder& b) {
    Args a;
    if (s.dir == Direction::fwd)
      a.x = b.in(io.in.x);
    else
      a.dy = b.in(io.in.dy);
    a.out = b.out(io.out);
    return a;
  }
};

class AvgpoolFamily final : public PlanFamily<Op> {
 public:
  AvgpoolFamily() : PlanFamily("global_avgpool", onednn_unsupported_reason) {}

  std::vector<Problem> benchmark_problems(const std::vector<std::int64_t>& batches) const override {
    return per_shape_and_batch(named_shapes(), batches, [](const NamedShape& ns, std::int64_t b, std::vector<Problem>& out) {
      for (const char* layout : ns.layouts)
        if (layout) expand(args_of(ns.name, "batch", b, ns.L, ns.C, layout), out);
    });
  }

  std::vector<Problem> test_problems() const override {
    // One position (the mean is the input); fewer channels than a warp; the fasttext pool's odd 50
    // channels (a second, partial CUDA channel tile) over more positions than a block's rows, and
    // over fastText's 400 (CUDA's 16-byte vectors: bwd in 20 steps of 20 rows); 300 samples of 148
    // positions (samples enough to fill an H100's or H200's SMs, so fwd takes the vectors too: steps
    // of 72 rows in f32 and 144 in bf16, the last partial); 6 channels over 12 positions (fewer
    // rows than a step); more rows than one CUDA block of rows in NCL; both layouts of a small image;
    // one position in NCL (the CPU loops' tail alone).
    struct T {
      std::int64_t N, L, C;
      const char* layout;
    };
    constexpr T kShapes[] = {
        {3, 1, 7, "nlc"},     {2, 5, 3, "nlc"},     {3, 401, 50, "nlc"},  {3, 400, 50, "nlc"},
        {300, 148, 50, "nlc"}, {2, 12, 6, "nlc"},   {5, 9, 70, "ncl"},    {2, 49, 33, "nlc"},   {2, 49, 33, "ncl"},
        {3, 1, 7, "ncl"},
    };
    std::vector<Problem> out;
    for (const T& t : kShapes) expand(args_of("test", "N", t.N, t.L, t.C, t.layout), out);
    return out;
  }

  // FLOPs: one add an input element (fwd's sums, or bwd's scaling, one an output of the pair), a
  // convention: the op is memory-bound. Bytes: the input read once and the output written once.
  Work work(const Problem& p) const override {
    const Shape s = shape_of(p);
    const double e = static_cast<double>(dtype_size(s.dtype));
    Work w;
    w.flops = static_cast<double>(s.in_elements());
    w.bytes = static_cast<double>(s.in_elements() + s.out_elements()) * e;
    w.items = static_cast<double>(s.N);
    return w;
  }
};

}  // namespace

Shape shape_of(const Problem& p) {
  Shape s = fwd_bwd_shape<Shape>(p, "global_avgpool");
  const std::string& layout = p.get("layout");
  HOTOPS_CHECK(layout == "nlc" || layout == "ncl", "global_avgpool layout is nlc or ncl: " + p.name());
  s.layout = layout == "nlc" ? Layout::nlc : Layout::ncl;
  s.N = p.batch() ? *p.batch() : p.get_int("N");
  s.L = p.get_int("L"), s.C = p.get_int("C");
  HOTOPS_CHECK(s.N > 0 && s.L > 0 && s.C > 0, "global_avgpool dimensions must be positive: " + p.name());
  return s;
}

Inputs make_inputs(const Shape& s, std::uint64_t seed) {
  const bool fwd = s.dir == Direction::fwd;
  Inputs in;
  HostBuffer& input = fwd ? in.x : in.dy;  // the pass's one input
  input = HostBuffer(s.dtype, fwd ? s.in_elements() : s.out_elements());
  input.fill_uniform(seed, fwd ? 0 : 1);
  return in;
}

HostBuffer make_output(const Shape& s) {
  return HostBuffer(s.dtype, s.dir == Direction::fwd ? s.out_elements() : s.in_elements());
}

// u = 2^-24 (f32's unit roundoff); r = the dtype's rounding of the stored output (0 for f32, whose
// last rounding is counted in u; 2^-8 for bf16's 8 significant bits). The stored inputs are exact.
//   fwd: a sum of L terms in f32, in any order, errs by at most (L - 1) u Σ|x| (to first order), the
//        division by L by u of the mean, the store by r: |y - ref| <= L u mean|x| + (2u + r) |ref|.
//        Bounded at twice that, plus a floor for a mean that cancels to 0. A dropped position moves
//        y by |x| / L, 1 / (2 u L^2) times the bound where |x| ~ mean|x| (50 at fasttext's 400
//        tokens): caught for L up to ~2000; a missing / L scales y by L.
//   bwd: dy / L (or dy · (1/L)) rounds once or twice, then the store: |dx - ref| <= (2u + r) |ref|,
//        bounded at 4u + r. Exact where L is a power of two.
Check verify(const Shape& s, const Inputs& in, const HostBuffer& out) {
  const double u = std::ldexp(1.0, -24), r = s.dtype == DType::bf16 ? std::ldexp(1.0, -8) : 0.0;
  const double L = static_cast<double>(s.L);
  const std::vector<std::size_t> idx = sample_indices(out.count(), std::size_t(1) << 18, 29);
  if (s.dir == Direction::fwd)
    return compare_each(out, idx,
                        [&](std::size_t i, double& bound) {
                          const auto n = static_cast<std::int64_t>(i) / s.C, c = static_cast<std::int64_t>(i) % s.C;
                          double abs = 0;
                          for (std::int64_t l = 0; l < s.L; ++l) abs += std::fabs(in.x.get(s.x_at(n, l, c)));
                          const double want = reference_fwd(s, in.x, i);
                          bound = 2 * (u * abs + (2 * u + r) * std::fabs(want)) + u * 1e-3;  // u Σ|x| = L u mean|x|
                          return want;
                        },
                        "y");
  return compare_each(out, idx,
                      [&](std::size_t i, double& bound) {
                        const double want = reference_bwd(s, in.dy, i);
                        bound = (4 * u + r) * std::fabs(want) + u * 1e-3 / L;
                        return want;
                      },
                      "dx");
}

HOTOPS_DEFINE_FAMILY(AvgpoolFamily);

}  // namespace hotops::avgpool
