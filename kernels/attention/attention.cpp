// The attention family: problem names and shapes, work, inputs, verification and its bounds.
//
// Names: attention/<backend>/<dtype>/<fwd|bwd>/shape:<model.layer>/batch:B/seq:S/heads:H/head_dim:D;
// test problems are attention/.../shape:test/batch:B/seq:S/heads:H/head_dim:D.
#include "kernels/attention/attention.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <vector>

#include "hotops/check.h"
#include "hotops/op_family.h"
#ifdef HOTOPS_HAVE_CUDA
#include "kernels/attention/cuda_fused.h"
#endif

namespace hotops::attention {
namespace {

// The op as the benchmark runs it: a PlanCase over qkv (and dctx) and the output. A backward reads
// what its forward wrote (ctx and saved, as that backend's forward lays saved out): the forward plan
// runs once here, at setup, on this problem's qkv.
struct Op : OpOf<Shape, Args, Inputs, HostBuffer> {
  static Shape shape(const Problem& p) { return shape_of(p); }
  static Args bind(const Shape& s, Io& io, Binder& b) {
    Args a;
    a.qkv = b.in(io.in.qkv);
    a.saved = b.scratch(saved_bytes(s, b.backend()));
    if (s.dir == Direction::fwd) {
      a.ctx = b.out(io.out);
      return a;
    }
    Shape fwd = s;
    fwd.dir = Direction::fwd;
    a.ctx = b.scratch(s.ctx_elements() * dtype_size(s.dtype));
    const auto forward = make_plan(fwd, b.backend());
    forward->run(a);
    if (b.backend() == Backend::cuda) gpu::synchronize();  // done before the forward plan goes
    a.dctx = b.in(io.in.dctx);
    a.dqkv = b.out(io.out);
    return a;
  }
};

// The attention of a real model's layer at its default batch.
struct NamedShape {
  const char* name;
  std::int64_t seq, heads, head_dim, batch;
};

constexpr NamedShape kNamedShapes[] = {
    // BERT-base, sequence 128: 12 heads of 64 (the softmax family's bert.attn is its probabilities).
    {"bert.attn", 128, 12, 64, 32},
    // ViT-B/16 at 224x224: 196 patches + the class token, 12 heads of 64.
    {"vit.attn", 197, 12, 64, 32},
};

std::vector<Arg> args_of(const char* shape, std::int64_t batch, std::int64_t seq, std::int64_t heads, std::int64_t head_dim) {
  return {{"shape", shape},
          {"batch", std::to_string(batch)},
          {"seq", std::to_string(seq)},
          {"heads", std::to_string(heads)},
          {"head_dim", std::to_string(head_dim)}};
}

void expand(const std::vector<Arg>& args, std::vector<Problem>& out) { expand_fwd_bwd("attention", args, out); }

class AttentionFamily final : public PlanFamily<Op> {
 public:
  AttentionFamily() : PlanFamily("attention", cpu_unsupported_reason) {}

  std::vector<Problem> benchmark_problems(const std::vector<std::int64_t>& batches) const override {
    return per_shape_and_batch(kNamedShapes, batches, [](const NamedShape& ns, std::int64_t b, std::vector<Problem>& out) {
      expand(args_of(ns.name, b, ns.seq, ns.heads, ns.head_dim), out);
    });
  }

  std::vector<Problem> test_problems() const override {
    // head_dim 64 (on CUDA the fused kernels in bf16): one key (P = 1, dQ = dK = 0); 5 and 37, ragged
    // against any tile of keys; 64 and 128, whole tiles; 200, ViT's length class; 256, the longest
    // the fused kernels take. head_dim 16 and 3 heads: the composition on CUDA in both dtypes.
    std::vector<Problem> out;
    for (std::int64_t seq : {1, 5, 37, 64, 128, 200, 256}) expand(args_of("test", 2, seq, 2, 64), out);
    expand(args_of("test", 2, 37, 3, 16), out);
    return out;
  }

