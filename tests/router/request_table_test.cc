// RequestTable (services/router/request_table.h): ids registered for a request's lifetime, the
// worker holding each, the aborted mark (one id or all), duplicates not registered, handles
// that move and release, and the ids the router makes up.
#include "services/router/request_table.h"

#include <algorithm>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "common/request_limits.h"
#include "gtest/gtest.h"

namespace rl::router {
namespace {

TEST(RequestTableTest, RegistersMarksAndForgets) {
  RequestTable table;
  {
    RequestTable::Handle h = table.Add("a");
    EXPECT_FALSE(h.aborted());
    RequestTable::Handle dup = table.Add("a");  // already in flight: not registered
    h.SetWorker("127.0.0.1:1");
    auto w = table.MarkAborted("a");
    ASSERT_TRUE(w.ok());
    EXPECT_EQ(*w, "127.0.0.1:1");
    EXPECT_TRUE(h.aborted());
    EXPECT_FALSE(dup.aborted());
    EXPECT_EQ(table.size(), 1u);
  }
  EXPECT_EQ(table.size(), 0u);
  EXPECT_EQ(table.MarkAborted("a").status().code(), absl::StatusCode::kNotFound);
  RequestTable::Handle x = table.Add("x"), y = table.Add("y");
  EXPECT_EQ(table.MarkAllAborted(), 2);
  EXPECT_TRUE(x.aborted() && y.aborted());
  EXPECT_NE(RequestTable::NewId(), RequestTable::NewId());
}

TEST(RequestTableTest, BetweenAttemptsNoWorkerHoldsIt) {
  RequestTable table;
  RequestTable::Handle h = table.Add("r1");
  h.SetWorker("127.0.0.1:5");
  h.SetWorker("");  // the attempt ended
  auto w = table.MarkAborted("r1");
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ(*w, "");  // the mark alone stops the request
  EXPECT_TRUE(h.aborted());
  const absl::Status missing = table.MarkAborted("r2").status();
  EXPECT_TRUE(absl::IsNotFound(missing));
  EXPECT_NE(missing.message().find("'r2' is not in flight"), std::string::npos) << missing;
}

TEST(RequestTableTest, HandlesMoveAndReleaseOnce) {
  RequestTable table;
  RequestTable::Handle a = table.Add("a");
  RequestTable::Handle moved = std::move(a);
  EXPECT_EQ(table.size(), 1u);
  a = table.Add("b");  // the moved-from handle takes another id
  EXPECT_EQ(table.size(), 2u);
  moved = std::move(a);  // releases "a", takes "b"
  EXPECT_EQ(table.size(), 1u);
  EXPECT_TRUE(table.MarkAborted("b").ok());
  EXPECT_TRUE(absl::IsNotFound(table.MarkAborted("a").status()));
  EXPECT_TRUE(moved.aborted());
  RequestTable::Handle empty;
  EXPECT_FALSE(empty.aborted());
  empty.SetWorker("x:1");  // no id: nothing happens
  moved = RequestTable::Handle();
  EXPECT_EQ(table.size(), 0u);
  // An id comes free for a new request once its handle is gone.
  RequestTable::Handle again = table.Add("b");
  EXPECT_FALSE(again.aborted());
  EXPECT_EQ(table.size(), 1u);
}

TEST(RequestTableTest, MadeUpIdsCarryTheRouterPrefixAndDiffer) {
  std::set<std::string> ids;
  for (int i = 0; i < 100; ++i) {
    const std::string id = RequestTable::NewId();
    EXPECT_TRUE(absl::StartsWith(id, kRouterRequestIdPrefix)) << id;
    ids.insert(id);
  }
  EXPECT_EQ(ids.size(), 100u);
}

// Issue 34: Router.Abort(group_id) marks every in-flight member of the group, no other.
TEST(RequestTableTest, MarkGroupAbortedMarksTheGroupsMembersOnly) {
  RequestTable table;
  RequestTable::Handle a = table.Add("a", "g1");
  RequestTable::Handle b = table.Add("b", "g1");
  RequestTable::Handle c = table.Add("c", "g2");
  RequestTable::Handle d = table.Add("d");
  std::vector<std::string> ids = table.MarkGroupAborted("g1");
  std::sort(ids.begin(), ids.end());
  EXPECT_EQ(ids, (std::vector<std::string>{"a", "b"}));
  EXPECT_TRUE(a.aborted());
  EXPECT_TRUE(b.aborted());
  EXPECT_FALSE(c.aborted());
  EXPECT_FALSE(d.aborted());
  EXPECT_TRUE(table.MarkGroupAborted("").empty());  // no group: nothing
  EXPECT_TRUE(table.MarkGroupAborted("none").empty());
  b = RequestTable::Handle();  // ended: no longer a member
  EXPECT_EQ(table.MarkGroupAborted("g1"), std::vector<std::string>{"a"});
}

}  // namespace
}  // namespace rl::router
