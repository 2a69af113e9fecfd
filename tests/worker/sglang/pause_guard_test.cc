// PauseGuard on synthetic time (Tick) and, once, with its poll thread.
#include "services/worker/sglang/pause_guard.h"

#include <atomic>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace rl::worker {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::UnorderedElementsAre;

class PauseGuardTest : public ::testing::Test {
 protected:
  PauseGuardTest()
      : guard_([this] { return paused_.load(); },
               [this](const std::string& id, const std::string& why) {
                 absl::MutexLock lock(&mu_);
                 aborted_.push_back(id);
                 last_why_ = why;
               },
               absl::Seconds(10)) {}

  std::vector<std::string> Aborted() {
    absl::MutexLock lock(&mu_);
    return aborted_;
  }

  const absl::Time t0_ = absl::FromUnixSeconds(1000);
  std::atomic<bool> paused_{false};
  absl::Mutex mu_;
  std::vector<std::string> aborted_ ABSL_GUARDED_BY(mu_);
  std::string last_why_ ABSL_GUARDED_BY(mu_);
  PauseGuard guard_;  // never started: the tests tick it
};

TEST_F(PauseGuardTest, AShortPauseAbortsNothing) {
  guard_.Track("a");
  paused_ = true;
  guard_.Tick(t0_);
  guard_.Tick(t0_ + absl::Seconds(9));
  EXPECT_TRUE(guard_.CheckAdmission().ok());
  paused_ = false;
  guard_.Tick(t0_ + absl::Seconds(9.5));
  // A new pause starts its own clock.
  paused_ = true;
  guard_.Tick(t0_ + absl::Seconds(12));
  guard_.Tick(t0_ + absl::Seconds(21));
  EXPECT_THAT(Aborted(), IsEmpty());
  EXPECT_TRUE(guard_.CheckAdmission().ok());
}

TEST_F(PauseGuardTest, APauseOverTheBoundEndsTrackedRequestsAndRefusesNewOnes) {
  guard_.Track("a");
  const uint64_t b = guard_.Track("b");
  guard_.Track("c");
  guard_.Untrack(b);  // finished before
  paused_ = true;
  guard_.Tick(t0_);
  guard_.Tick(t0_ + absl::Seconds(10));
  EXPECT_THAT(Aborted(), UnorderedElementsAre("a", "c"));
  {
    absl::MutexLock lock(&mu_);
    EXPECT_THAT(last_why_, HasSubstr("paused for more than 10s"));
    EXPECT_THAT(last_why_, HasSubstr("--sglang-pause-timeout-s"));
  }
  absl::Status s = guard_.CheckAdmission();
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(s.message(), HasSubstr("retry on another worker"));
  // One admitted just before the sample that found the bound passed ends at the next one.
  guard_.Track("d");
  guard_.Tick(t0_ + absl::Seconds(10.05));
  EXPECT_THAT(Aborted(), UnorderedElementsAre("a", "c", "d"));
  // Resumed: admitted again, and tracked requests are left alone.
  paused_ = false;
  guard_.Tick(t0_ + absl::Seconds(11));
  EXPECT_TRUE(guard_.CheckAdmission().ok());
  guard_.Track("e");
  guard_.Tick(t0_ + absl::Seconds(30));
  EXPECT_EQ(Aborted().size(), 3u);
}

TEST_F(PauseGuardTest, UntrackedTokensAreNeverAborted) {
  const uint64_t a = guard_.Track("a");
  guard_.Untrack(a);
  guard_.Untrack(a);  // twice: harmless
  guard_.Untrack(12345);
  paused_ = true;
  guard_.Tick(t0_);
  guard_.Tick(t0_ + absl::Minutes(5));
  EXPECT_THAT(Aborted(), IsEmpty());
}

TEST(PauseGuardThreadTest, ThePollThreadEndsARequestOnAPausedWorker) {
  std::atomic<bool> paused{true};
  absl::Mutex mu;
  std::vector<std::string> aborted;
  PauseGuard guard([&] { return paused.load(); },
                   [&](const std::string& id, const std::string&) {
                     absl::MutexLock lock(&mu);
                     aborted.push_back(id);
                   },
                   absl::Milliseconds(20), absl::Milliseconds(2));
  guard.Track("r");
  guard.Start();
  {
    absl::MutexLock lock(&mu);
    EXPECT_TRUE(
        mu.AwaitWithTimeout(absl::Condition(
                                +[](std::vector<std::string>* v) { return !v->empty(); }, &aborted),
                            absl::Seconds(30)));
    EXPECT_THAT(aborted, ElementsAre("r"));
  }
  guard.Shutdown();
  guard.Shutdown();  // idempotent
}

}  // namespace
}  // namespace rl::worker
