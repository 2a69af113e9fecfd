// Engine::SubscribeKvEvents (services/worker/engine/engine.h): a snapshot taken between steps,
// then one batch per step with the prefix cache's stores, removals and clears; events are
// recorded only while someone subscribes; a late subscriber's snapshot equals what an early
// one replayed.
#include <map>
#include <set>

#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"
#include "services/worker/engine/engine.h"
#include "tests/worker/engine/engine_test_util.h"

namespace rl::engine::testing {
namespace {

// Replays a subscription's batches into the set of block hashes it describes.
struct Replay {
  std::set<int64_t> blocks;
  int clears = 0;
  void Apply(const KvEventBatch& b) {
    for (const KvCacheEvent& e : b.events) {
      switch (e.kind) {
        case KvCacheEvent::Kind::kCleared:
          blocks.clear();
          ++clears;
          break;
        case KvCacheEvent::Kind::kStored:
          for (int64_t h : e.hashes) EXPECT_TRUE(blocks.insert(h).second);
          break;
        case KvCacheEvent::Kind::kRemoved:
          for (int64_t h : e.hashes) EXPECT_EQ(blocks.erase(h), 1u);
          break;
      }
    }
  }
  void Drain(KvEventLog::Subscription& s) {
    std::vector<std::shared_ptr<const KvEventBatch>> out;
    do {
      out.clear();
      ASSERT_TRUE(s.Take(64, 1 << 20, &out).ok());
      for (const auto& b : out) Apply(*b);
    } while (!out.empty());
  }
};

class EngineKvEventsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    fo_.page_size = 4;
    fe_ = MakeFakeEngine(fo_, eo_);
  }
  void Generate(const std::string& tag, int n, int32_t len) {
    const size_t before = collector_.num_finished();
    for (int i = 0; i < n; ++i) {
      ASSERT_TRUE(
          fe_.engine
              ->Submit(Greedy(absl::StrCat(tag, i), Prompt(len, i), 8), collector_.Callbacks())
              .ok());
    }
    ASSERT_TRUE(collector_.WaitFor(before + n));
  }
  // Blocks the tree holds now, as a fresh subscription's snapshot says.
  std::set<int64_t> Snapshot() {
    auto sub = fe_.engine->SubscribeKvEvents([] {});
    EXPECT_TRUE(sub.ok()) << sub.status();
    Replay r;
    r.Drain(**sub);
    EXPECT_EQ(r.clears, 1);
    return r.blocks;
  }

  Collector collector_;
  FakeRunnerOptions fo_;
  EngineOptions eo_;
  FakeEngine fe_;
};

TEST_F(EngineKvEventsTest, LiveEventsReplayToTheSnapshot) {
  Generate("warm", 2, 20);  // cached before anyone subscribed: in the snapshot only
  absl::Mutex mu;
  int notified = 0;
  auto sub = fe_.engine->SubscribeKvEvents([&] {
    absl::MutexLock lock(&mu);
    ++notified;
  });
  ASSERT_TRUE(sub.ok()) << sub.status();
  Replay live;
  live.Drain(**sub);
  EXPECT_EQ(live.clears, 1);
  const size_t warm_blocks = live.blocks.size();
  EXPECT_EQ(warm_blocks,
            static_cast<size_t>(fe_.engine->GetServerInfo().scheduler.tree_cache_tokens / 4));
  Generate("a", 4, 25);
  Generate("b", 3, 12);
  live.Drain(**sub);
  {
    absl::MutexLock lock(&mu);
    EXPECT_GT(notified, 0);
  }
  EXPECT_GT(live.blocks.size(), warm_blocks);
  EXPECT_EQ(live.blocks, Snapshot());
  EXPECT_EQ(live.blocks.size(),
            static_cast<size_t>(fe_.engine->GetServerInfo().scheduler.tree_cache_tokens / 4));
  // A flush clears.
  ASSERT_TRUE(fe_.engine->FlushCache().ok());
  live.Drain(**sub);
  EXPECT_EQ(live.clears, 2);
  EXPECT_TRUE(live.blocks.empty());
}

TEST_F(EngineKvEventsTest, EvictionUnderKvPressureIsReported) {
  FakeRunnerOptions fo;
  fo.page_size = 4;
  fo.num_kv_slots = 256;  // 64 pages: the cache must evict to admit new prompts
  fe_ = MakeFakeEngine(fo, eo_);
  auto sub = fe_.engine->SubscribeKvEvents([] {});
  ASSERT_TRUE(sub.ok());
  Replay live;
  for (int round = 0; round < 6; ++round) {
    Generate(absl::StrCat("r", round, "-"), 3, 40);
    live.Drain(**sub);
  }
  EXPECT_EQ(live.blocks, Snapshot());
  EXPECT_LE(live.blocks.size(), 64u);
}

TEST_F(EngineKvEventsTest, NothingIsRecordedWithoutSubscribers) {
  {
    auto sub = fe_.engine->SubscribeKvEvents([] {});
    ASSERT_TRUE(sub.ok());
    EXPECT_EQ(fe_.engine->kv_events().num_subscribers(), 1u);
  }
  EXPECT_EQ(fe_.engine->kv_events().num_subscribers(), 0u);
  Generate("x", 4, 30);
  EXPECT_EQ(fe_.engine->kv_events().buffered_units(), 0u);
  // A new subscriber still sees everything, through its snapshot.
  EXPECT_EQ(Snapshot().size(),
            static_cast<size_t>(fe_.engine->GetServerInfo().scheduler.tree_cache_tokens / 4));
}

}  // namespace
}  // namespace rl::engine::testing
