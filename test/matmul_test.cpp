// The matmul reference on hand-computed values, verification that can fail, the CPU plan's loops for
// the smallest problems, the bias_grad op, and the CUDA GEMM's column-major view of each direction
// (checked on the host).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "hotops/cpu.h"
#include "kernels/matmul/bias_grad.h"
#include "kernels/matmul/matmul.h"
#include "test/plan_test_util.h"
#ifdef HOTOPS_HAVE_CUDA
#include "hotops/gpu.h"
#include "kernels/matmul/cuda_gemm.h"
#endif

namespace hotops::matmul {
namespace {

Problem addmm_problem(Direction d, double alpha = 1, double beta = 1) {
  Problem p{"addmm", Backend::cpu, DType::f32, d, {{"M", "2"}, {"N", "2"}, {"K", "3"}}};
  p.args.push_back({"alpha", std::to_string(alpha)});
  p.args.push_back({"beta", std::to_string(beta)});
  return p;
}

// A = [[1,2,3],[4,5,6]], B = [[1,0],[0,1],[1,1]], bias = [10, 20], dOut = [[1,2],[3,4]]
Inputs hand_inputs(const Shape& s) {
  Inputs in = make_inputs(s, 1);
  const double a[] = {1, 2, 3, 4, 5, 6}, b[] = {1, 0, 0, 1, 1, 1}, bias[] = {10, 20}, d[] = {1, 2, 3, 4};
  if (in.a.count()) for (int i = 0; i < 6; ++i) in.a.set(i, a[i]);
  if (in.b.count()) for (int i = 0; i < 6; ++i) in.b.set(i, b[i]);
  if (in.bias.count()) for (int i = 0; i < 2; ++i) in.bias.set(i, bias[i]);
  if (in.dout.count()) for (int i = 0; i < 4; ++i) in.dout.set(i, d[i]);
  return in;
}

TEST(MatmulReference, ForwardIsPyTorchAddmm) {
  const Shape s = shape_of(addmm_problem(Direction::fwd, 0.5, 2));
  const Inputs in = hand_inputs(s);
  Outputs out = make_outputs(s);
  reference(s, in, out);
  // A.B = [[4,5],[10,11]]; 0.5 * A.B + 2 * bias
  const double want[] = {22, 42.5, 25, 45.5};
  for (int i = 0; i < 4; ++i) EXPECT_DOUBLE_EQ(out.primary.get(i), want[i]) << i;
}

TEST(MatmulReference, BackwardDataAndWeight) {
  const Shape sd = shape_of(addmm_problem(Direction::bwd_data));
  Outputs od = make_outputs(sd);
  reference(sd, hand_inputs(sd), od);
  const double da[] = {1, 2, 3, 3, 4, 7};  // dOut . B^T
  for (int i = 0; i < 6; ++i) EXPECT_DOUBLE_EQ(od.primary.get(i), da[i]) << i;

  const Shape sw = shape_of(addmm_problem(Direction::bwd_weight, 1, 3));
  Outputs ow = make_outputs(sw);
  reference(sw, hand_inputs(sw), ow);
  const double db[] = {13, 18, 17, 24, 21, 30};  // A^T . dOut
  for (int i = 0; i < 6; ++i) EXPECT_DOUBLE_EQ(ow.primary.get(i), db[i]) << i;
  EXPECT_DOUBLE_EQ(ow.dbias.get(0), 3 * (1 + 3));
  EXPECT_DOUBLE_EQ(ow.dbias.get(1), 3 * (2 + 4));
}

TEST(MatmulVerify, CatchesAWrongElementNaNAndAnUnwrittenOutput) {
  const Shape s = shape_of(addmm_problem(Direction::fwd));
  const Inputs in = make_inputs(s, 42);
  Outputs out = make_outputs(s);
  reference(s, in, out);
  EXPECT_TRUE(verify(s, in, out).ok);

  Outputs wrong = out;
  wrong.primary.set(3, wrong.primary.get(3) + 0.5);
  const Check c = verify(s, in, wrong);
  EXPECT_FALSE(c.ok);
  EXPECT_GT(c.max_err, c.tol);
  EXPECT_NE(c.message.find("index 3"), std::string::npos) << c.message;

  Outputs nan = out;
  nan.primary.set(1, std::nan(""));
  EXPECT_FALSE(verify(s, in, nan).ok);

  Outputs inf = out;
  inf.primary.set(0, INFINITY);
  EXPECT_FALSE(verify(s, in, inf).ok);

  Outputs poisoned = out;
  poisoned.primary.poison();
  EXPECT_FALSE(verify(s, in, poisoned).ok);
}

TEST(MatmulVerify, Bf16OutputRoundingPassesButATf32SizedErrorFailsF32) {
  Problem p = addmm_problem(Direction::fwd);
  p.args = {{"M", "64"}, {"N", "64"}, {"K", "256"}};
  const Shape s = shape_of(p);
  const Inputs in = make_inputs(s, 3);
  Outputs out = make_outputs(s);
  reference(s, in, out);
  // A relative error of 2^-10 on every element (what tf32 inputs give) must fail the f32 bound.
  for (std::size_t i = 0; i < out.primary.count(); ++i) out.primary.set(i, out.primary.get(i) * (1 + 1.0 / 1024));
  EXPECT_FALSE(verify(s, in, out).ok);
}

// The plan's tensors: the inputs a direction has, its outputs.
Args args_of_outputs(const Inputs& in, Outputs& out) {
  Args a;
  a.a = in.a.count() ? in.a.data() : nullptr;
  a.b = in.b.count() ? in.b.data() : nullptr;
  a.bias = in.bias.count() ? in.bias.data() : nullptr;
  a.dout = in.dout.count() ? in.dout.data() : nullptr;
  a.out = out.primary.data();
  a.dbias = out.dbias.count() ? out.dbias.data() : nullptr;
  return a;
}

// A Linear layer's three GEMMs and its bias gradient, as a model fills the Shape in (the weight as
// PyTorch holds it, [N, K]), each plan run on two sets of the caller's buffers in turn: each run
// writes the buffers it is given, and only those.
TEST(MatmulPlan, RunsALinearLayerOnTheBuffersItIsGivenEachRun) {
  for (const Direction d : {Direction::fwd, Direction::bwd_data, Direction::bwd_weight}) {
    Shape s;
    s.op = Op::addmm;
    s.dir = d;
    s.M = 6, s.N = 5, s.K = 7;
    s.trans_b = true;
    s.beta = d == Direction::bwd_weight ? 1 : 2;
    auto plan = make_plan(s, Backend::cpu);
    Inputs in[2] = {make_inputs(s, 1), make_inputs(s, 2)};
    Outputs out[2] = {make_outputs(s), make_outputs(s)};
    auto args = [&](int i) { return args_of_outputs(in[i], out[i]); };
    for (Outputs& o : out) o.primary.poison(), o.dbias.poison();
    plan->run(args(0));
    const Check first = verify(s, in[0], out[0]);
    EXPECT_TRUE(first.ok) << direction_name(d) << ": " << first.message;
    EXPECT_TRUE(std::isnan(out[1].primary.get(0))) << direction_name(d) << ": the second output was written";
    plan->run(args(1));
    const Check second = verify(s, in[1], out[1]);
    EXPECT_TRUE(second.ok) << direction_name(d) << ": " << second.message;
    EXPECT_TRUE(verify(s, in[0], out[0]).ok) << direction_name(d) << ": the first output changed";
  }
}

// One bf16 GEMM whose N has a tail (lstm_textgen's Dense(57) head, a linear layer in every direction,
// and the weight gradient with an f32 output as the model takes it) on 1, 2 and 16 threads: each
// within the bound of the reference. On an AMX Xeon oneDNN 2.6.3 gets this wrong on several threads
// when the GEMM is posed as a 3-D [1, M, K] matmul (errors of 0.4 of the output's rms).
TEST(MatmulPlan, OneBf16GemmWithAnNTailOnEveryThread) {
  for (const Direction d : {Direction::fwd, Direction::bwd_data, Direction::bwd_weight})
    for (const bool f32_out : {false, true})
      for (const int threads : {1, 2, 16}) {
        Shape s;
        s.op = d == Direction::fwd ? Op::addmm : Op::mm;
        s.dir = d, s.dtype = DType::bf16, s.f32_out = f32_out && d != Direction::fwd;
        s.M = 128, s.N = 57, s.K = 128;
        s.trans_b = true;
        if (const std::string why = cpu_unsupported_reason(s); !why.empty()) GTEST_SKIP() << why;
        ASSERT_FALSE(cpu_runs_loops(s));
        const Inputs in = make_inputs(s, 11);
        Outputs out = make_outputs(s);
        out.primary.poison();
        {
          cpu::ThreadScope scope(threads);
          make_plan(s, Backend::cpu)->run(args_of_outputs(in, out));
        }
        const Check c = verify(s, in, out);
        EXPECT_TRUE(c.ok) << direction_name(d) << (s.f32_out ? " f32 out" : "") << ", " << threads << " threads: " << c.message;
      }
}

// B prepacked: the plan reads the weights in its own layout, written once from B as stored (f32 or
// the dtype, plain or transposed), and computes what it computes from B itself; the entry says so.
TEST(MatmulPlan, PrepackedWeightsGiveTheProductOfTheStoredOnes) {
  for (const DType t : {DType::f32, DType::bf16})
    for (const bool trans_b : {false, true}) {
      Shape s;
      s.op = Op::addmm, s.dtype = t, s.M = 9, s.N = 70, s.K = 150, s.trans_b = trans_b, s.relu = true, s.b_packed = true;
      if (const std::string why = cpu_unsupported_reason(s); !why.empty()) GTEST_SKIP() << why;
      const std::string what = std::string(dtype_name(t)) + (trans_b ? " trans_b" : "");
      auto plan = make_plan(s, Backend::cpu);
      Inputs in = make_inputs(s, 3);
      ASSERT_GE(in.b_packed.bytes(), cpu_packed_b_bytes(s)) << what;
      Outputs out = make_outputs(s);
      out.primary.poison();
      Args a = args_of_outputs(in, out);
      a.b = in.b_packed.data();
      plan->run(a);
      const Check c = verify(s, in, out);
      EXPECT_TRUE(c.ok) << what << ": " << c.message;
      EXPECT_NE(plan->label().find("prepacked"), std::string::npos) << plan->label();
      // From the f32 masters into a bf16 plan's layout (a model's weights): the same product.
      if (t != DType::bf16) continue;
      HostBuffer masters(DType::f32, in.b.count());
      for (std::size_t i = 0; i < masters.count(); ++i) masters.set(i, in.b.get(i));
      cpu_pack_b(s, masters.data(), DType::f32, in.b_packed.data());
      out.primary.poison();
      plan->run(a);
      const Check f = verify(s, in, out);
      EXPECT_TRUE(f.ok) << what << " from f32: " << f.message;
    }
  Problem p{"addmm", Backend::cpu, DType::f32, Direction::fwd, {{"shape", "test"}, {"M", "33"}, {"N", "65"}, {"K", "130"}, {"w", "packed"}}};
  EXPECT_TRUE(shape_of(p).b_packed);
  p.args.back().value = "plain";
  EXPECT_THROW(shape_of(p), Error);
}

// A model's hidden dense layer: the ReLU after the bias in the same GEMM (negative outputs clamped
// to zero, the others the plain addmm), on the CPU plan's loops and on oneDNN.
class MatmulPlanBothCpuPaths : public testing::TestWithParam<std::int64_t> {};  // the M of a shape
INSTANTIATE_TEST_SUITE_P(LoopsAndOneDnn, MatmulPlanBothCpuPaths, testing::Values(9, 2000));

TEST_P(MatmulPlanBothCpuPaths, ReluAfterTheBias) {
  Shape s;
  s.op = Op::addmm;
  s.M = GetParam(), s.N = 12, s.K = 5;
  s.relu = true;
  EXPECT_EQ(cpu_runs_loops(s), s.M * 60 < kCpuLoopMacs);
  const Inputs in = make_inputs(s, 3);
  Outputs out = make_outputs(s);
  out.primary.poison();
  make_plan(s, Backend::cpu)->run({in.a.data(), in.b.data(), in.bias.data(), nullptr, out.primary.data(), nullptr});
  const Check c = verify(s, in, out);
  EXPECT_TRUE(c.ok) << c.message;
  int clamped = 0;
  for (std::size_t i = 0; i < out.primary.count(); ++i) {
    Shape plain = s;
    plain.relu = false;
    const double pre = reference_primary(plain, in, i);
    if (pre < 0) {
      ++clamped;
      EXPECT_EQ(out.primary.get(i), 0.0) << i;
    } else {
      EXPECT_NEAR(out.primary.get(i), pre, 1e-5 * (1 + std::fabs(pre))) << i;
    }
  }
  EXPECT_GT(clamped, 0) << "the inputs give no negative pre-activation: the ReLU went untested";
}

// A model's bf16 weight gradient for its f32 master weights: written in f32 (more exact than bf16's
// rounding would allow), from bf16 A and dOut.
TEST_P(MatmulPlanBothCpuPaths, F32OutputOfBf16) {
  Shape w;
  w.op = Op::mm, w.dir = Direction::bwd_weight, w.dtype = DType::bf16;
  w.M = GetParam(), w.N = 7, w.K = 6;
  w.f32_out = true;
  if (const std::string why = cpu_unsupported_reason(w); !why.empty()) GTEST_SKIP() << why;
  const Inputs win = make_inputs(w, 4);
  Outputs wout = make_outputs(w);
  ASSERT_EQ(wout.primary.dtype(), DType::f32);
  wout.primary.poison();
  make_plan(w, Backend::cpu)->run({win.a.data(), nullptr, nullptr, win.dout.data(), wout.primary.data(), nullptr});
  for (std::size_t i = 0; i < wout.primary.count(); ++i) {
    const double ref = reference_primary(w, win, i);
    // f32 accumulation of M exact bf16 products: far inside bf16's rounding of the result (2^-9).
    EXPECT_NEAR(wout.primary.get(i), ref, 1e-5 * (1 + std::fabs(ref))) << i;
  }
}

// A residual (a model's skip connection folded into its GEMM) is added to what the GEMM computes,
// after alpha and the bias, in fwd and bwd_data; the residual itself is left as it was.
TEST(MatmulPlan, AddsAResidualAfterAlphaAndTheBias) {
  for (const Direction d : {Direction::fwd, Direction::bwd_data})
    for (const double alpha : {1.0, 0.5}) {
      Shape s;
      s.op = d == Direction::fwd ? Op::addmm : Op::mm;
      s.dir = d;
      s.M = 6, s.N = 5, s.K = 7;
      s.alpha = alpha, s.beta = 2;
      s.residual = true;
      auto plan = make_plan(s, Backend::cpu);
      const Inputs in = make_inputs(s, 1);
      Outputs out = make_outputs(s);
      HostBuffer c(s.dtype, primary_count(s));
      c.fill_uniform(3, 1);
      const HostBuffer c0 = c;
      Args a = args_of_outputs(in, out);
      a.c = c.data();
      out.primary.poison();
      plan->run(a);
      for (std::size_t i = 0; i < primary_count(s); ++i) {
        ASSERT_NEAR(out.primary.get(i), reference_primary(s, in, i) + c0.get(i), 1e-4)
            << direction_name(d) << " alpha " << alpha << " at " << i;
        ASSERT_EQ(c.get(i), c0.get(i));
      }
      a.c = a.out;
      EXPECT_THROW(plan->run(a), Error) << "the output as its own residual";
    }
}

// An f32 output from bf16 operands (a bf16 model's weight gradient): every direction of mm, within
// f32 accumulation's error of the reference on the same (bf16) inputs.
TEST_P(MatmulPlanBothCpuPaths, WritesAnF32OutputFromBf16Operands) {
  for (const Direction d : {Direction::fwd, Direction::bwd_data, Direction::bwd_weight}) {
    Shape s;
    s.op = Op::mm;
    s.dir = d;
    s.dtype = DType::bf16;
    s.M = GetParam(), s.N = 5, s.K = 7;
    s.f32_out = true;
    std::unique_ptr<Plan> plan;
    try {
      plan = make_plan(s, Backend::cpu);
    } catch (const Error& e) {
      GTEST_SKIP() << e.what();  // no bf16 matmul on this CPU
    }
    const Inputs in = make_inputs(s, 1);
    HostBuffer out(DType::f32, primary_count(s));
    out.poison();
    Args a;
    a.a = in.a.count() ? in.a.data() : nullptr;
    a.b = in.b.count() ? in.b.data() : nullptr;
    a.dout = in.dout.count() ? in.dout.data() : nullptr;
    a.out = out.data();
    plan->run(a);
    for (std::size_t i = 0; i < primary_count(s); ++i)
      ASSERT_NEAR(out.get(i), reference_primary(s, in, i), 1e-4 * (1 + s.M / 100)) << direction_name(d) << " at " << i;
  }
  Shape addmm;
  addmm.op = Op::addmm, addmm.dtype = DType::bf16, addmm.f32_out = true;
  EXPECT_THROW(make_plan(addmm, Backend::cpu), Error) << "an f32 output beside a bf16 bias";
}

// Attention's six GEMMs on strided heads (2 samples of 9 tokens, 3 heads of 4), in the step's order.
std::vector<Shape> attention_gemms(DType t) {
  std::vector<Shape> v;
  for (const AttentionGemm g : {AttentionGemm::scores, AttentionGemm::context})
    for (const Direction d : {Direction::fwd, Direction::bwd_data, Direction::bwd_weight})
      v.push_back(attention_gemm(g, d, t, 2, 9, 3, 4));
  return v;
}

// The tensors of one direction, on the host buffers of `in` and `out`.
Args args_of(const Inputs& in, Outputs& out) {
  Args a;
  a.a = in.a.count() ? in.a.data() : nullptr;
  a.b = in.b.count() ? in.b.data() : nullptr;
  a.dout = in.dout.count() ? in.dout.data() : nullptr;
  a.out = out.primary.data();
  return a;
}

// Whether every element of `out` outside the output's view is still NaN (poisoned before the run):
// a GEMM on a head writes its view only, as dQ, dK and dV share one [tokens, 3 hidden] buffer.
std::size_t written_outside_the_view(const Shape& s, const HostBuffer& out) {
  std::vector<bool> in_view(out.count());
  for (std::size_t i = 0; i < primary_count(s); ++i) in_view[primary_at(s, i)] = true;
  std::size_t n = 0;
  for (std::size_t j = 0; j < out.count(); ++j) n += !in_view[j] && !std::isnan(out.get(j));
  return n;
}

std::string what(const Shape& s) {
  return std::string(dtype_name(s.dtype)) + " " + direction_name(s.dir) + (s.trans_b ? " scores" : " context");
}

TEST(MatmulStrided, AttentionViewsAreTheHeadsOfTheFusedBuffers) {
  const Shape sc = attention_gemm(AttentionGemm::scores, Direction::fwd, DType::f32, 2, 9, 3, 4);
  EXPECT_EQ(sc.batch_count, 6);
  EXPECT_TRUE(sc.trans_b);
  EXPECT_DOUBLE_EQ(sc.alpha, 0.5);  // 1 / sqrt(head_dim)
  EXPECT_EQ(sc.views.a.ld, 36);     // a token's Q | K | V
  EXPECT_EQ(operand_count(sc, Operand::a), 2u * 9 * 36);
  // The element (sample 1, head 2, token 3, column 1) of Q, and of the probabilities (row 3, column 5).
  const Shape pv = attention_gemm(AttentionGemm::context, Direction::bwd_data, DType::f32, 2, 9, 3, 4);
  EXPECT_EQ(primary_at(pv, ((1 * 3 + 2) * 9 + 3) * 9 + 5), static_cast<std::size_t>(1 * 3 * 81 + 2 * 81 + 3 * 9 + 5));
  const Shape dq = attention_gemm(AttentionGemm::scores, Direction::bwd_data, DType::f32, 2, 9, 3, 4);
  EXPECT_EQ(primary_at(dq, ((1 * 3 + 2) * 9 + 3) * 4 + 1), static_cast<std::size_t>(1 * 9 * 36 + 2 * 4 + 3 * 36 + 1));
  // The benchmark's name asks for the same GEMM.
  const Problem p{"bmm", Backend::cpu, DType::f32, Direction::fwd,
                  {{"batch", "2"}, {"heads", "3"}, {"M", "9"}, {"N", "9"}, {"K", "4"}, {"view", "qkv.scores"}}};
  const Shape named = shape_of(p);
  EXPECT_EQ(named.views.b.per_sample, sc.views.b.per_sample);
  EXPECT_EQ(named.alpha, sc.alpha);
  Problem bad = p;
  bad.args.back().value = "qkv.context";  // M != K
  EXPECT_THROW(shape_of(bad), Error);
}

TEST(MatmulStrided, AttentionGemmsMatchTheReferenceAndWriteOnlyTheirView) {
  for (const DType t : {DType::f32, DType::bf16})
    for (const Shape& s : attention_gemms(t)) {
      if (const std::string why = cpu_unsupported_reason(s); !why.empty()) {
        EXPECT_EQ(t, DType::bf16) << what(s) << ": " << why;  // bf16 needs AVX-512; f32 runs on every CPU
        continue;
      }
      const Inputs in = make_inputs(s, 3);
      Outputs out = make_outputs(s);
      out.primary.poison();
      make_plan(s, Backend::cpu)->run(args_of(in, out));
      const Check c = verify(s, in, out);
      EXPECT_TRUE(c.ok) << what(s) << ": " << c.message;
      EXPECT_EQ(c.checked, primary_count(s)) << what(s);
      EXPECT_EQ(written_outside_the_view(s, out.primary), 0u) << what(s);
    }
}

TEST(MatmulStrided, RunsOnTheTensorsItIsGivenEachRun) {
  for (const Shape& s : attention_gemms(DType::f32)) {
    auto plan = make_plan(s, Backend::cpu);
    Inputs in[2] = {make_inputs(s, 1), make_inputs(s, 2)};
    Outputs out[2] = {make_outputs(s), make_outputs(s)};
    for (Outputs& o : out) o.primary.poison();
    plan_test::expect_each_run_on_its_own_tensors(
        *plan, [&](int k) { return args_of(in[k], out[k]); }, [&](int i, int o) { return verify(s, in[i], out[o]); },
        what(s));
  }
}

#ifdef HOTOPS_HAVE_CUDA
// The CUDA plan on device copies of each set's tensors: the reference's result, each run on the
// tensors it is given (its pointer arrays rewritten when they change), its view only written.
TEST(MatmulStridedCuda, AttentionGemmsMatchTheReferenceOnTheTensorsOfEachRun) {
  std::string why;
  if (!gpu::available(&why)) GTEST_SKIP() << why;
  for (const DType t : {DType::f32, DType::tf32, DType::bf16})
    for (const Shape& s : attention_gemms(t)) {
      auto plan = make_plan(s, Backend::cuda);
      Inputs in[2] = {make_inputs(s, 1), make_inputs(s, 2)};
      Outputs out[2] = {make_outputs(s), make_outputs(s)};
      std::vector<gpu::DeviceBuffer> a, b, dout, o;
      for (int k = 0; k < 2; ++k) {
        auto up = [](const HostBuffer& h) { return h.count() ? gpu::DeviceBuffer(h) : gpu::DeviceBuffer(); };
        a.push_back(up(in[k].a)), b.push_back(up(in[k].b)), dout.push_back(up(in[k].dout));
        out[k].primary.poison();
        o.push_back(gpu::DeviceBuffer(out[k].primary));
      }
      auto device_args = [&](int k) {
        Args x;
        x.a = a[k].get(), x.b = b[k].get(), x.dout = dout[k].get(), x.out = o[k].get();
        return x;
      };
      plan_test::expect_each_run_on_its_own_tensors(
          *plan, device_args,
          [&](int i, int k) {
            o[k].download(out[k].primary);
            return verify(s, in[i], out[k]);
          },
          what(s));
      EXPECT_EQ(written_outside_the_view(s, out[0].primary), 0u) << what(s);
      EXPECT_NE(plan->label().find("cublasGemmBatchedEx"), std::string::npos) << plan->label();
    }
}
#endif

#ifdef HOTOPS_HAVE_CUDA
// addmm bwd_weight's bias gradient on either CUDA path, and the timed choice between them: dW and
// dbias within the reference's bounds, at mlp_tiny's first layer over 4096 samples and at a shape of
// ragged sizes, with beta 1 (which the epilogue can fuse) and 2 (the column sums, scaled, always).
TEST(MatmulCuda, BiasGradientOnEitherPathMatchesTheReference) {
  std::string why;
  if (!gpu::available(&why)) GTEST_SKIP() << why;
  struct Restore {
    ~Restore() { set_cuda_dbias_path(DbiasPath::timed); }
  } restore;
  for (const DbiasPath path : {DbiasPath::epilogue, DbiasPath::sums, DbiasPath::timed}) {
    set_cuda_dbias_path(path);
    for (const DType t : {DType::f32, DType::tf32, DType::bf16})
      for (const auto& [M, N, K] : {std::tuple{4096, 32, 13}, std::tuple{33, 65, 17}})
        for (const double beta : {1.0, 2.0}) {
          Shape s;
          s.op = Op::addmm, s.dir = Direction::bwd_weight, s.dtype = t, s.M = M, s.N = N, s.K = K, s.beta = beta;
          auto plan = make_plan(s, Backend::cuda);
          const std::string label = plan->label();
          const Inputs in = make_inputs(s, 3);
          Outputs out = make_outputs(s);
          out.primary.poison(), out.dbias.poison();
          const gpu::DeviceBuffer a(in.a), dout(in.dout), dw(out.primary), db(out.dbias);
          Args x;
          x.a = a.get(), x.dout = dout.get(), x.out = dw.get(), x.dbias = db.get();
          plan->run(x);
          gpu::synchronize();
          dw.download(out.primary), db.download(out.dbias);
          const Check c = verify(s, in, out);
          EXPECT_TRUE(c.ok) << what(s) << " beta " << beta << ", " << label << ": " << c.message;
          const bool sums = label.find("column sums for dbias") != std::string::npos;
          EXPECT_NE(sums, label.find(", bgrad epilogue") != std::string::npos) << "one path or the other: " << label;
          if (beta != 1.0 || path == DbiasPath::sums) {
            EXPECT_TRUE(sums) << what(s) << " beta " << beta << ": " << label;
          }
          if (path == DbiasPath::timed && beta == 1.0) {
            EXPECT_NE(label.find("timed "), std::string::npos) << label;
          }
        }
  }
}
#endif

// timed's rule between the two paths: the column sums only beyond a near tie.
#ifdef HOTOPS_HAVE_CUDA
TEST(MatmulCuda, BiasGradientSumsOnlyWhenFasterBeyondANearTie) {
  const float near = 1 + gpu::kRetimeTie / 2, far = 1 + 2 * gpu::kRetimeTie;
  EXPECT_TRUE(dbias_sums_are_faster(1.0f, far));
  EXPECT_FALSE(dbias_sums_are_faster(1.0f, near)) << "a near tie keeps the epilogue";
  EXPECT_FALSE(dbias_sums_are_faster(far, 1.0f));
}
#endif

// A in blocks (a_blocks): a dense layer over the concatenation of the blocks, read where they lie.
Shape blocks_shape(Op op, Direction d, DType t, std::int64_t M, std::int64_t N, std::int64_t K, std::int64_t blocks,
                   bool f32_out = false) {
  Shape s;
  s.op = op, s.dir = d, s.dtype = t, s.M = M, s.N = N, s.K = K, s.a_blocks = blocks, s.f32_out = f32_out;
  return s;
}

TEST(MatmulBlocks, ReferenceReadsAInItsBlocks) {
  // A as blocks [[1, 2], [3, 4]] then [[5, 6], [7, 8]]: rows (1, 2, 5, 6) and (3, 4, 7, 8); B = (1, 10, 100, 1000).
  const double a[] = {1, 2, 3, 4, 5, 6, 7, 8}, b[] = {1, 10, 100, 1000}, dout[] = {1, 2};
  const auto fill = [&](const Shape& s) {
    Inputs in = make_inputs(s, 1);
    if (in.a.count()) for (int i = 0; i < 8; ++i) in.a.set(i, a[i]);
    if (in.b.count()) for (int i = 0; i < 4; ++i) in.b.set(i, b[i]);
    if (in.dout.count()) for (int i = 0; i < 2; ++i) in.dout.set(i, dout[i]);
    return in;
  };
  const std::pair<Direction, std::vector<double>> cases[] = {
      {Direction::fwd, {6521, 8743}},
      {Direction::bwd_data, {1, 10, 2, 20, 100, 1000, 200, 2000}},  // dA in A's blocks
      {Direction::bwd_weight, {7, 10, 19, 22}}};
  for (const auto& [d, want] : cases) {
    const Shape s = blocks_shape(Op::mm, d, DType::f32, 2, 1, 4, 2);
    Outputs out = make_outputs(s);
    reference(s, fill(s), out);
    ASSERT_EQ(out.primary.count(), want.size());
    for (std::size_t i = 0; i < want.size(); ++i) EXPECT_DOUBLE_EQ(out.primary.get(i), want[i]) << direction_name(d) << " " << i;
  }
}

// Every blocked case of the tests, as the family lists them: (op, dtype, direction, f32 output).
std::vector<Shape> blocks_cases(std::int64_t M, std::int64_t N, std::int64_t K, std::int64_t blocks) {
  std::vector<Shape> out;
  for (const Op op : {Op::mm, Op::addmm})
    for (const DType t : {DType::f32, DType::bf16})
      for (const Direction d : {Direction::fwd, Direction::bwd_data, Direction::bwd_weight})
        out.push_back(blocks_shape(op, d, t, M, N, K, blocks, op == Op::mm && t == DType::bf16 && d != Direction::fwd));
  return out;
}

std::string blocks_what(const Shape& s) {
  return std::string(s.op == Op::mm ? "mm " : "addmm ") + dtype_name(s.dtype) + " " + direction_name(s.dir) +
         (s.f32_out ? " out:f32" : "") + " M " + std::to_string(s.M) + " blocks " + std::to_string(s.a_blocks);
}

// The CPU plan: the reference's result on the tensors of each run; and the check fails A read as one
// packed [M, K] matrix (the blocks taken for rows).
TEST(MatmulBlocks, CpuPlanMatchesTheReferenceOnTheTensorsOfEachRun) {
  for (const auto& [M, N, K, blocks] : {std::tuple{3, 2, 14, 2}, std::tuple{37, 3, 12, 3}, std::tuple{300, 16, 256, 2}})
    for (const Shape& s : blocks_cases(M, N, K, blocks)) {
      auto plan = make_plan(s, Backend::cpu);
      Inputs in[2] = {make_inputs(s, 1), make_inputs(s, 2)};
      Outputs out[2] = {make_outputs(s), make_outputs(s)};
      for (Outputs& o : out) o.primary.poison(), o.dbias.poison();
      plan_test::expect_each_run_on_its_own_tensors(
          *plan, [&](int k) { return args_of_outputs(in[k], out[k]); },
          [&](int i, int o) { return verify(s, in[i], out[o]); }, blocks_what(s));
      EXPECT_NE(plan->label().find("block"), std::string::npos) << plan->label();
      Shape packed = s;
      packed.a_blocks = 1;
      if (s.dir == Direction::bwd_weight && s.op == Op::addmm) continue;  // dbias alone would pass; dB is checked by mm's
      Outputs wrong = make_outputs(s);
      reference(packed, in[0], wrong);
      EXPECT_FALSE(verify(s, in[0], wrong).ok) << blocks_what(s) << ": A read packed passed";
    }
}

TEST(MatmulBlocks, NamesParseIntoTheShape) {
  const Problem p{"mm", Backend::cuda, DType::bf16, Direction::bwd_weight,
                  {{"shape", "imdb_bilstm.dense"}, {"batch", "64"}, {"M", "64"}, {"N", "2"}, {"K", "256"}, {"a_blocks", "2"}, {"out", "f32"}}};
  const Shape s = shape_of(p);
  EXPECT_EQ(s.a_blocks, 2);
  EXPECT_TRUE(s.f32_out);
  EXPECT_EQ(out_dtype(s), DType::f32);
  Problem tf32 = p;
  tf32.dtype = DType::tf32;
  EXPECT_THROW(product(shape_of(tf32)), Error);
  Shape wide = s;
  wide.N = kBlocksMaxN + 1;
  EXPECT_THROW(product(wide), Error);
}

#ifdef HOTOPS_HAVE_CUDA
TEST(MatmulBlocksCuda, MatchesTheReferenceOnTheTensorsOfEachRun) {
  std::string why;
  if (!gpu::available(&why)) GTEST_SKIP() << why;
  for (const auto& [M, N, K, blocks] : {std::tuple{3, 2, 14, 2}, std::tuple{37, 3, 12, 3}, std::tuple{300, 16, 256, 2}})
    for (const Shape& s : blocks_cases(M, N, K, blocks)) {
      auto plan = make_plan(s, Backend::cuda);
      Inputs in[2] = {make_inputs(s, 1), make_inputs(s, 2)};
      Outputs out[2] = {make_outputs(s), make_outputs(s)};
      std::vector<gpu::DeviceBuffer> a, b, bias, dout, o, db;
      auto up = [](const HostBuffer& h) { return h.count() ? gpu::DeviceBuffer(h) : gpu::DeviceBuffer(); };
      for (int k = 0; k < 2; ++k) {
        a.push_back(up(in[k].a)), b.push_back(up(in[k].b)), bias.push_back(up(in[k].bias)), dout.push_back(up(in[k].dout));
        out[k].primary.poison(), out[k].dbias.poison();
        o.push_back(up(out[k].primary)), db.push_back(up(out[k].dbias));
      }
      auto device_args = [&](int k) {
        Args x;
        x.a = a[k].get(), x.b = b[k].get(), x.bias = bias[k].get(), x.dout = dout[k].get();
        x.out = o[k].get(), x.dbias = db[k].get();
        return x;
      };
      plan_test::expect_each_run_on_its_own_tensors(
          *plan, device_args,
          [&](int i, int k) {
            o[k].download(out[k].primary);
            if (out[k].dbias.count()) db[k].download(out[k].dbias);
            return verify(s, in[i], out[k]);
          },
          blocks_what(s));
    }
}
#endif

TEST(MatmulShapes, NamedShapesComeWithBatchesAndPositiveDims) {
  for (const NamedShape& ns : named_shapes()) {
    EXPECT_FALSE(ns.name.empty());
    EXPECT_GT(ns.N, 0) << ns.name;
    EXPECT_GT(ns.K, 0) << ns.name;
    if (ns.rows_per_sample > 0 || ns.heads > 0) EXPECT_FALSE(ns.batches.empty()) << ns.name;
    else EXPECT_GT(ns.M, 0) << ns.name;
  }
}

// The CPU plan takes its hand-written loops below kCpuLoopMacs multiply-adds, on packed operands as
// stored, and says so in its label; oneDNN from the threshold on, and for what the loops do not take.
TEST(MatmulCpuLoops, TakeTheProblemsBelowTheThresholdAndSaySo) {
  const auto linear = [](Op op, Direction d, std::int64_t M, std::int64_t N, std::int64_t K) {
    Shape s;
    s.op = op, s.dir = d, s.M = M, s.N = N, s.K = K;
    return s;
  };
  const auto loops = [](const Shape& s) {
    return make_plan(s, Backend::cpu)->label().rfind("hotops single-thread loops", 0) == 0;
  };
  for (const Direction d : {Direction::fwd, Direction::bwd_data, Direction::bwd_weight}) {
    EXPECT_TRUE(loops(linear(Op::addmm, d, 10, 32, 13))) << "mlp_tiny.fc1 at batch 10";
    EXPECT_TRUE(loops(linear(Op::mm, d, 65535, 1, 1)));
    EXPECT_FALSE(loops(linear(Op::mm, d, 65536, 1, 1)));
    EXPECT_FALSE(loops(linear(Op::addmm, d, 4096, 32, 13))) << "mlp_tiny.fc1 at batch 4096";
  }
  Shape t = linear(Op::addmm, Direction::fwd, 10, 32, 13);
  t.trans_b = true;
  EXPECT_FALSE(cpu_runs_loops(t)) << "a transposed operand";
  Shape r = linear(Op::addmm, Direction::fwd, 10, 32, 13);
  r.residual = true;
  EXPECT_FALSE(cpu_runs_loops(r)) << "a residual";
  Shape b = linear(Op::bmm, Direction::fwd, 10, 32, 13);
  b.batch_count = 2;
  EXPECT_FALSE(cpu_runs_loops(b)) << "a batch of matrices";
  Shape bf = linear(Op::mm, Direction::fwd, 10, 32, 13);
  bf.dtype = DType::bf16;
  EXPECT_EQ(cpu_unsupported_reason(bf), "") << "the loops need no oneDNN bf16";
}

// The loops in every direction of mm and addmm (alpha and beta, the ReLU, an f32 output of bf16),
// at mlp_tiny's first and last layers, at a size of many vectors with a tail and at sums too short
// for the blocks: each within the matmul bound of the reference, and addmm bwd_weight's dbias too.
TEST(MatmulCpuLoops, EveryDirectionMatchesTheReference) {
  for (const DType t : {DType::f32, DType::bf16})
    for (const Op op : {Op::mm, Op::addmm})
      for (const Direction d : {Direction::fwd, Direction::bwd_data, Direction::bwd_weight})
        // Whole column blocks; blocks and a one-column tail over rows that are not whole blocks; a
        // 2-class head's narrow columns (no whole block); sums too short for the blocks.
        for (const auto& [M, N, K] : {std::tuple{10, 32, 13}, std::tuple{33, 65, 17}, std::tuple{11, 2, 16}, std::tuple{5, 20, 4}})
          for (const int variant : {0, 1}) {
            Shape s;
            s.op = op, s.dir = d, s.dtype = t, s.M = M, s.N = N, s.K = K;
            if (variant == 1) {  // addmm: alpha, beta and (fwd) the ReLU; mm: (bf16) the f32 output
              if (op == Op::addmm) s.alpha = 0.5, s.beta = 2, s.relu = d == Direction::fwd;
              else if (t == DType::bf16) s.f32_out = true;
              else continue;
            }
            ASSERT_TRUE(cpu_runs_loops(s));
            const Inputs in = make_inputs(s, 7);
            Outputs out = make_outputs(s);
            out.primary.poison(), out.dbias.poison();
            Args a = args_of(in, out);
            a.bias = in.bias.count() ? in.bias.data() : nullptr;
            a.dbias = out.dbias.count() ? out.dbias.data() : nullptr;
            make_plan(s, Backend::cpu)->run(a);
            const Check c = verify(s, in, out);
            EXPECT_TRUE(c.ok) << dtype_name(t) << " " << (op == Op::mm ? "mm " : "addmm ") << direction_name(d) << " " << M
                              << " variant " << variant << ": " << c.message;
          }
}

// bias_grad: the column sums of dy, on hand-computed values, with the sum of their magnitudes.
TEST(BiasGrad, ReferenceOnHandValues) {
  bias_grad::Shape s;
  s.rows = 3, s.cols = 2;
  bias_grad::Inputs in = bias_grad::make_inputs(s, 1);
  const double dy[] = {1, 2, 3, 4, 5, -6};
  for (int i = 0; i < 6; ++i) in.dy.set(i, dy[i]);
  double mag = 0;
  EXPECT_DOUBLE_EQ(bias_grad::reference(s, in, 0, &mag), 9);
  EXPECT_DOUBLE_EQ(mag, 9);
  EXPECT_DOUBLE_EQ(bias_grad::reference(s, in, 1, &mag), 0);
  EXPECT_DOUBLE_EQ(mag, 12);
}

bias_grad::Shape bias_shape(DType t, std::int64_t rows, std::int64_t cols) {
  bias_grad::Shape s;
  s.dtype = t, s.rows = rows, s.cols = cols;
  return s;
}

// A correct result passes; a row left out of one column's sum (its largest term), the column sums of
// another tensor, and one NaN each fail.
TEST(BiasGrad, VerifyCatchesAMissingRowAnotherTensorAndNaN) {
  for (const DType t : {DType::f32, DType::bf16})
    for (const std::int64_t rows : {130, 4096}) {
      const bias_grad::Shape s = bias_shape(t, rows, 47);
      const bias_grad::Inputs in = bias_grad::make_inputs(s, 5);
      HostBuffer db = bias_grad::make_output(s);
      db.poison();
      bias_grad::make_plan(s, Backend::cpu)->run({in.dy.data(), db.as<float>()});
      const Check ok = bias_grad::verify(s, in, db);
      ASSERT_TRUE(ok.ok) << ok.message;
      const auto R = static_cast<std::size_t>(s.rows), C = static_cast<std::size_t>(s.cols);
      for (const std::size_t col : {std::size_t{0}, std::size_t{46}})
        EXPECT_FALSE(bias_grad::verify(s, in, plan_test::without_largest(in.dy, db, R, C, col)).ok) << dtype_name(t) << " " << col;
      const bias_grad::Inputs other = bias_grad::make_inputs(s, 6);
      EXPECT_FALSE(bias_grad::verify(s, in, plan_test::column_sums_of(other.dy, R, C)).ok) << dtype_name(t);
      HostBuffer nan = db;
      nan.set(13, std::nan(""));
      EXPECT_FALSE(bias_grad::verify(s, in, nan).ok) << dtype_name(t);
    }
}

// The plan, built once, run on two sets of caller-owned tensors in turn (on CUDA their device
// copies), on a shape with a partial last chain of 64 rows and more than one block of columns.
void expect_bias_grad_plan_runs_on_its_tensors(Backend be) {
  for (const DType t : {DType::f32, DType::bf16}) {
    const bias_grad::Shape s = bias_shape(t, 200, 1100);
    const auto plan = bias_grad::make_plan(s, be);
    const bias_grad::Inputs in[2] = {bias_grad::make_inputs(s, 1), bias_grad::make_inputs(s, 2)};
    HostBuffer db[2] = {bias_grad::make_output(s), bias_grad::make_output(s)};
#ifdef HOTOPS_HAVE_CUDA
    std::vector<gpu::DeviceBuffer> dev;
    if (be == Backend::cuda)
      for (int k = 0; k < 2; ++k) dev.emplace_back(in[k].dy), dev.emplace_back(db[k].bytes());
#endif
    const auto set = [&](int k) -> bias_grad::Args {
      db[k].poison();
#ifdef HOTOPS_HAVE_CUDA
      if (be == Backend::cuda) {
        dev[2 * k + 1].poison();
        return {dev[2 * k].get(), dev[2 * k + 1].as<float>()};
      }
#endif
      return {in[k].dy.data(), db[k].as<float>()};
    };
    const auto check = [&](int i, int o) {
#ifdef HOTOPS_HAVE_CUDA
      if (be == Backend::cuda) gpu::synchronize(), dev[2 * o + 1].download(db[o]);
#endif
      return bias_grad::verify(s, in[i], db[o]);
    };
    plan_test::expect_each_run_on_its_own_tensors(*plan, set, check, dtype_name(t));
  }
}
HOTOPS_PLAN_TESTS(BiasGrad, PlanRunsOnTheTensorsItIsGivenEachRun, expect_bias_grad_plan_runs_on_its_tensors)

// The named entries: the models' bias gradients at their batches, in the matmul shapes' names, and
// their work (an add per element; dy read, db written in f32).
TEST(BiasGrad, NamedEntriesAndWork) {
  std::vector<std::string> names;
  for (const Problem& p : family().benchmark_problems({})) names.push_back(p.name());
  for (const char* n : {"bias_grad/cuda/bf16/bwd/shape:bert.qkv/batch:32/M:4096/N:2304",
                        "bias_grad/cpu/f32/bwd/shape:bert.qkv/batch:8/M:1024/N:2304",
                        "bias_grad/cuda/f32/bwd/shape:vit.qkv/batch:32/M:6304/N:2304",
                        "bias_grad/cpu/bf16/bwd/shape:vit.mlp_down/batch:8/M:1576/N:768"})
    EXPECT_NE(std::find(names.begin(), names.end(), n), names.end()) << n;
  EXPECT_EQ(std::count_if(names.begin(), names.end(), [](const std::string& n) { return n.rfind("bias_grad/", 0) == 0; }),
            3 * 2 * 2 * 2 + 3 * 2 * 2);  // 3 shapes x 2 batches, lstm_textgen.dense x 3 batches; x 2 backends x 2 dtypes
  const Problem p{"bias_grad", Backend::cuda, DType::bf16, Direction::bwd, {{"shape", "bert.qkv"}, {"batch", "32"}, {"M", "4096"}, {"N", "2304"}}};
  const Work w = family().work(p);
  EXPECT_DOUBLE_EQ(w.flops, 4096.0 * 2304);
  EXPECT_DOUBLE_EQ(w.bytes, 2.0 * 4096 * 2304 + 4.0 * 2304);
  EXPECT_DOUBLE_EQ(w.items, 32);
  EXPECT_EQ(family().unsupported_reason(Problem{"bias_grad", Backend::cpu, DType::bf16, Direction::bwd, p.args}), "");
  EXPECT_THROW(bias_grad::shape_of(Problem{"bias_grad", Backend::cpu, DType::f16, Direction::bwd, p.args}), Error);
}

#ifdef HOTOPS_HAVE_CUDA
// Whether `batch` matrices of layout l, one after another, lie inside a buffer of `count` elements
// without overlapping.
bool fits(const gpu::MatrixLayout& l, std::int64_t batch, std::size_t count) {
  return l.ld >= l.rows && (batch == 1 || l.stride >= l.ld * l.cols) &&
         (batch - 1) * l.stride + (l.cols - 1) * l.ld + l.rows <= static_cast<std::int64_t>(count);
}

// op(X)[r, c] of batch item `item`, as cublasLt reads it: column-major, ld and stride from l.
double op_element(const HostBuffer& x, const gpu::MatrixLayout& l, cublasOperation_t op, std::int64_t item,
                  std::int64_t r, std::int64_t c) {
  if (op != CUBLAS_OP_N) std::swap(r, c);
  return x.get(static_cast<std::size_t>(item * l.stride + c * l.ld + r));
}

// How many elements of D = alpha op(A) op(B) + bias(i), evaluated on the host from cuBLAS' fields
// in `d` (op_a(item, r, c): op(A)[r, c], op_b likewise), differ from the reference's D[i, j] of item
// `item` (want(item, i, j)); the first three are reported.
template <class OpA, class OpB, class Bias, class Want>
int mismatches(const gpu::GemmDesc& d, OpA op_a, OpB op_b, Bias bias, Want want, const std::string& what) {
  int bad = 0;
  for (std::int64_t item = 0; item < d.batch; ++item)
    for (std::int64_t j = 0; j < d.n; ++j)
      for (std::int64_t i = 0; i < d.m; ++i) {
        double acc = 0;
        for (std::int64_t q = 0; q < d.k; ++q) acc += op_a(item, i, q) * op_b(item, q, j);
        const double got = d.alpha * acc + bias(i);
        const double ref = want(item, i, j);
        if (std::fabs(got - ref) > 1e-5 * (1 + std::fabs(ref)) && ++bad <= 3)
          ADD_FAILURE() << what << " at item " << item << " (" << i << ", " << j << "): " << got << " vs " << ref;
      }
  return bad;
}

// A mixed-precision weight gradient: bf16 operands, f32 output, partial sums reduced in f32; the
// defaults keep one dtype and cublasLt's own reduction.
TEST(MatmulCudaGemm, F32OutputAndReductionInComputeType) {
  Shape s;
  s.dir = Direction::bwd_weight, s.dtype = DType::bf16, s.M = 8, s.N = 4, s.K = 6;
  EXPECT_EQ(cuda_gemm(s).desc.cd, CUDA_R_16BF);
  EXPECT_FALSE(cuda_gemm(s).desc.reduce_in_compute);
  s.f32_out = true, s.reduce_in_compute = true;
  const CudaGemm g = cuda_gemm(s);
  EXPECT_EQ(g.desc.ab, CUDA_R_16BF);
  EXPECT_EQ(g.desc.cd, CUDA_R_32F);
  EXPECT_TRUE(g.desc.reduce_in_compute);
  EXPECT_EQ(make_outputs(s).primary.dtype(), DType::f32);
}

// What the CUDA plan asks cublasLt for (matmul::cuda_gemm, laid out by gpu::gemm_layouts), evaluated
// on the host with cublasLt's meaning of each field, must be the reference's result: a wrong operand,
// transpose, leading dimension, batch stride, alpha or epilogue shows here without a GPU.
TEST(MatmulCudaGemm, ColumnMajorViewOfEachDirectionIsTheReference) {
  std::vector<Problem> problems;
  for (const Direction d : {Direction::fwd, Direction::bwd_data, Direction::bwd_weight}) {
    problems.push_back({"mm", Backend::cuda, DType::f32, d, {{"M", "5"}, {"N", "3"}, {"K", "7"}}});
    problems.push_back({"addmm", Backend::cuda, DType::f32, d, {{"M", "4"}, {"N", "6"}, {"K", "3"}, {"alpha", "0.5"}, {"beta", "1"}}});
    problems.push_back({"addmm", Backend::cuda, DType::f32, d, {{"M", "4"}, {"N", "6"}, {"K", "3"}, {"alpha", "1"}, {"beta", "2"}}});
    problems.push_back({"bmm", Backend::cuda, DType::f32, d, {{"batch", "2"}, {"heads", "3"}, {"M", "5"}, {"N", "2"}, {"K", "4"}}});
    // Operands stored transposed: a Linear's weight (trans_b), A as [K, M], and both.
    problems.push_back({"addmm", Backend::cuda, DType::f32, d, {{"M", "4"}, {"N", "6"}, {"K", "3"}, {"trans_b", "1"}}});
    problems.push_back({"mm", Backend::cuda, DType::f32, d, {{"M", "5"}, {"N", "3"}, {"K", "7"}, {"trans_a", "1"}}});
    problems.push_back({"bmm", Backend::cuda, DType::f32, d,
                        {{"batch", "2"}, {"heads", "3"}, {"M", "5"}, {"N", "2"}, {"K", "4"}, {"trans_a", "1"}, {"trans_b", "1"}}});
  }
  for (const Problem& p : problems) {
    const Shape s = shape_of(p);
    const Inputs in = make_inputs(s, 5);
    Outputs want = make_outputs(s);
    reference(s, in, want);

    const CudaGemm g = cuda_gemm(s);
    const gpu::GemmDesc& d = g.desc;
    const gpu::GemmLayouts l = gpu::gemm_layouts(d);
    const HostBuffer& a = operand(in, g.a);
    const HostBuffer& b = operand(in, g.b);
    ASSERT_TRUE(fits(l.a, d.batch, a.count())) << p.name();
    ASSERT_TRUE(fits(l.b, d.batch, b.count())) << p.name();
    ASSERT_TRUE(fits(l.d, d.batch, want.primary.count())) << p.name();
    EXPECT_EQ(d.batch * d.m * d.n, static_cast<std::int64_t>(want.primary.count())) << p.name();  // D covers the output

    const int bad = mismatches(
        d, [&](std::int64_t item, std::int64_t r, std::int64_t c) { return op_element(a, l.a, d.opa, item, r, c); },
        [&](std::int64_t item, std::int64_t r, std::int64_t c) { return op_element(b, l.b, d.opb, item, r, c); },
        [&](std::int64_t i) { return g.bias ? s.beta * in.bias.get(static_cast<std::size_t>(i)) : 0.0; },  // beta folded in
        [&](std::int64_t item, std::int64_t i, std::int64_t j) {
          return want.primary.get(static_cast<std::size_t>(item * l.d.stride + j * l.d.ld + i));
        },
        p.name());
    EXPECT_EQ(bad, 0) << p.name();

    EXPECT_EQ(g.bias, s.op == Op::addmm && s.dir == Direction::fwd) << p.name();
    // BGRADA sums cublasLt's A, which is dOut where B is stored [K, N]; otherwise a column sum does it.
    EXPECT_EQ(g.bias_grad, want.dbias.count() > 0 && s.beta == 1 && !s.trans_b) << p.name();
    if (g.bias_grad) {  // BGRADA: op(A)'s rows summed over k
      ASSERT_EQ(d.batch, 1);
      ASSERT_EQ(d.m, static_cast<std::int64_t>(want.dbias.count()));
      for (std::int64_t i = 0; i < d.m; ++i) {
        double sum = 0;
        for (std::int64_t q = 0; q < d.k; ++q) sum += op_element(a, l.a, d.opa, 0, i, q);
        EXPECT_NEAR(sum, want.dbias.get(static_cast<std::size_t>(i)), 1e-5 * (1 + std::fabs(sum))) << p.name() << " dbias " << i;
      }
    }
  }
}

// What the CUDA plan asks cublasGemmBatchedEx for on strided heads (matmul::strided_gemm), evaluated
// on the host with cuBLAS' meaning of each field (column-major, ld, each item's pointer at its
// views' offsets), must be the reference's result, written where the output's view holds it.
TEST(MatmulCudaGemm, StridedHeadsOfEachDirectionAreTheReference) {
  for (const Shape& s : attention_gemms(DType::f32)) {
    const Inputs in = make_inputs(s, 5);
    Outputs want = make_outputs(s);
    reference(s, in, want);
    const StridedGemm g = strided_gemm(s);
    const gpu::GemmDesc& d = g.gemm.desc;
    const HostBuffer& a = operand(in, g.gemm.a);
    const HostBuffer& b = operand(in, g.gemm.b);
    ASSERT_EQ(d.batch * d.m * d.n, static_cast<std::int64_t>(primary_count(s))) << what(s);
    // op(X)[r, c] of item i: X column-major with leading dimension v.ld from the item's offset.
    auto element = [&](const HostBuffer& x, const View& v, cublasOperation_t op, std::int64_t i, std::int64_t r,
                       std::int64_t c) {
      if (op != CUBLAS_OP_N) std::swap(r, c);
      return x.get(static_cast<std::size_t>(item_offset(v, g.heads, i) + c * v.ld + r));
    };
    const int bad = mismatches(
        d, [&](std::int64_t item, std::int64_t r, std::int64_t c) { return element(a, g.a, d.opa, item, r, c); },
        [&](std::int64_t item, std::int64_t r, std::int64_t c) { return element(b, g.b, d.opb, item, r, c); },
        [](std::int64_t) { return 0.0; },
        [&](std::int64_t item, std::int64_t i, std::int64_t j) {
          return want.primary.get(static_cast<std::size_t>(item_offset(g.d, g.heads, item) + j * g.d.ld + i));
        },
        what(s));
    EXPECT_EQ(bad, 0) << what(s);
  }
}

// A hidden dense layer's ReLU is cublasLt's RELU_BIAS epilogue; a bf16 weight gradient in f32 is D
// (and C) in f32 with A and B bf16.
TEST(MatmulCudaGemm, ReluEpilogueAndF32Output) {
  Shape s;
  s.op = Op::addmm, s.M = 4, s.N = 6, s.K = 3, s.relu = true;
  EXPECT_TRUE(cuda_gemm(s).bias);
  EXPECT_TRUE(cuda_gemm(s).desc.relu);
  s.relu = false;
  EXPECT_FALSE(cuda_gemm(s).desc.relu);
  Shape w;
  w.op = Op::mm, w.dir = Direction::bwd_weight, w.dtype = DType::bf16, w.M = 4, w.N = 6, w.K = 3, w.f32_out = true;
  const CudaGemm g = cuda_gemm(w);
  EXPECT_EQ(g.desc.ab, CUDA_R_16BF);
  EXPECT_EQ(g.desc.cd, CUDA_R_32F);
}
#endif

}  // namespace
}  // namespace hotops::matmul
