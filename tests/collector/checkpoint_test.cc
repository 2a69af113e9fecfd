// checkpoint.h: compact encoding, durable round trip, every bound checked on load.
#include "services/collector/checkpoint.h"

#include <cmath>
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

// Over-sampling (issue 34): dropped groups and the partial samples of aborted groups round-trip
// (NaN logprobs as null), and a corrupt partial is refused naming the problem.
TEST(Checkpoint, DroppedGroupsAndPartialSamplesRoundTrip) {
  CollectCheckpoint c;
  c.n = 2;
  c.total = 20;
  c.dropped.insert({3, 0});
  PartialSample aborted;
  aborted.key = {4, 1};
  aborted.dispatch_version = 7;
  aborted.output_ids = {10, 11, 12};
  aborted.output_logprobs = {-0.5f, std::nanf(""), -1.5f};
  aborted.segments = {{6, 1}, {7, 2}};
  c.partials.push_back(aborted);
  PartialSample finished;
  finished.key = {4, 0};
  SampleRecord r;
  r.key = finished.key;
  r.finish_reason = "length";
  r.prompt_len = 2;
  r.tokens = {1, 2, 3};
  r.loss_mask = {0, 0, 1};
  r.rollout_logprobs = {std::nanf(""), std::nanf(""), -0.25f};
  r.weight_versions = {-1, -1, 7};
  r.text = "x";
  finished.record = r;
  c.partials.push_back(finished);
  const std::string json = EncodeCheckpoint(c);
  auto back = DecodeCheckpoint(json, "x");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->dropped, c.dropped);
  ASSERT_EQ(back->partials.size(), 2u);
  const PartialSample& a = back->partials[0];
  EXPECT_EQ(a.key, aborted.key);
  EXPECT_EQ(a.dispatch_version, 7);
  EXPECT_EQ(a.output_ids, aborted.output_ids);
  EXPECT_TRUE(std::isnan(a.output_logprobs[1]));
  EXPECT_EQ(a.output_logprobs[2], -1.5f);
  EXPECT_EQ(a.segments, aborted.segments);
  EXPECT_FALSE(a.record.has_value());
  ASSERT_TRUE(back->partials[1].record.has_value());
  EXPECT_EQ(back->partials[1].record->tokens, r.tokens);
  EXPECT_EQ(back->partials[1].record->finish_reason, "length");
  EXPECT_TRUE(std::isnan(back->partials[1].record->rollout_logprobs[0]));

  // Segments that do not add up to the ids: refused.
  std::string bad = json;
  bad.replace(bad.find("[[6,1],[7,2]]"), 13, "[[6,1],[7,5]]");
  auto refused = DecodeCheckpoint(bad, "ckpt");
  ASSERT_FALSE(refused.ok());
  EXPECT_THAT(refused.status().message(), HasSubstr("columns disagree"));
}

}  // namespace
}  // namespace rl::collector
