// RunAtLowPriority (common/low_priority.h): the work runs on another thread, niced by the
// amount asked (capped at 19), returns its value, and leaves the caller's priority as it was.
#include "common/low_priority.h"

#include <thread>

#include "gtest/gtest.h"

namespace rl {
namespace {

TEST(LowPriorityTest, RunsNicedOnAnotherThreadAndLeavesTheCallerAlone) {
  const int base = CurrentThreadNice();
  const std::thread::id caller = std::this_thread::get_id();
  std::thread::id ran_on;
  const int seen = RunAtLowPriority(5, [&] {
    ran_on = std::this_thread::get_id();
    return CurrentThreadNice();
  });
  EXPECT_NE(ran_on, caller);
  EXPECT_EQ(seen, std::min(base + 5, 19));
  EXPECT_EQ(CurrentThreadNice(), base);
  // Capped at 19; void work runs too.
  int capped = -100;
  RunAtLowPriority(100, [&] { capped = CurrentThreadNice(); });
  EXPECT_EQ(capped, 19);
  EXPECT_EQ(CurrentThreadNice(), base);
}

}  // namespace
}  // namespace rl