  // FLOPs: the four GEMMs' (two forward, 2 S^2 D each per head; four backward), softmax not counted,
  // the usual count: fwd 4 B H S^2 D, bwd 8 B H S^2 D. Bytes, the fewest the op must move: fwd reads
  // qkv and writes ctx; bwd reads qkv and dctx and writes dqkv. What a backward reads of its forward
  // (ctx, saved) is the implementation's choice and not counted.
  Work work(const Problem& p) const override {
    const Shape s = shape_of(p);
    const double per_head = static_cast<double>(s.seq) * static_cast<double>(s.seq) * static_cast<double>(s.head_dim);
    const double heads = static_cast<double>(s.batch * s.heads), ctx = static_cast<double>(s.ctx_elements());
    const bool fwd = s.dir == Direction::fwd;
    Work w;
    w.flops = (fwd ? 4 : 8) * heads * per_head;
    w.bytes = (fwd ? 4 : 7) * ctx * static_cast<double>(dtype_size(s.dtype));
    w.items = static_cast<double>(s.batch);
    return w;
  }
};

// Bounds. u: the storage's unit roundoff (f32 2^-24; bf16 2^-8, as softmax.cpp); e = 2^-24, f32
// arithmetic; S = seq, D = head_dim, sc = 1 / sqrt(D). The inputs are exact in the dtype. Each bound
// is a sum of magnitudes: the formula with its factors taken absolute.
// The worst path is the composition in bf16, which stores the scores, P, dP and dS in the dtype:
//   scores: f32 dot products of D terms, |err| <= D e a_ij (a_ij = sc sum_d |Q_id K_jd|), stored: + u |s_ij|.
//   P: a score error d_ij moves P_ij by P_ij (d_ij - sum_l P_il d_il), at most 2 max|d| P_ij; softmax's
//     f32 math adds (4 + S) e relative (softmax.cpp); stored: + u. So |err(P_ij)| <= rho P_ij with
//     rho = 2 u Smax + 2 D e A + (4 + S) e + u, Smax and A the largest |s_ij| and a_ij of the checked heads.
//   O = P V: P's error, the f32 sum of S terms and the stored output: |err(O_id)| <= (rho + S e + u) m_id,
//     m_id = sum_j P_ij |V_jd|. dV = P^T dO likewise, with m_jd = sum_i P_ij |dO_id|.
//   bwd, per query row i: dP_ij = dO_i . V_j, f32 (D e g_ij, g_ij = sum_d |dO_id V_jd|), stored (u |dP_ij|);
//     r_i = sum_j P_ij dP_ij (composed) or sum_d dO_id O_id (fused, from the forward's O, whose error
//     beyond P's is the f32 sum and O's storage): |err(r_i)| <= (rho + u) R_i + u Q_i + (D + S) e G_i,
//     R_i = sum_j P_ij |dP_ij|, Q_i = sum_d |dO_id O_id|, G_i = sum_j P_ij g_ij.
//     dS_ij = P_ij (dP_ij - r_i), f32, stored: |err| <= (2 rho + 3 u + 2 e) w_ij + u x_ij + (D + S) e h_ij,
//     w_ij = P_ij (|dP_ij| + R_i) (>= |dS_ij|), x_ij = P_ij Q_i, h_ij = P_ij (g_ij + G_i).
//   dQ_id = sc sum_j dS_ij K_jd adds the f32 sum of S terms and its storage:
//     |err| <= (2 rho + 4 u + (S + 2) e) W + u X + (D + S) e H, with W, X, H = sc sum_j (w, x, h)_ij |K_jd|;
//     dK_jd = sc sum_i dS_ij Q_id likewise over i, with |Q_id|.
// The fused kernels keep the scores and dP in f32 and round P and dS only as the bf16 operands of their
// tensor-core products: within the same terms.
// max: each tensor (O; dQ, dK and dV apart, whose scales differ) as softmax's, max|out - ref| <= the
// largest of its elements' bounds, handed to compare() relative to rms(ref) (absolute where the
// reference is all zeros: dQ and dK at seq 1).
// rms: those bounds add every rounding error up with one sign. The errors are independent from element
// to element and within each sum: a stored value's is at most u relative, an f32 sum of n terms adds a
// random walk of about sqrt(n) e. rms(out - ref) <= 5 (u + sqrt(S + D) e) rms(ref) then bounds a
// correct implementation with a margin of 3: modelled in double with the bf16 composition's roundings
// at every test shape and at BERT's and ViT's sequence lengths, 0.7 u to 1.5 u
// (test/attention_test.cpp); measured on the CPU (oneDNN) in f32 at those shapes, up to 8 e. A key left out of every row makes 2.8 to 10 times
// that bound in bf16, where the max bound lets it through in the backward.
constexpr double kF32Unit = 0x1p-24;

// A bound's coefficients: of w (O: m; dV: its m), of x and of h (dQ, dK; see above).
struct Coefficients {
  double w, x = 0, h = 0;
};

// One output tensor of the checked heads: where each element lies in the output, its reference, and
// the magnitudes its bound is made of.
struct Checked {
  std::vector<std::size_t> idx;
  std::vector<double> ref, w, x, h;
  explicit Checked(std::size_t n) : idx(n), ref(n), w(n), x(n, 0.0), h(n, 0.0) {}
};

// The largest |score| and absolute score a_ij of the checked heads (see the bounds).
struct ScoreRange {
  double smax = 0, amax = 0;
};

// Head (b, h) into the checked tensors at [at, at + seq * head_dim): fwd O; bwd dQ, dK, dV.
ScoreRange check_head(const Shape& s, const Inputs& in, std::int64_t b, std::int64_t h, std::size_t at,
                      std::vector<Checked>& out) {
  const auto S = static_cast<std::size_t>(s.seq), D = static_cast<std::size_t>(s.head_dim);
  const auto hidden = static_cast<std::size_t>(s.hidden()), head = static_cast<std::size_t>(h);
  const double sc = 1 / std::sqrt(static_cast<double>(D));
  // Element d of token i's Q (0), K (1) or V (2) in qkv, of its context (gradient) in ctx or dctx.
  const auto qkv_at = [&](std::size_t i, std::size_t which, std::size_t d) {
    return ((static_cast<std::size_t>(b) * S + i) * 3 + which) * hidden + head * D + d;
  };
  const auto ctx_at = [&](std::size_t i, std::size_t d) { return (static_cast<std::size_t>(b) * S + i) * hidden + head * D + d; };
  std::vector<double> q(S * D), k(S * D), v(S * D), p(S * S), o(S * D);
  for (std::size_t i = 0; i < S; ++i)
    for (std::size_t d = 0; d < D; ++d) {
      q[i * D + d] = in.qkv.get(qkv_at(i, 0, d));
      k[i * D + d] = in.qkv.get(qkv_at(i, 1, d));
      v[i * D + d] = in.qkv.get(qkv_at(i, 2, d));
    }
  ScoreRange r;
  for (std::size_t i = 0; i < S; ++i)
    for (std::size_t j = 0; j < S; ++j) {
      double dot = 0, abs = 0;
      for (std::size_t d = 0; d < D; ++d) dot += q[i * D + d] * k[j * D + d], abs += std::fabs(q[i * D + d] * k[j * D + d]);
      r.smax = std::max(r.smax, std::fabs(dot) * sc), r.amax = std::max(r.amax, abs * sc);
    }
  reference_fwd(q.data(), k.data(), v.data(), S, D, p.data(), o.data());
  if (s.dir == Direction::fwd) {
    for (std::size_t i = 0; i < S; ++i)
      for (std::size_t d = 0; d < D; ++d) {
        double m = 0;
        for (std::size_t j = 0; j < S; ++j) m += p[i * S + j] * std::fabs(v[j * D + d]);
        const std::size_t e = at + i * D + d;
        out[0].idx[e] = ctx_at(i, d), out[0].ref[e] = o[i * D + d], out[0].w[e] = m;
      }
    return r;
  }
  std::vector<double> dout(S * D), dq(S * D), dk(S * D), dv(S * D);
  for (std::size_t i = 0; i < S; ++i)
    for (std::size_t d = 0; d < D; ++d) dout[i * D + d] = in.dctx.get(ctx_at(i, d));
  reference_bwd(q.data(), k.data(), v.data(), p.data(), dout.data(), S, D, dq.data(), dk.data(), dv.data());
  // The magnitudes of dS (see the bounds): w, x and h of every (i, j).
  std::vector<double> w(S * S), x(S * S), hm(S * S), dp(S), g(S);
  for (std::size_t i = 0; i < S; ++i) {
    double R = 0, G = 0, Q = 0;
    for (std::size_t d = 0; d < D; ++d) Q += std::fabs(dout[i * D + d] * o[i * D + d]);
    for (std::size_t j = 0; j < S; ++j) {
      dp[j] = 0, g[j] = 0;
      for (std::size_t d = 0; d < D; ++d) dp[j] += dout[i * D + d] * v[j * D + d], g[j] += std::fabs(dout[i * D + d] * v[j * D + d]);
      R += p[i * S + j] * std::fabs(dp[j]), G += p[i * S + j] * g[j];
    }
    for (std::size_t j = 0; j < S; ++j) {
      const double pij = p[i * S + j];
      w[i * S + j] = pij * (std::fabs(dp[j]) + R), x[i * S + j] = pij * Q, hm[i * S + j] = pij * (g[j] + G);
    }
  }
  const double* ref[3] = {dq.data(), dk.data(), dv.data()};
  for (std::size_t t = 0; t < S; ++t)  // token t: its query row (dQ) and its key and value column (dK, dV)
    for (std::size_t d = 0; d < D; ++d) {
      double mag[3][3] = {};  // [dQ, dK, dV][w, x, h]
      for (std::size_t l = 0; l < S; ++l) {
        const double kd = std::fabs(k[l * D + d]) * sc, qd = std::fabs(q[l * D + d]) * sc;
        const std::size_t row = t * S + l, col = l * S + t;
        mag[0][0] += w[row] * kd, mag[0][1] += x[row] * kd, mag[0][2] += hm[row] * kd;
        mag[1][0] += w[col] * qd, mag[1][1] += x[col] * qd, mag[1][2] += hm[col] * qd;
        mag[2][0] += p[col] * std::fabs(dout[l * D + d]);
      }
      const std::size_t e = at + t * D + d;
      for (std::size_t which = 0; which < 3; ++which) {
        Checked& c = out[which];
        c.idx[e] = qkv_at(t, which, d), c.ref[e] = ref[which][t * D + d];
        c.w[e] = mag[which][0], c.x[e] = mag[which][1], c.h[e] = mag[which][2];
      }
    }
  return r;
}

// One tensor against its reference: max|out - ref| within the largest of its elements' bounds, and
// rms(out - ref) within rms_of_ref rms(ref), both handed to compare() relative to rms(ref).
Check compare_tensor(const HostBuffer& out, const Checked& c, const Coefficients& k, double rms_of_ref) {
  double bmax = 0, rsq = 0;
  for (std::size_t e = 0; e < c.ref.size(); ++e)
    bmax = std::max(bmax, k.w * c.w[e] + k.x * c.x[e] + k.h * c.h[e]), rsq += c.ref[e] * c.ref[e];
  const double rms = std::sqrt(rsq / static_cast<double>(c.ref.size())), scale = rms > 0 ? rms : 1.0;
  return compare(out, c.idx, c.ref, bmax / scale, rms_of_ref);
}

}  // namespace

Shape shape_of(const Problem& p) {
  Shape s = fwd_bwd_shape<Shape>(p, "attention");
  s.batch = p.get_int("batch"), s.seq = p.get_int("seq"), s.heads = p.get_int("heads"), s.head_dim = p.get_int("head_dim");
  HOTOPS_CHECK(s.batch > 0 && s.seq > 0 && s.heads > 0 && s.head_dim > 0, "bad attention shape: " + p.name());
  return s;
}

std::size_t saved_bytes(const Shape& s, Backend b) {
#ifdef HOTOPS_HAVE_CUDA
  if (b == Backend::cuda && fused::unsupported_reason(s.dtype, s.seq, s.head_dim).empty())
    return fused::saved_bytes(s.batch, s.seq, s.heads);
#else
  (void)b;
#endif
  return s.probability_elements() * dtype_size(s.dtype);
}

Inputs make_inputs(const Shape& s, std::uint64_t seed) {
  Inputs in;
  in.qkv = HostBuffer(s.dtype, s.qkv_elements());
  in.qkv.fill_uniform(seed, 0, -2.f, 2.f);
  if (s.dir == Direction::bwd) {
    in.dctx = HostBuffer(s.dtype, s.ctx_elements());
    in.dctx.fill_uniform(seed, 1);
  }
  return in;
}

HostBuffer make_output(const Shape& s) {
  return HostBuffer(s.dtype, (s.dir == Direction::fwd ? s.ctx_elements() : s.qkv_elements()) + kGuard);
}

Check verify(const Shape& s, const Inputs& in, const HostBuffer& out) {
  const bool fwd = s.dir == Direction::fwd;
  const std::size_t per_head = static_cast<std::size_t>(s.seq * s.head_dim);
  // Whole heads, all of them up to about 2^18 checked elements, else a seeded sample (with the first
  // and last).
  const std::size_t limit = std::max<std::size_t>(4, (std::size_t(1) << 18) / (per_head * (fwd ? 1 : 3)));
  const std::vector<std::size_t> heads = sample_indices(static_cast<std::size_t>(s.batch * s.heads), limit, 29);
  std::vector<Checked> tensors(fwd ? 1 : 3, Checked(heads.size() * per_head));
  double smax = 0, amax = 0;
  const auto n = static_cast<std::int64_t>(heads.size());
#pragma omp parallel for schedule(dynamic, 1) reduction(max : smax, amax)
  for (std::int64_t k = 0; k < n; ++k) {
    const auto head = static_cast<std::int64_t>(heads[static_cast<std::size_t>(k)]);
    const ScoreRange r = check_head(s, in, head / s.heads, head % s.heads, static_cast<std::size_t>(k) * per_head, tensors);
    smax = std::max(smax, r.smax), amax = std::max(amax, r.amax);
  }
  // The bounds' coefficients (see above).
  const double u = s.dtype == DType::bf16 ? 0x1p-8 : kF32Unit, e = kF32Unit;
  const auto S = static_cast<double>(s.seq), D = static_cast<double>(s.head_dim);
  const double rho = 2 * u * smax + 2 * D * e * amax + (4 + S) * e + u;
  const Coefficients like_o{rho + S * e + u};
  const Coefficients like_dq{2 * rho + 4 * u + (S + 2) * e, u, (D + S) * e};
  const double rms = 5 * (u + std::sqrt(S + D) * e);
  Check c;
  if (fwd) {
    c = compare_tensor(out, tensors[0], like_o, rms);
  } else {
    c.merge(compare_tensor(out, tensors[0], like_dq, rms), "dQ");
    c.merge(compare_tensor(out, tensors[1], like_dq, rms), "dK");
    c.merge(compare_tensor(out, tensors[2], like_o, rms), "dV");
  }
  const std::size_t outputs = out.count() - kGuard;
  for (std::size_t i = outputs; i < out.count() && c.ok; ++i)
    if (!std::isnan(out.get(i))) {
      char buf[160];
      std::snprintf(buf, sizeof buf, "guard element %zu after the %zu outputs was written (%g)", i, outputs, out.get(i));
      c.ok = false, c.message = buf;
    }
  return c;
}

HOTOPS_DEFINE_FAMILY(AttentionFamily);

}  // namespace hotops::attention
