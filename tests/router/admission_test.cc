// Admission (services/router/admission.h): the in-flight bound, the queue bound with
// RESOURCE_EXHAUSTED naming the flags, round-robin hand-over between clients, withdrawal, and
// a full queue giving the newest place of the longest client queue to a newcomer.
#include "services/router/admission.h"

#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace rl::router {
namespace {

struct Recorder final : Admission::Waiter {
  explicit Recorder(std::string n, std::vector<std::string>* log) : name(std::move(n)), log(log) {}
  void Admitted(const absl::Status& status) override {
    log->push_back(
        name + (status.ok() ? ":ok" : ":" + std::string(absl::StatusCodeToString(status.code()))));
  }
  std::string name;
  std::vector<std::string>* log;
};

TEST(AdmissionTest, SlotsThenFairQueueThenRefusal) {
  Admission a(AdmissionOptions{2, 4});
  std::vector<std::string> log;
  std::vector<std::unique_ptr<Recorder>> w;
  auto admit = [&](const std::string& client, const std::string& name) {
    w.push_back(std::make_unique<Recorder>(name, &log));
    return a.Admit(client, w.back().get());
  };
  EXPECT_EQ(*admit("A", "a1"), Admission::Result::kAdmitted);
  EXPECT_EQ(*admit("A", "a2"), Admission::Result::kAdmitted);
  EXPECT_EQ(*admit("A", "a3"), Admission::Result::kQueued);
  EXPECT_EQ(*admit("A", "a4"), Admission::Result::kQueued);
  EXPECT_EQ(*admit("A", "a5"), Admission::Result::kQueued);
  EXPECT_EQ(*admit("B", "b1"), Admission::Result::kQueued);
  EXPECT_EQ(a.in_flight(), 2);
  EXPECT_EQ(a.queued(), 4);
  // Full; B has fewer waiting than A: A's newest gives its place to B's newcomer.
  EXPECT_EQ(*admit("B", "b2"), Admission::Result::kQueued);
  EXPECT_EQ(log, (std::vector<std::string>{"a5:RESOURCE_EXHAUSTED"}));
  // Full and B now holds as many as A (2 each): refused at once, naming the bounds.
  absl::StatusOr<Admission::Result> r = admit("B", "b3");
  ASSERT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(r.status().message().find("--max-in-flight 2"), std::string::npos);
  EXPECT_NE(r.status().message().find("--max-queued 4"), std::string::npos);
  // Freed slots go to the clients in turn: A, B, A, B.
  log.clear();
  for (int i = 0; i < 4; ++i) a.Release();
  EXPECT_EQ(log, (std::vector<std::string>{"a3:ok", "b1:ok", "a4:ok", "b2:ok"}));
  EXPECT_EQ(a.in_flight(), 2);
  EXPECT_EQ(a.queued(), 0);
  a.Release();
  a.Release();
  EXPECT_EQ(a.in_flight(), 0);
}

// --max-in-flight 0: the bound follows SetLimit (the workers' capacity). Raised, it admits
// waiters at once, in turn; lowered, freed slots are not handed over until under it again.
TEST(AdmissionTest, AnAutomaticBoundFollowsTheCapacity) {
  Admission a(AdmissionOptions{0, 100});
  a.SetLimit(1);
  std::vector<std::string> log;
  std::vector<std::unique_ptr<Recorder>> w;
  auto admit = [&](const std::string& client, const std::string& name) {
    w.push_back(std::make_unique<Recorder>(name, &log));
    return a.Admit(client, w.back().get());
  };
  EXPECT_EQ(*admit("A", "a1"), Admission::Result::kAdmitted);
  EXPECT_EQ(*admit("A", "a2"), Admission::Result::kQueued);
  EXPECT_EQ(*admit("A", "a3"), Admission::Result::kQueued);
  EXPECT_EQ(*admit("B", "b1"), Admission::Result::kQueued);
  a.SetLimit(3);
  EXPECT_EQ(log, (std::vector<std::string>{"a2:ok", "b1:ok"}));
  EXPECT_EQ(a.in_flight(), 3);
  EXPECT_EQ(a.limit(), 3);
  a.SetLimit(1);  // two over the bound now: the next two releases hand nothing over
  a.Release();
  a.Release();
  EXPECT_EQ(log.size(), 2u);
  EXPECT_EQ(a.in_flight(), 1);
  a.Release();
  EXPECT_EQ(log.back(), "a3:ok");
  EXPECT_EQ(a.in_flight(), 1);
  absl::StatusOr<Admission::Result> r = Admission(AdmissionOptions{0, 0}).Admit("C", nullptr);
  EXPECT_EQ(*r, Admission::Result::kAdmitted);  // one slot before any capacity is known
  // A fixed bound ignores SetLimit.
  Admission fixed(AdmissionOptions{2, 10});
  fixed.SetLimit(50);
  EXPECT_EQ(fixed.limit(), 2);
}

TEST(AdmissionTest, WithdrawnWaitersAreNeverCalled) {
  Admission a(AdmissionOptions{1, 10});
  std::vector<std::string> log;
  Recorder first("first", &log), second("second", &log), third("third", &log);
  EXPECT_EQ(*a.Admit("A", &first), Admission::Result::kAdmitted);
  EXPECT_EQ(*a.Admit("A", &second), Admission::Result::kQueued);
  EXPECT_EQ(*a.Admit("B", &third), Admission::Result::kQueued);
  EXPECT_TRUE(a.Withdraw("A", &second));
  EXPECT_FALSE(a.Withdraw("A", &second));
  a.Release();
  EXPECT_EQ(log, (std::vector<std::string>{"third:ok"}));
  EXPECT_FALSE(a.Withdraw("B", &third));  // admitted already
  a.Release();
  EXPECT_EQ(a.in_flight(), 0);
  EXPECT_EQ(a.queued(), 0);
}

TEST(AdmissionTest, NoQueueRefusesAtOnce) {
  Admission a(AdmissionOptions{1, 0});
  std::vector<std::string> log;
  Recorder one("one", &log), two("two", &log);
  EXPECT_EQ(*a.Admit("A", &one), Admission::Result::kAdmitted);
  EXPECT_EQ(a.Admit("B", &two).status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(log.empty());
}

}  // namespace
}  // namespace rl::router
