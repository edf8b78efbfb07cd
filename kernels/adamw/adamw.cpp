// The adamw family: parameter lists of real models, names, work, state, reference and verification.
//
// Names: adamw/<cpu|cuda>/<f32|bf16>/step/params:<bert_base|keras_cnn|mlp_tiny>/lr:.../beta1:...
// /beta2:.../eps:.../wd:... for whole models, adamw/.../params:flat/elements:N/lr:... for one tensor.
// The hyperparameters default to PyTorch's (lr 1e-3, betas 0.9 and 0.999, eps 1e-8) with wd 0.01;
// they are in the name because they are the op's arguments, not because the time depends on them.
#include "kernels/adamw/adamw.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <numeric>

#include "hotops/check.h"

namespace hotops::adamw {
namespace {

// Parameter lists, tensor by tensor, as the models' optimizers see them (trainable tensors only).

// BERT-base (Hugging Face BertModel): 199 tensors, 109,482,240 parameters.
std::vector<std::int64_t> bert_base() {
  constexpr std::int64_t H = 768, FF = 3072, kVocab = 30522, kPositions = 512, kTypes = 2, kLayers = 12;
  std::vector<std::int64_t> t = {kVocab * H, kPositions * H, kTypes * H, H, H};  // embeddings + LayerNorm
  for (std::int64_t l = 0; l < kLayers; ++l) {
    for (int qkvo = 0; qkvo < 4; ++qkvo) t.insert(t.end(), {H * H, H});  // query, key, value, output dense
    t.insert(t.end(), {H, H});                                            // attention output LayerNorm
    t.insert(t.end(), {FF * H, FF, H * FF, H, H, H});                     // FFN up, down, output LayerNorm
  }
  t.insert(t.end(), {H * H, H});  // pooler
  return t;
}

// The TensorFlow 2 comparison's Keras CNN (256x256x3, 4 classes): 26 trainable tensors, 58,088,516
// parameters. Conv kernels 3x3; each BatchNormalization trains gamma and beta (its moving mean and
// variance are the summary's 2,880 non-trainable parameters); flatten gives 21*21*128 = 56448.
std::vector<std::int64_t> keras_cnn() {
  std::vector<std::int64_t> t;
  auto conv = [&](std::int64_t cin, std::int64_t cout) { t.insert(t.end(), {3 * 3 * cin * cout, cout}); };
  auto bn = [&](std::int64_t c) { t.insert(t.end(), {c, c}); };
  auto dense = [&](std::int64_t in, std::int64_t out) { t.insert(t.end(), {in * out, out}); };
  conv(3, 32), bn(32);
  conv(32, 64), bn(64), conv(64, 64), bn(64);
  conv(64, 128), bn(128), conv(128, 128), bn(128);
  dense(21 * 21 * 128, 1024), bn(1024);
  dense(1024, 4);
  return t;
}

// The PyTorch tiny-MLP notebook's MLP on the 13 UCI heart-disease features: 13 -> 32 -> 16 -> 2,
// 6 tensors, 1,010 parameters.
std::vector<std::int64_t> mlp_tiny() { return {32 * 13, 32, 16 * 32, 16, 2 * 16, 2}; }

// For the tests: sizes below, at and across the vector width, padding of every length, and a last
// tensor whose 1-element tail the flat pass ends on.
std::vector<std::int64_t> odd() { return {1, 3, 1027, 4, 2 * 16384 + 5, 8, 768, 16384, 5}; }

const char* const kDefaultHyper[][2] = {
    {"lr", "0.001"}, {"beta1", "0.9"}, {"beta2", "0.999"}, {"eps", "1e-08"}, {"wd", "0.01"}};

constexpr DType kDTypes[] = {DType::f32, DType::bf16};

// The flat sweep: 1M, 16M and 64M parameters (28 MiB to 1.75 GiB moved per step in f32).
constexpr std::int64_t kFlatElements[] = {1 << 20, 1 << 24, 1 << 26};

std::vector<Arg> list_args(const std::string& params, std::int64_t elements = 0,
                           const char* const (*hyper)[2] = kDefaultHyper) {
  std::vector<Arg> a{{"params", params}};
  if (params == "flat") a.push_back({"elements", std::to_string(elements)});
  for (int i = 0; i < 5; ++i) a.push_back({hyper[i][0], hyper[i][1]});
  return a;
}

void expand(const std::vector<Arg>& args, std::vector<Problem>& out) {
  for (Backend be : kAllBackends)
    for (DType t : kDTypes) out.push_back(Problem{"adamw", be, t, Direction::step, args});
}

// FLOPs per parameter, each operation of the formula once (sqrt and division one each):
//   p *= 1 - lr*wd                     1
//   m = b1*m + (1-b1)*g                3
//   v = b2*v + (1-b2)*g*g              4
//   denom = sqrt(v) / sqrt(bc2) + eps  3
//   p -= (lr/bc1) * m / denom          3   -> 14
constexpr double kFlopsPerParam = 14;
// Bytes per parameter, each read once and each write once: f32 reads p, g, m, v and writes p, m, v
// (7 x 4); bf16 reads the f32 master, the bf16 g, m, v and writes the master, m, v and the bf16 p
// (6 x 4 + 2 x 2). 28 either way.
constexpr double kBytesPerParam = 28;

// The op as the benchmark runs it: a PlanCase over one seeded state. p, m, v and the step count are
// updated in place (reset to the seeded state before the check); the bf16 p is an output. The check
// runs kVerifySteps steps and compares them with as many reference steps from the seeded start.
struct Op {
  using Shape = adamw::Shape;
  using Args = adamw::Args;
  struct Io {
    State start;       // the seeded state
    State result;      // p, m, v and the bf16 p after the check's steps (no g)
    HostBuffer step0;  // first_step(hyper), as bytes
    HostBuffer step;   // the step count after the check's steps
    Snapshot snap;     // the start's sample, for the check
  };

