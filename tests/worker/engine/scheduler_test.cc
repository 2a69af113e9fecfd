// The scheduler's policy driven directly, without the engine thread or a runner: a test plays
// the runner and the sampler (every sequence that finished its prefill gets token 1), so each
// assertion names one decision: decode first, FCFS admission within the prefill budget,
// chunked prefill, retraction of the newest when KV runs out, n > 1 waiting for its prompt's
// prefix, finishing on max_new_tokens, aborts.
#include "services/worker/engine/scheduler.h"

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace rl::engine {
namespace {

struct Finished {
  std::map<std::string, GenerateResult> results;
};

SchedulerOptions Options(int64_t slots, int32_t chunk, int32_t rows = 8) {
  SchedulerOptions o;
  o.num_kv_slots = slots;
  o.page_size = 4;
  o.max_context_len = 1024;
  o.max_running_requests = rows;
  o.chunked_prefill_size = chunk;
  return o;
}

std::shared_ptr<RequestGroup> Group(const std::string& id, int32_t prompt, int32_t max_new,
                                    Finished* done, int32_t n = 1) {
  auto g = std::make_shared<RequestGroup>();
  g->request.id = id;
  // Prompts of different requests differ from their first token.
  for (int32_t i = 0; i < prompt; ++i) {
    g->request.input_ids.push_back(2 + ((i + static_cast<unsigned char>(id[0])) % 20));
  }
  g->request.sampling.max_new_tokens = max_new;
  g->request.sampling.n = n;
  g->callbacks.on_finish = [done](GenerateResult r) {
    done->results[absl::StrCat(r.id, "#", r.index)] = std::move(r);
  };
  return g;
}

// One step: Schedule, then "sample" token 1 for every entry at the end of its tokens.
ScheduledBatch Step(Scheduler& s, int64_t now = 0) {
  ScheduledBatch batch = s.Schedule(now);
  SampledBatch sampled;
  for (const BatchEntry& e : batch.entries) {
    SampledEntry r;
    if (e.start + e.count == static_cast<int64_t>(e.seq->tokens.size())) r.token = 1;
    sampled.entries.push_back(r);
  }
  s.Update(batch, &sampled, now);
  EXPECT_TRUE(s.CheckInvariants().ok()) << s.CheckInvariants();
  return batch;
}

TEST(SchedulerTest, AdmitsFcfsWithinThePrefillBudgetAndChunks) {
  Scheduler s(Options(256, /*chunk=*/8), nullptr);
  Finished done;
  s.Add(Group("a", 6, 4, &done), 1);
  s.Add(Group("b", 6, 4, &done), 2);
  ScheduledBatch b1 = Step(s);
  ASSERT_EQ(b1.entries.size(), 2u);
  EXPECT_EQ(b1.entries[0].count, 6);  // a: whole prompt
  EXPECT_EQ(b1.entries[1].count, 2);  // b: a chunk of the remaining budget
  EXPECT_EQ(b1.entries[1].logits, model::LogitsMode::kNone);
  EXPECT_EQ(b1.num_prefill_tokens, 8);
  ScheduledBatch b2 = Step(s);
  // a decodes first; b's prefill goes on.
  ASSERT_EQ(b2.entries.size(), 2u);
  EXPECT_EQ(b2.entries[0].count, 1);
  EXPECT_EQ(b2.num_decode, 1);
  EXPECT_EQ(b2.entries[1].count, 4);
  EXPECT_EQ(b2.entries[1].logits, model::LogitsMode::kLast);
  for (int i = 0; i < 10 && s.HasWork(); ++i) Step(s);
  EXPECT_FALSE(s.HasWork());
  ASSERT_EQ(done.results.size(), 2u);
  EXPECT_EQ(done.results["a#0"].output_ids, (std::vector<int32_t>{1, 1, 1, 1}));
  EXPECT_EQ(done.results["b#0"].finish_reason.kind, FinishKind::kLength);
  EXPECT_EQ(s.Stats().generated_tokens, 8);
}

TEST(SchedulerTest, RetractsTheNewestWhenKvRunsOut) {
  // 6 pages of 4: two sequences of 8 prompt tokens take 4 pages; decoding 8 more each needs
  // 8 pages, so the newest is retracted and finishes later.
  SchedulerOptions o = Options(24, 64);
  o.init_new_token_ratio = o.min_new_token_ratio = 0;  // no reservation: both are admitted
  Scheduler s(o, nullptr);
  Finished done;
  s.Add(Group("old", 8, 8, &done), 1);
  s.Add(Group("new", 8, 8, &done), 2);
  Step(s);
  EXPECT_EQ(s.Stats().num_running, 2);
  int steps = 0;
  while (s.HasWork() && steps < 100) {
    Step(s);
    ++steps;
  }
  EXPECT_FALSE(s.HasWork());
  EXPECT_GE(s.Stats().num_retractions, 1);
  ASSERT_EQ(done.results.size(), 2u);
  EXPECT_EQ(done.results["old#0"].num_retractions, 0);
  EXPECT_GE(done.results["new#0"].num_retractions, 1);
  EXPECT_EQ(done.results["new#0"].output_ids.size(), 8u);
}

TEST(SchedulerTest, SiblingsWaitForTheirPromptPrefixThenShareIt) {
  Scheduler s(Options(256, 64), nullptr);
  Finished done;
  s.Add(Group("n", 9, 2, &done, /*n=*/3), 1);
  ScheduledBatch b1 = Step(s);
  // Only the first completion prefills; the others wait one step for its pages.
  ASSERT_EQ(b1.entries.size(), 1u);
  EXPECT_EQ(s.Stats().num_waiting, 2);
  ScheduledBatch b2 = Step(s);
  ASSERT_EQ(b2.entries.size(), 3u);
  EXPECT_EQ(b2.entries[1].start, 8);  // 2 cached pages reused
  EXPECT_EQ(s.Stats().cache_hit_tokens, 16);
  for (int i = 0; i < 100 && s.HasWork(); ++i) Step(s);
  EXPECT_FALSE(s.HasWork());
  EXPECT_EQ(done.results.size(), 3u);
}

TEST(SchedulerTest, AbortFinishesWaitingAndRunningCompletions) {
  Scheduler s(Options(256, 4), nullptr);
  Finished done;
  s.Add(Group("a", 8, 8, &done), 1);
  s.Add(Group("b", 8, 8, &done), 2);
  Step(s);  // a: first chunk; b waits
  EXPECT_EQ(s.Abort("b", "bye", 0), 1);
  EXPECT_EQ(done.results["b#0"].finish_reason.kind, FinishKind::kAbort);
  EXPECT_EQ(done.results["b#0"].finish_reason.message, "bye");
  EXPECT_EQ(s.AbortAll("all", 0), 1);
  EXPECT_FALSE(s.HasWork());
  EXPECT_TRUE(s.CheckInvariants().ok());
  EXPECT_EQ(s.Stats().num_aborted, 2);
  EXPECT_TRUE(s.Flush().ok());
  EXPECT_EQ(s.Stats().tree_cache_tokens, 0);
}

}  // namespace
}  // namespace rl::engine
