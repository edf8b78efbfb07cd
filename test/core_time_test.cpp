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
