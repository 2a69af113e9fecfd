// KV cache events (services/worker/engine/kv_events.h): the radix cache's stored / removed /
// cleared events replay to exactly its snapshot, with chained block hashes; the log's bounded
// buffer, subscriber limit, snapshot parts, DATA_LOSS for a subscriber left behind, Close.
#include "services/worker/engine/kv_events.h"

#include <map>
#include <random>
#include <set>
#include <vector>

#include "gtest/gtest.h"
#include "services/worker/engine/kv_pool.h"
#include "services/worker/engine/radix_cache.h"

namespace rl::engine {
namespace {

// A subscriber's model of one worker's blocks: hash → (parent hash or none, tokens).
struct Blocks {
  struct Block {
    bool has_parent;
    int64_t parent;
    std::vector<int32_t> tokens;
  };
  std::map<int64_t, Block> blocks;

  void Apply(const KvCacheEvent& e, int32_t page) {
    switch (e.kind) {
      case KvCacheEvent::Kind::kCleared:
        blocks.clear();
        break;
      case KvCacheEvent::Kind::kRemoved:
        for (int64_t h : e.hashes) EXPECT_EQ(blocks.erase(h), 1u) << "removed unknown block";
        break;
      case KvCacheEvent::Kind::kStored: {
        ASSERT_EQ(e.tokens.size(), e.hashes.size() * static_cast<size_t>(page));
        if (e.has_parent) EXPECT_TRUE(blocks.count(e.parent_hash)) << "parent not stored";
        bool has_parent = e.has_parent;
        int64_t parent = e.parent_hash;
        for (size_t b = 0; b < e.hashes.size(); ++b) {
          std::vector<int32_t> t(e.tokens.begin() + static_cast<long>(b) * page,
                                 e.tokens.begin() + static_cast<long>(b + 1) * page);
          // The hash chains the page's tokens onto the parent's.
          if (has_parent) {
            EXPECT_EQ(e.hashes[b], static_cast<int64_t>(
                                       RadixCache::BlockHash(static_cast<uint64_t>(parent), t)));
          }
          EXPECT_TRUE(blocks.emplace(e.hashes[b], Block{has_parent, parent, t}).second)
              << "stored twice";
          has_parent = true;
          parent = e.hashes[b];
        }
        break;
      }
    }
  }
};

std::vector<int32_t> Pages(int32_t first, int32_t n) {
  std::vector<int32_t> p;
  for (int32_t i = 0; i < n; ++i) p.push_back(first + i);
  return p;
}

TEST(RadixCacheEventsTest, InsertSplitEvictAndResetReplayToTheSnapshot) {
  RadixCache tree(2);
  std::vector<KvCacheEvent> events;
  tree.set_event_sink(&events);
  std::vector<int32_t> dups;
  tree.Insert(0, {1, 2, 3, 4, 5, 6}, Pages(0, 3), &dups);
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].kind, KvCacheEvent::Kind::kStored);
  EXPECT_FALSE(events[0].has_parent);
  EXPECT_EQ(events[0].hashes.size(), 3u);
  // A branch in the middle: only the new pages are stored, their parent the shared page.
  tree.Insert(0, {1, 2, 3, 4, 9, 9, 8, 8}, {0, 1, 10, 11}, &dups);
  ASSERT_EQ(events.size(), 2u);
  EXPECT_TRUE(events[1].has_parent);
  EXPECT_EQ(events[1].parent_hash, events[0].hashes[1]);
  EXPECT_EQ(events[1].hashes.size(), 2u);
  // The split made no event; the blocks are the same.
  Blocks replay;
  for (const auto& e : events) replay.Apply(e, 2);
  std::vector<KvCacheEvent> snap;
  tree.Snapshot(&snap);
  Blocks from_snapshot;
  for (const auto& e : snap) from_snapshot.Apply(e, 2);
  EXPECT_EQ(replay.blocks.size(), 5u);
  EXPECT_EQ(from_snapshot.blocks.size(), 5u);
  for (const auto& [h, b] : replay.blocks) EXPECT_TRUE(from_snapshot.blocks.count(h));
  // Evicting: removed events name the stored hashes.
  std::vector<int32_t> freed;
  tree.Evict(10, &freed);
  for (size_t i = 2; i < events.size(); ++i) replay.Apply(events[i], 2);
  EXPECT_TRUE(replay.blocks.empty());
  // Reset: one clear.
  events.clear();
  tree.Insert(0, {7, 7}, {3}, &dups);
  tree.Reset(&freed);
  ASSERT_EQ(events.size(), 2u);
  EXPECT_EQ(events[1].kind, KvCacheEvent::Kind::kCleared);
  // Without a sink nothing is recorded.
  tree.set_event_sink(nullptr);
  tree.Insert(0, {7, 7}, {3}, &dups);
  EXPECT_EQ(events.size(), 2u);
}

