// AffinityPolicy (services/router/pool/policies/affinity.h): consistent hashing with bounded
// loads on the routing key or group id, the trajectory's worker first, least load without
// either. Distribution, stickiness, the bound under a skewed key set, ring stability when a
// worker joins or leaves.
#include "services/router/pool/policies/affinity.h"

#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/testing/routing_candidates.h"

namespace rl::router {
namespace {

using testing::FakeFleet;

PickRequest Keyed(std::string_view key, int32_t units = 1) {  // a view: `key` must outlive it
  PickRequest r;
  r.routing_key = key;
  r.units = units;
  return r;
}

// Where each of `keys` lands on an idle fleet (no bound in play).
std::map<std::string, std::string> Placement(AffinityPolicy& p, FakeFleet& fleet,
                                             const std::vector<std::string>& keys,
                                             const std::vector<std::string>& without = {}) {
  std::map<std::string, std::string> out;
  for (const std::string& k : keys) {
    out[k] = fleet.Pick(p, Keyed(k), false, nullptr, without);
  }
  return out;
}

std::vector<std::string> Keys(int n) {
  std::vector<std::string> keys;
  for (int i = 0; i < n; ++i) keys.push_back(absl::StrCat("episode-", i));
  return keys;
}

TEST(AffinityPolicyTest, KeysSpreadEvenlyAndStick) {
  AffinityPolicy p(1.25);
  EXPECT_STREQ(p.name(), "affinity");
  FakeFleet fleet({"10.0.0.1:50061", "10.0.0.2:50061", "10.0.0.3:50061"});
  const std::vector<std::string> keys = Keys(3000);
  const auto first = Placement(p, fleet, keys);
  std::map<std::string, int> per_worker;
  for (const auto& [k, w] : first) ++per_worker[w];
  ASSERT_EQ(per_worker.size(), 3u);
  for (const auto& [w, n] : per_worker) {
    EXPECT_GT(n, 750) << w;  // 1000 each, within 25% (128 points per worker)
    EXPECT_LT(n, 1250) << w;
  }
  EXPECT_EQ(Placement(p, fleet, keys), first);  // sticky
  Choice choice;
  fleet.Pick(p, Keyed("episode-1"), false, &choice);
  EXPECT_TRUE(choice.keyed);
  EXPECT_FALSE(choice.moved);
}

TEST(AffinityPolicyTest, PlacementIsTheSameInAFreshRouter) {
  FakeFleet fleet({"a:1", "b:1", "c:1", "d:1"});
  AffinityPolicy one(1.25), two(1.25);
  const std::vector<std::string> keys = Keys(500);
  EXPECT_EQ(Placement(one, fleet, keys), Placement(two, fleet, keys));
}

TEST(AffinityPolicyTest, GroupIdKeysWhenThereIsNoRoutingKey) {
  AffinityPolicy p(1.25);
  FakeFleet fleet({"a:1", "b:1", "c:1"});
  std::map<std::string, int> workers;
  for (int g = 0; g < 30; ++g) {
    std::map<std::string, int> seen;
    for (int s = 0; s < 8; ++s) {  // a group's samples as separate requests
      PickRequest r;
      const std::string group = absl::StrCat("group-", g);
      r.group_id = group;
      ++seen[fleet.Pick(p, r)];
    }
    EXPECT_EQ(seen.size(), 1u) << "group " << g;
    ++workers[seen.begin()->first];
  }
  EXPECT_EQ(workers.size(), 3u);
  // The routing key wins over the group id.
  PickRequest both = Keyed("episode-9");
  both.group_id = "group-0";
  EXPECT_EQ(fleet.Pick(p, both), fleet.Pick(p, Keyed("episode-9")));
}

TEST(AffinityPolicyTest, WithoutKeyOrTrajectoryItIsLeastLoad) {
  AffinityPolicy p(1.25);
  FakeFleet fleet({"a:1", "b:1", "c:1"});
  fleet.load("a:1") = 4;
  fleet.load("c:1") = 2;
  Choice choice;
  EXPECT_EQ(fleet.Pick(p, PickRequest{}, false, &choice), "b:1");
  EXPECT_FALSE(choice.keyed);
  EXPECT_FALSE(choice.moved);
}

// The ring: a joining worker takes only the keys whose walk now meets it first, a leaving one's
// keys move and no other (fresh routers on an idle fleet place every key on its ring worker).
TEST(AffinityPolicyTest, OnTheRingOnlyTheChangedWorkersKeysMove) {
  FakeFleet four({"a:1", "b:1", "c:1", "d:1"});
  const std::vector<std::string> keys = Keys(2000);
  AffinityPolicy p1(1.25, 8), p2(1.25, 8), p3(1.25, 8);
  const auto before = Placement(p1, four, keys, {"d:1"});  // d not there yet
  const auto joined = Placement(p2, four, keys);
  int moved_to_d = 0;
  for (const auto& k : keys) {
    if (joined.at(k) != before.at(k)) {
      EXPECT_EQ(joined.at(k), "d:1") << k;
      ++moved_to_d;
    }
  }
  EXPECT_GT(moved_to_d, 300);  // about a quarter
  EXPECT_LT(moved_to_d, 700);
  const auto left = Placement(p3, four, keys, {"b:1"});
  int moved = 0;
  for (const auto& k : keys) {
    if (joined.at(k) == "b:1") {
      EXPECT_NE(left.at(k), "b:1");
      ++moved;
    } else {
      EXPECT_EQ(left.at(k), joined.at(k)) << k;
    }
  }
  EXPECT_GT(moved, 300);
}

// In one router a placed key stays where its cache is: a joining worker takes none of them (it
// takes new keys), a leaving worker's keys are placed again and no other key moves.
TEST(AffinityPolicyTest, PlacedKeysStayWhenAWorkerJoinsAndOnlyALeaversKeysMove) {
  AffinityPolicy p(1.25, 8);
  FakeFleet four({"a:1", "b:1", "c:1", "d:1"});
  const std::vector<std::string> keys = Keys(2000);
  const auto before = Placement(p, four, keys, {"d:1"});  // d not there yet
  EXPECT_EQ(Placement(p, four, keys), before);            // d joined: no placed key moves
  std::vector<std::string> fresh;
  for (int i = 0; i < 2000; ++i) fresh.push_back(absl::StrCat("new-", i));
  int on_d = 0;
  for (const auto& [k, w] : Placement(p, four, fresh)) on_d += w == "d:1";
  EXPECT_GT(on_d, 300);  // new keys: about a quarter on d (the ring, on an idle fleet)
  EXPECT_LT(on_d, 700);
  const auto left = Placement(p, four, keys, {"b:1"});
  int moved = 0;
  for (const auto& k : keys) {
    if (before.at(k) == "b:1") {
      EXPECT_NE(left.at(k), "b:1");
      ++moved;
    } else {
      EXPECT_EQ(left.at(k), before.at(k)) << k;
    }
  }
  EXPECT_GT(moved, 400);  // about a third
  // b back: its old keys were placed again elsewhere and stay there; nothing else moves.
  EXPECT_EQ(Placement(p, four, keys), left);
}

// 80% of the requests carry one of two hot keys and stay in flight: no worker ever goes past
// the bound (load + units <= factor * mean after the pick, or it was idle), hot keys move.
TEST(AffinityPolicyTest, BoundHoldsUnderASkewedKeySet) {
  for (const auto& [factor, slack] : std::vector<std::pair<double, int32_t>>{
           {1.0, 0}, {1.25, 0}, {2.0, 0}, {1.25, 8}, {1.0, 3}}) {
    AffinityPolicy p(factor, slack);
    FakeFleet fleet({"a:1", "b:1", "c:1"});
    int moves = 0;
    for (int i = 0; i < 600; ++i) {
      const std::string key = i % 5 == 0  ? absl::StrCat("cold-", i)
                              : i % 5 < 3 ? std::string("hot-1")
                                          : std::string("hot-2");
      const int32_t units = i % 7 == 0 ? 8 : 1;
      std::vector<Candidate> c = fleet.Candidates();
      int64_t total = 0;
      for (const Candidate& x : c) total += x.load;
      const double mean = static_cast<double>(total + units) / 3.0;
      const double cap = std::max(factor * mean, mean + slack);
      Choice choice;
      const std::string w = fleet.Pick(p, Keyed(key, units), /*take=*/false, &choice);
      const int32_t before = fleet.load(w);
      // The least loaded worker is always within the bound unless a heavy request arrives on
      // an unbalanced fleet; then the pick is the least loaded one.
      int32_t min_load = 1 << 30;
      for (const auto& a : fleet.addresses()) min_load = std::min(min_load, fleet.load(a));
      EXPECT_TRUE(before == 0 || before + units <= cap + 1e-9 || before == min_load)
          << "factor " << factor << " slack " << slack << " pick " << i << " load " << before
          << " cap " << cap;
      fleet.load(w) += units;
      if (choice.moved) ++moves;
      // Requests finish now and then (the oldest load drains).
      if (i % 3 == 0) {
        for (const auto& a : fleet.addresses()) fleet.load(a) = fleet.load(a) * 3 / 4;
      }
    }
    EXPECT_GT(moves, 0) << factor << " " << slack;
    int32_t hi = 0, total = 0;
    for (const auto& a : fleet.addresses()) {
      hi = std::max(hi, fleet.load(a));
      total += fleet.load(a);
    }
    EXPECT_LE(hi, std::max(factor * total / 3.0, total / 3.0 + slack) + 8) << factor;
  }
}

TEST(AffinityPolicyTest, FollowsTheTrajectoryWithinTheBound) {
  AffinityPolicy p(1.25);
  FakeFleet fleet({"a:1", "b:1", "c:1"});
  const PrefixHolder holders[] = {{"c:1", 120}, {"a:1", 40}};
  PickRequest r = Keyed("episode-1");
  r.prefix_holders = holders;
  r.trajectory_tokens = 100;  // c holds the whole trajectory, a only its system prompt
  Choice choice;
  EXPECT_EQ(fleet.Pick(p, r, false, &choice), "c:1");
  EXPECT_TRUE(choice.keyed);
  EXPECT_FALSE(choice.moved);
  // c over the bound: the key's worker on the ring (or the next within the bound) instead.
  fleet.load("c:1") = 10;
  fleet.load("a:1") = 1;
  fleet.load("b:1") = 1;
  const std::string moved = fleet.Pick(p, r, false, &choice);
  EXPECT_NE(moved, "c:1");
  EXPECT_TRUE(choice.moved);
  // A trajectory with no key: least load.
  PickRequest keyless;
  keyless.prefix_holders = holders;
  keyless.trajectory_tokens = 100;
  EXPECT_EQ(fleet.Pick(p, keyless, false, &choice), "a:1");
  EXPECT_TRUE(choice.moved);
  EXPECT_FALSE(choice.keyed);
  // A prefix that is no trajectory (tokens short of it) is not followed.
  fleet.load("c:1") = 0;
  keyless.trajectory_tokens = 0;
  fleet.load("a:1") = 3;
  fleet.load("b:1") = 3;
  EXPECT_EQ(fleet.Pick(p, keyless, false, &choice), "c:1");  // least load, not a preference
  EXPECT_FALSE(choice.keyed);
}

TEST(AffinityPolicyTest, AnExcludedWorkersKeysGoToTheNextOnTheRing) {
  AffinityPolicy p(1.25);
  FakeFleet fleet({"a:1", "b:1", "c:1"});
  const std::vector<std::string> keys = Keys(300);
  const auto all = Placement(p, fleet, keys);
  const auto without_a = Placement(p, fleet, keys, {"a:1"});
  for (const auto& k : keys) {
    if (all.at(k) != "a:1") EXPECT_EQ(without_a.at(k), all.at(k));
  }
}

// The GRPO burst with no slack (--load-slack 0): two groups of 8 samples sent together, as
// separate requests sharing each group's id, none finished yet. The bound caps every worker at
// 1.25 x the mean (6 of 16 here), so a group cannot gather on one worker; it bounds the most
// loaded worker only, so the least loaded one may hold as few as 16 - 2 x 6 = 4.
TEST(AffinityPolicyTest, WithoutSlackAGroupBurstStaysWithinTheRelativeBound) {
  AffinityPolicy p(1.25, 0);
  FakeFleet fleet({"a:1", "b:1", "c:1"});
  int keyed = 0;
  for (int g = 0; g < 2; ++g) {
    for (int s = 0; s < 8; ++s) {
      PickRequest r;
      const std::string group = absl::StrCat("group-", g);
      r.group_id = group;
      Choice choice;
      fleet.Pick(p, r, /*take=*/true, &choice);
      if (choice.keyed) ++keyed;
    }
  }
  int32_t total = 0;
  for (const auto& a : fleet.addresses()) {
    EXPECT_LE(fleet.load(a), 6) << a;
    EXPECT_GE(fleet.load(a), 4) << a;
    total += fleet.load(a);
  }
  EXPECT_EQ(total, 16);
  EXPECT_GT(keyed, 8);  // most samples still placed by their group's key
}

// A GRPO step: 6 groups of 8 samples sent at once, none finished. With the default slack each
// group stays on one worker (8 over a mean of 8/3 at the first group's last sample), and new
// groups go to the workers at or below the mean load: 2 groups on each worker, whatever the
// groups' hashes (hashing alone puts 3 or more of 6 on one worker 7 times in 8).
TEST(AffinityPolicyTest, AStepsGroupsSpreadByLoadAndStayTogether) {
  for (int step = 0; step < 20; ++step) {
    AffinityPolicy p(1.25, 8);
    FakeFleet fleet({"a:1", "b:1", "c:1"});
    for (int g = 0; g < 6; ++g) {
      std::set<std::string> workers;
      for (int s = 0; s < 8; ++s) {
        PickRequest r;
        const std::string group = absl::StrCat("step-", step, "-group-", g);
        r.group_id = group;
        Choice choice;
        workers.insert(fleet.Pick(p, r, /*take=*/true, &choice));
        EXPECT_TRUE(choice.keyed);
        EXPECT_FALSE(choice.moved);
      }
      EXPECT_EQ(workers.size(), 1u) << "step " << step << " group " << g;
    }
    for (const auto& a : fleet.addresses()) EXPECT_EQ(fleet.load(a), 16) << a << " " << step;
  }
}

// A hot key under the slack: it stays on its worker up to `slack` samples above the mean, then
// walks on along the ring; no worker ever goes past max(1.25 x mean, mean + 8).
TEST(AffinityPolicyTest, AHotKeyFillsItsWorkerUpToTheSlackThenSpreads) {
  AffinityPolicy p(1.25, 8);
  FakeFleet fleet({"a:1", "b:1", "c:1"});
  std::string home;
  int moves = 0;
  for (int i = 0; i < 60; ++i) {
    Choice choice;
    const std::string w = fleet.Pick(p, Keyed("hot"), /*take=*/true, &choice);
    if (i == 0) home = w;
    if (choice.moved) ++moves;
    EXPECT_TRUE(choice.keyed);
  }
  // 60 in flight: mean 20, so the hot key's worker holds 28; every other pick moved.
  EXPECT_EQ(fleet.load(home), 28);
  EXPECT_EQ(moves, 32);
  for (const auto& a : fleet.addresses()) EXPECT_LE(fleet.load(a), 28) << a;
}

// A trajectory held whole by two workers (a turn retried elsewhere): the less loaded one.
TEST(AffinityPolicyTest, OfTwoWholeTrajectoryHoldersTheLessLoaded) {
  AffinityPolicy p(1.25);
  FakeFleet fleet({"a:1", "b:1", "c:1"});
  const PrefixHolder holders[] = {{"a:1", 300}, {"c:1", 300}, {"b:1", 40}};
  PickRequest r;
  r.prefix_holders = holders;
  r.trajectory_tokens = 300;
  fleet.load("a:1") = 5;  // both within the bound (cap 1.25 x 15 / 3 = 6.25)
  fleet.load("b:1") = 5;
  fleet.load("c:1") = 4;
  Choice choice;
  EXPECT_EQ(fleet.Pick(p, r, false, &choice), "c:1");
  EXPECT_TRUE(choice.keyed);
  EXPECT_FALSE(choice.moved);
  // The less loaded holder over the bound, the other within it: no move, no history lost.
  fleet.load("a:1") = 1;
  fleet.load("c:1") = 9;
  EXPECT_EQ(fleet.Pick(p, r, false, &choice), "a:1");
  EXPECT_TRUE(choice.keyed);
  EXPECT_FALSE(choice.moved);
}

}  // namespace
}  // namespace rl::router
