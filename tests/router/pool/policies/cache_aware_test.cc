// CacheAwarePolicy (services/router/pool/policies/cache_aware.h): the worker holding the longest
// cached prefix, equal prefixes by least load, within the load bound; least load otherwise.
#include "services/router/pool/policies/cache_aware.h"

#include <map>
#include <set>
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

// A group's first turn: its samples share the question, which no worker holds yet (the tree
// knows only the system prompt, everywhere). By the group's key they all go to one worker
// (without it, least load spreads them and each worker prefills the question); groups spread by
// load. A later turn (its prompt extends a cached trajectory) follows the tree, not the key.
TEST(CacheAwarePolicyTest, AGroupsFirstTurnGoesTogetherThenTheTree) {
  CacheAwarePolicy p(1.25, 8);
  FakeFleet fleet({"a:1", "b:1", "c:1"});
  const PrefixHolder system[] = {{"a:1", 100}, {"b:1", 100}, {"c:1", 100}};
  std::map<std::string, int> groups_per_worker;
  for (int g = 0; g < 6; ++g) {
    std::set<std::string> workers;
    const std::string group = "group-" + std::to_string(g);
    for (int s = 0; s < 8; ++s) {
      PickRequest r = WithHolders(system);
      r.group_id = group;
      Choice choice;
      workers.insert(fleet.Pick(p, r, /*take=*/true, &choice));
      EXPECT_TRUE(choice.keyed);
      EXPECT_FALSE(choice.moved);
    }
    ASSERT_EQ(workers.size(), 1u) << group;
    ++groups_per_worker[*workers.begin()];
  }
  EXPECT_EQ(groups_per_worker, (std::map<std::string, int>{{"a:1", 2}, {"b:1", 2}, {"c:1", 2}}));
  // Turn 2 of a sample of group-0 whose turn 1 ran elsewhere (a retry): its history's worker.
  std::string other;
  for (const auto& a : fleet.addresses()) {
    PickRequest first = WithHolders(system);
    first.group_id = "group-0";
    if (a != fleet.Pick(p, first)) other = a;
  }
  const PrefixHolder history[] = {{other, 700}, {"a:1", 100}, {"b:1", 100}, {"c:1", 100}};
  PickRequest turn2 = WithHolders(history);
  turn2.group_id = "group-0";
  turn2.trajectory_tokens = 650;
  EXPECT_EQ(fleet.Pick(p, turn2), other);
}

// A hot key's first turns (the skewed trace's 2 keys) spread once its worker is `slack` over
// the mean: no worker past max(1.25 x mean, mean + 8).
TEST(CacheAwarePolicyTest, AHotKeysFirstTurnsSpreadPastTheSlack) {
  CacheAwarePolicy p(1.25, 8);
  FakeFleet fleet({"a:1", "b:1", "c:1"});
  for (int i = 0; i < 90; ++i) {
    PickRequest r;
    r.routing_key = i % 2 == 0 ? "hot-0" : "hot-1";
    fleet.Pick(p, r, /*take=*/true);
  }
  for (const auto& a : fleet.addresses()) EXPECT_LE(fleet.load(a), 38) << a;  // 30 + 8
}

}  // namespace
}  // namespace rl::router
