// sample_set.h against std::set: same members, maximal runs, no overflow at the ends.
#include "services/collector/sample_set.h"

#include <cstdint>
#include <limits>
#include <random>
#include <set>

#include "gtest/gtest.h"

namespace rl::collector {
namespace {

// SampleSet against std::set under random inserts and erases: same members, same size, and
// runs that stay maximal (disjoint and never adjacent).
TEST(SampleSet, MatchesAnOrderedSetAndKeepsRunsMaximal) {
  std::mt19937 rng(5);
  SampleSet set;
  std::set<SampleKey> ref;
  for (int step = 0; step < 20000; ++step) {
    const SampleKey k{static_cast<int64_t>(rng() % 300) - 50, static_cast<int32_t>(rng() % 3)};
    if (rng() % 3 == 0) {
      set.erase(k);
      ref.erase(k);
    } else if (rng() % 5 == 0) {
      const int64_t len = rng() % 7;
      set.InsertRun(k.index, k.index + len, k.sample);
      for (int64_t i = 0; i <= len; ++i) ref.insert(SampleKey{k.index + i, k.sample});
    } else {
      set.insert(k);
      ref.insert(k);
    }
    ASSERT_EQ(set.size(), ref.size());
  }
  for (int64_t i = -60; i < 260; ++i) {
    for (int32_t s = 0; s < 3; ++s) {
      ASSERT_EQ(set.contains({i, s}), ref.contains({i, s})) << i << " " << s;
    }
  }
  int64_t prev_last = 0;
  int32_t prev_sample = -1;
  set.ForEachRun([&](int64_t first, int64_t last, int32_t sample) {
    EXPECT_LE(first, last);
    if (sample == prev_sample) EXPECT_GT(first, prev_last + 1);
    prev_last = last;
    prev_sample = sample;
  });
}

TEST(SampleSet, EndsOfTheIndexRangeDoNotOverflow) {
  constexpr int64_t kMin = std::numeric_limits<int64_t>::min();
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  SampleSet set;
  set.InsertRun(kMax - 2, kMax, 0);
  set.InsertRun(kMin, kMin + 1, 0);
  set.insert({kMax - 3, 0});
  EXPECT_EQ(set.size(), 6u);
  EXPECT_TRUE(set.contains({kMax, 0}));
  EXPECT_TRUE(set.contains({kMin, 0}));
  EXPECT_FALSE(set.contains({0, 0}));
  set.erase({kMax, 0});
  set.erase({kMin, 0});
  EXPECT_EQ(set.size(), 4u);
  int runs = 0;
  set.ForEachRun([&](int64_t, int64_t, int32_t) { ++runs; });
  EXPECT_EQ(runs, 2);
}

}  // namespace
}  // namespace rl::collector
