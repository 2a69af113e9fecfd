// The collector's parts against hand-made inputs, and whole runs against an in-process
// FakeRouter: shard format, checkpoint, prompt set validation, weight-version expansion,
// retries, failures, interrupt + resume, merge.
#include "services/collector/collector.h"

#include <atomic>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <random>
#include <set>
#include <thread>

#include "common/server_runner.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "services/collector/checkpoint.h"
#include "services/collector/durable_file.h"
#include "tests/testing/fake_router.h"
#include "services/collector/prompt_set.h"
#include "services/collector/sample.h"
#include "services/collector/sample_set.h"
#include "services/collector/shard.h"

namespace rl::collector {
namespace {

namespace fs = std::filesystem;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::string TempDir(const std::string& name) {
  fs::path p = fs::temp_directory_path() /
               ("rl_collector_" + name + "_" + std::to_string(::getpid()) + "_" +
                std::to_string(std::chrono::steady_clock::now().time_since_epoch().count()));
  fs::create_directories(p);
  return p.string();
}

rl::v1::GenerateFinal MakeFinal(std::vector<int32_t> prompt, std::vector<int32_t> out) {
  rl::v1::GenerateFinal f;
  for (int32_t t : prompt) f.mutable_trajectory()->add_tokens(t);
  for (size_t i = 0; i < out.size(); ++i) {
    f.add_output_ids(out[i]);
    f.mutable_trajectory()->add_tokens(out[i]);
    f.add_output_logprobs()->set_logprob(-1.0f - static_cast<float>(i));
  }
  f.set_finish_reason(rl::v1::FINISH_REASON_STOP);
  return f;
}

TEST(WeightVersions, SegmentsExpandPerToken) {
  rl::v1::GenerateFinal f = MakeFinal({1, 2}, {10, 11, 12, 13, 14});
  f.set_weight_version(4);
  auto* a = f.add_weight_version_segments();
  a->set_weight_version(3);
  a->set_num_tokens(2);
  auto* b = f.add_weight_version_segments();
  b->set_weight_version(4);
  b->set_num_tokens(3);
  auto v = ExpandWeightVersions(f);
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_THAT(*v, ElementsAre(3, 3, 4, 4, 4));
}

TEST(WeightVersions, NoSegmentsFallsBackToWeightVersion) {
  rl::v1::GenerateFinal f = MakeFinal({1}, {10, 11, 12});
  f.set_weight_version(7);
  auto v = ExpandWeightVersions(f);
  ASSERT_TRUE(v.ok());
  EXPECT_THAT(*v, ElementsAre(7, 7, 7));
}

TEST(WeightVersions, SegmentsThatDoNotCoverTheOutputAreRejected) {
  rl::v1::GenerateFinal f = MakeFinal({1}, {10, 11, 12});
  auto* a = f.add_weight_version_segments();
  a->set_weight_version(1);
  a->set_num_tokens(2);
  EXPECT_THAT(ExpandWeightVersions(f).status().message(), HasSubstr("cover 2 of the 3"));
  a->set_num_tokens(4);
  EXPECT_FALSE(ExpandWeightVersions(f).ok());
  a->set_num_tokens(-1);
  EXPECT_FALSE(ExpandWeightVersions(f).ok());
}

TEST(FillFromFinal, PromptAndResponseColumns) {
  rl::v1::GenerateFinal f = MakeFinal({5, 6, 7}, {20, 21});
  f.set_weight_version(2);
  auto* a = f.add_weight_version_segments();
  a->set_weight_version(1);
  a->set_num_tokens(1);
  auto* b = f.add_weight_version_segments();
  b->set_weight_version(2);
  b->set_num_tokens(1);
  SampleRecord r;
  ASSERT_TRUE(FillFromFinal(f, &r).ok());
  EXPECT_EQ(r.prompt_len, 3);
  EXPECT_THAT(r.tokens, ElementsAre(5, 6, 7, 20, 21));
  EXPECT_THAT(r.loss_mask, ElementsAre(0, 0, 0, 1, 1));
  EXPECT_THAT(r.weight_versions, ElementsAre(-1, -1, -1, 1, 2));
  EXPECT_TRUE(std::isnan(r.rollout_logprobs[0]));
  EXPECT_FLOAT_EQ(r.rollout_logprobs[3], -1.0f);
  EXPECT_FLOAT_EQ(r.rollout_logprobs[4], -2.0f);
  EXPECT_EQ(r.finish_reason, "stop");
  EXPECT_EQ(r.weight_version, 2);
}

TEST(FillFromFinal, MissingTrajectoryIsAnError) {
  rl::v1::GenerateFinal f;
  f.add_output_ids(3);
  SampleRecord r;
  EXPECT_THAT(FillFromFinal(f, &r).message(), HasSubstr("return_trajectory"));
}

SampleRecord Record(int64_t index, int32_t sample, std::vector<int32_t> tokens, int prompt_len) {
  SampleRecord r;
  r.key = {index, sample};
  r.group = index * 10;
  r.prompt_len = prompt_len;
  r.tokens = tokens;
  for (size_t i = 0; i < tokens.size(); ++i) {
    const bool resp = static_cast<int>(i) >= prompt_len;
    r.loss_mask.push_back(resp ? 1 : 0);
    r.rollout_logprobs.push_back(resp ? -0.5f * i : NAN);
    r.weight_versions.push_back(resp ? 3 : -1);
  }
  r.finish_reason = "length";
  r.attempts = 1;
  r.weight_version = 3;
  r.metadata_json = R"({"source":"gsm8k","label":[1,2]})";
  return r;
}

TEST(Shard, RoundTripIsExactAndDeterministic) {
  std::vector<SampleRecord> in = {Record(4, 0, {1, 2, 3, 9}, 3), Record(1, 1, {7, 8}, 1)};
  SampleRecord failed;
  failed.key = {2, 0};
  failed.status = "UNAVAILABLE: gone (after 6 attempts)";
  failed.attempts = 6;
  in.push_back(failed);
  const std::string bytes = EncodeShard(in);
  EXPECT_EQ(bytes, EncodeShard(in));
  auto out = DecodeShard(bytes, "mem");
  ASSERT_TRUE(out.ok()) << out.status();
  ASSERT_EQ(out->size(), 3u);
  for (size_t i = 0; i < in.size(); ++i) {
    const SampleRecord& a = in[i];
    const SampleRecord& b = (*out)[i];
    EXPECT_EQ(a.key, b.key);
    EXPECT_EQ(a.group, b.group);
    EXPECT_EQ(a.status, b.status);
    EXPECT_EQ(a.finish_reason, b.finish_reason);
    EXPECT_EQ(a.prompt_len, b.prompt_len);
    EXPECT_EQ(a.attempts, b.attempts);
    EXPECT_EQ(a.tokens, b.tokens);
    EXPECT_EQ(a.loss_mask, b.loss_mask);
    EXPECT_EQ(a.weight_versions, b.weight_versions);
    ASSERT_EQ(a.rollout_logprobs.size(), b.rollout_logprobs.size());
    for (size_t j = 0; j < a.rollout_logprobs.size(); ++j) {
      EXPECT_EQ(std::isnan(a.rollout_logprobs[j]), std::isnan(b.rollout_logprobs[j]));
      if (!std::isnan(a.rollout_logprobs[j]))
        EXPECT_EQ(a.rollout_logprobs[j], b.rollout_logprobs[j]);
    }
  }
  EXPECT_EQ((*out)[0].metadata_json, R"({"label":[1,2],"source":"gsm8k"})");
  // Re-encoding what was decoded gives the same bytes.
  EXPECT_EQ(EncodeShard(*out), bytes);
}

// R3: the final's routed experts land in the record (checked against their shape) and travel
// through a shard exactly; shards without routing keep their old layout.
TEST(Shard, RoutedExpertsRoundTrip) {
  rl::v1::GenerateFinal f = MakeFinal({5, 6, 7}, {20, 21});
  rl::v1::RoutedExperts* re = f.mutable_routed_experts();
  const std::vector<int32_t> ids = {3, 1, 0, 2, 7, 4, 5, 6};  // [2 tokens, 2 layers, 2]
  const std::vector<float> w = {0.6f, 0.4f, 0.5f, 0.5f, 0.9f, 0.1f, 0.7f, 0.3f};
  re->set_expert_ids(ids.data(), ids.size() * 4);
  re->set_expert_weights(w.data(), w.size() * 4);
  for (int d : {2, 2, 2}) re->add_shape(d);
  re->set_start_pos(2);
  SampleRecord r;
  ASSERT_TRUE(FillFromFinal(f, &r).ok());
  EXPECT_EQ(r.routed_experts, ids);
  EXPECT_EQ(r.expert_weights, w);
  EXPECT_THAT(r.routed_shape, ElementsAre(2, 2, 2));
  EXPECT_EQ(r.routed_start, 2);

  std::vector<SampleRecord> in = {r, Record(1, 1, {7, 8}, 1)};
  const std::string bytes = EncodeShard(in);
  auto out = DecodeShard(bytes, "mem");
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ((*out)[0].routed_experts, ids);
  EXPECT_EQ((*out)[0].expert_weights, w);
  EXPECT_EQ((*out)[0].routed_shape, r.routed_shape);
  EXPECT_EQ((*out)[0].routed_start, 2);
  EXPECT_TRUE((*out)[1].routed_shape.empty());
  EXPECT_TRUE((*out)[1].routed_experts.empty());
  EXPECT_EQ(EncodeShard(*out), bytes);
  EXPECT_EQ(EncodeShard({Record(1, 1, {7, 8}, 1)}).find("routed"), std::string::npos);
  // A shard whose routed_shape overflows or is negative is refused, never multiplied blindly.
  for (const std::vector<int32_t>& shape :
       {std::vector<int32_t>{2147483647, 2147483647, 2147483647}, std::vector<int32_t>{-2, -2, 2}}) {
    SampleRecord odd = r;
    odd.routed_shape = shape;
    auto decoded = DecodeShard(EncodeShard({odd}), "mem");
    ASSERT_FALSE(decoded.ok());
    EXPECT_THAT(decoded.status().message(), HasSubstr("routed_shape"));
  }

  // Bytes that do not match the shape are refused.
  re->set_expert_ids(ids.data(), 7 * 4);
  SampleRecord bad;
  EXPECT_THAT(FillFromFinal(f, &bad).message(), HasSubstr("routed_experts"));
  re->set_expert_ids(ids.data(), ids.size() * 4);
  re->set_start_pos(4);  // tokens [4, 6) beyond the 5 tokens
  EXPECT_THAT(FillFromFinal(f, &bad).message(), HasSubstr("beyond"));
}

TEST(Shard, EmptyShardAndCorruptionAreHandled) {
  auto empty = DecodeShard(EncodeShard({}), "empty");
  ASSERT_TRUE(empty.ok()) << empty.status();
  EXPECT_TRUE(empty->empty());
  std::string bytes = EncodeShard({Record(1, 0, {1, 2, 3}, 1)});
  EXPECT_FALSE(DecodeShard(bytes.substr(0, bytes.size() - 3), "cut").ok());
  EXPECT_FALSE(DecodeShard("", "nothing").ok());
  EXPECT_FALSE(DecodeShard(std::string(16, '\xff'), "garbage").ok());
}

TEST(PromptSet, RowsAreValidatedWithTheLineNamed) {
  EXPECT_THAT(ParsePromptRow(R"({"text":"hi"})", 3).status().message(),
              HasSubstr("prompt line 3: missing required field `index`"));
  EXPECT_THAT(ParsePromptRow(R"({"index":1})", 1).status().message(), HasSubstr("exactly one"));
  EXPECT_THAT(ParsePromptRow(R"({"index":1,"text":"a","input_ids":[1]})", 1).status().message(),
              HasSubstr("exactly one"));
  EXPECT_THAT(ParsePromptRow(R"({"index":"1","text":"a"})", 1).status().message(),
              HasSubstr("`index` is not"));
  EXPECT_THAT(ParsePromptRow(R"({"index":1,"input_ids":[1,-2]})", 1).status().message(),
              HasSubstr("not a token id"));
  EXPECT_THAT(ParsePromptRow(R"({"index":1,"text":"a","sampling_params":{"temprature":1}})", 9)
                  .status()
                  .message(),
              HasSubstr("unknown field sampling_params.temprature"));
  EXPECT_FALSE(ParsePromptRow("{not json", 1).ok());
  auto row = ParsePromptRow(
      R"({"index":5,"input_ids":[1,2],"sampling_params":{"temperature":0.5,"stop":["x"]},"answer":"42"})",
      1);
  ASSERT_TRUE(row.ok()) << row.status();
  EXPECT_EQ(row->index, 5);
  EXPECT_THAT(row->input_ids, ElementsAre(1, 2));
  EXPECT_EQ(row->metadata_json, R"({"answer":"42"})");
  rl::v1::SamplingParams p;
  p.set_temperature(1.0f);
  ASSERT_TRUE(ApplySamplingOverrides(row->sampling_json, &p).ok());
  EXPECT_FLOAT_EQ(p.temperature(), 0.5f);
  EXPECT_EQ(p.stop(0), "x");
}

TEST(PromptSet, DuplicateIndexFailsNamingBothLines) {
  const std::string dir = TempDir("dup");
  const std::string path = dir + "/p.jsonl";
  std::ofstream(path) << "{\"index\":1,\"text\":\"a\"}\n\n{\"index\":2,\"text\":\"b\"}\n"
                         "{\"index\":1,\"text\":\"c\"}\n";
  auto set = LoadPromptSet(path);
  ASSERT_FALSE(set.ok());
  EXPECT_THAT(set.status().message(),
              HasSubstr("prompt line 4: duplicate index 1 (first on line 1)"));
  fs::remove_all(dir);
}

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
  const std::string dir = TempDir("ckpt");
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
  fs::remove_all(dir);
}

// A FakeRouter served on loopback.
struct Fleet {
  explicit Fleet(FakeRouterOptions o) : router(std::move(o)) {
    auto s = GrpcServer::Start(ServerOptions{}, {&router});
    EXPECT_TRUE(s.ok()) << s.status();
    server = std::move(*s);
  }
  FakeRouter router;
  std::unique_ptr<GrpcServer> server;
};

std::string WritePrompts(const std::string& dir, int rows) {
  const std::string path = dir + "/prompts.jsonl";
  std::ofstream out(path);
  for (int i = 0; i < rows; ++i) {
    // Indices out of file order, some token-id prompts, metadata carried through.
    const int index = (i * 7) % rows;
    if (i % 3 == 0) {
      out << "{\"index\":" << index << ",\"input_ids\":[" << i + 1 << "," << i + 2
          << "],\"tag\":\"ids\"}\n";
    } else {
      out << "{\"index\":" << index << ",\"text\":\"prompt " << i << "\",\"tag\":" << i << "}\n";
    }
  }
  return path;
}

CollectConfig Config(const Fleet& f, const std::string& prompts, const std::string& out) {
  CollectConfig c;
  c.router = f.server->address();
  c.prompts = prompts;
  c.out = out;
  c.n = 2;
  c.concurrency = 8;
  c.save_batch_size = 7;
  c.seed = 11;
  c.retry_backoff_ms = 1;
  c.max_backoff_ms = 5;
  c.progress = "off";
  return c;
}

std::string Slurp(const std::string& path) {
  auto b = ReadFileBounded(path, 1 << 30);
  return b.ok() ? *b : "";
}

TEST(Collector, CollectsEverySampleOnceSortedWithSegments) {
  Fleet fleet(FakeRouterOptions{.two_segments = true, .weight_version = 4});
  const std::string dir = TempDir("run");
  CollectConfig c = Config(fleet, WritePrompts(dir, 30), dir + "/out");
  c.jsonl = true;
  auto s = RunCollect(c);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->total, 60);
  EXPECT_EQ(s->done, 60);
  EXPECT_EQ(s->failed, 0);
  EXPECT_TRUE(s->merged);
  EXPECT_EQ(s->shards, 9);  // ceil(60 / 7)
  EXPECT_TRUE(fs::exists(c.out + "/shard_00000.jsonl"));
  auto merged = DecodeShard(Slurp(c.out + "/trajectories.safetensors"), "merged");
  ASSERT_TRUE(merged.ok()) << merged.status();
  ASSERT_EQ(merged->size(), 60u);
  for (size_t i = 0; i < merged->size(); ++i) {
    const SampleRecord& r = (*merged)[i];
    EXPECT_EQ(r.key.index, static_cast<int64_t>(i / 2));
    EXPECT_EQ(r.key.sample, static_cast<int32_t>(i % 2));
    ASSERT_EQ(r.tokens.size(), static_cast<size_t>(r.prompt_len) + 8);
    EXPECT_THAT(
        std::vector<int64_t>(r.weight_versions.begin() + r.prompt_len, r.weight_versions.end()),
        ElementsAre(4, 4, 4, 4, 5, 5, 5, 5));
    EXPECT_EQ(r.weight_version, 5);
    EXPECT_THAT(r.metadata_json, HasSubstr("\"tag\""));
  }
  // Group members differ (per-sample seeds), groups are the rows' positions.
  EXPECT_NE((*merged)[0].tokens, (*merged)[1].tokens);
  EXPECT_EQ((*merged)[0].group, (*merged)[1].group);
  EXPECT_TRUE(fs::exists(c.out + "/manifest.json"));
  EXPECT_THAT(Slurp(c.out + "/manifest.json"), HasSubstr("\"complete\": true"));
  // Nothing pending: the same command goes straight to the merge, output unchanged.
  const std::string before = Slurp(c.out + "/trajectories.safetensors");
  const int64_t calls = fleet.router.calls();
  auto again = RunCollect(c);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(fleet.router.calls(), calls);
  EXPECT_EQ(Slurp(c.out + "/trajectories.safetensors"), before);
  fs::remove_all(dir);
}

