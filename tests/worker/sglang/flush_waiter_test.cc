// FlushWaiter (SGLang's FlushCache{timeout_s}) over a scripted flush: retried until it succeeds
// or the deadline passes, every caller answered once; the bounds (waiting callers, a full
// executor) answer RESOURCE_EXHAUSTED at once; Shutdown answers whoever waits.
#include "services/worker/sglang/flush_waiter.h"

#include <atomic>
#include <memory>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace rl::worker {
namespace {

using ::testing::HasSubstr;

// Only a hang guard, never a speed assertion.
constexpr absl::Duration kHangGuard = absl::Seconds(60);

// The flush the waiter retries: not idle (FAILED_PRECONDITION) until the test says so.
class ScriptedFlush {
 public:
  absl::Status operator()() {
    absl::MutexLock lock(&mu_);
    ++attempts_;
    return result_;
  }
  void Set(absl::Status s) {
    absl::MutexLock lock(&mu_);
    result_ = std::move(s);
  }
  int attempts() {
    absl::MutexLock lock(&mu_);
    return attempts_;
  }
  bool WaitAttempts(int n) {
    absl::MutexLock lock(&mu_);
    auto done = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return attempts_ >= n; };
    return mu_.AwaitWithTimeout(absl::Condition(&done), kHangGuard);
  }

 private:
  absl::Mutex mu_;
  absl::Status result_ ABSL_GUARDED_BY(mu_) = absl::FailedPreconditionError("busy");
  int attempts_ ABSL_GUARDED_BY(mu_) = 0;
};

// One caller's answer.
struct Answer {
  absl::Notification done;
  absl::Status status;
  FlushWaiter::Done Callback() {
    return [this](const absl::Status& s) {
      status = s;
      done.Notify();
    };
  }
  bool Wait() { return done.WaitForNotificationWithTimeout(kHangGuard); }
};

class FlushWaiterTest : public ::testing::Test {
 protected:
  void Make(int threads, size_t queued, size_t max_waiting) {
    executor_ = std::make_unique<BoundedExecutor>("flush-test", threads, queued);
    waiter_ = std::make_unique<FlushWaiter>([this] { return flush_(); }, executor_.get(),
                                            max_waiting, absl::Milliseconds(1));
  }
  void TearDown() override {
    if (!release_.HasBeenNotified()) release_.Notify();
    if (waiter_) waiter_->Shutdown();
    executor_.reset();  // runs or finishes the pump
    waiter_.reset();
  }

  ScriptedFlush flush_;
  // Holds an executor thread until TearDown; outlives the executor's tasks (TearDown joins).
  absl::Notification release_;
  std::unique_ptr<BoundedExecutor> executor_;
  std::unique_ptr<FlushWaiter> waiter_;
};

TEST_F(FlushWaiterTest, RetriesUntilIdleThenAnswersEveryCaller) {
  Make(/*threads=*/1, /*queued=*/4, /*max_waiting=*/8);
  Answer a, b;
  waiter_->Add(absl::Now() + kHangGuard, a.Callback());
  waiter_->Add(absl::Now() + kHangGuard, b.Callback());
  ASSERT_TRUE(flush_.WaitAttempts(3));  // polled while busy
  EXPECT_FALSE(a.done.HasBeenNotified());
  flush_.Set(absl::OkStatus());
  ASSERT_TRUE(a.Wait() && b.Wait());
  EXPECT_TRUE(a.status.ok()) << a.status;
  EXPECT_TRUE(b.status.ok()) << b.status;
}

TEST_F(FlushWaiterTest, APassedDeadlineAnswersNotIdleAfterOneTry) {
  Make(1, 4, 8);
  Answer now;
  waiter_->Add(absl::Now(), now.Callback());  // timeout 0: one try
  ASSERT_TRUE(now.Wait());
  EXPECT_EQ(now.status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_GE(flush_.attempts(), 1);
  Answer soon;
  waiter_->Add(absl::Now() + absl::Milliseconds(30), soon.Callback());
  ASSERT_TRUE(soon.Wait());
  EXPECT_EQ(soon.status.code(), absl::StatusCode::kFailedPrecondition);
}

TEST_F(FlushWaiterTest, AnotherErrorIsAnsweredAtOnce) {
  Make(1, 4, 8);
  flush_.Set(absl::InternalError("engine stopped"));
  Answer a;
  waiter_->Add(absl::Now() + kHangGuard, a.Callback());
  ASSERT_TRUE(a.Wait());
  EXPECT_EQ(a.status.code(), absl::StatusCode::kInternal);
  EXPECT_EQ(flush_.attempts(), 1);
}

TEST_F(FlushWaiterTest, TooManyWaitingCallersAreRefused) {
  Make(1, 4, /*max_waiting=*/2);
  Answer a, b, c;
  waiter_->Add(absl::Now() + kHangGuard, a.Callback());
  waiter_->Add(absl::Now() + kHangGuard, b.Callback());
  waiter_->Add(absl::Now() + kHangGuard, c.Callback());
  ASSERT_TRUE(c.Wait());
  EXPECT_EQ(c.status.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(c.status.message(), HasSubstr("2 flushes already wait"));
  EXPECT_FALSE(a.done.HasBeenNotified());
  flush_.Set(absl::OkStatus());
  ASSERT_TRUE(a.Wait() && b.Wait());
  EXPECT_TRUE(a.status.ok() && b.status.ok());
}

// The pump runs on the shared executor: when that is full, the flush is refused at once.
TEST_F(FlushWaiterTest, AFullExecutorRefusesTheFlush) {
  Make(/*threads=*/1, /*queued=*/1, 8);
  ASSERT_TRUE(executor_->Submit([this] { release_.WaitForNotification(); }));
  // The executor's one thread takes it; then one more task fills the queue.
  while (executor_->queued() > 0) absl::SleepFor(absl::Milliseconds(1));
  ASSERT_TRUE(executor_->Submit([] {}));
  Answer a;
  waiter_->Add(absl::Now() + kHangGuard, a.Callback());
  ASSERT_TRUE(a.Wait());
  EXPECT_EQ(a.status.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(a.status.message(), HasSubstr("admin executor is full"));
  EXPECT_EQ(flush_.attempts(), 0);
}

TEST_F(FlushWaiterTest, ShutdownAnswersWhoeverWaitsAndRefusesNewCallers) {
  Make(1, 4, 8);
  Answer a;
  waiter_->Add(absl::Now() + kHangGuard, a.Callback());
  ASSERT_TRUE(flush_.WaitAttempts(1));
  waiter_->Shutdown();
  ASSERT_TRUE(a.Wait());
  EXPECT_EQ(a.status.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(a.status.message(), HasSubstr("shutting down"));
  Answer late;
  waiter_->Add(absl::Now() + kHangGuard, late.Callback());
  ASSERT_TRUE(late.Wait());
  EXPECT_EQ(late.status.code(), absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace rl::worker
