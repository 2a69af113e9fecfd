// HashRing (services/router/pool/policies/hash_ring.h): stable hashes, a walk that visits each
// candidate once in ring order, and pruning of members gone for good.
#include "services/router/pool/policies/hash_ring.h"

#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/testing/routing_candidates.h"

namespace rl::router {
namespace {

TEST(HashRingTest, StableHashIsFixed) {
  // Placement must survive a router restart: the hash is part of the contract.
  EXPECT_EQ(StableHash(""), StableHash(""));
  EXPECT_NE(StableHash("a"), StableHash("b"));
  EXPECT_EQ(StableHash("episode-1"), StableHash(std::string("episode-") + "1"));
}

TEST(HashRingTest, WalkVisitsEveryCandidateOnce) {
  testing::FakeFleet fleet({"a:1", "b:1", "c:1", "d:1"});
  HashRing ring;
  const std::vector<Candidate> c = fleet.Candidates();
  ring.Sync(c);
  for (int k = 0; k < 50; ++k) {
    std::vector<size_t> seen;
    const int64_t none = ring.Walk(StableHash(absl::StrCat(k)), [&](size_t i) {
      seen.push_back(i);
      return false;
    });
    EXPECT_EQ(none, -1);
    EXPECT_EQ(std::set<size_t>(seen.begin(), seen.end()).size(), 4u);
    EXPECT_EQ(seen.size(), 4u);
  }
}

TEST(HashRingTest, PrunesMembersGoneForGood) {
  HashRing ring;
  std::vector<std::string> many;
  for (int i = 0; i < 40; ++i) many.push_back(absl::StrCat("w", i, ":1"));
  testing::FakeFleet big(many);
  ring.Sync(big.Candidates());
  EXPECT_EQ(ring.num_members(), 40u);
  testing::FakeFleet small({"w1:1", "w2:1"});
  ring.Sync(small.Candidates());
  EXPECT_LE(ring.num_members(), 2u * 2 + 8);
  const std::vector<Candidate> c = small.Candidates();
  EXPECT_GE(ring.Walk(StableHash("x"), [](size_t) { return true; }), 0);
}

}  // namespace
}  // namespace rl::router
