// The pointwise family (relu, dropout, relu_dbias, relu_bias, scale_residual): reference values, the dropout mask's
// statistics and its agreement across the CPU loop, the CUDA kernel's code (run on the host) and the
// reference, verification that fails on planted errors, and the dense layers' plans run in place on
// given tensors.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <map>

#include "hotops/check.h"
#include "hotops/elementwise.h"
#include "hotops/gpu.h"
#include "kernels/pointwise/pointwise.h"
#include "kernels/pointwise/scale_residual.h"
#include "test/plan_test_util.h"

namespace hotops::pointwise {
namespace {

Problem flat_problem(const char* op, DType t, Direction d, std::int64_t n, std::int64_t offset = 0,
                     const char* p = "0.5") {
  Problem pr{op, Backend::cpu, t, d, {{"shape", "flat"}, {"elements", std::to_string(n)}}};
  if (offset) pr.args.push_back({"offset", std::to_string(offset)});
  if (std::string(op) == "dropout") pr.args.push_back({"p", p});
  return pr;
}

// Every output element from the reference; the guard left poisoned. For dropout fwd, the mask too.
struct Expected {
  HostBuffer out;
  std::vector<std::uint8_t> mask;
};
Expected reference_output(const Shape& s, const Inputs& in) {
  Expected e{make_output(s), std::vector<std::uint8_t>(buffer_count(s), kMaskPoison)};
  e.out.poison();
  for (std::int64_t i = 0; i < s.elements; ++i) {
    const auto k = static_cast<std::size_t>(i), at = static_cast<std::size_t>(s.offset + i);
    e.out.set(at, reference(s, in, k));
    if (s.op == Op::dropout) e.mask[at] = reference_keep(s, in, k) ? 1 : 0;
  }
  return e;
}

const std::uint8_t* fwd_mask(const Shape& s, const Expected& e) {
  return s.op == Op::dropout && s.dir == Direction::fwd ? e.mask.data() : nullptr;
}

TEST(PointwiseReference, KnownValues) {
  const Problem p = flat_problem("relu", DType::f32, Direction::bwd, 4);
  const Shape s = shape_of(p);
  Inputs in = make_inputs(s, p.seed());
  const double xs[] = {-1.5, 0.0, 0.25, 2.0}, dys[] = {0.5, 0.75, -0.125, 3.0};
  for (std::size_t i = 0; i < 4; ++i) in.x.set(i, xs[i]), in.dy.set(i, dys[i]);
  Shape f = s;
  f.dir = Direction::fwd;
  const double fwd[] = {0, 0, 0.25, 2.0}, bwd[] = {0, 0, -0.125, 3.0};  // threshold_backward: x = 0 -> 0
  for (std::size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(reference(f, in, i), fwd[i]) << i;
    EXPECT_EQ(reference(s, in, i), bwd[i]) << i;
  }
  // dropout's scale: 1 / (1 - p) in f32.
  EXPECT_EQ(dropout_key(1, 0.5).scale, 2.0f);
  EXPECT_EQ(dropout_key(1, 0.1).scale, static_cast<float>(1 / 0.9));
  EXPECT_EQ(dropout_key(1, 0.5).threshold, 1u << 23);
}

TEST(PointwiseMask, KeepRateIsOneMinusPWithinFiveSigma) {
  constexpr std::uint64_t n = 1 << 20;
  for (double p : {0.5, 0.1}) {
    for (std::uint64_t seed : {1ull, 0x123456789abcdefull}) {
      const DropoutKey k = dropout_key(seed, p);
      std::uint64_t kept = 0, kept_even = 0;
      for (std::uint64_t i = 0; i < n; ++i) {
        const bool keep = dropout_keep(k, i);
        kept += keep;
        kept_even += keep && i % 2 == 0;  // no bias by parity of the index
      }
      const double sigma = std::sqrt(p * (1 - p) / n);
      EXPECT_NEAR(static_cast<double>(kept) / n, 1 - p, 5 * sigma) << "p " << p << " seed " << seed;
      EXPECT_NEAR(static_cast<double>(kept_even) / (n / 2), 1 - p, 5 * sigma * std::sqrt(2.0)) << "p " << p;
    }
  }
}

TEST(PointwiseMask, DependsOnTheSeedAndAgreesInNeighbouringElements) {
  // Two seeds' masks agree where independent masks would: about p^2 + (1 - p)^2 of the time.
  const DropoutKey a = dropout_key(1, 0.5), b = dropout_key(2, 0.5);
  constexpr std::uint64_t n = 1 << 20;
  std::uint64_t same = 0, same_next = 0;
  for (std::uint64_t i = 0; i < n; ++i) {
    same += dropout_keep(a, i) == dropout_keep(b, i);
    same_next += dropout_keep(a, i) == dropout_keep(a, i + 1);
  }
  const double sigma = std::sqrt(0.25 / n);
  EXPECT_NEAR(static_cast<double>(same) / n, 0.5, 5 * sigma);
  EXPECT_NEAR(static_cast<double>(same_next) / n, 0.5, 5 * sigma);
}

TEST(PointwiseMask, CpuLoopDrawsTheReferenceMask) {
  for (DType t : {DType::f32, DType::bf16}) {
    // 1M elements from 0, and a span across the 2^32 boundary of the index (high word changes).
    for (std::uint64_t first : {std::uint64_t(0), (std::uint64_t(1) << 32) - 1001}) {
      const std::int64_t n = first == 0 ? 1 << 20 : 2003;
      const Problem p = flat_problem("dropout", t, Direction::fwd, n, 0, "0.1");
      const Shape s = shape_of(p);
      const Inputs in = make_inputs(s, p.seed());
      HostBuffer out = make_output(s);
      std::vector<std::uint8_t> mask(buffer_count(s), kMaskPoison);
      cpu_dropout_span(s, in.key, first, in.x.data(), nullptr, out.data(), mask.data(), n);
      std::int64_t wrong = 0;
      for (std::int64_t i = 0; i < n; ++i) {
        const auto k = static_cast<std::size_t>(i);
        const bool keep = dropout_keep(in.key, first + k);
        wrong += mask[k] != (keep ? 1 : 0);
        const float want = keep ? static_cast<float>(in.x.get(k)) * in.key.scale : 0.f;
        const double want_t = t == DType::bf16 ? bf16_to_float(float_to_bf16(want)) : want;
        wrong += out.get(k) != want_t;
      }
      EXPECT_EQ(wrong, 0) << dtype_name(t) << " first " << first;
    }
  }
}

TEST(PointwiseVerify, AcceptsTheReferenceAndFailsPlantedErrors) {
  for (const char* op : {"relu", "dropout"})
    for (DType t : {DType::f32, DType::bf16})
      for (Direction d : {Direction::fwd, Direction::bwd}) {
        const Problem p = flat_problem(op, t, d, 1027, 3);
        const Shape s = shape_of(p);
        const Inputs in = make_inputs(s, p.seed());
        const Expected e = reference_output(s, in);
        const std::string what = p.name();
        ASSERT_TRUE(verify(s, in, e.out, fwd_mask(s, e)).ok) << what << ": " << verify(s, in, e.out, fwd_mask(s, e)).message;
        // One element off by one unit in the last place of its dtype (a nonzero one).
        std::size_t at = 3 + 700;
        while (e.out.get(at) == 0) ++at;
        Expected bad = e;
        bad.out.set(at, e.out.get(at) * (1 + (t == DType::bf16 ? 1.0 / 128 : 1.0 / (1 << 23))));
        EXPECT_FALSE(verify(s, in, bad.out, fwd_mask(s, bad)).ok) << what << " ulp";
        // An element written past the end.
        bad = e;
        bad.out.set(3 + 1027, 0.0);
        EXPECT_FALSE(verify(s, in, bad.out, fwd_mask(s, bad)).ok) << what << " guard";
        if (s.op == Op::dropout && s.dir == Direction::fwd) {
          bad = e;
          bad.mask[3 + 5] ^= 1;
          EXPECT_FALSE(verify(s, in, bad.out, fwd_mask(s, bad)).ok) << what << " mask";
          bad = e;
          bad.mask[2] = 0;
          EXPECT_FALSE(verify(s, in, bad.out, fwd_mask(s, bad)).ok) << what << " mask guard";
        }
      }
}

// Each CPU plan, built once, run on two sets of caller-owned buffers in turn (tensors 3 elements
// into them; dropout fwd with each set's own seed): each result, and each mask, is that of its own
// inputs, and nothing outside the tensors is written.
TEST(PointwisePlan, RunsOnTheBuffersItIsGivenEachRun) {
  for (const char* op : {"relu", "dropout"})
    for (DType t : {DType::f32, DType::bf16})
      for (Direction d : {Direction::fwd, Direction::bwd}) {
        const Problem p = flat_problem(op, t, d, 3 * 16384 + 7, 3, "0.1");
        if (!family().unsupported_reason(p).empty()) continue;  // oneDNN without bf16 on this CPU
        const Shape s = shape_of(p);
        const auto plan = make_plan(s, Backend::cpu);
        const bool bwd = d == Direction::bwd, mask_out = s.op == Op::dropout && !bwd;
        struct Set {
          Inputs in;
          HostBuffer out, mask;
        };
        Set sets[] = {{make_inputs(s, 1), make_output(s), make_mask(s)},
                      {make_inputs(s, 2), make_output(s), make_mask(s)}};
        for (Set& x : sets) {
          x.out.poison();
          Args a;
          a.x = x.in.x.data();
          a.dy = x.in.dy.data();
          a.mask_in = x.in.mask.as<std::uint8_t>();
          a.out = x.out.data();
          a.mask_out = x.mask.as<std::uint8_t>();
          a.seed = x.in.seed;
          plan->run(a);
        }
        for (const Set& x : sets) {
          const Check c = verify(s, x.in, x.out, mask_out ? x.mask.as<std::uint8_t>() : nullptr);
          EXPECT_TRUE(c.ok) << p.name() << ": " << c.message;
        }
        EXPECT_FALSE(verify(s, sets[1].in, sets[0].out, mask_out ? sets[0].mask.as<std::uint8_t>() : nullptr).ok)
            << p.name();
      }
}

TEST(PointwiseShapes, NamesParseAndWorkCountsBytes) {
  const Problem p{"dropout", Backend::cuda, DType::bf16, Direction::fwd,
                  {{"shape", "bert.ffn"}, {"batch", "2"}, {"dims", "2x128x3072"}, {"p", "0.1"}}};
  const Shape s = shape_of(p);
  EXPECT_EQ(s.elements, 2 * 128 * 3072);
  EXPECT_DOUBLE_EQ(s.p, 0.1);
  EXPECT_EQ(p.name(), "dropout/cuda/bf16/fwd/shape:bert.ffn/batch:2/dims:2x128x3072/p:0.1");
  const Work w = family().work(p);
  EXPECT_DOUBLE_EQ(w.bytes, s.elements * (2.0 * 2 + 1));  // x, y and the uint8 mask
  EXPECT_DOUBLE_EQ(w.flops, 2.0 * s.elements);
  EXPECT_DOUBLE_EQ(w.items, 2);
  const Problem r{"relu", Backend::cpu, DType::f32, Direction::bwd, {{"shape", "flat"}, {"elements", "10"}}};
  EXPECT_DOUBLE_EQ(family().work(r).bytes, 10 * 4 * 3.0);
  EXPECT_DOUBLE_EQ(family().work(r).flops, 10);
  // Both ops and p values in the benchmark list; the same inputs and mask on both backends.
  std::map<std::string, int> count;
  for (const Problem& q : family().benchmark_problems({})) count[q.op]++;
  EXPECT_EQ(count["dropout"], 2 * count["relu"]);
  EXPECT_EQ(count["relu_dbias"], 4 * 2 * 2);  // four model layers, both backends and dtypes, bwd only
  EXPECT_EQ(count["relu_bias"], 4 * 2 * 2);   // the same layers, fwd only
  Problem c = p;
  c.backend = Backend::cpu;
  EXPECT_EQ(dropout_key(c).k0, dropout_key(p).k0);
  EXPECT_EQ(dropout_key(c).k1, dropout_key(p).k1);
  EXPECT_THROW(shape_of(flat_problem("dropout", DType::f32, Direction::fwd, 4, 0, "1")), Error);
}

#ifdef HOTOPS_HAVE_CUDA
// The CUDA kernels' code on the host, over grids of 1 and 3 blocks (many vectors per thread, and
// the last partial round) and the full grid, at an odd size off a 16-byte boundary.
TEST(PointwiseCudaKernelOnHost, MatchesTheReference) {
  for (const char* op : {"relu", "dropout"})
    for (DType t : {DType::f32, DType::bf16})
      for (Direction d : {Direction::fwd, Direction::bwd})
        for (std::int64_t n : {1, 5, 1027, 100003})
          for (unsigned blocks : {1u, 3u, 1u << 20}) {
            const Problem p = flat_problem(op, t, d, n, n == 1027 ? 3 : 0, "0.1");
            const Shape s = shape_of(p);
            const Inputs in = make_inputs(s, p.seed());
            HostBuffer out = make_output(s);
            out.poison();
            std::vector<std::uint8_t> mask(buffer_count(s), kMaskPoison);
            const std::size_t off = static_cast<std::size_t>(s.offset), eoff = off * dtype_size(t);
            const bool dropout = s.op == Op::dropout, bwd = d == Direction::bwd;
            run_cuda_kernel_on_host(s, in.key, bwd && dropout ? nullptr : static_cast<const std::byte*>(in.x.data()) + eoff,
                                    bwd ? static_cast<const std::byte*>(in.dy.data()) + eoff : nullptr,
                                    dropout && bwd ? in.mask.as<std::uint8_t>() + off : nullptr,
                                    static_cast<std::byte*>(out.data()) + eoff,
                                    dropout && !bwd ? mask.data() + off : nullptr, blocks);
            const Check c = verify(s, in, out, dropout && !bwd ? mask.data() : nullptr);
            EXPECT_TRUE(c.ok) << p.name() << " blocks " << blocks << ": " << c.message;
          }
}
#endif

// ---- relu_dbias ----

Problem dbias_problem(DType t, std::int64_t rows, std::int64_t cols) {
  return Problem{"relu_dbias", Backend::cpu, t, Direction::bwd, elementwise::model_args("test", rows, {cols})};
}

// dx and db from the reference, the guards left poisoned; db rounded to f32 as the op writes it.
struct DbiasExpected {
  HostBuffer out, db;
};
DbiasExpected dbias_reference(const Shape& s, const Inputs& in) {
  DbiasExpected e{reference_output(s, in).out, make_dbias(s)};
  e.db.poison();
  std::vector<double> db, terms;
  reference_dbias(s, in, db, terms);
  for (std::size_t c = 0; c < db.size(); ++c) e.db.set(c, db[c]);
  return e;
}

TEST(ReluDbias, ShapeAndReference) {
  const Problem p{"relu_dbias", Backend::cuda, DType::bf16, Direction::bwd,
                  {{"shape", "mlp_mnist.hidden"}, {"batch", "128"}, {"dims", "128x512"}}};
  const Shape s = shape_of(p);
  EXPECT_EQ(s.rows(), 128);
  EXPECT_EQ(s.cols, 512);
  EXPECT_DOUBLE_EQ(family().work(p).bytes, 128 * 512 * 2 * 3.0 + 512 * 4);
  EXPECT_THROW(shape_of(Problem{"relu_dbias", Backend::cpu, DType::f32, Direction::fwd,
                                elementwise::model_args("test", 2, {3})}),
               Error);
  // Two rows of three: db is the column sums of threshold_backward.
  const Shape t = shape_of(dbias_problem(DType::f32, 2, 3));
  Inputs in = make_inputs(t, 1);
  const double xs[] = {1, -1, 0.5, 0, 2, 3}, dys[] = {0.25, 9, -0.5, 9, 1.5, 2};
  for (std::size_t i = 0; i < 6; ++i) in.x.set(i, xs[i]), in.dy.set(i, dys[i]);
  std::vector<double> db, terms;
  reference_dbias(t, in, db, terms);
  EXPECT_EQ(db, (std::vector<double>{0.25, 1.5, 1.5}));
  EXPECT_EQ(terms, (std::vector<double>{0.25, 1.5, 2.5}));
}

TEST(ReluDbias, VerifyAcceptsTheReferenceAndFailsPlantedErrors) {
  for (DType t : {DType::f32, DType::bf16}) {
    const Shape s = shape_of(dbias_problem(t, 130, 70));
    const Inputs in = make_inputs(s, 3);
    const DbiasExpected e = dbias_reference(s, in);
    ASSERT_TRUE(verify(s, in, e.out).ok) << verify(s, in, e.out).message;
    ASSERT_TRUE(verify_dbias(s, in, e.db).ok) << verify_dbias(s, in, e.db).message;
    // A column summed without its last row's term (a row split dropped, a loop bound off by one).
    std::size_t c = 5;
    const auto last = static_cast<std::size_t>(129 * 70);
    while (e.out.get(last + c) == 0) ++c;
    DbiasExpected bad = e;
    bad.db.set(c, e.db.get(c) - e.out.get(last + c));
    EXPECT_FALSE(verify_dbias(s, in, bad.db).ok) << dtype_name(t) << " dropped row";
    // Every db as the sum of dy, the ReLU's mask not applied.
    bad = e;
    for (std::size_t j = 0; j < 70; ++j) {
      double sum = 0;
      for (std::size_t r = 0; r < 130; ++r) sum += in.dy.get(r * 70 + j);
      bad.db.set(j, sum);
    }
    EXPECT_FALSE(verify_dbias(s, in, bad.db).ok) << dtype_name(t) << " unmasked";
    // A db element left unwritten, and one written past the end.
    bad = e;
    bad.db.set(69, std::nan(""));
    EXPECT_FALSE(verify_dbias(s, in, bad.db).ok) << dtype_name(t) << " unwritten";
    bad = e;
    bad.db.set(70, 0.0);
    EXPECT_FALSE(verify_dbias(s, in, bad.db).ok) << dtype_name(t) << " guard";
  }
}

// relu_dbias on the CPU, at a model's sizes above its grain of work, with 2 column blocks (mlp_tiny's
// first layer) and with 16: neither runs a smaller OpenMP team than the last full one.
TEST(ReluDbias, CpuPlanKeepsTheThreadPool) {
  for (std::int64_t cols : {32, 256}) {
    const Shape s = shape_of(dbias_problem(DType::f32, 4096, cols));
    auto plan = make_plan(s, Backend::cpu);
    Inputs in = make_inputs(s, 1);
    HostBuffer db = make_dbias(s);
    Args a;
    a.x = in.x.data(), a.dy = a.out = in.dy.data(), a.db = db.as<float>();
    plan_test::expect_keeps_thread_pool([&] { plan->run(a); }, "relu_dbias " + std::to_string(cols) + " columns");
  }
}

// One relu_dbias plan on `backend` run in place (out == dy, as a model step runs it) on two sets of
// tensors in turn: each dx and db is that of its own inputs. On CUDA the second run also shows that
// the kernel left its tickets ready for the next launch. Shapes: one CUDA tile, three column tiles
// by three row splits.
void expect_dbias_plan_runs_in_place(Backend backend) {
  for (DType t : {DType::f32, DType::bf16})
    for (auto [rows, cols] : {std::pair<std::int64_t, std::int64_t>{10, 32}, {130, 70}}) {
      const Shape s = shape_of(dbias_problem(t, rows, cols));
      auto plan = make_plan(s, backend);
      Inputs in[2] = {make_inputs(s, 1), make_inputs(s, 2)};
      HostBuffer out[2] = {in[0].dy, in[1].dy}, db[2] = {make_dbias(s), make_dbias(s)};
      for (HostBuffer& o : out)  // dy in place; its guard poisoned, as verify expects of an output's
        for (std::size_t i = static_cast<std::size_t>(s.elements); i < o.count(); ++i) o.set(i, std::nan(""));
      gpu::DeviceBuffer dx_d[2], x_d[2], db_d[2];
      const auto args_of = [&](int k) {
        db[k].poison();
        Args a;
        if (backend == Backend::cpu) {
          a.x = in[k].x.data(), a.dy = a.out = out[k].data(), a.db = db[k].as<float>();
          return a;
        }
        x_d[k] = gpu::DeviceBuffer(in[k].x), dx_d[k] = gpu::DeviceBuffer(out[k]), db_d[k] = gpu::DeviceBuffer(db[k]);
        a.x = x_d[k].get(), a.dy = a.out = dx_d[k].get(), a.db = db_d[k].as<float>();
        return a;
      };
      const auto check = [&](int i, int o) {
        if (backend == Backend::cuda) dx_d[o].download(out[o]), db_d[o].download(db[o]);
        Check c = verify(s, in[i], out[o]);
        c.merge(verify_dbias(s, in[i], db[o]), "db");
        return c;
      };
      plan_test::expect_each_run_on_its_own_tensors(*plan, args_of, check,
                                                    std::string(dtype_name(t)) + " " + std::to_string(rows) + "x" +
                                                        std::to_string(cols));
    }
}

HOTOPS_PLAN_TESTS(ReluDbias, PlanRunsInPlaceOnTheTensorsItIsGiven, expect_dbias_plan_runs_in_place)

// ---- relu_bias ----

Problem bias_problem(DType t, std::int64_t rows, std::int64_t cols) {
  return Problem{"relu_bias", Backend::cpu, t, Direction::fwd, elementwise::model_args("test", rows, {cols})};
}

TEST(ReluBias, ReferenceAndVerify) {
  // Two rows of two: y = max(x + b, 0); without the ReLU, x + b.
  Shape s = shape_of(bias_problem(DType::f32, 2, 2));
  Inputs in = make_inputs(s, 1);
  const double xs[] = {1, -1, -0.5, 0.25}, bs[] = {-2, 0.5};
  for (std::size_t i = 0; i < 4; ++i) in.x.set(i, xs[i]);
  for (std::size_t c = 0; c < 2; ++c) in.b.set(c, bs[c]);
  const double relu[] = {0, 0, 0, 0.75}, plain[] = {-1, -0.5, -2.5, 0.75};
  for (std::size_t i = 0; i < 4; ++i) EXPECT_EQ(reference(s, in, i), relu[i]) << i;
  s.relu = false;
  for (std::size_t i = 0; i < 4; ++i) EXPECT_EQ(reference(s, in, i), plain[i]) << i;
  for (DType t : {DType::f32, DType::bf16}) {
    const Shape u = shape_of(bias_problem(t, 130, 70));
    const Inputs v = make_inputs(u, 3);
    const HostBuffer y = reference_output(u, v).out;
    ASSERT_TRUE(verify(u, v, y).ok) << verify(u, v, y).message;
    // The bias of the next column (an index off by one), in one element where it shows.
    HostBuffer bad = y;
    std::size_t at = 70 * 9 + 4;
    while (std::max(v.x.get(at) + v.b.get(4), 0.0) == std::max(v.x.get(at) + v.b.get(5), 0.0)) ++at;
    bad.set(at, std::max(v.x.get(at) + v.b.get(at % 70 + 1), 0.0));
    EXPECT_FALSE(verify(u, v, bad).ok) << dtype_name(t) << " column";
    bad = y;
    bad.set(130 * 70, 0.0);
    EXPECT_FALSE(verify(u, v, bad).ok) << dtype_name(t) << " guard";
  }
}

// One relu_bias plan on `backend` run in place (out == x, as a model step runs it) on two sets of
// tensors in turn, with and without the ReLU: each y is that of its own x and b.
void expect_bias_plan_runs_in_place(Backend backend) {
  for (DType t : {DType::f32, DType::bf16})
    for (bool relu : {true, false}) {
      Shape s = shape_of(bias_problem(t, 130, 70));
      s.relu = relu;
      auto plan = make_plan(s, backend);
      Inputs in[2] = {make_inputs(s, 1), make_inputs(s, 2)};
      HostBuffer out[2] = {in[0].x, in[1].x};
      for (HostBuffer& o : out)  // x in place; its guard poisoned, as verify expects of an output's
        for (std::size_t i = static_cast<std::size_t>(s.elements); i < o.count(); ++i) o.set(i, std::nan(""));
      gpu::DeviceBuffer y_d[2], b_d[2];
      const auto args_of = [&](int k) {
        Args a;
        if (backend == Backend::cpu) {
          a.x = a.out = out[k].data(), a.b = in[k].b.data();
          return a;
        }
        y_d[k] = gpu::DeviceBuffer(out[k]), b_d[k] = gpu::DeviceBuffer(in[k].b);
        a.x = a.out = y_d[k].get(), a.b = b_d[k].get();
        return a;
      };
      const auto check = [&](int i, int o) {
        if (backend == Backend::cuda) y_d[o].download(out[o]);
        return verify(s, in[i], out[o]);
      };
      plan_test::expect_each_run_on_its_own_tensors(*plan, args_of, check,
                                                    std::string(dtype_name(t)) + (relu ? " relu" : " no relu"));
    }
}

HOTOPS_PLAN_TESTS(ReluBias, PlanRunsInPlaceOnTheTensorsItIsGiven, expect_bias_plan_runs_in_place)

// ---- scale_residual ----

namespace sr = scale_residual;

Problem scale_problem(DType t, Direction d, std::int64_t rows, std::int64_t cols) {
  return Problem{"scale_residual", Backend::cpu, t, d, elementwise::model_args("test", rows, {cols})};
}

// Every output from the reference (dgamma and dbias summed in double).
sr::Outputs scale_reference(const sr::Shape& s, const sr::Inputs& in) {
  sr::Outputs o = sr::make_outputs(s);
  const auto cols = static_cast<std::size_t>(s.cols);
  for (std::size_t i = 0; i < static_cast<std::size_t>(s.count()); ++i) o.out.set(i, sr::reference(s, in, i));
  if (s.dir == Direction::fwd) return o;
  for (std::size_t c = 0; c < cols; ++c) {
    double g = 0, b = 0;
    for (std::size_t r = 0; r < static_cast<std::size_t>(s.rows); ++r)
      g += in.dy.get(r * cols + c) * in.z.get(r * cols + c), b += o.out.get(r * cols + c);
    o.dgamma.set(c, g), o.dbias.set(c, b);
  }
  return o;
}

TEST(ScaleResidual, ShapeReferenceAndWork) {
  const Problem p{"scale_residual", Backend::cuda, DType::bf16, Direction::bwd,
                  elementwise::model_args("convnext.s1", 8, {56, 56, 96})};
  EXPECT_EQ(p.name(), "scale_residual/cuda/bf16/bwd/shape:convnext.s1/batch:8/dims:8x56x56x96");
  const sr::Shape s = sr::shape_of(p);
  EXPECT_EQ(s.rows, 8 * 56 * 56);
  EXPECT_EQ(s.cols, 96);
  const Work w = family().work(p);
  EXPECT_DOUBLE_EQ(w.flops, 4.0 * s.count());
  EXPECT_DOUBLE_EQ(w.bytes, 3 * 2.0 * s.count() + 3 * 4 * 96);
  // One row of two: y = x + gamma z, dz = gamma dy.
  sr::Shape f = sr::shape_of(scale_problem(DType::f32, Direction::fwd, 1, 2));
  sr::Inputs in = sr::make_inputs(f, 1);
  in.x.set(0, 1), in.x.set(1, -2), in.z.set(0, 0.5), in.z.set(1, 4), in.gamma.set(0, 2), in.gamma.set(1, 0.25);
  EXPECT_EQ(sr::reference(f, in, 0), 2);
  EXPECT_EQ(sr::reference(f, in, 1), -1);
  // Both ops' problems in the benchmark list: 2 stages x 2 batches x 2 backends x 2 dtypes x 2 directions.
  int count = 0;
  for (const Problem& q : family().benchmark_problems({}))
    if (q.op == "scale_residual") ++count;
  EXPECT_EQ(count, 2 * 2 * 2 * 2 * 2);
  EXPECT_THROW(sr::shape_of(Problem{"scale_residual", Backend::cpu, DType::f16, Direction::fwd,
                                    elementwise::model_args("test", 1, {4})}),
               Error);
}

TEST(ScaleResidual, VerifyAcceptsTheReferenceAndFailsPlantedErrors) {
  for (DType t : {DType::f32, DType::bf16}) {
    const std::string what = dtype_name(t);
    const sr::Shape f = sr::shape_of(scale_problem(t, Direction::fwd, 130, 70));
    const sr::Inputs fin = sr::make_inputs(f, 3);
    const sr::Outputs fy = scale_reference(f, fin);
    ASSERT_TRUE(sr::verify(f, fin, fy).ok) << sr::verify(f, fin, fy).message;
    // The next channel's gamma in one element; the residual left out of another.
    sr::Outputs bad = fy;
    const std::size_t at = 70 * 9 + 4;
    bad.out.set(at, fin.x.get(at) + fin.gamma.get(5) * fin.z.get(at));
    EXPECT_FALSE(sr::verify(f, fin, bad).ok) << what << " column";
    bad = fy;
    bad.out.set(at, fin.gamma.get(4) * fin.z.get(at));
    EXPECT_FALSE(sr::verify(f, fin, bad).ok) << what << " no residual";

    const sr::Shape b = sr::shape_of(scale_problem(t, Direction::bwd, 130, 70));
    const sr::Inputs bin = sr::make_inputs(b, 3);
    const sr::Outputs e = scale_reference(b, bin);
    ASSERT_TRUE(sr::verify(b, bin, e).ok) << sr::verify(b, bin, e).message;
    bad = e;
    bad.out.set(at, bin.dy.get(at));  // gamma not applied
    EXPECT_FALSE(sr::verify(b, bin, bad).ok) << what << " dz";
    bad = e;
    bad.dgamma.set(6, e.dgamma.get(6) - bin.dy.get(129 * 70 + 6) * bin.z.get(129 * 70 + 6));  // the last row dropped
    EXPECT_FALSE(sr::verify(b, bin, bad).ok) << what << " dgamma";
    bad = e;
    bad.dbias = plan_test::without_largest(e.out, e.dbias, 130, 70, 11);  // dz's largest term dropped
    EXPECT_FALSE(sr::verify(b, bin, bad).ok) << what << " dbias dropped row";
    bad = e;
    bad.dbias = plan_test::column_sums_of(bin.dy, 130, 70);  // the sums of dy, not of dz
    EXPECT_FALSE(sr::verify(b, bin, bad).ok) << what << " dbias of dy";
    bad = e;
    bad.dgamma.set(69, std::nan(""));
    EXPECT_FALSE(sr::verify(b, bin, bad).ok) << what << " dgamma unwritten";
  }
}

// One scale_residual plan on `backend` run on two sets of tensors in turn: fwd out of place, bwd in
// place over dy (as the ConvNeXt block runs it), with and without dbias. Shapes: one element; three
// column tiles by three row splits; more rows than one CPU chunk.
void expect_scale_plan_runs(Backend backend) {
  for (DType t : {DType::f32, DType::bf16})
    for (Direction d : {Direction::fwd, Direction::bwd})
      for (auto [rows, cols] : {std::pair<std::int64_t, std::int64_t>{1, 1}, {130, 70}, {600, 8}}) {
        const sr::Shape s = sr::shape_of(scale_problem(t, d, rows, cols));
        auto plan = sr::make_plan(s, backend);
        const bool bwd = d == Direction::bwd;
        sr::Inputs in[2] = {sr::make_inputs(s, 1), sr::make_inputs(s, 2)};
        sr::Outputs out[2] = {sr::make_outputs(s), sr::make_outputs(s)};
        gpu::DeviceBuffer x_d[2], z_d[2], g_d[2], o_d[2], dg_d[2], db_d[2];
        const auto args_of = [&](int k) {
          out[k].out = bwd ? in[k].dy : HostBuffer(s.dtype, static_cast<std::size_t>(s.count()));
          if (!bwd) out[k].out.poison();
          if (bwd) out[k].dgamma.poison(), out[k].dbias.poison();
          sr::Args a;
          if (backend == Backend::cpu) {
            a.x = in[k].x.data(), a.z = in[k].z.data(), a.gamma = in[k].gamma.as<float>(), a.out = out[k].out.data();
            if (bwd) a.dy = a.out, a.dgamma = out[k].dgamma.as<float>(), a.dbias = k ? out[k].dbias.as<float>() : nullptr;
            return a;
          }
          if (!bwd) x_d[k] = gpu::DeviceBuffer(in[k].x);
          z_d[k] = gpu::DeviceBuffer(in[k].z), g_d[k] = gpu::DeviceBuffer(in[k].gamma), o_d[k] = gpu::DeviceBuffer(out[k].out);
          a.x = x_d[k].get(), a.z = z_d[k].get(), a.gamma = g_d[k].as<float>(), a.out = o_d[k].get();
          if (bwd) {
            dg_d[k] = gpu::DeviceBuffer(out[k].dgamma), db_d[k] = gpu::DeviceBuffer(out[k].dbias);
            a.dy = a.out, a.dgamma = dg_d[k].as<float>(), a.dbias = k ? db_d[k].as<float>() : nullptr;
          }
          return a;
        };
        const auto check = [&](int i, int o) {
          if (backend == Backend::cuda) {
            o_d[o].download(out[o].out);
            if (bwd) dg_d[o].download(out[o].dgamma), db_d[o].download(out[o].dbias);
          }
          sr::Outputs got = out[o];
          if (bwd && o == 0) {  // run without dbias: it must stay unwritten; then check the rest
            for (std::size_t c = 0; c < got.dbias.count(); ++c)
              if (!std::isnan(got.dbias.get(c))) {
                Check written;
                written.ok = false, written.message = "dbias written without being asked";
                return written;
              }
            for (std::size_t c = 0; c < got.dbias.count(); ++c) {  // the sums of the stored dz
              double sum = 0;
              for (std::int64_t r = 0; r < rows; ++r) sum += got.out.get(static_cast<std::size_t>(r * cols) + c);
              got.dbias.set(c, sum);
            }
          }
          return sr::verify(s, in[i], got);
        };
        plan_test::expect_each_run_on_its_own_tensors(*plan, args_of, check,
                                                      std::string(dtype_name(t)) + " " + direction_name(d) + " " +
                                                          std::to_string(rows) + "x" + std::to_string(cols));
      }
}

HOTOPS_PLAN_TESTS(ScaleResidual, PlanRunsOnTheTensorsItIsGiven, expect_scale_plan_runs)

}  // namespace
}  // namespace hotops::pointwise
