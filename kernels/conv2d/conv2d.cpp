// The conv2d family: problem names, work, inputs, verification, and the problem lists.
#include "kernels/conv2d/conv2d.h"

#include <algorithm>
#include <cmath>
#include <tuple>
#include <utility>

#include "hotops/check.h"
#include "hotops/op_family.h"

namespace hotops::conv2d {
namespace {

const char* layout_name(Layout l) { return l == Layout::nchw ? "nchw" : "nhwc"; }

// The dtypes each backend runs: tf32 is a tensor-core mode that only the CUDA backend has.
std::vector<DType> dtypes_of(Backend b) {
  if (b == Backend::cpu) return {DType::f32, DType::bf16};
  return {DType::f32, DType::tf32, DType::bf16};
}

constexpr Direction kDirections[] = {Direction::fwd, Direction::bwd_data, Direction::bwd_weight};

// One layer's geometry as name args; `stride`, `pad`, `dilation` are "v" or "<h>x<w>".
struct Geometry {
  std::int64_t N, C, H, W, K, R, S;
  std::string stride, pad, dilation;
  bool bias;
  std::int64_t groups = 1;
};

std::vector<Arg> args_of(const std::string& shape, const Geometry& g, Layout l) {
  const auto str = [](std::int64_t v) { return std::to_string(v); };
  std::vector<Arg> args = {{"shape", shape}, {"batch", str(g.N)}, {"C", str(g.C)},     {"H", str(g.H)},
                           {"W", str(g.W)},  {"K", str(g.K)},     {"R", str(g.R)},     {"S", str(g.S)},
                           {"stride", g.stride}, {"pad", g.pad},  {"dilation", g.dilation}};
  if (g.groups != 1) args.push_back({"groups", str(g.groups)});  // groups:1 is the default, unnamed
  args.push_back({"bias", g.bias ? "1" : "0"});
  args.push_back({"layout", layout_name(l)});
  return args;
}

// Expands one layer into every backend x dtype x direction x layout problem.
void expand(const std::string& shape, const Geometry& g, std::vector<Problem>& out) {
  for (Backend be : kAllBackends)
    for (DType t : dtypes_of(be))
      for (Direction d : kDirections)
        for (Layout l : {Layout::nchw, Layout::nhwc}) out.push_back(Problem{"conv2d", be, t, d, args_of(shape, g, l)});
}

// The layer's forward with its ReLU fused (relu:1), NHWC, in each CPU dtype: what a convnet's CPU
// step runs (model_cnn); the CUDA plan has no fused ReLU.
void expand_relu(const std::string& shape, const Geometry& g, std::vector<Problem>& out) {
  for (DType t : dtypes_of(Backend::cpu)) {
    std::vector<Arg> args = args_of(shape, g, Layout::nhwc);
    args.push_back({"relu", "1"});
    out.push_back(Problem{"conv2d", Backend::cpu, t, Direction::fwd, args});
  }
}

// "3" -> (3, 3); "2x1" -> (2, 1).
std::pair<std::int64_t, std::int64_t> pair_arg(const Problem& p, const std::string& key) {
  const std::string& v = p.get(key);
  try {
    const std::size_t x = v.find('x');
    if (x == std::string::npos) {
      const std::int64_t n = std::stoll(v);
      return {n, n};
    }
    return {std::stoll(v.substr(0, x)), std::stoll(v.substr(x + 1))};
  } catch (const std::exception&) {
    throw Error("conv2d: " + key + ":" + v + " is not <n> or <h>x<w> in " + p.name());
  }
}

// The tensor a pass writes: y (fwd), dx (bwd_data) or dw (bwd_weight).
Tensor output_of(Direction d) { return d == Direction::bwd_data ? Tensor::x : d == Direction::bwd_weight ? Tensor::w : Tensor::y; }

// A host tensor for `bytes` of the shape's dtype (oneDNN's layouts may pad channels).
HostBuffer host_bytes(const Shape& s, std::size_t bytes) {
  return HostBuffer(s.dtype, (bytes + dtype_size(s.dtype) - 1) / dtype_size(s.dtype));
}

// What a problem's seeded inputs are made of: its seed (the same on every backend) and its shape.
std::string reference_key(const Shape& s, std::uint64_t seed) {
  std::string key = "conv2d/" + std::to_string(seed) + "/" + dtype_name(s.dtype) + "/" + direction_name(s.dir) + "/" +
                    layout_name(s.layout);
  for (const std::int64_t v : {s.N, s.C, s.H, s.W, s.K, s.R, s.S, s.stride_h, s.stride_w, s.pad_h, s.pad_w, s.dil_h,
                               s.dil_w, s.groups, std::int64_t{s.bias}, std::int64_t{s.relu}, std::int64_t{s.f32_params}})
    key += "/" + std::to_string(v);
  return key;
}

// The op as the benchmark runs it: a PlanCase over the problem's inputs and outputs. On the CPU the
// plan takes oneDNN's layouts: the inputs are reordered into them here, at setup, and the output back
// to the user's layout by the check, so the timed run is the convolution alone.
struct Op {
  using Shape = conv2d::Shape;
  using Args = conv2d::Args;
  struct Io {
    Inputs in;               // the user's layout: what the reference reads
    Outputs out;             // the user's layout: what the check compares
    Inputs onednn;           // onednn_layouts: x, w and dy in oneDNN's layouts
    HostBuffer onednn_out;   // onednn_layouts: the pass's output in oneDNN's layout
    std::string reference_key;  // the seed and the shape: what the inputs, and so the reference, are made of
  };
  static Shape shape(const Problem& p) { return shape_of(p); }
  static Io io(const Shape& s, std::uint64_t seed) {
    Io io{make_inputs(s, seed), make_outputs(s), {}, {}, reference_key(s, seed)};
    if (!s.onednn_layouts) return io;
    const auto reordered = [&](const HostBuffer& user, Tensor t) {
      if (user.count() == 0) return HostBuffer();
      HostBuffer h = host_bytes(s, onednn_bytes(s, t));
      to_onednn_layout(s, t, user.data(), h.data());
      return h;
    };
    io.onednn.x = reordered(io.in.x, Tensor::x);
    io.onednn.w = reordered(io.in.w, Tensor::w);
    io.onednn.dy = reordered(io.in.dy, Tensor::y);
    io.onednn_out = host_bytes(s, onednn_bytes(s, output_of(s.dir)));
    return io;
  }
  static Args bind(const Shape& s, Io& io, Binder& b) {
    const Inputs& in = s.onednn_layouts ? io.onednn : io.in;
    const auto input = [&](const HostBuffer& h) { return h.count() ? b.in(h) : nullptr; };
    Args a;
    a.x = input(in.x), a.w = input(in.w), a.b = input(io.in.b), a.dy = input(in.dy);
    a.out = b.out(s.onednn_layouts ? io.onednn_out : io.out.primary);
    if (io.out.db.count()) a.db = b.out(io.out.db);
    return a;
  }
  static std::unique_ptr<Plan> plan(const Shape& s, Backend b) { return make_plan(s, b); }
  static Check check(const Shape& s, Io& io) {
    if (s.onednn_layouts) to_user_layout(s, output_of(s.dir), io.onednn_out.data(), io.out.primary.data());
    return verify(s, io.in, io.out, io.reference_key);
  }
};

class Conv2dFamily final : public PlanFamily<Op> {
 public:
  Conv2dFamily() : PlanFamily("conv2d", cpu_unsupported_reason) {}

