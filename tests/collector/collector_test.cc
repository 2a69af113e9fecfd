// Whole runs of RunCollect against an in-process FakeRouter: every sample once, retries,
// failures, interrupt + resume to the same bytes, cancellation, idle flushes, bounds.
#include "services/collector/collector.h"

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "common/server_runner.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "services/collector/checkpoint.h"
#include "services/collector/durable_file.h"
#include "services/collector/oversample.h"
#include "services/collector/prompt_set.h"
#include "services/collector/shard.h"
#include "tests/testing/fake_router.h"
#include "tests/testing/test_data.h"

namespace rl::collector {
namespace {

namespace fs = std::filesystem;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

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
  const rl::testing::TempDir tmp;
  const std::string dir = tmp.path();
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
}

TEST(Collector, InterruptedRunsResumeToTheSameMergedBytes) {
  Fleet fleet(FakeRouterOptions{});
  const rl::testing::TempDir tmp;
  const std::string dir = tmp.path();
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
}

// A stop cancels the calls in flight instead of waiting for them: the slow samples (row
// "prompt 1", index 7), which would take ten minutes, stay pending, neither completed nor
// failed, and the next run does them. The stop comes once a slow call is in flight (not after a
// fixed time, which a loaded machine can stretch past anything).
TEST(Collector, StopCancelsCallsInFlight) {
  Fleet fleet(FakeRouterOptions{.slow_text = "prompt 1", .slow_ms = 600000});
  const rl::testing::TempDir tmp;
  const std::string dir = tmp.path();
  const std::string prompts = WritePrompts(dir, 40);
  CollectConfig c = Config(fleet, prompts, dir + "/out");
  c.concurrency = 4;
  std::atomic<bool> stop{false};
  std::thread stopper([&] {
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (fleet.router.slow_calls() == 0 && std::chrono::steady_clock::now() < give_up) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    stop = true;
  });
  auto s = RunCollect(c, &stop);
  stopper.join();
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_TRUE(s->interrupted);
  auto ckpt = LoadCheckpoint(c.out + "/checkpoint.json");
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  EXPECT_GE(fleet.router.slow_calls(), 1);
  for (int32_t k = 0; k < 2; ++k) {
    EXPECT_FALSE(ckpt->completed.contains({7, k}));
    EXPECT_FALSE(ckpt->failed.contains({7, k}));
  }
  fleet.router.SetSlowMs(50);
  auto last = RunCollect(c);
  ASSERT_TRUE(last.ok()) << last.status();
  EXPECT_EQ(last->done, 80);
  EXPECT_EQ(last->failed, 0);
}

TEST(Collector, RetriesUnavailableAndAbortedThenRecordsFinalFailures) {
  Fleet fleet(
      FakeRouterOptions{.unavailable_first = 2, .abort_first = 1, .invalid_text = "prompt 4"});
  const rl::testing::TempDir tmp;
  const std::string dir = tmp.path();
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
  const rl::testing::TempDir tmp;
  const std::string dir = tmp.path();
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
}

TEST(Collector, RefusesAnotherPromptSetAndMergesOnRequest) {
  Fleet fleet(FakeRouterOptions{});
  const rl::testing::TempDir tmp;
  const std::string dir = tmp.path();
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
}

TEST(Collector, IdleTimeoutWritesAShardWhileASampleIsSlow) {
  Fleet fleet(FakeRouterOptions{.slow_text = "prompt 2", .slow_ms = 2500});
  const rl::testing::TempDir tmp;
  const std::string dir = tmp.path();
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
}

// rows x --n is bounded before any per-sample allocation, with both numbers named.
TEST(Collector, RowsTimesNIsBounded) {
  Fleet fleet(FakeRouterOptions{});
  const rl::testing::TempDir tmp;
  const std::string dir = tmp.path();
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
}

// Over-sampling prompts: rows 0..rows-1 in index order, text "row I" (held rows: "hold I").
std::string WriteBatchPrompts(const std::string& dir, int rows, const std::vector<int>& held) {
  const std::string path = dir + "/batch.jsonl";
  std::ofstream out(path);
  for (int i = 0; i < rows; ++i) {
    const bool hold = std::find(held.begin(), held.end(), i) != held.end();
    out << "{\"index\":" << i << ",\"text\":\"" << (hold ? "hold " : "row ") << i << "\"}\n";
  }
  return path;
}

// The row index a collector group id ("collect-TAG-INDEX") names.
int64_t IndexOfGroup(const std::string& group_id) {
  return std::stoll(group_id.substr(group_id.rfind('-') + 1));
}

// Records by (index, sample) from a merged output.
std::map<std::pair<int64_t, int32_t>, SampleRecord> Merged(const std::string& out) {
  std::map<std::pair<int64_t, int32_t>, SampleRecord> by_key;
  auto merged = DecodeShard(Slurp(out + "/trajectories.safetensors"), "merged");
  EXPECT_TRUE(merged.ok()) << merged.status();
  if (!merged.ok()) return by_key;
  for (SampleRecord& r : *merged) by_key[{r.key.index, r.key.sample}] = std::move(r);
  return by_key;
}

// Over-sampling's drain aborts exactly the groups with a call in flight, once each: rows 0 and
// 3 are held by the router until aborted (and answer 1.5 s after the abort, longer than any
// re-send period), rows 1 and 2 answer at once and make the batch of 2. Three dispatcher
// threads: two hold row 0's samples, the third does rows 1 and 2 and then (unless the batch
// was complete first) holds on row 3, so rows 4..9 are never sent. Row 0 (and row 3 when it
// was sent) is aborted exactly once; no other group, sent or not, is aborted. The output is
// the calls' own: groups 1 and 2 whole, row 0's samples saved as partials with the first half
// of what a plain collection makes.
TEST(OverSampling, AbortsOnlyTheGroupsInFlightOnceEach) {
  const rl::testing::TempDir tmp;
  const std::string dir = tmp.path();
  const std::string prompts = WriteBatchPrompts(dir, 10, {0, 3});
  Fleet plain(FakeRouterOptions{});
  CollectConfig ref = Config(plain, prompts, dir + "/ref");
  ASSERT_TRUE(RunCollect(ref).ok());
  const auto want = Merged(ref.out);
  ASSERT_EQ(want.size(), 20u);

  Fleet fleet(FakeRouterOptions{.hold_texts = {"hold 0", "hold 3"}, .abort_reply_ms = 1500});
  CollectConfig c = Config(fleet, prompts, dir + "/out");
  c.concurrency = 3;
  c.batch_groups = 2;
  c.over_sample = 5;  // all ten rows submitted
  auto s = RunCollect(c);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->kept_groups, 2);

