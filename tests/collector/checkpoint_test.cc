// checkpoint.h: compact encoding, durable round trip, every bound checked on load.
#include "services/collector/checkpoint.h"

#include <filesystem>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/test_data.h"

namespace rl::collector {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

// A million samples saved in order are one run per sample number: the checkpoint stays a few
// bytes, however long the collection (it is rewritten after every shard).
TEST(Checkpoint, SamplesSavedInOrderEncodeAsOneRunEach) {
  CollectCheckpoint c;
  c.n = 2;
  c.total = 2'000'000;
  for (int64_t i = 0; i < 1'000'000; ++i) {
    c.completed.insert({i, 0});
    c.completed.insert({i, 1});
  }
  c.failed.insert({500, 1});
  c.completed.erase({500, 1});
  EXPECT_EQ(c.completed.size(), 1'999'999u);
  const std::string json = EncodeCheckpoint(c);
  EXPECT_LT(json.size(), 400u);
  EXPECT_THAT(json, HasSubstr("\"completed\":[[0,999999,0],[0,499,1],[501,999999,1]]"));
  auto back = DecodeCheckpoint(json, "x");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->completed, c.completed);
  EXPECT_EQ(back->failed, c.failed);
}

TEST(Checkpoint, DurableRoundTrip) {
  const rl::testing::TempDir tmp;
  const std::string dir = tmp.path();
  CollectCheckpoint c;
  c.prompts_sha256 = "abc";
  c.n = 2;
  c.total = 10;
  c.shards = {"shard_00000.safetensors"};
  c.completed = {{1, 0}, {1, 1}, {2, 0}, {3, 0}, {7, 0}, {-2, 1}};
  c.failed = {{3, 1}};
  ASSERT_TRUE(SaveCheckpoint(dir + "/checkpoint.json", c).ok());
  EXPECT_FALSE(fs::exists(dir + "/checkpoint.json.tmp"));
  auto back = LoadCheckpoint(dir + "/checkpoint.json");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->n, 2);
  EXPECT_EQ(back->total, 10);
  EXPECT_EQ(back->shards, c.shards);
  EXPECT_EQ(back->completed, c.completed);
  EXPECT_EQ(back->failed, c.failed);
  EXPECT_THAT(EncodeCheckpoint(c), HasSubstr("\"completed\":[[1,3,0],[7,7,0],[-2,-2,1],[1,1,1]]"));
  // A corrupt range cannot make the loader allocate more than the total.
  EXPECT_THAT(DecodeCheckpoint(R"({"format":"rlfleet.collect.checkpoint.v1","prompts_sha256":"",
      "n":1,"total":10,"shards":[],"completed":[[0,1000000000000,0]],"failed":[]})",
                               "x")
                  .status()
                  .message(),
              HasSubstr("more samples than the total"));
  EXPECT_TRUE(absl::IsNotFound(LoadCheckpoint(dir + "/none.json").status()));
  EXPECT_THAT(DecodeCheckpoint(R"({"format":"rlfleet.collect.checkpoint.v1","prompts_sha256":"",
      "n":1,"total":10,"shards":["../x"],"completed":[],"failed":[]})",
                               "x")
                  .status()
                  .message(),
              HasSubstr("bad shard name"));
  // The total itself is bounded (it is the budget of the ranges), and so are n and samples.
  EXPECT_THAT(DecodeCheckpoint(R"({"format":"rlfleet.collect.checkpoint.v1","prompts_sha256":"",
      "n":1,"total":9000000000000000000,"shards":[],"completed":[],"failed":[]})",
                               "x")
                  .status()
                  .message(),
              HasSubstr("total is out of range"));
  EXPECT_THAT(DecodeCheckpoint(R"({"format":"rlfleet.collect.checkpoint.v1","prompts_sha256":"",
      "n":0,"total":0,"shards":[],"completed":[],"failed":[]})",
                               "x")
                  .status()
                  .message(),
              HasSubstr("n is out of range"));
  EXPECT_THAT(DecodeCheckpoint(R"({"format":"rlfleet.collect.checkpoint.v1","prompts_sha256":"",
      "n":1,"total":10,"shards":[],"completed":[[0,0,5]],"failed":[]})",
                               "x")
                  .status()
                  .message(),
              HasSubstr("bad sample number"));
  // A range spanning the whole int64 line does not overflow the size check.
  EXPECT_THAT(DecodeCheckpoint(R"({"format":"rlfleet.collect.checkpoint.v1","prompts_sha256":"",
      "n":1,"total":10,"shards":[],"completed":[[-9223372036854775808,9223372036854775807,0]],
      "failed":[]})",
                               "x")
                  .status()
                  .message(),
              HasSubstr("more samples than the total"));
}

}  // namespace
}  // namespace rl::collector