  std::vector<Problem> benchmark_problems(const std::vector<std::int64_t>& batches) const override {
    return per_shape_and_batch(named_shapes(), batches, [](const NamedShape& ns, std::int64_t b, std::vector<Problem>& out) {
      const Geometry g{b, ns.C, ns.H, ns.W, ns.K, ns.R, ns.S, std::to_string(ns.stride), std::to_string(ns.pad), "1",
                       ns.bias, ns.groups};
      expand(ns.name, g, out);
      if (ns.relu) expand_relu(ns.name, g, out);
    });
  }

  std::vector<Problem> test_problems() const override {
    // Odd sizes, non-square filters, strides that skip input rows, padding wider than the filter
    // reach, dilation, a degenerate 1x1x1, and one large enough that verification samples. Grouped:
    // depthwise 3x3 on odd channels, two groups of 2 input and 3 output channels with a stride, and
    // ConvNeXt's depthwise 7x7 (padding 3) on 16 channels. First layers of 3 and 1 input channels
    // (the CUDA forward's direct kernel where it times faster than cuDNN), odd output widths.
    const Geometry shapes[] = {
        {2, 3, 7, 9, 4, 3, 3, "1", "1", "1", true},
        {1, 5, 11, 6, 7, 3, 2, "2x1", "1x0", "1", false},
        {3, 8, 10, 10, 16, 3, 3, "1", "2", "2", false},
        {2, 16, 9, 9, 8, 1, 1, "2", "0", "1", true},
        {2, 4, 13, 12, 6, 5, 5, "3", "2", "1x2", true},
        {1, 1, 1, 1, 1, 1, 1, "1", "0", "1", true},
        {2, 32, 28, 28, 32, 3, 3, "1", "1", "1", true},
        {2, 5, 7, 9, 5, 3, 3, "1", "1", "1", true, 5},
        {2, 4, 9, 8, 6, 3, 3, "2", "1", "1", false, 2},
        {2, 16, 10, 10, 16, 7, 7, "1", "3", "1", true, 16},
        {2, 3, 9, 11, 16, 3, 3, "1", "1", "1", true},
        {3, 1, 12, 10, 32, 5, 5, "2", "2", "1", false},
    };
    std::vector<Problem> out;
    for (const Geometry& g : shapes) expand("test", g, out);
    expand_relu("test", shapes[0], out);
    expand_relu("test", shapes[6], out);
    return out;
  }

