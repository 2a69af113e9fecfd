#include "services/worker/engine/kv_pool.h"

#include <algorithm>

#include "gtest/gtest.h"
#include "services/worker/engine/req_to_token.h"

namespace rl::engine {
namespace {

TEST(KvPoolTest, AllocatesWholePagesAndFreesThem) {
  KvPool pool(/*num_slots=*/103, /*page_size=*/4);
  EXPECT_EQ(pool.num_pages(), 25);
  EXPECT_EQ(pool.total_tokens(), 100);
  std::vector<int32_t> pages;
  ASSERT_TRUE(pool.Alloc(10, &pages));
  EXPECT_EQ(pool.available_tokens(), 60);
  std::vector<int32_t> sorted = pages;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_TRUE(std::adjacent_find(sorted.begin(), sorted.end()) == sorted.end());
  EXPECT_FALSE(pool.Alloc(16, &pages));
  EXPECT_EQ(pages.size(), 10u) << "a failed Alloc allocates nothing";
  pool.Free(pages);
  EXPECT_EQ(pool.num_free_pages(), 25);
}

TEST(KvPoolTest, ResetFreesEverything) {
  KvPool pool(64, 1);
  std::vector<int32_t> pages;
  ASSERT_TRUE(pool.Alloc(64, &pages));
  EXPECT_EQ(pool.num_free_pages(), 0);
  pool.Reset();
  EXPECT_EQ(pool.num_free_pages(), 64);
}

TEST(KvPoolDeathTest, DoubleFreeAborts) {
  KvPool pool(8, 1);
  std::vector<int32_t> pages;
  ASSERT_TRUE(pool.Alloc(1, &pages));
  pool.Free(pages[0]);
  EXPECT_DEATH(pool.Free(pages[0]), "RL_CHECK");
}

TEST(ReqToTokenPoolTest, RowsAreReusedAndCounted) {
  ReqToTokenPool pool(/*num_rows=*/3, /*row_len=*/16);
  auto a = pool.Alloc(), b = pool.Alloc(), c = pool.Alloc();
  ASSERT_TRUE(a && b && c);
  EXPECT_FALSE(pool.Alloc().has_value());
  EXPECT_EQ(pool.num_used(), 3);
  pool.row(*b)[15] = 7;
  EXPECT_EQ(pool.row(*b)[15], 7);
  pool.Free(*b);
  EXPECT_EQ(pool.num_used(), 2);
  EXPECT_EQ(pool.Alloc(), b);
  pool.Reset();
  EXPECT_EQ(pool.num_used(), 0);
}

}  // namespace
}  // namespace rl::engine