TEST(Collector, InterruptedRunsResumeToTheSameMergedBytes) {
  Fleet fleet(FakeRouterOptions{});
  const std::string dir = TempDir("resume");
  const std::string prompts = WritePrompts(dir, 40);
  CollectConfig ref = Config(fleet, prompts, dir + "/ref");
  ASSERT_TRUE(RunCollect(ref).ok());

  CollectConfig c = Config(fleet, prompts, dir + "/out");
  c.concurrency = 2;
  int interrupted = 0;
  for (int round = 0; round < 20; ++round) {
    std::atomic<bool> stop{false};
    std::thread stopper([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(2 + round));
      stop = true;
    });
    auto s = RunCollect(c, &stop);
    stopper.join();
    ASSERT_TRUE(s.ok()) << s.status();
    if (!s->interrupted) break;
    ++interrupted;
    auto ckpt = LoadCheckpoint(c.out + "/checkpoint.json");
    if (ckpt.ok()) {
      EXPECT_LE(ckpt->completed.size(), 80u);
    }
  }
  auto last = RunCollect(c);
  ASSERT_TRUE(last.ok());
  EXPECT_EQ(last->done, 80);
  EXPECT_EQ(Slurp(c.out + "/trajectories.safetensors"),
            Slurp(ref.out + "/trajectories.safetensors"));
  RecordProperty("interrupted_runs", interrupted);
  fs::remove_all(dir);
}

