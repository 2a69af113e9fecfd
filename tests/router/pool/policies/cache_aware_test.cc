// CacheAwarePolicy (services/router/pool/policies/cache_aware.h): the worker holding the longest
// cached prefix, equal prefixes by least load, within the load bound; least load otherwise.
#include "services/router/pool/policies/cache_aware.h"

#include <map>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/testing/routing_candidates.h"

namespace rl::router {
namespace {

using testing::FakeFleet;

PickRequest WithHolders(absl::Span<const PrefixHolder> holders, int32_t units = 1) {
  PickRequest r;
  r.prefix_holders = holders;
  r.units = units;
  return r;
}

TEST(CacheAwarePolicyTest, TheLongestCachedPrefixWins) {
  CacheAwarePolicy p(1.25);
  EXPECT_STREQ(p.name(), "cache_aware");
  FakeFleet fleet({"a:1", "b:1", "c:1"});
  const PrefixHolder holders[] = {{"b:1", 300}, {"a:1", 200}, {"c:1", 200}};
  Choice choice;
  EXPECT_EQ(fleet.Pick(p, WithHolders(holders), false, &choice), "b:1");
  EXPECT_TRUE(choice.keyed);
  EXPECT_FALSE(choice.moved);
}

TEST(CacheAwarePolicyTest, EqualPrefixesGoByLeastLoadAndInTurn) {
  CacheAwarePolicy p(1.25);
  FakeFleet fleet({"a:1", "b:1", "c:1"});
  // The shared system prompt on every worker.
  const PrefixHolder holders[] = {{"a:1", 500}, {"b:1", 500}, {"c:1", 500}};
  fleet.load("a:1") = 2;
  fleet.load("b:1") = 1;
  fleet.load("c:1") = 2;
  EXPECT_EQ(fleet.Pick(p, WithHolders(holders)), "b:1");
  fleet.load("b:1") = 2;
  std::map<std::string, int> picks;
  for (int i = 0; i < 6; ++i) ++picks[fleet.Pick(p, WithHolders(holders))];
  EXPECT_EQ(picks, (std::map<std::string, int>{{"a:1", 2}, {"b:1", 2}, {"c:1", 2}}));
}

TEST(CacheAwarePolicyTest, AHolderOverTheBoundPassesToTheNextLongest) {
  CacheAwarePolicy p(1.25);
  FakeFleet fleet({"a:1", "b:1", "c:1"});
  const PrefixHolder holders[] = {{"a:1", 900}, {"c:1", 300}};
  fleet.load("a:1") = 12;
  fleet.load("b:1") = 2;
  fleet.load("c:1") = 2;
  Choice choice;
  EXPECT_EQ(fleet.Pick(p, WithHolders(holders), false, &choice), "c:1");
  EXPECT_TRUE(choice.moved);
  EXPECT_TRUE(choice.keyed);
  fleet.load("c:1") = 12;  // both holders over the bound: least load
  EXPECT_EQ(fleet.Pick(p, WithHolders(holders), false, &choice), "b:1");
  EXPECT_TRUE(choice.moved);
  EXPECT_FALSE(choice.keyed);
}

TEST(CacheAwarePolicyTest, NoHolderOrAnExcludedOneIsLeastLoad) {
  CacheAwarePolicy p(1.25);
  FakeFleet fleet({"a:1", "b:1", "c:1"});
  fleet.load("a:1") = 3;
  fleet.load("b:1") = 1;
  fleet.load("c:1") = 2;
  Choice choice;
  EXPECT_EQ(fleet.Pick(p, PickRequest{}, false, &choice), "b:1");
  EXPECT_FALSE(choice.keyed);
  // A holder that is no candidate (removed, excluded by a retry) is passed over.
  const PrefixHolder holders[] = {{"gone:1", 900}, {"c:1", 50}};
  fleet.load("c:1") = 1;
  EXPECT_EQ(fleet.Pick(p, WithHolders(holders), false, &choice, {"c:1"}), "b:1");
  EXPECT_FALSE(choice.keyed);
  EXPECT_EQ(fleet.Pick(p, WithHolders(holders), false, &choice), "c:1");
  EXPECT_TRUE(choice.keyed);
}

// Every request shares one prefix only `a` holds (a widely shared prefix): `a` fills up to the
// bound, then the rest spread; no worker ends above factor x mean (+ one request).
TEST(CacheAwarePolicyTest, AWidelySharedPrefixDoesNotBuildAHotWorker) {
  CacheAwarePolicy p(1.25);
  FakeFleet fleet({"a:1", "b:1", "c:1"});
  const PrefixHolder holders[] = {{"a:1", 800}};
  int moves = 0;
  for (int i = 0; i < 90; ++i) {
    Choice choice;
    fleet.Pick(p, WithHolders(holders), /*take=*/true, &choice);
    if (choice.moved) ++moves;
  }
  EXPECT_GT(moves, 0);
  EXPECT_LE(fleet.load("a:1"), 1.25 * 30 + 1);
  EXPECT_GE(fleet.load("a:1"), 30);
}

}  // namespace
}  // namespace rl::router
