// The attention reference on hand-computed values and against central differences of its forward;
// verification that passes a correct composition in f32 and bf16 (modelled in double with its
// roundings) and fails where it must: a planted element, a key left out of every row, the scale left out, a written
// guard; names and work; the CPU plan on the tensors it is given; the CUDA plans' paths.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <vector>

#include "hotops/gpu.h"
#include "kernels/attention/attention.h"
#include "test/plan_test_util.h"

namespace hotops::attention {
namespace {

Problem test_problem(DType t, Direction d, std::int64_t seq, std::int64_t heads = 2, std::int64_t head_dim = 64,
                     std::int64_t batch = 2, Backend b = Backend::cpu) {
  return Problem{"attention", b, t, d,
                 {{"shape", "test"},
                  {"batch", std::to_string(batch)},
                  {"seq", std::to_string(seq)},
                  {"heads", std::to_string(heads)},
                  {"head_dim", std::to_string(head_dim)}}};
}

// A head's outputs from its q, k, v [seq, head_dim] (and dout): o (fwd) or dq, dk, dv (bwd).
using HeadFn = std::function<void(const double* q, const double* k, const double* v, const double* dout, std::size_t seq,
                                  std::size_t head_dim, double* o, double* dq, double* dk, double* dv)>;

// The output buffer of every head from `head`, rounded to the dtype; the guard left poisoned.
HostBuffer output_of(const Shape& s, const Inputs& in, const HeadFn& head) {
  HostBuffer out = make_output(s);
  out.poison();
  const auto S = static_cast<std::size_t>(s.seq), D = static_cast<std::size_t>(s.head_dim);
  const auto hidden = static_cast<std::size_t>(s.hidden());
  std::vector<double> q(S * D), k(S * D), v(S * D), dout(S * D), r[3] = {std::vector<double>(S * D), std::vector<double>(S * D),
                                                                          std::vector<double>(S * D)};
  for (std::size_t b = 0; b < static_cast<std::size_t>(s.batch); ++b)
    for (std::size_t h = 0; h < static_cast<std::size_t>(s.heads); ++h) {
      const auto qkv_at = [&](std::size_t i, std::size_t which, std::size_t d) { return ((b * S + i) * 3 + which) * hidden + h * D + d; };
      const auto ctx_at = [&](std::size_t i, std::size_t d) { return (b * S + i) * hidden + h * D + d; };
      for (std::size_t i = 0; i < S; ++i)
        for (std::size_t d = 0; d < D; ++d) {
          q[i * D + d] = in.qkv.get(qkv_at(i, 0, d)), k[i * D + d] = in.qkv.get(qkv_at(i, 1, d));
          v[i * D + d] = in.qkv.get(qkv_at(i, 2, d));
          if (s.dir == Direction::bwd) dout[i * D + d] = in.dctx.get(ctx_at(i, d));
        }
      head(q.data(), k.data(), v.data(), dout.data(), S, D, r[0].data(), r[0].data(), r[1].data(), r[2].data());
      for (std::size_t i = 0; i < S; ++i)
        for (std::size_t d = 0; d < D; ++d) {
          if (s.dir == Direction::fwd) out.set(ctx_at(i, d), r[0][i * D + d]);
          else
            for (std::size_t which = 0; which < 3; ++which) out.set(qkv_at(i, which, d), r[which][i * D + d]);
        }
    }
  return out;
}

// The family's reference.
HeadFn reference_of(const Shape& s) {
  const bool bwd = s.dir == Direction::bwd;
  return [bwd](const double* q, const double* k, const double* v, const double* dout, std::size_t S, std::size_t D, double* o,
               double* dq, double* dk, double* dv) {
    std::vector<double> p(S * S), fwd_o(S * D);
    reference_fwd(q, k, v, S, D, p.data(), bwd ? fwd_o.data() : o);
    if (bwd) reference_bwd(q, k, v, p.data(), dout, S, D, dq, dk, dv);
  };
}

// A correct composition, in double with the roundings of what it stores in the dtype: the scores, P,
// dP, dS and each output (as the CPU plan and the composed CUDA plan run it). `drop_last_key`: the
// last key of every row left out of the softmax (a kernel's tile of keys one short); `scale`: the
// scores' scale (1 / sqrt(D) when right).
HeadFn composition(const Shape& s, bool drop_last_key = false, double scale = 0) {
  const bool bwd = s.dir == Direction::bwd;
  const DType dtype = s.dtype;
  const auto stored = [dtype](double x) {
    const auto f = static_cast<float>(x);
    return dtype == DType::bf16 ? static_cast<double>(bf16_to_float(float_to_bf16(f))) : static_cast<double>(f);
  };
  return [=](const double* q, const double* k, const double* v, const double* dout, std::size_t S, std::size_t D, double* o,
             double* dq, double* dk, double* dv) {
    const double sc = scale > 0 ? scale : 1 / std::sqrt(static_cast<double>(D));
    const std::size_t keys = drop_last_key && S > 1 ? S - 1 : S;
    std::vector<double> p(S * S, 0.0), ds(S * S), out(S * D);
    for (std::size_t i = 0; i < S; ++i) {
      double m = -1e300, sum = 0;
      for (std::size_t j = 0; j < keys; ++j) {
        double dot = 0;
        for (std::size_t d = 0; d < D; ++d) dot += q[i * D + d] * k[j * D + d];
        m = std::max(m, p[i * S + j] = stored(dot * sc));
      }
      for (std::size_t j = 0; j < keys; ++j) sum += (p[i * S + j] = std::exp(p[i * S + j] - m));
      for (std::size_t j = 0; j < keys; ++j) p[i * S + j] = stored(p[i * S + j] / sum);
    }
    const auto product = [&](double* to, auto term) {  // to[t, d] = bf16(sum_l term(t, l, d))
      for (std::size_t t = 0; t < S; ++t)
        for (std::size_t d = 0; d < D; ++d) {
          double acc = 0;
          for (std::size_t l = 0; l < S; ++l) acc += term(t, l, d);
          to[t * D + d] = stored(acc);
        }
    };
    if (!bwd) return product(o, [&](std::size_t i, std::size_t j, std::size_t d) { return p[i * S + j] * v[j * D + d]; });
    for (std::size_t i = 0; i < S; ++i) {
      double r = 0;
      for (std::size_t j = 0; j < S; ++j) {
        double dp = 0;
        for (std::size_t d = 0; d < D; ++d) dp += dout[i * D + d] * v[j * D + d];
        r += (ds[i * S + j] = stored(dp)) * p[i * S + j];
      }
      for (std::size_t j = 0; j < S; ++j) ds[i * S + j] = stored(p[i * S + j] * (ds[i * S + j] - r));
    }
    product(dv, [&](std::size_t j, std::size_t i, std::size_t d) { return p[i * S + j] * dout[i * D + d]; });
    product(dq, [&](std::size_t i, std::size_t j, std::size_t d) { return ds[i * S + j] * k[j * D + d] * sc; });
    product(dk, [&](std::size_t j, std::size_t i, std::size_t d) { return ds[i * S + j] * q[i * D + d] * sc; });
  };
}

TEST(AttentionReference, KnownValues) {
  // seq 2, head_dim 2 (scale 1/sqrt(2)). Query 0 = (sqrt(2) ln 3, 0) scores ln 3 and 0 against the
  // keys (1, 0) and (0, 1): P = (3/4, 1/4); query 1 = 0 scores 0 and 0: P = (1/2, 1/2).
  const double q[4] = {std::sqrt(2.0) * std::log(3.0), 0, 0, 0}, k[4] = {1, 0, 0, 1}, v[4] = {1, 2, 3, 4};
  double p[4], o[4];
  reference_fwd(q, k, v, 2, 2, p, o);
  const double want_p[4] = {0.75, 0.25, 0.5, 0.5}, want_o[4] = {1.5, 2.5, 2, 3};
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(p[i], want_p[i], 1e-15) << i;
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(o[i], want_o[i], 1e-14) << i;
  // dO = ((1, 0), (0, 0)): dV_j = P_0j (1, 0); dP_0 = (V_00, V_10) = (1, 3), sum dP P = 1.5, so
  // dS_0 = (0.75 (1 - 1.5), 0.25 (3 - 1.5)) = (-0.375, 0.375) and dS_1 = 0;
  // dQ_0 = dS_0 K / sqrt(2) = (-0.375, 0.375) / sqrt(2); dK_j = dS_0j q_0 / sqrt(2) = dS_0j (ln 3, 0).
  const double dout[4] = {1, 0, 0, 0};
  double dq[4], dk[4], dv[4];
  reference_bwd(q, k, v, p, dout, 2, 2, dq, dk, dv);
  const double r2 = 1 / std::sqrt(2.0), ln3 = std::log(3.0);
  const double want_dq[4] = {-0.375 * r2, 0.375 * r2, 0, 0}, want_dk[4] = {-0.375 * ln3, 0, 0.375 * ln3, 0},
               want_dv[4] = {0.75, 0, 0.25, 0};
  for (int i = 0; i < 4; ++i) {
    EXPECT_NEAR(dq[i], want_dq[i], 1e-15) << i;
    EXPECT_NEAR(dk[i], want_dk[i], 1e-15) << i;
    EXPECT_NEAR(dv[i], want_dv[i], 1e-15) << i;
  }
}

// The backward is the gradient of L = sum dO * O: central differences of the forward, every input.
TEST(AttentionReference, BackwardIsTheGradientOfTheForward) {
  constexpr std::size_t S = 3, D = 4;
  std::vector<double> qkv(3 * S * D), dout(S * D);
  for (std::size_t i = 0; i < qkv.size(); ++i) qkv[i] = std::sin(1.7 * static_cast<double>(i) + 0.3) * 1.5;
  for (std::size_t i = 0; i < dout.size(); ++i) dout[i] = std::cos(0.9 * static_cast<double>(i));
  const auto loss = [&](const std::vector<double>& x) {
    double p[S * S], o[S * D], l = 0;
    reference_fwd(x.data(), x.data() + S * D, x.data() + 2 * S * D, S, D, p, o);
    for (std::size_t i = 0; i < S * D; ++i) l += dout[i] * o[i];
    return l;
  };
  double p[S * S], o[S * D], grad[3 * S * D];
  reference_fwd(qkv.data(), qkv.data() + S * D, qkv.data() + 2 * S * D, S, D, p, o);
  reference_bwd(qkv.data(), qkv.data() + S * D, qkv.data() + 2 * S * D, p, dout.data(), S, D, grad, grad + S * D,
                grad + 2 * S * D);
  const double h = 1e-6;
  for (std::size_t i = 0; i < qkv.size(); ++i) {
    std::vector<double> up = qkv, down = qkv;
    up[i] += h, down[i] -= h;
    EXPECT_NEAR(grad[i], (loss(up) - loss(down)) / (2 * h), 1e-8) << "input " << i;
  }
}

TEST(AttentionNames, NamesAndWork) {
  const Family& f = family();
  const auto problems = f.benchmark_problems({8});
  ASSERT_EQ(problems.size(), 2u * 8);
  const Problem& p = problems.front();
  EXPECT_EQ(p.name(), "attention/cpu/f32/fwd/shape:bert.attn/batch:8/seq:128/heads:12/head_dim:64");
  EXPECT_EQ(problems[8 + 7].name(), "attention/cuda/bf16/bwd/shape:vit.attn/batch:8/seq:197/heads:12/head_dim:64");
  Work w = f.work(p);
  EXPECT_DOUBLE_EQ(w.flops, 4.0 * 8 * 12 * 128 * 128 * 64);
  EXPECT_DOUBLE_EQ(w.bytes, 4.0 * 8 * 128 * 768 * 4);  // qkv read, ctx written
  EXPECT_DOUBLE_EQ(w.items, 8);
  w = f.work(problems[3]);  // cpu bf16 bwd
  EXPECT_DOUBLE_EQ(w.flops, 8.0 * 8 * 12 * 128 * 128 * 64);
  EXPECT_DOUBLE_EQ(w.bytes, 7.0 * 8 * 128 * 768 * 2);  // qkv and dctx read, dqkv written
  EXPECT_EQ(f.benchmark_problems({}).front().name(), "attention/cpu/f32/fwd/shape:bert.attn/batch:32/seq:128/heads:12/head_dim:64");
  const Shape s = shape_of(test_problem(DType::bf16, Direction::bwd, 37, 3, 16));
  EXPECT_EQ(s.hidden(), 48);
  EXPECT_EQ(s.tokens(), 74);
  EXPECT_EQ(saved_bytes(s, Backend::cpu), 2u * 3 * 37 * 37 * 2);  // the probabilities, bf16
}

class AttentionVerify : public testing::TestWithParam<std::tuple<DType, Direction, std::int64_t>> {};

TEST_P(AttentionVerify, PassesTheReferenceAndFailsAPlantedError) {
  const auto [t, d, seq] = GetParam();
  const Shape s = shape_of(test_problem(t, d, seq));
  const Inputs in = make_inputs(s, 11);
  const HostBuffer out = output_of(s, in, reference_of(s));
  const Check ok = verify(s, in, out);
  EXPECT_TRUE(ok.ok) << ok.message;
  EXPECT_EQ(ok.checked, out.count() - kGuard);

  // One token's row of one head (head_dim elements: a tile's row gone wrong) off by a quarter of the
  // largest output.
  double largest = 0;
  for (std::size_t i = 0; i + kGuard < out.count(); ++i) largest = std::max(largest, std::fabs(out.get(i)));
  HostBuffer bad = out;
  const std::size_t row = (out.count() - kGuard) / 2 / 64 * 64;
  for (std::size_t i = row; i < row + 64; ++i) bad.set(i, out.get(i) + 0.25 * largest);
  EXPECT_FALSE(verify(s, in, bad).ok) << "a planted error passed";

  HostBuffer guard = out;
  guard.set(out.count() - kGuard, 0);
  EXPECT_FALSE(verify(s, in, guard).ok) << "a written guard element passed";
}

INSTANTIATE_TEST_SUITE_P(Attention, AttentionVerify,
                         testing::Combine(testing::Values(DType::f32, DType::bf16),
                                          testing::Values(Direction::fwd, Direction::bwd),
                                          testing::Values<std::int64_t>(5, 128)));

// The bounds against a model of a correct composition, the worst of the implementations (attention.cpp):
// it passes at every test shape and at BERT's and ViT's sequence lengths, within a third of each
// bound; a key left out of every row, or the scores' scale, fails.
TEST(AttentionVerify, BoundsPassACorrectCompositionAndFailAMissingKeyOrScale) {
  std::vector<Problem> problems;
  for (const Problem& p : family().test_problems())
    if (p.backend == Backend::cpu) problems.push_back(p);
  for (DType t : {DType::f32, DType::bf16})
    for (Direction d : {Direction::fwd, Direction::bwd}) {
      problems.push_back(test_problem(t, d, 128, 2, 64, 1));
      problems.push_back(test_problem(t, d, 197, 2, 64, 1));
    }
  for (const Problem& p : problems) {
    const Shape s = shape_of(p);
    const Inputs in = make_inputs(s, p.seed());
    const Check c = verify(s, in, output_of(s, in, composition(s)));
    EXPECT_TRUE(c.ok) << p.name() << ": " << c.message;
    EXPECT_LE(c.max_err, c.tol / 3) << p.name();
    EXPECT_LE(c.rms_err, c.rms_tol / 3) << p.name();
    if (s.seq != 37 && s.seq != 128 && s.seq != 197) continue;  // the slips at ragged and whole tiles
    const Check dropped = verify(s, in, output_of(s, in, composition(s, true)));
    EXPECT_FALSE(dropped.ok) << p.name() << ": a key left out of every row passed";
    const Check unscaled = verify(s, in, output_of(s, in, composition(s, false, 1.0)));
    EXPECT_FALSE(unscaled.ok) << p.name() << ": scores without their scale passed";
  }
}

// The CPU plan runs on the tensors it is given each run (no pointers kept from the first).
TEST(AttentionPlan, CpuRunsOnTheTensorsItIsGivenEachRun) {
  const Shape s = shape_of(test_problem(DType::f32, Direction::fwd, 37));
  auto plan = make_plan(s, Backend::cpu);
  const Inputs in[2] = {make_inputs(s, 1), make_inputs(s, 2)};
  HostBuffer out[2] = {make_output(s), make_output(s)}, saved[2];
  for (int k = 0; k < 2; ++k) {
    saved[k] = HostBuffer(DType::f32, (saved_bytes(s, Backend::cpu) + 3) / 4);
    out[k].poison();
  }
  plan_test::expect_each_run_on_its_own_tensors(
      *plan, [&](int k) { return Args{in[k].qkv.data(), out[k].data(), saved[k].data(), nullptr, nullptr}; },
      [&](int input, int output) { return verify(s, in[input], out[output]); }, "attention fwd");
  EXPECT_EQ(plan->label().rfind("composed: scores, context: oneDNN matmul", 0), 0u) << plan->label();
  EXPECT_NE(plan->label().find("; softmax: oneDNN softmax"), std::string::npos) << plan->label();
}

// On CUDA: the fused kernels in bf16 with head_dim 64, the composition (saying why) otherwise; each
// verifies against the reference (as every test problem does in OpTest).
TEST(AttentionCuda, FusedWhereTheKernelsTakeTheShapeComposedElsewhere) {
  std::string why;
  if (!gpu::available(&why)) GTEST_SKIP() << why;
  const auto label = [](const Problem& p) { return family().make(p)->label(); };
  for (Direction d : {Direction::fwd, Direction::bwd}) {
    const Problem fused = test_problem(DType::bf16, d, 128, 2, 64, 2, Backend::cuda);
    EXPECT_EQ(label(fused).rfind("hotops fused attention", 0), 0u) << label(fused);
    for (const Problem& p : {test_problem(DType::f32, d, 128, 2, 64, 2, Backend::cuda),
                             test_problem(DType::bf16, d, 37, 3, 16, 2, Backend::cuda)}) {
      const std::string l = label(p);
      EXPECT_EQ(l.rfind("composed: ", 0), 0u) << l;
      EXPECT_NE(l.find("(not the fused kernels: "), std::string::npos) << l;
      const Check c = family().make(p)->verify();
      EXPECT_TRUE(c.ok) << p.name() << ": " << c.message;
    }
  }
}

}  // namespace
}  // namespace hotops::attention