// A stop cancels the calls in flight instead of waiting for them: the slow samples (row
// "prompt 1", index 7) stay pending, neither completed nor failed, and the next run does them.
TEST(Collector, StopCancelsCallsInFlight) {
  Fleet fleet(FakeRouterOptions{.slow_text = "prompt 1", .slow_ms = 3000});
  const std::string dir = TempDir("cancel");
  const std::string prompts = WritePrompts(dir, 40);
  CollectConfig c = Config(fleet, prompts, dir + "/out");
  c.concurrency = 4;
  std::atomic<bool> stop{false};
  std::thread stopper([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    stop = true;
  });
  auto s = RunCollect(c, &stop);
  stopper.join();
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_TRUE(s->interrupted);
  auto ckpt = LoadCheckpoint(c.out + "/checkpoint.json");
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  for (int32_t k = 0; k < 2; ++k) {
    EXPECT_FALSE(ckpt->completed.contains({7, k}));
    EXPECT_FALSE(ckpt->failed.contains({7, k}));
  }
  auto last = RunCollect(c);
  ASSERT_TRUE(last.ok()) << last.status();
  EXPECT_EQ(last->done, 80);
  EXPECT_EQ(last->failed, 0);
  fs::remove_all(dir);
}

TEST(Collector, RetriesUnavailableAndAbortedThenRecordsFinalFailures) {
  Fleet fleet(
      FakeRouterOptions{.unavailable_first = 2, .abort_first = 1, .invalid_text = "prompt 4"});
  const std::string dir = TempDir("faults");
  CollectConfig c = Config(fleet, WritePrompts(dir, 6), dir + "/out");
  auto s = RunCollect(c);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->done, 12);
  EXPECT_EQ(s->failed, 2);  // both samples of the invalid prompt, not retried
  EXPECT_GE(s->retries, 10 * 3);
  auto merged = DecodeShard(Slurp(c.out + "/trajectories.safetensors"), "merged");
  ASSERT_TRUE(merged.ok());
  int failed = 0;
  for (const SampleRecord& r : *merged) {
    if (r.ok()) {
      EXPECT_EQ(r.attempts, 4);
    } else {
      ++failed;
      EXPECT_THAT(r.status, HasSubstr("INVALID_ARGUMENT: fake: bad prompt"));
      EXPECT_TRUE(r.tokens.empty());
    }
  }
  EXPECT_EQ(failed, 2);
  EXPECT_THAT(Slurp(c.out + "/manifest.json"), HasSubstr("\"complete\": false"));
}

