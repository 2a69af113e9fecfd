// MakeRoutingPolicy / ValidatePolicyOptions (services/router/pool/routing_policy.h): --policy
// names and --load-factor bounds.
#include "services/router/pool/routing_policy.h"

#include "gtest/gtest.h"
#include "services/router/pool/policies/make_policy.h"

namespace rl::router {
namespace {

TEST(RoutingPolicyTest, MakesEveryNamedPolicy) {
  for (const char* name : {"round_robin", "least_load", "affinity", "cache_aware"}) {
    auto p = MakeRoutingPolicy({name, 1.5});
    ASSERT_TRUE(p.ok()) << name << ": " << p.status();
    EXPECT_STREQ((*p)->name(), name);
  }
  EXPECT_EQ((*MakeRoutingPolicy({"affinity", 1.5}))->load_factor(), 1.5);
  EXPECT_EQ((*MakeRoutingPolicy({"round_robin", 1.5}))->load_factor(), 0);
  EXPECT_EQ((*MakeRoutingPolicy({"cache_aware", 1.5, 3}))->load_slack(), 3);
  EXPECT_EQ((*MakeRoutingPolicy({"least_load", 1.5, 3}))->load_slack(), 0);
}

TEST(RoutingPolicyTest, RefusesBadOptionsNamingTheFlag) {
  auto bad = MakeRoutingPolicy({"random", 1.25});
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("--policy"), std::string::npos);
  EXPECT_NE(bad.status().message().find("cache_aware"), std::string::npos);
  for (double f : {0.5, 0.0, -1.0, 101.0}) {
    auto s = ValidatePolicyOptions({"affinity", f});
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << f;
    EXPECT_NE(s.message().find("--load-factor"), std::string::npos);
  }
  EXPECT_TRUE(ValidatePolicyOptions({"affinity", 1.0}).ok());
  for (int32_t slack : {-1, 1000001}) {
    auto s = ValidatePolicyOptions({"affinity", 1.25, slack});
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << slack;
    EXPECT_NE(s.message().find("--load-slack"), std::string::npos);
  }
  EXPECT_TRUE(ValidatePolicyOptions({"affinity", 1.25, 0}).ok());
  EXPECT_EQ(PolicyOptions{}.load_slack, 8);
}

}  // namespace
}  // namespace rl::router