  static Shape shape(const Problem& p) { return shape_of(p); }

  static Io io(const Shape& s, std::uint64_t seed) {
    const Layout l = layout_of(s.sizes);
    Io io;
    io.start = make_state(s, l);
    restore(s, io.start, seed);
    io.result.p = HostBuffer(DType::f32, l.arena);
    io.result.m = HostBuffer(DType::f32, l.arena);
    io.result.v = HostBuffer(DType::f32, l.arena);
    if (s.dtype == DType::bf16) io.result.p16 = HostBuffer(DType::bf16, l.arena);
    constexpr std::size_t kStepWords = (sizeof(DeviceStep) + 3) / 4;
    io.step0 = HostBuffer(DType::f32, kStepWords);
    io.step = HostBuffer(DType::f32, kStepWords);
    const DeviceStep first = first_step(s.hyper);
    std::memcpy(io.step0.data(), &first, sizeof first);
    io.snap = snapshot(s, l, io.start, seed);
    return io;
  }

  static Args bind(const Shape& s, Io& io, Binder& b) {
    Args a;
    a.p = static_cast<float*>(b.inout(io.start.p, io.result.p));
    a.g = b.in(io.start.g);
    a.m = static_cast<float*>(b.inout(io.start.m, io.result.m));
    a.v = static_cast<float*>(b.inout(io.start.v, io.result.v));
    if (s.dtype == DType::bf16) a.p16 = static_cast<std::uint16_t*>(b.out(io.result.p16));
    a.step = static_cast<DeviceStep*>(b.inout(io.step0, io.step));
    return a;
  }

  static std::unique_ptr<Plan> plan(const Shape& s, Backend b) { return make_plan(s, b); }
  static int check_runs(const Shape&) { return kVerifySteps; }

  static Check check(const Shape& s, const Io& io) {
    Check c = adamw::check(s, io.snap, io.result, kVerifySteps);
    DeviceStep after;
    std::memcpy(&after, io.step.data(), sizeof after);
    c.merge(check_step(after, kVerifySteps), "step");
    return c;
  }
};

class AdamwFamily final : public Family {
 public:
  std::string name() const override { return "adamw"; }

  std::vector<Problem> benchmark_problems(const std::vector<std::int64_t>&) const override {
    std::vector<Problem> out;  // no batch axis: an optimizer step sees parameters, not samples
    for (const char* list : {"bert_base", "keras_cnn", "mlp_tiny"}) expand(list_args(list), out);
    for (std::int64_t n : kFlatElements) expand(list_args("flat", n), out);
    return out;
  }

  std::vector<Problem> test_problems() const override {
    static const char* const kOtherHyper[][2] = {
        {"lr", "0.01"}, {"beta1", "0.8"}, {"beta2", "0.95"}, {"eps", "1e-06"}, {"wd", "0.1"}};
    std::vector<Problem> out;
    expand(list_args("odd"), out);
    expand(list_args("odd", 0, kOtherHyper), out);
    expand(list_args("mlp_tiny"), out);
    // 100003: several CPU threads (from 2 * 32768 elements), a 3-element tail.
    for (std::int64_t n : {1, 3, 1027, 100003}) expand(list_args("flat", n), out);
    return out;
  }

