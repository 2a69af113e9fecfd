// AdminLease (services/worker/control/admin_lease.h) on a manual clock: one owner at a time,
// renewal by the holder only, lapse, the operator's ownerless calls, and the header parser.
#include "services/worker/control/admin_lease.h"

#include "gtest/gtest.h"

namespace rl::worker {
namespace {

using std::chrono::milliseconds;

class AdminLeaseTest : public ::testing::Test {
 protected:
  std::chrono::steady_clock::time_point now_{};
  AdminLease lease_{[this] { return now_; }};
  LeaseClaim Claim(const std::string& owner, int ttl_ms = 1000) {
    return LeaseClaim{owner, milliseconds(ttl_ms)};
  }
};

TEST_F(AdminLeaseTest, OneOwnerAtATimeUntilItLapses) {
  EXPECT_EQ(lease_.state().owner, "");
  ASSERT_TRUE(lease_.Acquire(Claim("router-a"), "PauseGeneration").ok());
  EXPECT_EQ(lease_.state().owner, "router-a");
  EXPECT_EQ(lease_.state().expires_in_ms, 1000);
  now_ += milliseconds(400);
  const absl::Status refused = lease_.Acquire(Claim("router-b"), "UpdateWeightsFromDisk");
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(refused.message().find("held by 'router-a' for another 600 ms"), std::string::npos)
      << refused;
  EXPECT_NE(refused.message().find("UpdateWeightsFromDisk"), std::string::npos) << refused;
  // The holder renews; the other is still refused.
  ASSERT_TRUE(lease_.Acquire(Claim("router-a"), "ContinueGeneration").ok());
  now_ += milliseconds(900);
  EXPECT_FALSE(lease_.Acquire(Claim("router-b"), "PauseGeneration").ok());
  // Lapsed: the other takes it.
  now_ += milliseconds(101);
  EXPECT_EQ(lease_.state().owner, "");
  ASSERT_TRUE(lease_.Acquire(Claim("router-b", 5000), "PauseGeneration").ok());
  EXPECT_EQ(lease_.state().owner, "router-b");
  EXPECT_FALSE(lease_.Acquire(Claim("router-a"), "PauseGeneration").ok());
}

TEST_F(AdminLeaseTest, RenewExtendsOnlyTheHoldersLiveLease) {
  ASSERT_TRUE(lease_.Acquire(Claim("a"), "x").ok());
  now_ += milliseconds(900);
  lease_.Renew(Claim("b"));  // not the holder: nothing
  EXPECT_EQ(lease_.state().expires_in_ms, 100);
  lease_.Renew(Claim("a"));
  EXPECT_EQ(lease_.state().expires_in_ms, 1000);
  now_ += milliseconds(1000);
  lease_.Renew(Claim("a"));  // lapsed: not revived
  EXPECT_EQ(lease_.state().owner, "");
  lease_.Renew(Claim("b"));  // a renewal never takes a lease
  EXPECT_EQ(lease_.state().owner, "");
}

TEST_F(AdminLeaseTest, OwnerlessCallsAreTheOperatorsAndTakeNothing) {
  ASSERT_TRUE(lease_.Acquire(Claim(""), "PauseGeneration").ok());
  EXPECT_EQ(lease_.state().owner, "");
  ASSERT_TRUE(lease_.Acquire(Claim("a"), "PauseGeneration").ok());
  EXPECT_TRUE(lease_.Acquire(Claim(""), "ContinueGeneration").ok());
  EXPECT_EQ(lease_.state().owner, "a");
}

TEST(ParseLeaseClaimTest, BoundsAndDefaults) {
  auto none = ParseLeaseClaim(nullptr, nullptr);
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(none->owner, "");
  EXPECT_EQ(none->ttl, milliseconds(30000));
  const std::string owner = "rlfleet-router-7d9f", ttl = "1500";
  auto c = ParseLeaseClaim(&owner, &ttl);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->owner, owner);
  EXPECT_EQ(c->ttl, milliseconds(1500));
  for (const std::string bad_ttl : {"0", "99", "3600001", "x", "-5", ""}) {
    EXPECT_EQ(ParseLeaseClaim(&owner, &bad_ttl).status().code(), absl::StatusCode::kInvalidArgument)
        << bad_ttl;
  }
  for (const std::string bad_owner :
       {std::string(129, 'a'), std::string("a b"), std::string("a\nb")}) {
    const auto r = ParseLeaseClaim(&bad_owner, nullptr);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(r.status().message().find("rl-admin-lease-owner"), std::string::npos);
  }
}

}  // namespace
}  // namespace rl::worker