  Work work(const Problem& p) const override {
    const Shape s = shape_of(p);
    const auto d = [](std::int64_t v) { return static_cast<double>(v); };
    const double x = d(s.N * s.C * s.H * s.W), w = d(s.K * s.Cg() * s.R * s.S), y = d(s.N * s.K * s.P() * s.Q());
    const double e = static_cast<double>(dtype_size(s.dtype));
    Work wk;
    wk.flops = 2 * d(s.N) * d(s.K) * d(s.Cg()) * d(s.R) * d(s.S) * d(s.P()) * d(s.Q());
    switch (s.dir) {
      case Direction::bwd_data: wk.bytes = e * (y + w + x); break;  // dy, w -> dx
      case Direction::bwd_weight:                                   // x, dy -> dw (, db)
        wk.bytes = e * (x + y + w + (s.bias ? d(s.K) : 0));
        if (s.bias) wk.flops += y;  // the db reduction
        break;
      default:  // x, w (, b) -> y
        wk.bytes = e * (x + w + y + (s.bias ? d(s.K) : 0));
        if (s.bias) wk.flops += y;  // the bias add
    }
    wk.items = d(s.N);
    return wk;
  }
};

}  // namespace

Shape shape_of(const Problem& p) {
  Shape s;
  s.dir = p.dir;
  s.onednn_layouts = p.backend == Backend::cpu;
  s.dtype = p.dtype;
  const std::string& l = p.get("layout");
  HOTOPS_CHECK(l == "nchw" || l == "nhwc", "conv2d: layout must be nchw or nhwc in " + p.name());
  s.layout = l == "nchw" ? Layout::nchw : Layout::nhwc;
  s.N = p.get_int("batch");
  s.C = p.get_int("C"), s.H = p.get_int("H"), s.W = p.get_int("W");
  s.K = p.get_int("K"), s.R = p.get_int("R"), s.S = p.get_int("S");
  std::tie(s.stride_h, s.stride_w) = pair_arg(p, "stride");
  std::tie(s.pad_h, s.pad_w) = pair_arg(p, "pad");
  std::tie(s.dil_h, s.dil_w) = pair_arg(p, "dilation");
  s.groups = p.has("groups") ? p.get_int("groups") : 1;
  s.bias = p.get_int("bias") != 0;
  s.relu = p.has("relu") && p.get_int("relu") != 0;
  HOTOPS_CHECK(!s.relu || (p.dir == Direction::fwd && p.backend == Backend::cpu),
               "conv2d: relu:1 is a CPU forward's only in " + p.name());
  HOTOPS_CHECK(std::min({s.N, s.C, s.H, s.W, s.K, s.R, s.S, s.stride_h, s.stride_w, s.dil_h, s.dil_w}) >= 1 &&
                   std::min(s.pad_h, s.pad_w) >= 0,
               "conv2d: sizes, strides and dilations must be >= 1 and pads >= 0 in " + p.name());
  HOTOPS_CHECK(s.P() >= 1 && s.Q() >= 1, "conv2d: the filter does not fit the padded input in " + p.name());
  HOTOPS_CHECK(s.groups >= 1 && s.C % s.groups == 0 && s.K % s.groups == 0,
               "conv2d: groups must divide C and K in " + p.name());
  // A wide depthwise weight gradient runs hotops' loops on the user's NHWC tensors (no oneDNN
  // layouts to reorder into): the entry times what a model's step runs.
  if (p.backend == Backend::cpu) {
    Shape loops = s;
    loops.onednn_layouts = false;
    loops.x_pick = loops.y_pick = Shape::Pick::nhwc;
    if (cpu_depthwise_loops_take(loops)) return loops;
  }
  return s;
}

Inputs make_inputs(const Shape& s, std::uint64_t seed) {
  const auto n = [](std::int64_t v) { return static_cast<std::size_t>(v); };
  Inputs in;
  const bool fwd = s.dir == Direction::fwd;
  if (fwd || s.dir == Direction::bwd_weight) in.x = HostBuffer(s.dtype, n(s.N * s.C * s.H * s.W));
  const DType param = s.f32_params ? DType::f32 : s.dtype;  // of w, b, dw and db
  if (fwd || s.dir == Direction::bwd_data) in.w = HostBuffer(param, n(s.K * s.Cg() * s.R * s.S));
  if (fwd && s.bias) in.b = HostBuffer(param, n(s.K));
  if (!fwd) in.dy = HostBuffer(s.dtype, n(s.N * s.K * s.P() * s.Q()));
  in.x.fill_uniform(seed, 1);
  in.w.fill_uniform(seed, 2);
  in.b.fill_uniform(seed, 3);
  in.dy.fill_uniform(seed, 4);
  return in;
}

std::size_t primary_count(const Shape& s) {
  const std::int64_t n = s.dir == Direction::bwd_weight ? s.K * s.Cg() * s.R * s.S
                         : s.dir == Direction::bwd_data ? s.N * s.C * s.H * s.W
                                                        : s.N * s.K * s.P() * s.Q();
  return static_cast<std::size_t>(n);
}

Outputs make_outputs(const Shape& s) {
  Outputs o;
  if (s.dir != Direction::bwd_weight) {
    o.primary = HostBuffer(s.dtype, primary_count(s));
    return o;
  }
  const DType param = s.f32_params ? DType::f32 : s.dtype;
  o.primary = HostBuffer(param, primary_count(s));
  if (s.bias) o.db = HostBuffer(param, static_cast<std::size_t>(s.K));
  return o;
}

// The weight gradients verify() computes whole (reference_weight_grads): at most this many times the
// elements a sample would check, and at most this many per-image sums (N x elements) held at once.
constexpr std::size_t kWholeWeightGradSamples = 8;
constexpr double kWholeWeightGradSums = 1 << 23;
// Sampled references kept for the process (shared_reference): more than a shape's CPU entries (12),
// which the list puts between each CPU entry and its CUDA twin.
constexpr std::size_t kKeptReferences = 16;

Sampled sampled_reference(const Shape& s, const Inputs& in) {
  // Each sampled element is a sum of Cg*R*S (fwd), Kg*R*S (bwd_data) or N*P*Q (bwd_weight, db)
  // products (Cg, Kg: a group's channels); sample as many as fit ~2e8 of them (well under a second),
  // between 256 and 2048.
  const RefData d(in);
  const auto terms_of = [](std::int64_t v) { return static_cast<double>(v); };
  const double terms = s.dir == Direction::fwd        ? terms_of(s.Cg() * s.R * s.S)
                       : s.dir == Direction::bwd_data ? terms_of(s.Kg() * s.R * s.S)
                                                      : terms_of(s.N * s.P() * s.Q());
  const auto limit = static_cast<std::size_t>(std::clamp(2e8 / terms, 256.0, 2048.0));
  Sampled r;
  // tolerance(dtype) covers the dtype's rounding and f32 sums of up to ~16k terms. A weight
  // gradient sums N*P*Q terms (2M for a 256x256 image at batch 32), and the f32 rounding error of
  // a sum of random-sign terms grows as sqrt(length) relative to its rms: 8 eps_f32 sqrt(length)
  // bounds the worst of the samples (oneDNN f32 measured ~1.3e-4 at 2M terms; bound 7.7e-4).
  r.tol = tolerance(s.dtype) + 8 * 0x1.0p-24 * std::sqrt(terms);
  // An NHWC weight gradient of at most kWholeWeightGradSamples times the sample's elements
  // (keras_cnn's first layer: 864) is computed whole, in one pass over the batch, and checked
  // everywhere: a sampled element reads one channel of every pixel of x and dy, a cache line for each
  // in NHWC (in NCHW, a contiguous plane: sampling stays the cheaper there).
  const std::size_t count = primary_count(s);
  const bool whole = s.dir == Direction::bwd_weight && s.layout == Layout::nhwc && count <= kWholeWeightGradSamples * limit &&
                     static_cast<double>(s.N) * static_cast<double>(count) <= kWholeWeightGradSums;
  WeightGrads g;
  if (whole) g = reference_weight_grads(s, d);
  const std::size_t checked = whole ? count : limit;  // whole: every index of dw, and of db (K <= count)
  // Each sample's sum on a thread of its own (a sum reads elements scattered over x or dy: a cache
  // miss at each).
  const auto at = [](const std::vector<std::size_t>& idx, auto f) {
    std::vector<double> v(idx.size());
    const auto m = static_cast<std::int64_t>(idx.size());
#pragma omp parallel for schedule(dynamic, 16)
    for (std::int64_t j = 0; j < m; ++j) v[static_cast<std::size_t>(j)] = f(idx[static_cast<std::size_t>(j)]);
    return v;
  };
  r.count = count;
  r.idx = sample_indices(count, checked, 7);
  r.ref = at(r.idx, [&](std::size_t i) { return whole ? g.dw[i] : reference_primary(s, d, i); });
  if (s.dir != Direction::bwd_weight || !s.bias) return r;
  r.db_idx = sample_indices(static_cast<std::size_t>(s.K), checked, 11);
  r.db_ref = at(r.db_idx, [&](std::size_t k) { return whole ? g.db[k] : reference_db(s, d, static_cast<std::int64_t>(k)); });
  return r;
}

Check verify(const Shape& s, const Inputs& in, const Outputs& out, const std::string& key) {
  const auto make = [&] { return sampled_reference(s, in); };
  const std::shared_ptr<const Sampled> r =
      key.empty() ? std::make_shared<const Sampled>(make()) : shared_reference<Sampled>(key, make, kKeptReferences);
  HOTOPS_CHECK(out.primary.count() == r->count, "conv2d: the output is not the shape's size");
  Check c = compare(out.primary, r->idx, r->ref, r->tol);
  if (out.db.count() == 0) return c;
  Check all;
  all.merge(c, "dw");
  all.merge(compare(out.db, r->db_idx, r->db_ref, r->tol), "db");
  return all;
}

HOTOPS_DEFINE_FAMILY(Conv2dFamily);

}  // namespace hotops::conv2d
