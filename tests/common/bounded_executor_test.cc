// BoundedExecutor (common/bounded_executor.h): tasks run on the fixed threads in order, a full
// queue refuses a task without consuming it, and destruction runs what is still queued.
#include "common/bounded_executor.h"

#include <atomic>
#include <vector>

#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"

namespace rl {
namespace {

TEST(BoundedExecutorTest, RunsTasksAndRefusesPastTheBound) {
  std::atomic<int> ran{0};
  absl::Notification release;
  absl::Notification started;
  {
    BoundedExecutor ex("test-pool", 1, 2);
    EXPECT_EQ(ex.num_threads(), 1);
    ASSERT_TRUE(ex.Submit([&] {
      started.Notify();
      release.WaitForNotification();
      ran.fetch_add(1);
    }));
    started.WaitForNotification();  // the one thread is busy: the next two wait in the queue
    ASSERT_TRUE(ex.Submit([&] { ran.fetch_add(1); }));
    ASSERT_TRUE(ex.Submit([&] { ran.fetch_add(1); }));
    EXPECT_EQ(ex.queued(), 2u);
    absl::AnyInvocable<void() &&> refused = [&] { ran.fetch_add(100); };
    EXPECT_FALSE(ex.Submit(std::move(refused)));
    EXPECT_TRUE(static_cast<bool>(refused));  // left to the caller
    EXPECT_EQ(ex.BusyError().code(), absl::StatusCode::kResourceExhausted);
    EXPECT_NE(ex.BusyError().message().find("test-pool"), std::string::npos);
    release.Notify();
  }  // the destructor runs the queued tasks, then joins
  EXPECT_EQ(ran.load(), 3);
}

}  // namespace
}  // namespace rl