TEST(RadixCacheEventsTest, NamespacesHashDifferently) {
  RadixCache tree(2);
  std::vector<KvCacheEvent> events;
  tree.set_event_sink(&events);
  std::vector<int32_t> dups;
  tree.Insert(0, {1, 2}, {0}, &dups);
  tree.Insert(1, {1, 2}, {1}, &dups);
  ASSERT_EQ(events.size(), 2u);
  EXPECT_NE(events[0].hashes[0], events[1].hashes[0]);
}

// Random inserts, matches (splits), locks and evictions: the events, replayed from an empty
// model, always give exactly the snapshot's blocks.
TEST(RadixCacheEventsTest, RandomOperationsReplayExactly) {
  std::mt19937 rng(7);
  const int32_t page = 2;
  KvPool pool(4096, page);
  RadixCache tree(page);
  std::vector<KvCacheEvent> events;
  tree.set_event_sink(&events);
  Blocks replay;
  std::vector<RadixCache::Node*> locked;
  for (int op = 0; op < 2000; ++op) {
    const int kind = static_cast<int>(rng() % 10);
    std::vector<int32_t> tokens;
    const int len = 2 + static_cast<int>(rng() % 12);
    for (int i = 0; i < len; ++i) tokens.push_back(static_cast<int32_t>(rng() % 3));
    if (kind < 5) {
      auto m = tree.Match(0, tokens);
      const int64_t whole = len / page;
      std::vector<int32_t> pages = m.pages;
      std::vector<int32_t> fresh;
      if (!pool.Alloc(whole - static_cast<int64_t>(m.pages.size()), &fresh)) {
        std::vector<int32_t> freed;
        tree.Evict(64, &freed);
        pool.Free(freed);
        continue;
      }
      pages.insert(pages.end(), fresh.begin(), fresh.end());
      std::vector<int32_t> dups;
      tree.Insert(0, tokens, pages, &dups);
      pool.Free(dups);
    } else if (kind < 7) {
      auto m = tree.Match(0, tokens);
      if (m.last_node != nullptr && locked.size() < 4) {
        tree.Lock(m.last_node);
        locked.push_back(m.last_node);
      }
    } else if (kind < 8 && !locked.empty()) {
      tree.Unlock(locked.back());
      locked.pop_back();
    } else {
      std::vector<int32_t> freed;
      tree.Evict(1 + rng() % 8, &freed);
      pool.Free(freed);
    }
    for (const auto& e : events) replay.Apply(e, page);
    events.clear();
  }
  std::vector<KvCacheEvent> snap;
  tree.Snapshot(&snap);
  Blocks from_snapshot;
  for (const auto& e : snap) from_snapshot.Apply(e, page);
  EXPECT_EQ(from_snapshot.blocks.size(), static_cast<size_t>(tree.cached_tokens() / page));
  ASSERT_EQ(replay.blocks.size(), from_snapshot.blocks.size());
  for (const auto& [h, b] : from_snapshot.blocks) {
    auto it = replay.blocks.find(h);
    ASSERT_NE(it, replay.blocks.end());
    EXPECT_EQ(it->second.tokens, b.tokens);
  }
}

KvCacheEvent Stored(int64_t hash, int n_tokens) {
  KvCacheEvent e;
  e.hashes = {hash};
  e.tokens.assign(static_cast<size_t>(n_tokens), 1);
  return e;
}

