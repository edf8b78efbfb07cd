// Every op x backend x dtype x direction of every registered family against its reference, at the
// family's small and odd test shapes. Cases this machine cannot run are skipped with the reason.
#include <gtest/gtest.h>

#include <cctype>

#include "hotops/op.h"

namespace hotops {
namespace {

struct OpCase {
  const Family* family;
  Problem problem;
};

void PrintTo(const OpCase& c, std::ostream* os) { *os << c.problem.name(); }

std::vector<OpCase> all_cases() {
  std::vector<OpCase> v;
  for (const Family* f : families())
    for (Problem& p : f->test_problems()) v.push_back({f, std::move(p)});
  return v;
}

std::string test_name(const testing::TestParamInfo<OpCase>& info) {
  std::string n = info.param.problem.name();
  for (char& c : n)
    if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
  return n;
}

class OpTest : public testing::TestWithParam<OpCase> {};

TEST_P(OpTest, MatchesReference) {
  const auto& [family, problem] = GetParam();
  const std::string why = family->unsupported_reason(problem);
  if (!why.empty()) GTEST_SKIP() << why;
  const auto c = family->make(problem);
  const Check chk = c->verify();
  EXPECT_TRUE(chk.ok) << problem.name() << ": " << chk.message;
  EXPECT_GT(chk.checked, 0u);
  EXPECT_FALSE(c->label().empty());
  // A second run must give the same verdict: nothing in the case depends on a first-run state.
  EXPECT_TRUE(c->verify().ok) << problem.name() << " failed on its second run";
}

INSTANTIATE_TEST_SUITE_P(Registry, OpTest, testing::ValuesIn(all_cases()), test_name);

TEST(Registry, BenchmarkProblemsHaveWorkAndSchemeNames) {
  for (const Family* f : families()) {
    const auto problems = f->benchmark_problems({});
    ASSERT_FALSE(problems.empty()) << f->name();
    ASSERT_FALSE(f->test_problems().empty()) << f->name();
    for (const Problem& p : problems) {
      const Work w = f->work(p);
      EXPECT_GE(w.flops, 0) << p.name();  // copies compute nothing
      EXPECT_GT(w.bytes, 0) << p.name();
      EXPECT_GE(w.items, 1) << p.name();
      EXPECT_EQ(p.name().rfind(p.op + "/" + backend_name(p.backend) + "/" + dtype_name(p.dtype) + "/" +
                                   direction_name(p.dir) + "/",
                               0),
                0u)
          << p.name();
    }
  }
}

TEST(Registry, BatchOverrideReplacesEveryBatchAxis) {
  for (const Family* f : families()) {
    for (const Problem& p : f->benchmark_problems({3, 5})) {
      if (auto b = p.batch()) {
        EXPECT_TRUE(*b == 3 || *b == 5) << p.name();
      }
    }
  }
}

TEST(Registry, SameProblemOnBothBackendsDiffersOnlyInBackendSegment) {
  Problem p{"addmm", Backend::cpu, DType::f32, Direction::fwd, {{"M", "2"}}};
  Problem q = p;
  q.backend = Backend::cuda;
  EXPECT_EQ(p.name(), "addmm/cpu/f32/fwd/M:2");
  EXPECT_EQ(q.name(), "addmm/cuda/f32/fwd/M:2");
  EXPECT_EQ(p.seed(), q.seed());  // and they compute on the same inputs
}

}  // namespace
}  // namespace hotops
