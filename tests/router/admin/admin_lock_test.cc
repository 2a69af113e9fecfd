// AdminLock (services/router/admin/admin_lock.h): one holder at a time, a bounded wait that
// ends UNAVAILABLE naming the call, and a release from another thread letting a waiter in.
#include "services/router/admin/admin_lock.h"

#include <thread>

#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"

namespace rl::router::admin {
namespace {

TEST(AdminLockTest, OneHolderAndABoundedWait) {
  AdminLock lock(std::chrono::milliseconds(50));
  ASSERT_TRUE(lock.Acquire("PauseGeneration").ok());
  const absl::Status busy = lock.Acquire("FlushCache");
  EXPECT_TRUE(absl::IsUnavailable(busy)) << busy;
  EXPECT_NE(busy.message().find("FlushCache"), std::string::npos) << busy;
  EXPECT_NE(busy.message().find("admin lock"), std::string::npos) << busy;
  lock.Release();
  EXPECT_TRUE(lock.Acquire("FlushCache").ok());
  lock.Release();
}

TEST(AdminLockTest, AReleaseFromAnotherThreadLetsTheWaiterIn) {
  AdminLock lock(std::chrono::seconds(60));
  ASSERT_TRUE(lock.Acquire("UpdateWeightsFromDisk").ok());
  absl::Notification acquired;
  absl::Status waited;
  std::thread waiter([&] {
    waited = lock.Acquire("catch-up");
    acquired.Notify();
  });
  EXPECT_FALSE(acquired.WaitForNotificationWithTimeout(absl::Milliseconds(50)));
  std::thread([&] { lock.Release(); }).join();  // the broadcast's own thread may differ
  waiter.join();
  EXPECT_TRUE(acquired.HasBeenNotified());
  EXPECT_TRUE(waited.ok()) << waited;
  lock.Release();
}

}  // namespace
}  // namespace rl::router::admin