TEST(Collector, ExhaustedRetriesAreRecordedAndRetriedOnResume) {
  const std::string dir = TempDir("exhaust");
  std::string prompts = WritePrompts(dir, 3);
  {
    Fleet fleet(FakeRouterOptions{.unavailable_first = 100});
    CollectConfig c = Config(fleet, prompts, dir + "/out");
    c.max_attempts = 2;
    auto s = RunCollect(c);
    ASSERT_TRUE(s.ok()) << s.status();
    EXPECT_EQ(s->failed, 6);
    auto merged = DecodeShard(Slurp(c.out + "/trajectories.safetensors"), "merged");
    ASSERT_TRUE(merged.ok());
    EXPECT_THAT((*merged)[0].status, HasSubstr("UNAVAILABLE: fake: not yet (after 2 attempts)"));
  }
  Fleet healthy(FakeRouterOptions{});
  CollectConfig c = Config(healthy, prompts, dir + "/out");
  auto s = RunCollect(c);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->failed, 0);
  EXPECT_EQ(s->done, 6);
  EXPECT_EQ(healthy.router.calls(), 6);
  auto merged = DecodeShard(Slurp(c.out + "/trajectories.safetensors"), "merged");
  ASSERT_TRUE(merged.ok());
  ASSERT_EQ(merged->size(), 6u);
  for (const SampleRecord& r : *merged) EXPECT_TRUE(r.ok());
  fs::remove_all(dir);
}

