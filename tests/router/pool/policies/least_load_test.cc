// LeastLoadPolicy (services/router/pool/policies/least_load.h): the fewest samples in flight,
// then the lowest KV usage, remaining ties in turn.
#include "services/router/pool/policies/least_load.h"

#include <map>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/testing/routing_candidates.h"

namespace rl::router {
namespace {

TEST(LeastLoadPolicyTest, PicksTheLeastLoadedWorker) {
  LeastLoadPolicy p;
  EXPECT_STREQ(p.name(), "least_load");
  testing::FakeFleet fleet({"a:1", "b:1", "c:1"});
  fleet.load("a:1") = 5;
  fleet.load("b:1") = 2;
  fleet.load("c:1") = 9;
  EXPECT_EQ(fleet.Pick(p, PickRequest{}), "b:1");
}

TEST(LeastLoadPolicyTest, KvUsageBreaksLoadTies) {
  LeastLoadPolicy p;
  const std::vector<std::string> a = {"a:1", "b:1", "c:1"};
  std::vector<Candidate> c;
  for (const auto& x : a) c.push_back({nullptr, &x, 1, 3, 0.9, 0});
  c[2].kv_usage = 0.1;
  for (int i = 0; i < 3; ++i) EXPECT_EQ(*c[p.Choose(PickRequest{}, c).index].address, "c:1");
}

// Requests that each stay in flight spread evenly: a weighted mix (n = 8 groups and n = 1
// turns) ends with every worker's load within one group of the others.
TEST(LeastLoadPolicyTest, DistributesEvenly) {
  LeastLoadPolicy p;
  testing::FakeFleet fleet({"a:1", "b:1", "c:1"});
  std::map<std::string, int> picks;
  for (int i = 0; i < 300; ++i) {
    PickRequest r;
    r.units = i % 4 == 0 ? 8 : 1;
    ++picks[fleet.Pick(p, r, /*take=*/true)];
  }
  int lo = 1 << 30, hi = 0;
  for (const auto& a : fleet.addresses()) {
    lo = std::min(lo, fleet.load(a));
    hi = std::max(hi, fleet.load(a));
  }
  EXPECT_LE(hi - lo, 8);
  EXPECT_EQ(picks.size(), 3u);
}

TEST(LeastLoadPolicyTest, IdleWorkersShareTheFirstRequests) {
  LeastLoadPolicy p;
  testing::FakeFleet fleet({"a:1", "b:1", "c:1"});
  std::map<std::string, int> picks;
  for (int i = 0; i < 6; ++i) ++picks[fleet.Pick(p, PickRequest{})];  // nothing stays in flight
  EXPECT_EQ(picks, (std::map<std::string, int>{{"a:1", 2}, {"b:1", 2}, {"c:1", 2}}));
}

}  // namespace
}  // namespace rl::router
