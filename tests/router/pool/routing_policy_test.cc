// RoundRobinPolicy (services/router/pool/routing_policy.h): every candidate takes its turn in
// address order, whatever joins, leaves or is excluded between picks.
#include "services/router/pool/routing_policy.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace rl::router {
namespace {

// Candidates for the given addresses (sorted, as the pool hands them over).
std::vector<Candidate> Candidates(const std::vector<std::string>& addresses) {
  std::vector<Candidate> out;
  for (const std::string& a : addresses) out.push_back({nullptr, &a, 0, 0});
  return out;
}

std::string ChooseOne(RoutingPolicy& p, const std::vector<std::string>& addresses) {
  const std::vector<Candidate> c = Candidates(addresses);
  const size_t i = p.Choose(PickRequest{}, c);
  EXPECT_LT(i, c.size());
  return i < c.size() ? *c[i].address : "";
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

}  // namespace
}  // namespace rl::router
