// The collectives family: names and sizes, nccl-tests' bandwidth formulas, exact inputs and the
// exact check (a planted wrong element fails it), and why an entry without its GPUs does not run.
// The collectives themselves run in the registry's tests (gpus:1, a communicator of one process)
// and, over 2 and 4 GPUs, in the bench smoke tests (bench --hotops_gpus=G).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <set>
#include <string>

#include "hotops/dtype.h"
#include "kernels/collectives/collectives.h"

namespace hotops::collectives {
namespace {

constexpr Kind kKinds[] = {Kind::allreduce, Kind::reduce_scatter, Kind::allgather, Kind::broadcast};

TEST(Collectives, NamesFollowTheScheme) {
  std::set<std::string> names;
  for (const Problem& p : family().benchmark_problems({})) names.insert(p.name());
  for (const char* n : {"allreduce/cuda/f32/fwd/bytes:268435456/gpus:4/inplace:1",
                        "allreduce/cuda/bf16/fwd/bytes:1073741824/gpus:2/inplace:0", "allreduce/cuda/f32/fwd/bytes:8/gpus:8/inplace:0",
                        "reduce_scatter/cuda/f32/fwd/bytes:32/gpus:8/inplace:1", "allgather/cuda/bf16/fwd/bytes:16/gpus:8/inplace:0",
                        "broadcast/cuda/f32/fwd/bytes:8/gpus:2/inplace:1"})
    EXPECT_TRUE(names.count(n)) << n;
  // A reduce-scatter or all-gather must split into one whole part of elements per GPU.
  EXPECT_FALSE(names.count("reduce_scatter/cuda/f32/fwd/bytes:16/gpus:8/inplace:0"));
  EXPECT_FALSE(names.count("allgather/cuda/bf16/fwd/bytes:8/gpus:8/inplace:0"));
  for (const Problem& p : family().benchmark_problems({})) {
    const Shape s = shape_of(p);
    EXPECT_GE(s.bytes, 8u) << p.name();
    EXPECT_LE(s.bytes, std::size_t(1) << 30) << p.name();
    EXPECT_EQ(s.bytes & (s.bytes - 1), 0u) << p.name() << ": sizes are powers of 2";
    EXPECT_TRUE(s.gpus == 2 || s.gpus == 4 || s.gpus == 8) << p.name();
    EXPECT_EQ(s.send_count() * (s.op == Kind::allgather ? s.gpus : 1), s.elements()) << p.name();
    EXPECT_EQ(s.recv_count() * (s.op == Kind::reduce_scatter ? s.gpus : 1), s.elements()) << p.name();
  }
  // 28 sizes from 8 B to 1 GiB for an all-reduce of each dtype, GPU count and placement.
  EXPECT_EQ(std::count_if(names.begin(), names.end(), [](const std::string& n) {
              return n.rfind("allreduce/cuda/f32/", 0) == 0 && n.find("/gpus:4/inplace:1") != std::string::npos;
            }),
            28);
}

TEST(Collectives, BusBandwidthFollowsNcclTests) {
  EXPECT_DOUBLE_EQ(busbw_factor(Kind::allreduce, 2), 1.0);
  EXPECT_DOUBLE_EQ(busbw_factor(Kind::allreduce, 4), 1.5);
  EXPECT_DOUBLE_EQ(busbw_factor(Kind::allreduce, 8), 1.75);
  EXPECT_DOUBLE_EQ(busbw_factor(Kind::reduce_scatter, 4), 0.75);
  EXPECT_DOUBLE_EQ(busbw_factor(Kind::allgather, 8), 0.875);
  EXPECT_DOUBLE_EQ(busbw_factor(Kind::broadcast, 4), 1.0);
  const Problem p{"allreduce", Backend::cuda, DType::f32, Direction::fwd,
                  {{"bytes", "268435456"}, {"gpus", "4"}, {"inplace", "1"}}};
  const Work w = family().work(p);
  EXPECT_DOUBLE_EQ(w.bytes, 268435456.0);      // algbw = bytes / time
  EXPECT_DOUBLE_EQ(w.bus_bytes, 1.5 * 268435456.0);  // busbw = algbw x 2(n-1)/n
}

TEST(Collectives, InputsSumExactlyInEveryDtype) {
  // The largest sum of 8 ranks' inputs, and every partial sum on the way, is an integer that the
  // dtype holds exactly.
  for (DType t : {DType::f32, DType::bf16}) {
    double largest = 0;
    for (std::size_t i = 0; i < 4096; ++i)
      for (int r = 0; r < 8; ++r) {
        const double v = input_value(t, 7, r, i);
        EXPECT_EQ(v, std::floor(v));
        EXPECT_GE(v, 1);
        largest = std::max(largest, v);
      }
    const double bound = 8 * largest;
    if (t == DType::bf16) {
      EXPECT_LE(bound, 256);
      for (int k = 1; k <= static_cast<int>(bound); ++k) EXPECT_EQ(bf16_to_float(float_to_bf16(static_cast<float>(k))), k);
    } else {
      EXPECT_LT(bound, 1 << 24);
    }
  }
  // Ranks give different numbers, so a rank's part in the wrong place shows.
  EXPECT_NE(input_value(DType::f32, 7, 0, 5), input_value(DType::f32, 7, 1, 5));
}

// The output a correct collective leaves on rank `rank` of `gpus`, built from the definition.
HostBuffer correct_output(const Shape& s, const Inputs& in) {
  HostBuffer out = make_output(s);
  if (s.inplace) {
    for (std::size_t i = 0; i < out.count(); ++i) out.set(i, in.data.get(i));  // the rest of the buffer as it was
  }
  for (std::size_t i = 0; i < s.recv_count(); ++i) out.set(s.recv_offset() + i, expected(s, in.seed, i));
  return out;
}

TEST(Collectives, TheExactCheckCatchesAPlantedWrongElement) {
  for (Kind k : kKinds)
    for (DType t : {DType::f32, DType::bf16})
      for (bool inplace : {false, true}) {
        Shape s;
        s.op = k, s.dtype = t, s.bytes = 4096, s.gpus = 4, s.inplace = inplace, s.rank = 2;
        const Inputs in = make_inputs(s, 11);
        HostBuffer out = correct_output(s, in);
        const std::string what = std::string(kind_name(k)) + " " + dtype_name(t) + (inplace ? " in place" : "");
        const Check good = verify(s, in, out);
        EXPECT_TRUE(good.ok) << what << ": " << good.message;
        EXPECT_EQ(good.checked, s.recv_count()) << what;
        // One element off by one (the smallest error an integer result can have).
        const std::size_t j = s.recv_offset() + s.recv_count() / 3;
        out.set(j, out.get(j) + 1);
        const Check bad = verify(s, in, out);
        EXPECT_FALSE(bad.ok) << what;
        EXPECT_NE(bad.message.find("1 of " + std::to_string(s.recv_count()) + " elements"), std::string::npos) << bad.message;
        EXPECT_NE(bad.message.find("element " + std::to_string(s.recv_count() / 3) + " is"), std::string::npos) << bad.message;
        // An element never written (poisoned: NaN).
        out = correct_output(s, in);
        out.set(s.recv_offset() + s.recv_count() - 1, NAN);
        EXPECT_FALSE(verify(s, in, out).ok) << what;
        // Another rank's result: the right numbers in the wrong place.
        Shape other = s;
        other.rank = 1;
        const HostBuffer theirs = correct_output(other, make_inputs(other, 11));
        if (k == Kind::reduce_scatter) {
          EXPECT_FALSE(verify(s, in, theirs).ok) << what;
        }
      }
}

TEST(Collectives, InPlaceInputsSitWhereNcclReadsThem) {
  Shape s;
  s.op = Kind::allgather, s.dtype = DType::f32, s.bytes = 64, s.gpus = 4, s.inplace = true, s.rank = 2;
  const Inputs in = make_inputs(s, 3);
  ASSERT_EQ(in.data.count(), 16u);
  for (std::size_t i = 0; i < 16; ++i) {
    if (i / 4 == 2) {
      EXPECT_EQ(in.data.get(i), input_value(DType::f32, 3, 2, i % 4)) << i;
    } else {
      EXPECT_TRUE(std::isnan(in.data.get(i))) << i << ": the other ranks' parts start poisoned";
    }
  }
  s.op = Kind::broadcast;
  EXPECT_TRUE(std::isnan(make_inputs(s, 3).data.get(0))) << "only the root holds the broadcast's input";
  s.op = Kind::reduce_scatter;
  EXPECT_EQ(s.recv_offset(), 2 * s.recv_count());
}

TEST(Collectives, AnEntryWithoutItsGpusSaysWhy) {
  ranks::Layout alone;
  EXPECT_EQ(gpus_unsupported_reason(1, alone, 1), "");
  EXPECT_EQ(gpus_unsupported_reason(2, alone, 4), "needs 2 GPUs in the run; start bench with --hotops_gpus=2");
  EXPECT_EQ(gpus_unsupported_reason(4, alone, 2),
            "needs 4 GPUs in the run; start bench with --hotops_gpus=4 on a machine with 4 GPUs (this one has 2)");
  ranks::Layout two;
  two.world = 2, two.source = "--hotops_gpus";
  EXPECT_EQ(gpus_unsupported_reason(2, two, 2), "");
  EXPECT_EQ(gpus_unsupported_reason(8, two, 2), "needs 8 GPUs; the run has 2 (--hotops_gpus)");
}

TEST(Collectives, TestProblemsRunOnOneGpu) {
  for (const Problem& p : family().test_problems()) {
    EXPECT_EQ(p.get("gpus"), "1") << p.name();
    EXPECT_NO_THROW(shape_of(p)) << p.name();
  }
}

// On one GPU (a communicator of this process alone): the planted bugs every op case must catch
// (include/hotops/plan.h) fail the exact check of each collective.
TEST(CollectivesCuda, APlantedBugFailsTheExactCheck) {
  for (const Problem& p : family().test_problems()) {
    if (p.get("bytes") != "1048576") continue;
    const std::string why = family().unsupported_reason(p);
    if (!why.empty()) GTEST_SKIP() << why;
    ASSERT_TRUE(family().make(p)->verify().ok) << p.name();
    for (const std::string m : {"shift_output", "zero_input"}) {
      // In place, the one buffer is the op's input and output: a shift or zeroed input is a new
      // buffer that the check does not read (the Binder's in-out slots are not mutated).
      if (p.get("inplace") == "1") continue;
      set_test_mutation(m);
      const Check c = family().make(p)->verify();
      set_test_mutation("");
      EXPECT_FALSE(c.ok) << p.name() << " with the planted bug " << m << " passed";
      EXPECT_NE(c.message.find("are not exact"), std::string::npos) << c.message;
    }
  }
}

}  // namespace
}  // namespace hotops::collectives