  const absl::flat_hash_set<std::string> sent = fleet.router.generated_groups();
  absl::flat_hash_set<int64_t> sent_rows;
  for (const std::string& g : sent) sent_rows.insert(IndexOfGroup(g));
  EXPECT_TRUE(sent_rows.contains(0));
  for (int64_t i = 4; i < 10; ++i) EXPECT_FALSE(sent_rows.contains(i)) << i;
  std::map<int64_t, int> aborts;
  for (const auto& [group, n] : fleet.router.aborts()) aborts[IndexOfGroup(group)] = n;
  std::map<int64_t, int> expected = {{0, 1}};
  if (sent_rows.contains(3)) expected[3] = 1;
  EXPECT_EQ(aborts, expected);

  auto ckpt = LoadCheckpoint(c.out + "/checkpoint.json");
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  const auto got = Merged(c.out);
  ASSERT_EQ(got.size(), 4u);
  for (const auto& [key, r] : got) {
    EXPECT_TRUE(key.first == 1 || key.first == 2) << key.first;
    EXPECT_EQ(r.tokens, want.at(key).tokens) << key.first << "/" << key.second;
  }
  int row0_partials = 0;
  for (const PartialSample& p : ckpt->partials) {
    if (p.key.index != 0) continue;
    ++row0_partials;
    ASSERT_FALSE(p.record.has_value());
    const SampleRecord& full = want.at({0, p.key.sample});
    const std::vector<int32_t> first_half(full.tokens.begin() + full.prompt_len,
                                          full.tokens.begin() + full.prompt_len + 4);
    EXPECT_EQ(p.output_ids, first_half);
  }
  EXPECT_EQ(row0_partials, 2);
}

