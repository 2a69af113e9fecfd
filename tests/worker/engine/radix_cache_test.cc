#include "services/worker/engine/radix_cache.h"

#include <map>
#include <random>

#include "gtest/gtest.h"
#include "services/worker/engine/kv_pool.h"

namespace rl::engine {
namespace {

std::vector<int32_t> Pages(int32_t first, int32_t n) {
  std::vector<int32_t> p;
  for (int32_t i = 0; i < n; ++i) p.push_back(first + i);
  return p;
}

TEST(RadixCacheTest, MatchesLongestCachedPrefix) {
  RadixCache tree(1);
  std::vector<int32_t> dups;
  EXPECT_EQ(tree.Insert(0, {1, 2, 3, 4}, Pages(10, 4), &dups), 0);
  auto m = tree.Match(0, std::vector<int32_t>{1, 2, 3, 9});
  EXPECT_EQ(m.num_tokens, 3);
  EXPECT_EQ(m.pages, (std::vector<int32_t>{10, 11, 12}));
  ASSERT_NE(m.last_node, nullptr);
  EXPECT_EQ(tree.Match(0, std::vector<int32_t>{7}).num_tokens, 0);
  EXPECT_EQ(tree.Match(0, std::vector<int32_t>{7}).last_node, nullptr);
  EXPECT_EQ(tree.cached_tokens(), 4);
  // The match split the edge: [1,2,3] and [4].
  EXPECT_EQ(tree.num_nodes(), 2);
}

TEST(RadixCacheTest, PageAlignedKeysIgnorePartialPages) {
  RadixCache tree(4);
  std::vector<int32_t> dups;
  // 10 tokens → 2 whole pages cached, the partial third ignored.
  tree.Insert(0, {1, 2, 3, 4, 5, 6, 7, 8, 9, 10}, Pages(0, 3), &dups);
  EXPECT_EQ(tree.cached_tokens(), 8);
  EXPECT_EQ(tree.Match(0, std::vector<int32_t>{1, 2, 3, 4, 5, 6, 7, 8, 9}).num_tokens, 8);
  // A difference inside the second page stops the match at the first page.
  auto m = tree.Match(0, std::vector<int32_t>{1, 2, 3, 4, 5, 6, 0, 8});
  EXPECT_EQ(m.num_tokens, 4);
  EXPECT_EQ(m.pages, (std::vector<int32_t>{0}));
  EXPECT_EQ(tree.Match(0, std::vector<int32_t>{1, 2, 3}).num_tokens, 0);
}

TEST(RadixCacheTest, InsertReportsDuplicatePages) {
  RadixCache tree(2);
  std::vector<int32_t> dups;
  tree.Insert(0, {1, 2, 3, 4}, {5, 6}, &dups);
  EXPECT_TRUE(dups.empty());
  // Same prefix computed again by another sequence in pages 7, 8 plus a new page 9.
  EXPECT_EQ(tree.Insert(0, {1, 2, 3, 4, 5, 6}, {7, 8, 9}, &dups), 4);
  EXPECT_EQ(dups, (std::vector<int32_t>{7, 8}));
  // The tree's own pages are not duplicates.
  dups.clear();
  EXPECT_EQ(tree.Insert(0, {1, 2, 3, 4}, {5, 6}, &dups), 4);
  EXPECT_TRUE(dups.empty());
  EXPECT_EQ(tree.Match(0, std::vector<int32_t>{1, 2, 3, 4, 5, 6}).pages,
            (std::vector<int32_t>{5, 6, 9}));
}

TEST(RadixCacheTest, LocksPinNodesAndEvictionIsLru) {
  RadixCache tree(1);
  std::vector<int32_t> dups, freed;
  tree.Insert(0, {1, 2}, {0, 1}, &dups);
  tree.Insert(0, {1, 3}, {0, 2}, &dups);
  tree.Insert(0, {4, 5}, {3, 4}, &dups);
  EXPECT_EQ(tree.cached_tokens(), 5);
  auto m = tree.Match(0, std::vector<int32_t>{1, 2});
  tree.Lock(m.last_node);
  EXPECT_EQ(tree.locked_tokens(), 2);
  EXPECT_EQ(tree.evictable_tokens(), 3);
  // Touch [4,5] so that [1,3]'s leaf is the least recently used.
  tree.Match(0, std::vector<int32_t>{4, 5});
  EXPECT_EQ(tree.Evict(1, &freed), 1);
  EXPECT_EQ(freed, (std::vector<int32_t>{2}));
  freed.clear();
  EXPECT_EQ(tree.Evict(100, &freed), 2);  // only [4,5] is left unlocked
  EXPECT_EQ(tree.cached_tokens(), 2);
  tree.Unlock(m.last_node);
  EXPECT_EQ(tree.evictable_tokens(), 2);
  freed.clear();
  EXPECT_EQ(tree.Evict(100, &freed), 2);
  EXPECT_EQ(tree.cached_tokens(), 0);
}

TEST(RadixCacheTest, NamespacesAreIsolated) {
  RadixCache tree(1);
  std::vector<int32_t> dups;
  tree.Insert(/*ns=*/1, {1, 2, 3}, {0, 1, 2}, &dups);
  EXPECT_EQ(tree.Match(1, std::vector<int32_t>{1, 2, 3}).num_tokens, 3);
  EXPECT_EQ(tree.Match(2, std::vector<int32_t>{1, 2, 3}).num_tokens, 0);
  tree.Insert(2, {1, 2, 3}, {3, 4, 5}, &dups);
  EXPECT_TRUE(dups.empty());
  EXPECT_EQ(tree.Match(2, std::vector<int32_t>{1, 2, 3}).pages, (std::vector<int32_t>{3, 4, 5}));
  EXPECT_EQ(tree.cached_tokens(), 6);
}

TEST(RadixCacheTest, ResetReturnsEveryPage) {
  RadixCache tree(2);
  std::vector<int32_t> dups, freed;
  tree.Insert(0, {1, 2, 3, 4}, {0, 1}, &dups);
  tree.Insert(0, {1, 2, 5, 6}, {0, 2}, &dups);
  tree.Insert(3, {1, 2}, {3}, &dups);
  tree.Reset(&freed);
  std::sort(freed.begin(), freed.end());
  EXPECT_EQ(freed, (std::vector<int32_t>{0, 1, 2, 3}));
  EXPECT_EQ(tree.cached_tokens(), 0);
  EXPECT_EQ(tree.num_nodes(), 0);
}

// Random inserts, matches, locks and evictions against the page pool: no page is lost or
// handed out twice, and matches always return pages that hold the matched tokens.
TEST(RadixCacheTest, RandomizedAccountingHolds) {
  for (int32_t ps : {1, 2, 4}) {
    RadixCache tree(ps);
    KvPool pool(512, ps);
    std::map<int32_t, std::vector<int32_t>> page_tokens;  // what each cached page holds
    std::mt19937 rng(ps);
    std::vector<RadixCache::Node*> locked;
    for (int iter = 0; iter < 2000; ++iter) {
      std::vector<int32_t> seq;
      const int len = 1 + rng() % 24;
      for (int i = 0; i < len; ++i) seq.push_back(rng() % 3);
      const int op = rng() % 10;
      if (op < 5) {
        auto m = tree.Match(0, seq);
        for (size_t pi = 0; pi < m.pages.size(); ++pi) {
          std::vector<int32_t> expect(seq.begin() + pi * ps, seq.begin() + (pi + 1) * ps);
          ASSERT_EQ(page_tokens[m.pages[pi]], expect);
        }
        const int64_t n = static_cast<int64_t>(seq.size()) / ps * ps;
        std::vector<int32_t> pages = m.pages;
        std::vector<int32_t> fresh;
        const int64_t need = n / ps - static_cast<int64_t>(pages.size());
        if (need > pool.num_free_pages()) {
          std::vector<int32_t> freed;
          tree.Evict(need - pool.num_free_pages(), &freed);
          for (int32_t p : freed) page_tokens.erase(p);
          pool.Free(freed);
        }
        if (!pool.Alloc(need, &fresh)) continue;
        for (size_t i = 0; i < fresh.size(); ++i) {
          const int64_t pi = static_cast<int64_t>(pages.size());
          page_tokens[fresh[i]] =
              std::vector<int32_t>(seq.begin() + pi * ps, seq.begin() + (pi + 1) * ps);
          pages.push_back(fresh[i]);
        }
        std::vector<int32_t> dups;
        tree.Insert(0, seq, pages, &dups);
        ASSERT_TRUE(dups.empty());
      } else if (op < 7) {
        auto m = tree.Match(0, seq);
        tree.Lock(m.last_node);
        locked.push_back(m.last_node);
      } else if (op < 8 && !locked.empty()) {
        tree.Unlock(locked.back());
        locked.pop_back();
      } else {
        std::vector<int32_t> freed;
        tree.Evict(1 + rng() % 8, &freed);
        for (int32_t p : freed) page_tokens.erase(p);
        pool.Free(freed);
      }
      ASSERT_EQ(pool.num_free_pages() + tree.cached_tokens() / ps, pool.num_pages());
      ASSERT_EQ(tree.evictable_tokens() + tree.locked_tokens(), tree.cached_tokens());
    }
    for (RadixCache::Node* n : locked) tree.Unlock(n);
    EXPECT_EQ(tree.locked_tokens(), 0);
  }
}

}  // namespace
}  // namespace rl::engine
