// KvCacheManager on its own: admission with a cached prefix, growth by pages, caching of
// computed pages (shared by the next sequence), release with and without caching, eviction,
// and the page accounting invariant after each.
#include "services/worker/engine/kv_cache_manager.h"

#include <memory>
#include <vector>

#include "gtest/gtest.h"

namespace rl::engine {
namespace {

constexpr int32_t kPage = 4;

std::unique_ptr<Sequence> Seq(std::vector<int32_t> tokens) {
  auto group = std::make_shared<RequestGroup>();
  group->request.id = "s";
  auto s = std::make_unique<Sequence>();
  s->group = group;
  s->prompt_len = static_cast<int32_t>(tokens.size());
  s->tokens = std::move(tokens);
  return s;
}

std::vector<int32_t> Range(int32_t n, int32_t first = 1) {
  std::vector<int32_t> v;
  for (int32_t i = 0; i < n; ++i) v.push_back(first + i);
  return v;
}

absl::Status Check(const KvCacheManager& kv, std::vector<const Sequence*> running) {
  return kv.CheckInvariants(running);
}

TEST(KvCacheManagerTest, AdmitGrowReleaseKeepsThePagesAccounted) {
  KvCacheManager kv(/*num_kv_slots=*/64, kPage, /*num_rows=*/2, /*row_len=*/64);
  EXPECT_EQ(kv.total_tokens(), 64);
  auto a = Seq(Range(10));
  ASSERT_TRUE(kv.Admit(a.get(), kv.Match(0, a->tokens), 0));
  EXPECT_EQ(a->num_allocated, 0);
  ASSERT_TRUE(kv.Grow(a.get(), 10));
  EXPECT_EQ(a->num_allocated, 10);
  EXPECT_EQ(kv.available_tokens(), 64 - 12);  // 3 pages
  // Every slot maps into its page, in order.
  for (int p = 0; p < 10; ++p) EXPECT_EQ(kv.row(*a)[p] % kPage, p % kPage);
  EXPECT_TRUE(Check(kv, {a.get()}).ok());
  a->num_computed = 10;
  kv.Release(a.get(), /*cache=*/false);
  EXPECT_EQ(a->row, -1);
  EXPECT_EQ(kv.available_tokens(), 64);
  EXPECT_EQ(kv.cached_tokens(), 0);
  EXPECT_TRUE(Check(kv, {}).ok());
}

TEST(KvCacheManagerTest, CachedPagesAreSharedByTheNextSequence) {
  KvCacheManager kv(64, kPage, 2, 64);
  auto a = Seq(Range(10));
  ASSERT_TRUE(kv.Admit(a.get(), kv.Match(0, a->tokens), 0));
  ASSERT_TRUE(kv.Grow(a.get(), 10));
  a->num_computed = 10;
  kv.Release(a.get(), /*cache=*/true);  // 2 whole pages cached, the partial one freed
  EXPECT_EQ(kv.cached_tokens(), 8);
  EXPECT_EQ(kv.available_tokens(), 64 - 8);
  EXPECT_EQ(kv.evictable_tokens(), 8);

  auto b = Seq(Range(12));
  RadixCache::MatchResult m = kv.Match(0, b->tokens);
  EXPECT_EQ(m.num_tokens, 8);
  EXPECT_EQ(kv.Match(1, b->tokens).num_tokens, 0);  // another weight version shares nothing
  ASSERT_TRUE(kv.Admit(b.get(), m, 0));
  EXPECT_EQ(b->cached_len, 8);
  EXPECT_EQ(b->num_computed, 8);
  EXPECT_EQ(kv.evictable_tokens(), 0);  // locked by b
  ASSERT_TRUE(kv.Grow(b.get(), 12));
  EXPECT_TRUE(Check(kv, {b.get()}).ok());
  b->num_computed = 12;
  kv.Release(b.get(), /*cache=*/true);
  EXPECT_EQ(kv.cached_tokens(), 12);
  EXPECT_TRUE(Check(kv, {}).ok());
}

TEST(KvCacheManagerTest, CacheUnfinishedSharesComputedPagesWhileRunning) {
  KvCacheManager kv(64, kPage, 2, 64);
  auto a = Seq(Range(9));
  ASSERT_TRUE(kv.Admit(a.get(), kv.Match(0, a->tokens), 0));
  ASSERT_TRUE(kv.Grow(a.get(), 9));
  a->num_computed = 9;
  kv.CacheUnfinished(a.get());
  EXPECT_EQ(a->cached_len, 8);
  EXPECT_EQ(kv.cached_tokens(), 8);
  EXPECT_EQ(kv.evictable_tokens(), 0);  // still locked by a
  EXPECT_TRUE(Check(kv, {a.get()}).ok());
  kv.Release(a.get(), /*cache=*/true);
  EXPECT_TRUE(Check(kv, {}).ok());
}

TEST(KvCacheManagerTest, GrowEvictsUnlockedCachePagesAndFailsCleanlyWhenFull) {
  KvCacheManager kv(16, kPage, 2, 16);  // 4 pages
  auto a = Seq(Range(8));
  ASSERT_TRUE(kv.Admit(a.get(), kv.Match(0, a->tokens), 0));
  ASSERT_TRUE(kv.Grow(a.get(), 8));
  a->num_computed = 8;
  kv.Release(a.get(), /*cache=*/true);  // 2 pages cached, 2 free
  auto b = Seq(Range(16, 100));
  ASSERT_TRUE(kv.Admit(b.get(), kv.Match(0, b->tokens), 0));
  ASSERT_TRUE(kv.Grow(b.get(), 16));  // needs all 4 pages: evicts the cache
  EXPECT_EQ(kv.cached_tokens(), 0);
  EXPECT_TRUE(Check(kv, {b.get()}).ok());
  EXPECT_FALSE(kv.Grow(b.get(), 17));  // no page left
  EXPECT_EQ(b->num_allocated, 16);     // unchanged
  EXPECT_TRUE(Check(kv, {b.get()}).ok());
  kv.Release(b.get(), false);
  EXPECT_TRUE(Check(kv, {}).ok());
}

TEST(KvCacheManagerTest, AdmitFailsWhenNoRowIsFreeAndResetEmptiesEverything) {
  KvCacheManager kv(64, kPage, 1, 64);
  auto a = Seq(Range(4));
  auto b = Seq(Range(4, 50));
  ASSERT_TRUE(kv.Admit(a.get(), kv.Match(0, a->tokens), 0));
  EXPECT_EQ(kv.num_free_rows(), 0);
  EXPECT_FALSE(kv.Admit(b.get(), kv.Match(0, b->tokens), 0));
  EXPECT_EQ(b->row, -1);
  // A leak is named.
  absl::Status leak = Check(kv, {});
  EXPECT_EQ(leak.code(), absl::StatusCode::kInternal);
  EXPECT_NE(leak.message().find("req_to_token leak"), std::string::npos) << leak;
  ASSERT_TRUE(kv.Grow(a.get(), 4));
  a->num_computed = 4;
  kv.Release(a.get(), true);
  EXPECT_EQ(kv.cached_tokens(), 4);
  kv.Reset();
  EXPECT_EQ(kv.cached_tokens(), 0);
  EXPECT_EQ(kv.available_tokens(), 64);
  EXPECT_EQ(kv.num_free_rows(), 1);
}

}  // namespace
}  // namespace rl::engine