// An abort that fails in transport (UNAVAILABLE) is sent again after a backoff until it is
// answered, at most --max-attempts times; any other failure is not repeated. The held row's
// calls then run to their end (hold_ms) and are kept whole for the next run.
TEST(OverSampling, RetriesAFailedAbortOnlyInTransportAndBounded) {
  struct Case {
    grpc::StatusCode code;
    int fail_first;
    int max_attempts;
    int want_aborts;
    bool aborted;  // the held calls ended by the abort (else by hold_ms)
  };
  for (const Case& k : {Case{grpc::StatusCode::UNAVAILABLE, 2, 10, 3, true},
                        Case{grpc::StatusCode::RESOURCE_EXHAUSTED, 100, 3, 3, false},
                        Case{grpc::StatusCode::PERMISSION_DENIED, 1, 10, 1, false}}) {
    SCOPED_TRACE(::testing::Message() << "abort fails " << k.fail_first << "x with code " << k.code
                                      << ", max_attempts " << k.max_attempts);
    const rl::testing::TempDir tmp;
    const std::string dir = tmp.path();
    const std::string prompts = WriteBatchPrompts(dir, 4, {0});
    Fleet fleet(FakeRouterOptions{.hold_texts = {"hold 0"},
                                  .hold_ms = 1000,
                                  .abort_fail_first = k.fail_first,
                                  .abort_fail_code = k.code});
    CollectConfig c = Config(fleet, prompts, dir + "/out");
    c.concurrency = 3;
    c.batch_groups = 1;
    c.over_sample = 2;  // rows 0 and 1
    c.max_attempts = k.max_attempts;
    auto s = RunCollect(c);
    ASSERT_TRUE(s.ok()) << s.status();
    EXPECT_EQ(s->kept_groups, 1);
    std::map<int64_t, int> aborts;
    for (const auto& [group, n] : fleet.router.aborts()) aborts[IndexOfGroup(group)] = n;
    EXPECT_EQ(aborts, (std::map<int64_t, int>{{0, k.want_aborts}}));
    auto ckpt = LoadCheckpoint(c.out + "/checkpoint.json");
    ASSERT_TRUE(ckpt.ok()) << ckpt.status();
    int partials = 0;
    for (const PartialSample& p : ckpt->partials) {
      if (p.key.index != 0) continue;
      ++partials;
      EXPECT_EQ(p.record.has_value(), !k.aborted);  // a finished sample is kept whole
      if (!k.aborted) continue;
      EXPECT_EQ(p.output_ids.size(), 4u);
    }
    EXPECT_EQ(partials, 2);
  }
}

// --group-filter: the first word of the command's output decides; anything else, a failed
// command or one that does not answer in time is an error naming it (a hung filter is stopped,
// never waited for).
TEST(GroupFilter, AnswersKeepOrDropAndIsStoppedWhenItHangs) {
  const rl::testing::TempDir tmp;
  const absl::StatusOr<bool> keep =
      RunGroupFilter("grep -q '\"index\"' && echo keep", "{\"index\": 1}", tmp.path());
  ASSERT_TRUE(keep.ok()) << keep.status();
  EXPECT_TRUE(*keep);
  const absl::StatusOr<bool> drop = RunGroupFilter("echo ' drop now'", "{}", tmp.path());
  ASSERT_TRUE(drop.ok()) << drop.status();
  EXPECT_FALSE(*drop);
  const absl::StatusOr<bool> maybe = RunGroupFilter("echo maybe", "{}", tmp.path());
  EXPECT_EQ(maybe.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(maybe.status().message(), HasSubstr("neither keep nor drop"));
  EXPECT_EQ(RunGroupFilter("exit 3", "{}", tmp.path()).status().code(),
            absl::StatusCode::kInvalidArgument);
  const auto start = std::chrono::steady_clock::now();
  const absl::StatusOr<bool> hung = RunGroupFilter("sleep 60; echo keep", "{}", tmp.path(), 1);
  EXPECT_EQ(hung.status().code(), absl::StatusCode::kDeadlineExceeded) << hung.status();
  EXPECT_THAT(hung.status().message(), HasSubstr("within 1 s"));
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(30));  // hang guard
}

}  // namespace
}  // namespace rl::collector
