// The threads' time waiting for a core (hotops/core_time.h).
#include "hotops/core_time.h"

#include <gtest/gtest.h>

#include <chrono>
#include <optional>
#include <thread>

#include "test/spinners.h"

namespace hotops {
namespace {

TEST(CoreTime, WaitedShareOfTheTimeWanted) {
  EXPECT_DOUBLE_EQ(waited_pct({1.0, 0.5}, {2.0, 1.5}), 50.0);  // 1 s on a core, 1 s waiting
  EXPECT_DOUBLE_EQ(waited_pct({0, 0}, {3.0, 1.0}), 25.0);
  EXPECT_DOUBLE_EQ(waited_pct({1.0, 1.0}, {2.0, 1.0}), 0.0);  // no wait
  EXPECT_DOUBLE_EQ(waited_pct({1.0, 1.0}, {1.0, 1.0}), 0.0);  // no time wanted
}

// The hypervisor's steal counts in the share that fell on the threads: all of it for a team as large
// as the machine, a sixteenth for one thread of 16 CPUs; none without a steady-clock interval.
TEST(CoreTime, StealCountsInTheShareThatFellOnTheThreads) {
  const CoreTime before{0, 0, 0, 10.0, 16};
  EXPECT_NEAR(waited_pct(before, {1.6, 0, 0.4, 10.1, 16}), 20.0, 1e-9);   // 16 threads busy: 0.4 of 2.0
  EXPECT_NEAR(waited_pct(before, {0.1, 0, 0.4, 10.1, 16}), 20.0, 1e-9);   // 1 thread: 0.025 of 0.125
  EXPECT_NEAR(waited_pct(before, {0.1, 0.1, 0.4, 10.1, 16}), 60.0, 1e-9);  // and waiting: 0.15 of 0.25
  EXPECT_DOUBLE_EQ(waited_pct({1.0, 0.5}, {2.0, 1.5, 0.4}), 50.0);        // no interval: waits alone
}

// /proc/stat's per-CPU steal (the eighth value, in ticks), summed over the CPUs asked for; the
// machine's "cpu" line and CPUs not asked for are left out.
TEST(CoreTime, StealOfTheProcessCpusFromProcStat) {
  const std::string text =
      "cpu  900 0 90 9000 9 0 9 70 0 0\n"
      "cpu0 100 0 10 1000 1 0 1 20 0 0\n"
      "cpu1 100 0 10 1000 1 0 1 30 0 0\n"
      "cpu12 100 0 10 1000 1 0 1 5 0 0\n"
      "intr 12345 0 0\n"
      "ctxt 999\n";
  EXPECT_DOUBLE_EQ(stolen_seconds(text, {0, 1, 12}, 100), 0.55);
  EXPECT_DOUBLE_EQ(stolen_seconds(text, {1}, 100), 0.30);
  EXPECT_DOUBLE_EQ(stolen_seconds(text, {2, 3}, 100), 0.0);
  EXPECT_DOUBLE_EQ(stolen_seconds("cpu0 1 2 3\n", {0}, 100), 0.0);  // a kernel without the column
}

// Twice as many spinning threads as cores: every thread waits for a core about half of the time
// it wants one. (The bound leaves room for a machine that gives the process fewer cores than it
// lists, which makes the waits longer, not shorter.)
TEST(CoreTime, ThreadsThatOutnumberTheCoresWait) {
  const std::optional<CoreTime> before = core_time();
  if (!before) GTEST_SKIP() << "this kernel reports no per-thread scheduler statistics (/proc/self/task/*/schedstat)";
  test::Spinners spinners;
  std::this_thread::sleep_for(std::chrono::milliseconds(400));
  // Read while the spinners run: a thread that has ended is in no task's statistics.
  const std::optional<CoreTime> after = core_time();
  spinners.stop();
  ASSERT_TRUE(after);
  EXPECT_GT(after->ran - before->ran, 0.1) << "the spinners ran";
  EXPECT_GT(waited_pct(*before, *after), 25) << spinners.count() << " spinning threads";
}

}  // namespace
}  // namespace hotops
