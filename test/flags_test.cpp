// hotops' own flags: parsed, removed from argv, and bad values refused with one clear message.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "hotops/flags.h"

namespace hotops {
namespace {

struct Argv {
  std::vector<std::string> store;
  std::vector<char*> ptrs;
  int argc = 0;
  explicit Argv(std::vector<std::string> a) : store(std::move(a)) {
    store.insert(store.begin(), "bench");
    for (auto& s : store) ptrs.push_back(s.data());
    ptrs.push_back(nullptr);
    argc = static_cast<int>(store.size());
  }
};

TEST(Flags, ParsesAndRemovesHotopsFlagsOnly) {
  Argv a({"--benchmark_filter=addmm", "--hotops_batch=1,8,32", "--hotops_verify=0", "--hotops_cold_l2",
          "--hotops_threads=4", "--hotops_seed=7", "--benchmark_min_time=0.01"});
  const Options o = parse_flags(a.argc, a.ptrs.data());
  EXPECT_EQ(o.batches, (std::vector<std::int64_t>{1, 8, 32}));
  EXPECT_FALSE(o.verify);
  EXPECT_TRUE(o.cold_l2);
  EXPECT_EQ(o.threads, 4);
  EXPECT_EQ(o.seed, 7u);
  ASSERT_EQ(a.argc, 3);
  EXPECT_STREQ(a.ptrs[1], "--benchmark_filter=addmm");
  EXPECT_STREQ(a.ptrs[2], "--benchmark_min_time=0.01");
  EXPECT_EQ(a.ptrs[3], nullptr);
}

TEST(Flags, DefaultsWhenAbsent) {
  Argv a({});
  const Options o = parse_flags(a.argc, a.ptrs.data());
  EXPECT_TRUE(o.batches.empty());
  EXPECT_TRUE(o.verify);
  EXPECT_FALSE(o.cold_l2);
  EXPECT_EQ(o.threads, 0);
}

TEST(Flags, BadValuesThrowOneLineNamingTheFlag) {
  const std::vector<std::string> bad = {
      "--hotops_batch=0",       "--hotops_batch=-4",  "--hotops_batch=abc",    "--hotops_batch=1,,2",
      "--hotops_batch=",        "--hotops_batch",     "--hotops_batch=99999999999999999999",
      "--hotops_batch=2000000", "--hotops_verify=2",  "--hotops_verify=yes",   "--hotops_threads=0",
      "--hotops_threads=x",     "--hotops_cold_l2=7", "--hotops_nonsense=1",   "--hotops_seed=-1",
      "--hotops_throttle_threshold=2", "--hotops_throttle_threshold=x", "--hotops_throttle_threshold=",
      "--hotops_runs_per_sample=-1", "--hotops_runs_per_sample=100000"};
  for (const std::string& flag : bad) {
    Argv a({flag});
    try {
      parse_flags(a.argc, a.ptrs.data());
      ADD_FAILURE() << flag << " was accepted";
    } catch (const FlagError& e) {
      const std::string msg = e.what();
      EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
      EXPECT_NE(msg.find("--hotops_"), std::string::npos) << msg;
    }
  }
}

}  // namespace
}  // namespace hotops