TEST(KvEventLogTest, SnapshotThenLiveBatchesInOrder) {
  auto log = KvEventLog::Create(1000, 4);
  EXPECT_FALSE(log->active());
  int notified = 0;
  std::vector<KvCacheEvent> snapshot = {KvCacheEvent{KvCacheEvent::Kind::kCleared}, Stored(1, 8),
                                        Stored(2, 8), Stored(3, 8)};
  auto sub = log->Subscribe(std::move(snapshot), [&] { ++notified; });
  ASSERT_TRUE(sub.ok());
  EXPECT_TRUE(log->active());
  log->Append({Stored(4, 8)}, 1.5);
  std::vector<std::shared_ptr<const KvEventBatch>> out;
  // Snapshot parts of at most 20 units (a stored event of 8 tokens is 10), then the live one.
  ASSERT_TRUE((*sub)->Take(16, 20, &out).ok());
  ASSERT_EQ(out.size(), 3u);
  EXPECT_EQ(out[0]->events.size(), 2u);  // the clear (1) and one block (10)
  EXPECT_EQ(out[0]->events[0].kind, KvCacheEvent::Kind::kCleared);
  EXPECT_EQ(out[1]->events.size(), 2u);
  EXPECT_EQ(out[2]->seq, 1u);
  EXPECT_EQ(out[2]->unix_s, 1.5);
  out.clear();
  ASSERT_TRUE((*sub)->Take(16, 20, &out).ok());
  EXPECT_TRUE(out.empty());
  EXPECT_EQ(notified, 0);
  log->Append({Stored(5, 8)}, 2);
  log->Append({Stored(6, 8)}, 3);
  EXPECT_EQ(notified, 1);  // once per wait
  ASSERT_TRUE((*sub)->Take(1, 20, &out).ok());
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0]->seq, 2u);
  ASSERT_TRUE((*sub)->Take(16, 20, &out).ok());
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[1]->seq, 3u);
  sub->reset();
  EXPECT_FALSE(log->active());
  EXPECT_EQ(log->buffered_units(), 0u);  // nobody needs them any more
  log->Append({Stored(7, 8)}, 4);
  EXPECT_EQ(log->buffered_units(), 0u);
}

TEST(KvEventLogTest, ASubscriberLeftBehindGetsDataLossNotUnboundedMemory) {
  auto log = KvEventLog::Create(100, 4);
  auto slow = log->Subscribe({}, [] {});
  auto fast = log->Subscribe({}, [] {});
  ASSERT_TRUE(slow.ok() && fast.ok());
  std::vector<std::shared_ptr<const KvEventBatch>> out;
  for (int i = 0; i < 50; ++i) {
    log->Append({Stored(i, 8)}, i);
    EXPECT_LE(log->buffered_units(), 100u);
    out.clear();
    ASSERT_TRUE((*fast)->Take(16, 1000, &out).ok());
    EXPECT_EQ(out.size(), 1u);
  }
  absl::Status s = (*slow)->Take(16, 1000, &out);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(s.message().find("subscribe again"), std::string::npos);
  // One batch bigger than the bound is still delivered (the newest is always kept).
  log->Append({Stored(99, 500)}, 99);
  out.clear();
  ASSERT_TRUE((*fast)->Take(16, 1000, &out).ok());
  ASSERT_EQ(out.size(), 1u);
}

TEST(KvEventLogTest, SubscribersAreBounded) {
  auto log = KvEventLog::Create(100, 2);
  auto a = log->Subscribe({}, [] {});
  auto b = log->Subscribe({}, [] {});
  auto c = log->Subscribe({}, [] {});
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kResourceExhausted);
  a->reset();
  EXPECT_TRUE(log->Subscribe({}, [] {}).ok());
}

TEST(KvEventLogTest, CloseEndsEverySubscriptionAndRefusesNewOnes) {
  auto log = KvEventLog::Create(100, 4);
  int notified = 0;
  auto waiting = log->Subscribe({}, [&] { ++notified; });
  ASSERT_TRUE(waiting.ok());
  std::vector<std::shared_ptr<const KvEventBatch>> out;
  ASSERT_TRUE((*waiting)->Take(16, 100, &out).ok());
  EXPECT_TRUE(out.empty());  // it waits now
  log->Close();
  EXPECT_EQ(notified, 1);  // woken, to find out
  absl::Status s = (*waiting)->Take(16, 100, &out);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(s.message().find("shutting down"), std::string::npos);
  EXPECT_EQ(log->Subscribe({}, [] {}).status().code(), absl::StatusCode::kUnavailable);
  log->Close();  // idempotent
  EXPECT_EQ(notified, 1);
}

}  // namespace
}  // namespace rl::engine
