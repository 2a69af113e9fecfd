// KeyPlacement (services/router/pool/policies/key_placement.h) and LoadBound (load_bound.h):
// where a new key goes, that a placed key stays, what a retry's exclusion and a worker gone do,
// the bounded memory; the bound's relative and absolute parts.
#include "services/router/pool/policies/key_placement.h"

#include <algorithm>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "services/router/pool/policies/load_bound.h"
#include "tests/testing/routing_candidates.h"

namespace rl::router {
namespace {

using testing::FakeFleet;

// Where `placement` sends one request of `key` (units 1), and the choice.
std::string Place(KeyPlacement& placement, FakeFleet& fleet, const std::string& key,
                  Choice* choice = nullptr, const std::vector<std::string>& without = {},
                  const std::set<std::string>* exclude = nullptr) {
  const std::vector<Candidate> c = fleet.Candidates(without);
  const LoadBound bound(c, 1, 1.25, 8);
  const Choice ch = placement.Place(key, bound, c, exclude);
  if (choice != nullptr) *choice = ch;
  return ch.keyed ? *c[ch.index].address : "";
}

TEST(LoadBoundTest, TheSlackAddsToTheRelativeBound) {
  FakeFleet fleet({"a:1", "b:1", "c:1"});
  fleet.load("a:1") = 7;  // a group's first 7 samples on one worker of an idle fleet
  const std::vector<Candidate> c = fleet.Candidates();
  // The 8th: 8 <= 1.25 x 8/3 fails, 8 <= 8/3 + 8 holds.
  EXPECT_FALSE(LoadBound(c, 1, 1.25, 0).Admits(c[0]));
  EXPECT_TRUE(LoadBound(c, 1, 1.25, 8).Admits(c[0]));
  EXPECT_TRUE(LoadBound(c, 1, 1.25, 8).Admits(c[1]));  // idle
  // Under a heavy fleet the relative part is the wider one: mean 100 -> cap 125.
  fleet.load("a:1") = 124;
  fleet.load("b:1") = 88;
  fleet.load("c:1") = 87;
  const std::vector<Candidate> heavy = fleet.Candidates();
  EXPECT_TRUE(LoadBound(heavy, 1, 1.25, 8).Admits(heavy[0]));
  fleet.load("a:1") = 125;
  fleet.load("c:1") = 86;
  const std::vector<Candidate> over = fleet.Candidates();
  EXPECT_FALSE(LoadBound(over, 1, 1.25, 8).Admits(over[0]));
}

TEST(KeyPlacementTest, ANewKeyGoesToTheFirstWorkerOnItsRingAtOrBelowTheMean) {
  FakeFleet fleet({"a:1", "b:1", "c:1"});
  for (int k = 0; k < 50; ++k) {
    const std::string key = absl::StrCat("g:", k);
    KeyPlacement idle;
    const std::string home = Place(idle, fleet, key);  // the ring's worker on an idle fleet
    fleet.load(home) = 9;
    fleet.load(home == "a:1" ? "b:1" : "a:1") = 3;
    KeyPlacement loaded;
    Choice choice;
    const std::string w = Place(loaded, fleet, key, &choice);
    EXPECT_NE(w, home) << key;  // 9 is over the mean of 4
    EXPECT_TRUE(choice.keyed);
    EXPECT_FALSE(choice.moved);
    // ... and stays there even once the ring's worker is idle again.
    for (const auto& a : fleet.addresses()) fleet.load(a) = 0;
    EXPECT_EQ(Place(loaded, fleet, key), w);
  }
}

TEST(KeyPlacementTest, ARetrysExclusionKeepsTheKeyAWorkerGoneLosesIt) {
  FakeFleet fleet({"a:1", "b:1", "c:1"});
  KeyPlacement placement;
  const std::string home = Place(placement, fleet, "g:group");
  const std::set<std::string> tried = {home};
  Choice choice;
  const std::string retry = Place(placement, fleet, "g:group", &choice, {home}, &tried);
  EXPECT_NE(retry, home);
  EXPECT_TRUE(choice.keyed);
  EXPECT_EQ(Place(placement, fleet, "g:group"), home);  // still placed there
  // The worker gone (not routable, not excluded by the request): placed again, and it stays
  // there when the worker comes back.
  const std::string again = Place(placement, fleet, "g:group", nullptr, {home});
  EXPECT_NE(again, home);
  EXPECT_EQ(Place(placement, fleet, "g:group"), again);
}

TEST(KeyPlacementTest, MemoryIsBounded) {
  FakeFleet fleet({"a:1", "b:1", "c:1"});
  KeyPlacement placement;
  for (size_t k = 0; k < KeyPlacement::kMaxKeys + 100; ++k) {
    Place(placement, fleet, absl::StrCat("k:episode-", k));
  }
  EXPECT_EQ(placement.num_keys(), KeyPlacement::kMaxKeys);
  Place(placement, fleet, "k:episode-5");  // forgotten: placed again as new
  EXPECT_EQ(placement.num_keys(), KeyPlacement::kMaxKeys);
}

TEST(KeyPlacementTest, PlacementKeyIsTheRoutingKeyElseTheGroup) {
  PickRequest r;
  EXPECT_EQ(PlacementKey(r), "");
  r.group_id = "g1";
  EXPECT_EQ(PlacementKey(r), "g:g1");
  r.routing_key = "g1";
  EXPECT_EQ(PlacementKey(r), "k:g1");
}

// A GRPO step's first turns arriving together, in any order: 6 groups of 8 samples on 3 workers
// end 2 groups a worker, whatever the interleaving (a worker whose group's samples have not all
// arrived yet looks underloaded, but already holds that group).
TEST(KeyPlacementTest, AStepsGroupsSpreadEvenlyInAnyArrivalOrder) {
  std::mt19937 rng(1);
  for (int trial = 0; trial < 200; ++trial) {
    FakeFleet fleet({"a:1", "b:1", "c:1"});
    KeyPlacement placement;
    std::vector<int> arrivals;
    for (int g = 0; g < 6; ++g) arrivals.insert(arrivals.end(), 8, g);
    std::shuffle(arrivals.begin(), arrivals.end(), rng);
    std::map<int, std::string> home;
    for (int g : arrivals) {
      const std::string key = absl::StrCat("g:trial", trial, "-", g);
      const std::string w = Place(placement, fleet, key);
      ASSERT_FALSE(w.empty());
      if (!home.contains(g)) home[g] = w;
      ++fleet.load(w);
    }
    std::map<std::string, int> groups;
    for (const auto& [g, w] : home) ++groups[w];
    for (const auto& [w, n] : groups) EXPECT_LE(n, 2) << "trial " << trial << ": " << w;
  }
}

}  // namespace
}  // namespace rl::router
