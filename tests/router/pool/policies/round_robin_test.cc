// RoundRobinPolicy (services/router/pool/policies/round_robin.h): every candidate takes its turn
// in address order, whatever joins, leaves or is excluded between picks.
#include "services/router/pool/policies/round_robin.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/testing/routing_candidates.h"

namespace rl::router {
namespace {

std::string ChooseOne(RoutingPolicy& p, const std::vector<std::string>& addresses) {
  testing::FakeFleet fleet(addresses);
  return fleet.Pick(p, PickRequest{});
}

TEST(RoundRobinPolicyTest, CyclesInAddressOrder) {
  auto p = MakeRoundRobinPolicy();
  EXPECT_STREQ(p->name(), "round_robin");
  const std::vector<std::string> all = {"a:1", "b:1", "c:1"};
  std::vector<std::string> picked;
  for (int i = 0; i < 7; ++i) picked.push_back(ChooseOne(*p, all));
  EXPECT_EQ(picked, (std::vector<std::string>{"a:1", "b:1", "c:1", "a:1", "b:1", "c:1", "a:1"}));
}

TEST(RoundRobinPolicyTest, ContinuesAfterTheLastChoiceWhenCandidatesChange) {
  auto p = MakeRoundRobinPolicy();
  EXPECT_EQ(ChooseOne(*p, {"a:1", "b:1", "c:1"}), "a:1");
  EXPECT_EQ(ChooseOne(*p, {"a:1", "b:1", "c:1"}), "b:1");
  // b left (or is excluded, or out of routing): the turn goes on to c, then wraps.
  EXPECT_EQ(ChooseOne(*p, {"a:1", "c:1"}), "c:1");
  EXPECT_EQ(ChooseOne(*p, {"a:1", "c:1"}), "a:1");
  // A newcomer between a and c gets its turn next.
  EXPECT_EQ(ChooseOne(*p, {"a:1", "b:2", "c:1"}), "b:2");
  // One candidate: always it.
  EXPECT_EQ(ChooseOne(*p, {"z:1"}), "z:1");
  EXPECT_EQ(ChooseOne(*p, {"z:1"}), "z:1");
}

TEST(RoundRobinPolicyTest, IgnoresKeysAndTheCache) {
  auto p = MakeRoundRobinPolicy();
  testing::FakeFleet fleet({"a:1", "b:1", "c:1"});
  const PrefixHolder holders[] = {{"a:1", 100}};
  PickRequest r;
  r.routing_key = "k";
  r.prefix_holders = holders;
  r.trajectory_tokens = 100;
  Choice choice;
  EXPECT_EQ(fleet.Pick(*p, r, false, &choice), "a:1");
  EXPECT_EQ(fleet.Pick(*p, r, false, &choice), "b:1");
  EXPECT_FALSE(choice.keyed);
}

}  // namespace
}  // namespace rl::router