TEST(Collector, RefusesAnotherPromptSetAndMergesOnRequest) {
  Fleet fleet(FakeRouterOptions{});
  const std::string dir = TempDir("mismatch");
  CollectConfig c = Config(fleet, WritePrompts(dir, 4), dir + "/out");
  c.merge_only = true;
  EXPECT_TRUE(absl::IsFailedPrecondition(RunCollect(c).status()));
  c.merge_only = false;
  ASSERT_TRUE(RunCollect(c).ok());
  fs::remove(c.out + "/trajectories.safetensors");
  c.merge_only = true;
  auto m = RunCollect(c);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->done, 8);
  EXPECT_TRUE(fs::exists(c.out + "/trajectories.safetensors"));
  c.merge_only = false;
  c.n = 3;
  EXPECT_THAT(RunCollect(c).status().message(), HasSubstr("another prompt set or --n"));
  fs::remove_all(dir);
}

TEST(Collector, IdleTimeoutWritesAShardWhileASampleIsSlow) {
  Fleet fleet(FakeRouterOptions{.slow_text = "prompt 2", .slow_ms = 2500});
  const std::string dir = TempDir("idle");
  CollectConfig c = Config(fleet, WritePrompts(dir, 6), dir + "/out");
  c.n = 1;
  c.save_batch_size = 100;
  c.idle_flush_ms = 400;
  auto s = RunCollect(c);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->done, 6);
  // The fast samples were saved on the idle timeout, before the slow one (row 2, index 2)
  // finished; it is alone in the last shard.
  EXPECT_GE(s->shards, 2);
  auto last = DecodeShard(
      Slurp(c.out + "/" + LoadCheckpoint(c.out + "/checkpoint.json")->shards.back()), "last");
  ASSERT_TRUE(last.ok());
  ASSERT_EQ(last->size(), 1u);
  EXPECT_EQ((*last)[0].key.index, 2);
  fs::remove_all(dir);
}