  Work work(const Problem& p) const override {
    const double n = static_cast<double>(shape_of(p).total());
    return {n * kFlopsPerParam, n * kBytesPerParam, 1};
  }

  std::string unsupported_reason(const Problem& p) const override {
    return backend_unsupported_reason(p, [](const Problem&) { return std::string(); });
  }

  std::unique_ptr<Case> make(const Problem& p) const override {
    return make_on_backend(p, make_plan_case<Op>, HOTOPS_CUDA_FACTORY(make_plan_case<Op>));
  }
};

double parse_positive_or_zero(const Problem& p, const char* key) {
  const std::string& s = p.get(key);
  std::size_t used = 0;
  double v = -1;
  try {
    v = std::stod(s, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  HOTOPS_CHECK(used == s.size() && v >= 0 && std::isfinite(v), std::string("adamw: bad ") + key + " in " + p.name());
  return v;
}

// max|out - ref| / max(rms(ref), floor) over the sample, against tol. The floor is the scale the
// quantity has by construction, so that a sample that happens to be small (a 1-element tensor whose
// m nearly cancels) is not judged against its own rounding.
Check within(const std::vector<double>& out, const std::vector<double>& ref, const std::vector<std::size_t>& idx,
             double floor, double tol) {
  Check c;
  c.tol = tol;
  c.checked = out.size();
  double sumsq = 0;
  for (double r : ref) sumsq += r * r;
  const double scale = std::max(std::sqrt(sumsq / static_cast<double>(std::max<std::size_t>(1, ref.size()))), floor);
  std::size_t worst = 0;
  // A NaN or Inf fails in the output and in the reference alike: a NaN reference would make the
  // scale and every error NaN, and NaN compares false against the tolerance.
  for (std::size_t k = 0; k < out.size(); ++k) {
    const char* what = !std::isfinite(out[k]) ? "output" : !std::isfinite(ref[k]) ? "reference" : nullptr;
    if (what != nullptr) {
      c.ok = false;
      c.max_err = std::nan("");
      c.message = std::string("non-finite ") + what + " " + std::to_string(std::isfinite(out[k]) ? ref[k] : out[k]) +
                  " at arena index " + std::to_string(idx[k]);
      return c;
    }
    const double e = std::fabs(out[k] - ref[k]) / scale;
    if (e > c.max_err) c.max_err = e, worst = k;
  }
  if (c.max_err > tol) {
    char buf[200];
    std::snprintf(buf, sizeof buf, "max|out-ref|/scale = %.3g > tol %.3g at arena index %zu (out %.9g, ref %.9g)",
                  c.max_err, tol, idx[worst], out[worst], ref[worst]);
    c.ok = false;
    c.message = buf;
  }
  return c;
}

Check failure(std::size_t checked, const std::string& message) {
  Check c;
  c.ok = false;
  c.checked = checked;
  c.message = message;
  return c;
}

}  // namespace

std::int64_t Shape::total() const { return std::accumulate(sizes.begin(), sizes.end(), std::int64_t{0}); }

std::vector<std::int64_t> tensor_sizes(const std::string& params, std::int64_t elements) {
  if (params == "bert_base") return bert_base();
  if (params == "keras_cnn") return keras_cnn();
  if (params == "mlp_tiny") return mlp_tiny();
  if (params == "odd") return odd();
  if (params == "flat") return {elements};
  throw Error("adamw: unknown params '" + params + "' (bert_base, keras_cnn, mlp_tiny, odd or flat)");
}

Shape shape_of(const Problem& p) {
  HOTOPS_CHECK(p.op == "adamw" && p.dir == Direction::step, "adamw has the step direction only: " + p.name());
  HOTOPS_CHECK(p.dtype == DType::f32 || p.dtype == DType::bf16, "adamw has f32 and bf16: " + p.name());
  Shape s;
  s.dtype = p.dtype;
  s.params = p.get("params");
  s.sizes = tensor_sizes(s.params, s.params == "flat" ? p.get_int("elements") : 0);
  for (std::int64_t n : s.sizes)
    HOTOPS_CHECK(n > 0 && n < (std::int64_t{1} << 40), "adamw: bad tensor size in " + p.name());
  s.hyper.lr = parse_positive_or_zero(p, "lr");
  s.hyper.beta1 = parse_positive_or_zero(p, "beta1");
  s.hyper.beta2 = parse_positive_or_zero(p, "beta2");
  s.hyper.eps = parse_positive_or_zero(p, "eps");
  s.hyper.wd = parse_positive_or_zero(p, "wd");
  HOTOPS_CHECK(s.hyper.beta1 < 1 && s.hyper.beta2 < 1, "adamw: betas must be below 1 in " + p.name());
  return s;
}

Layout layout_of(const std::vector<std::int64_t>& sizes) {
  Layout l;
  std::size_t at = 0;
  for (std::int64_t n : sizes) {
    l.offset.push_back(at);
    at = (at + static_cast<std::size_t>(n) + kAlignElements - 1) / kAlignElements * kAlignElements;
  }
  l.span = sizes.empty() ? 0 : l.offset.back() + static_cast<std::size_t>(sizes.back());
  l.arena = at + kGuard;
  return l;
}

State make_state(const Shape& s, const Layout& l) {
  State st;
  st.p = HostBuffer(DType::f32, l.arena);
  st.g = HostBuffer(s.dtype, l.arena);
  st.m = HostBuffer(DType::f32, l.arena);
  st.v = HostBuffer(DType::f32, l.arena);
  if (s.dtype == DType::bf16) st.p16 = HostBuffer(DType::bf16, l.arena);
  return st;
}

void restore(const Shape& s, State& st, std::uint64_t seed) {
  st.p.fill_uniform(seed, 0);
  st.g.fill_uniform(seed, 1);
  st.m.fill_uniform(seed, 2, -0.5f, 0.5f);
  st.v.fill_uniform(seed, 3, 0.01f, 0.5f);
  if (s.dtype == DType::bf16) st.p16.poison();
  const Layout l = layout_of(s.sizes);
  for (std::size_t t = 0; t < s.sizes.size(); ++t) {
    const std::size_t end = t + 1 < s.sizes.size() ? l.offset[t + 1] : l.arena;
    for (std::size_t a = l.offset[t] + static_cast<std::size_t>(s.sizes[t]); a < end; ++a) {
      st.p.set(a, 0), st.g.set(a, 0), st.m.set(a, 0), st.v.set(a, 0);
    }
  }
}

Corrections corrections(const Hyper& h, std::int64_t t) {
  return {1 - std::pow(h.beta1, static_cast<double>(t)), std::sqrt(1 - std::pow(h.beta2, static_cast<double>(t)))};
}

void reference_step(const Hyper& h, std::int64_t t, double g, Element& e) { reference_step(h, corrections(h, t), g, e); }

Snapshot snapshot(const Shape& s, const Layout& l, const State& st, std::uint64_t seed) {
  Snapshot snap;
  // Logical indices (over the concatenated tensors): a seeded sample plus both ends of every tensor,
  // where a vector straddles a tensor and its padding.
  std::vector<std::int64_t> first(s.sizes.size() + 1, 0);
  for (std::size_t t = 0; t < s.sizes.size(); ++t) first[t + 1] = first[t] + s.sizes[t];
  std::vector<std::size_t> logical = sample_indices(static_cast<std::size_t>(s.total()), 1 << 16, seed);
  for (std::size_t t = 0; t < s.sizes.size(); ++t)
    logical.insert(logical.end(), {static_cast<std::size_t>(first[t]), static_cast<std::size_t>(first[t + 1] - 1)});
  for (std::size_t i : logical) {
    const auto t = static_cast<std::size_t>(
        std::upper_bound(first.begin(), first.end(), static_cast<std::int64_t>(i)) - first.begin() - 1);
    const std::size_t a = l.offset[t] + (i - static_cast<std::size_t>(first[t]));
    snap.idx.push_back(a);
    snap.start.push_back({st.p.get(a), st.m.get(a), st.v.get(a)});
    snap.g.push_back(st.g.get(a));
  }
  for (std::size_t t = 0; t < s.sizes.size(); ++t) {
    const std::size_t end = t + 1 < s.sizes.size() ? l.offset[t + 1] : l.arena;
    for (std::size_t a = l.offset[t] + static_cast<std::size_t>(s.sizes[t]); a < end; ++a) {
      snap.gap_idx.push_back(a);
      snap.gap_p.push_back(st.p.as<float>()[a]);
      snap.gap_m.push_back(st.m.as<float>()[a]);
      snap.gap_v.push_back(st.v.as<float>()[a]);
    }
  }
  snap.span = l.span;
  return snap;
}

// The bounds, as max|out - ref| over the floor of check()'s `within`:
// - p is checked as its change p - p0 over the steps (exact in double), with the floor lr * steps:
//   an update is lr * m_hat / (sqrt(v_hat) + eps), of order lr. Checking p itself would divide the
//   error by |p| ~ 0.6 and hide a wrong step count under p's own size. f32 rounds p twice a step,
//   each within 2^-24 |p| <= 6e-8 (|p| < 1.01): 3.6e-7 over 3 steps; over the floor 3e-3 (lr 1e-3)
//   that is 1.2e-4 -> 5e-4. A step count off by one changes bc1 (0.1 against 0.19 at t = 1) and so
//   the update by tens of percent: O(0.1) or more.
// - m and v (floors 0.05 and 0.01, their smallest typical sizes) round a few times a step at 2^-24
//   relative: under 1e-6 -> 1e-5.
// - the bf16 p must be the f32 master rounded to nearest even, exactly.
// - every element outside the tensors keeps its value (0) exactly; the bf16 p there is the zero master
//   rounded (0) in the padding the pass covers, and stays NaN in the guard after it.
Check check(const Shape& s, const Snapshot& snap, const State& st, int steps) {
  const std::size_t n = snap.idx.size();
  std::vector<double> dp(n), dp_ref(n), m(n), m_ref(n), v(n), v_ref(n);
  for (std::size_t k = 0; k < n; ++k) {
    Element e = snap.start[k];
    for (int t = 1; t <= steps; ++t) reference_step(s.hyper, t, snap.g[k], e);
    const std::size_t a = snap.idx[k];
    dp[k] = st.p.get(a) - snap.start[k].p;
    dp_ref[k] = e.p - snap.start[k].p;
    m[k] = st.m.get(a), m_ref[k] = e.m;
    v[k] = st.v.get(a), v_ref[k] = e.v;
  }
  Check c;
  c.checked = 0;
  c.merge(within(dp, dp_ref, snap.idx, s.hyper.lr * steps, 5e-4), "p - p0");
  c.merge(within(m, m_ref, snap.idx, 0.05, 1e-5), "m");
  c.merge(within(v, v_ref, snap.idx, 0.01, 1e-5), "v");
  if (s.dtype == DType::bf16) {
    for (std::size_t k = 0; k < n; ++k) {
      const std::size_t a = snap.idx[k];
      const std::uint16_t want = float_to_bf16(st.p.as<float>()[a]), got = st.p16.as<std::uint16_t>()[a];
      if (got != want) {
        c.merge(failure(n, "bf16 p at arena index " + std::to_string(a) + " is " + std::to_string(bf16_to_float(got)) +
                               ", not the master " + std::to_string(st.p.as<float>()[a]) + " rounded"),
                "bf16 p");
        break;
      }
    }
  }
  for (std::size_t k = 0; k < snap.gap_idx.size(); ++k) {
    const std::size_t a = snap.gap_idx[k];
    const bool p16_kept = s.dtype != DType::bf16 || (a < snap.span ? st.p16.as<std::uint16_t>()[a] == 0
                                                                     : std::isnan(st.p16.get(a)));
    if (st.p.as<float>()[a] != snap.gap_p[k] || st.m.as<float>()[a] != snap.gap_m[k] ||
        st.v.as<float>()[a] != snap.gap_v[k] || !p16_kept) {
      c.merge(failure(snap.gap_idx.size(), "arena index " + std::to_string(a) +
                                               ", between tensors or after the last, changed"),
              "gaps");
      break;
    }
  }
  return c;
}

Check check_step(const DeviceStep& after, std::int64_t steps) {
  Check c;
  if (after.step != steps) {
    c.ok = false;
    c.message = "the step count is " + std::to_string(after.step) + " after " + std::to_string(steps) + " step(s)";
  }
  return c;
}

std::string describe(const Shape& s) {
  const double n = static_cast<double>(s.total());
  char buf[64];
  if (n >= 1e6) std::snprintf(buf, sizeof buf, "%.1fM", n / 1e6);
  else std::snprintf(buf, sizeof buf, "%.0f", n);
  return std::to_string(s.sizes.size()) + (s.sizes.size() == 1 ? " tensor, " : " tensors, ") + buf + " params";
}

HOTOPS_DEFINE_FAMILY(AdamwFamily);

}  // namespace hotops::adamw
