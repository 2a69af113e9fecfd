// RunAtLowPriority (common/low_priority.h): the work runs on another thread, niced by the
// amount asked (capped at 19), returns its value, and leaves the caller's priority as it was.
// LowerThreadPriority, which it and the weight updates' background threads share, lowers the
// calling thread only (and not at all for 0).
#include "common/low_priority.h"

#include <algorithm>
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

TEST(LowPriorityTest, LowerThreadPriorityLowersTheCallingThreadOnly) {
  const int base = CurrentThreadNice();
  int after_zero = -100, after_three = -100, capped = -100;
  std::thread t([&] {
    LowerThreadPriority(0);
    after_zero = CurrentThreadNice();
    LowerThreadPriority(3);
    after_three = CurrentThreadNice();
    LowerThreadPriority(100);
    capped = CurrentThreadNice();
  });
  t.join();
  EXPECT_EQ(after_zero, base);
  EXPECT_EQ(after_three, std::min(base + 3, 19));
  EXPECT_EQ(capped, 19);
  EXPECT_EQ(CurrentThreadNice(), base);
}

}  // namespace
}  // namespace rl