// rows x --n is bounded before any per-sample allocation, with both numbers named.
TEST(Collector, RowsTimesNIsBounded) {
  Fleet fleet(FakeRouterOptions{});
  const std::string dir = TempDir("bound");
  const int rows = static_cast<int>(kMaxSamples / kMaxSamplesPerPrompt) + 1;
  {
    std::ofstream out(dir + "/prompts.jsonl");
    for (int i = 0; i < rows; ++i) out << "{\"index\":" << i << ",\"input_ids\":[1]}\n";
  }
  CollectConfig c = Config(fleet, dir + "/prompts.jsonl", dir + "/out");
  c.n = kMaxSamplesPerPrompt;
  auto s = RunCollect(c);
  EXPECT_TRUE(absl::IsInvalidArgument(s.status())) << s.status();
  EXPECT_THAT(s.status().message(), HasSubstr("more than the limit of 50000000"));
  EXPECT_THAT(s.status().message(), HasSubstr(std::to_string(rows) + " rows x --n 1024"));
  EXPECT_FALSE(fs::exists(dir + "/out/checkpoint.json"));
  fs::remove_all(dir);
}

TEST(Collector, ConfigIsValidated) {
  CollectConfig c;
  c.out = "x";
  EXPECT_THAT(ValidateConfig(c).message(), HasSubstr("--router"));
  c.router = "a:1";
  c.prompts = "p";
  c.n = 0;
  EXPECT_THAT(ValidateConfig(c).message(), HasSubstr("--n"));
  c.n = 1;
  c.top_p = 0;
  EXPECT_THAT(ValidateConfig(c).message(), HasSubstr("--top-p"));
}

}  // namespace
}  // namespace rl::collector
