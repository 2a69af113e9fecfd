#include "services/router/episodes/episode_store.h"

#include <chrono>
#include <cstring>
#include <string>
#include <vector>

#include "common/metrics.h"
#include "gtest/gtest.h"
#include "services/router/episodes/episode_metrics.h"

namespace rl::router {
namespace {

using std::chrono::seconds;

// A turn whose prompt is `prompt` (mask taken from `prompt_mask`) and whose output is `out`.
EpisodeTurnRecord MakeTurn(const std::vector<int32_t>& prompt, const std::vector<uint8_t>& mask,
                           const std::vector<int32_t>& out, int64_t version = 1,
                           rl::v1::FinishReason finish = rl::v1::FINISH_REASON_LENGTH,
                           int32_t matched = -1) {
  EpisodeTurnRecord t;
  t.request_id = "r" + std::to_string(prompt.size());
  t.tokens = prompt;
  t.tokens.insert(t.tokens.end(), out.begin(), out.end());
  t.mask = mask;
  t.mask.resize(prompt.size(), 0);
  t.mask.insert(t.mask.end(), out.size(), 1);
  for (size_t i = 0; i < t.tokens.size(); ++i) {
    t.logprobs.push_back(t.mask[i] ? -0.5f * static_cast<float>(i) : 0.0f);
    t.versions.push_back(version);
  }
  t.prompt_tokens = static_cast<int32_t>(prompt.size());
  t.weight_version = version;
  t.finish_reason = finish;
  t.matched_token_id = matched;
  return t;
}

std::vector<int32_t> Concat(std::vector<int32_t> a, const std::vector<int32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

std::vector<int32_t> Tokens(const rl::v1::EpisodeSample& s) {
  return {s.trajectory().tokens().begin(), s.trajectory().tokens().end()};
}

TEST(EpisodeStoreTest, ChainOfTurnsExportsOneSampleWithEveryGeneratedToken) {
  EpisodeStore store(EpisodeOptions{});
  const std::vector<int32_t> p1 = {1, 10, 11};
  const std::vector<int32_t> o1 = {20, 21};
  ASSERT_TRUE(store.Record("ep", MakeTurn(p1, {}, o1)).ok());
  // Turn 2's prompt is turn 1's trajectory (its output reused exactly, mask 1) plus new text.
  const std::vector<int32_t> p2 = Concat(Concat(p1, o1), {12, 13});
  ASSERT_TRUE(store.Record("ep", MakeTurn(p2, {0, 0, 0, 1, 1}, {22, 23, 24})).ok());
  auto e = store.Export("ep", false);
  ASSERT_TRUE(e.ok()) << e.status();
  ASSERT_EQ(e->turns_size(), 2);
  EXPECT_EQ(e->turns(0).parent(), -1);
  EXPECT_EQ(e->turns(1).parent(), 0);
  EXPECT_EQ(e->turns(1).completion_tokens(), 3);
  ASSERT_EQ(e->samples_size(), 1);
  const rl::v1::EpisodeSample& s = e->samples(0);
  EXPECT_EQ(Tokens(s), Concat(p2, {22, 23, 24}));
  EXPECT_EQ(std::vector<int32_t>(s.turns().begin(), s.turns().end()), (std::vector<int32_t>{0, 1}));
  const std::vector<int32_t> mask(s.trajectory().loss_mask().begin(),
                                  s.trajectory().loss_mask().end());
  EXPECT_EQ(mask, (std::vector<int32_t>{0, 0, 0, 1, 1, 0, 0, 1, 1, 1}));
  EXPECT_EQ(s.trajectory().rollout_logp_size(), 10);
  EXPECT_EQ(s.trajectory().token_weight_versions_size(), 10);
}

TEST(EpisodeStoreTest, EditedHistoryForksIntoTwoSamplesSharingThePrefix) {
  EpisodeStore store(EpisodeOptions{});
  const std::vector<int32_t> p1 = {1, 10};
  const std::vector<int32_t> o1 = {20, 21};
  ASSERT_TRUE(store.Record("ep", MakeTurn(p1, {}, o1)).ok());
  const std::vector<int32_t> p2 = Concat(Concat(p1, o1), {12});
  ASSERT_TRUE(store.Record("ep", MakeTurn(p2, {0, 0, 1, 1}, {30})).ok());
  // The agent rewrites turn 2's answer: the prompt extends turn 1, not turn 2.
  const std::vector<int32_t> p3 = Concat(Concat(p1, o1), {12, 99});
  ASSERT_TRUE(store.Record("ep", MakeTurn(p3, {0, 0, 1, 1}, {40})).ok());
  auto e = store.Export("ep", false);
  ASSERT_TRUE(e.ok());
  EXPECT_EQ(e->turns(2).parent(), 0);
  ASSERT_EQ(e->samples_size(), 2);
  EXPECT_EQ(Tokens(e->samples(0)), Concat(p2, {30}));
  EXPECT_EQ(Tokens(e->samples(1)), Concat(p3, {40}));
  // Both share turn 1's trajectory, and neither holds the other's tokens.
  EXPECT_EQ(e->samples(0).turns(0), 0);
  EXPECT_EQ(e->samples(1).turns(0), 0);
  EXPECT_EQ(e->samples(0).trajectory().tokens(5), 30);
  EXPECT_EQ(e->samples(1).trajectory().tokens(5), 99);
}

TEST(EpisodeStoreTest, FinalStopTokenDroppedByTheTemplateStillContinues) {
  EpisodeStore store(EpisodeOptions{});
  const int32_t eos = 2;
  ASSERT_TRUE(
      store.Record("ep", MakeTurn({1, 10}, {}, {20, eos}, 1, rl::v1::FINISH_REASON_STOP, eos))
          .ok());
  ASSERT_TRUE(store.Record("ep", MakeTurn({1, 10, 20, 12}, {0, 0, 1, 0}, {30})).ok());
  // A token other than the matched stop token must match.
  ASSERT_TRUE(store.Record("ep2", MakeTurn({1, 10}, {}, {20, 21})).ok());
  ASSERT_TRUE(store.Record("ep2", MakeTurn({1, 10, 20, 12}, {0, 0, 1, 0}, {30})).ok());
  EXPECT_EQ(store.Export("ep", false)->turns(1).parent(), 0);
  EXPECT_EQ(store.Export("ep", false)->samples_size(), 1);
  EXPECT_EQ(store.Export("ep2", false)->turns(1).parent(), -1);
  EXPECT_EQ(store.Export("ep2", false)->samples_size(), 2);
}

TEST(EpisodeStoreTest, EpisodesNeverMix) {
  EpisodeStore store(EpisodeOptions{});
  ASSERT_TRUE(store.Record("a", MakeTurn({1, 10}, {}, {20})).ok());
  ASSERT_TRUE(store.Record("b", MakeTurn({1, 10, 20, 5}, {0, 0, 1, 0}, {21})).ok());
  EXPECT_EQ(store.Export("b", false)->turns(0).parent(), -1);
  EXPECT_EQ(store.Export("a", false)->turns_size(), 1);
}

TEST(EpisodeStoreTest, BadInputIsRefusedWithTheProblemNamed) {
  EpisodeStore store(EpisodeOptions{});
  EXPECT_EQ(store.Record("", MakeTurn({1}, {}, {2})).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store.Record("a/b", MakeTurn({1}, {}, {2})).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store.Record(std::string(kMaxEpisodeIdLen + 1, 'x'), MakeTurn({1}, {}, {2})).code(),
            absl::StatusCode::kInvalidArgument);
  EpisodeTurnRecord bad = MakeTurn({1}, {}, {2});
  bad.mask.pop_back();
  EXPECT_EQ(store.Record("a", bad).code(), absl::StatusCode::kInvalidArgument);
  bad = MakeTurn({1}, {}, {2});
  bad.prompt_tokens = 5;
  EXPECT_EQ(store.Record("a", bad).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store.Export("missing", false).status().code(), absl::StatusCode::kNotFound);
}

TEST(EpisodeStoreTest, BoundsRefuseTurnsAndDropTheLeastRecentlyUsedEpisode) {
  EpisodeOptions o;
  o.max_episodes = 2;
  o.max_turns = 2;
  o.max_episode_tokens = 10;
  EpisodeStore store(o);
  ASSERT_TRUE(store.Record("a", MakeTurn({1, 2}, {}, {3})).ok());
  ASSERT_TRUE(store.Record("a", MakeTurn({1, 2, 3}, {0, 0, 1}, {4})).ok());
  EXPECT_EQ(store.Record("a", MakeTurn({1}, {}, {5})).code(),
            absl::StatusCode::kResourceExhausted);  // max_turns
  ASSERT_TRUE(store.Record("b", MakeTurn({1, 2, 3, 4, 5, 6, 7}, {}, {8})).ok());
  EXPECT_EQ(store.Record("b", MakeTurn({1, 2}, {}, {3})).code(),
            absl::StatusCode::kResourceExhausted);       // 8 + 3 tokens > 10
  EXPECT_EQ(store.Export("a", false)->turns_size(), 2);  // a touched: b is now the oldest
  ASSERT_TRUE(store.Record("c", MakeTurn({1}, {}, {2})).ok());
  EXPECT_TRUE(store.Export("a", false).ok());
  EXPECT_FALSE(store.Export("b", false).ok());
  EXPECT_EQ(store.GetStats().refused_turns, 2);
  EXPECT_EQ(store.GetStats().episodes, 2);
}

TEST(EpisodeStoreTest, RemoveAgeAndVersionCollectEpisodes) {
  std::chrono::steady_clock::time_point now{};
  EpisodeOptions o;
  o.ttl = seconds(10);
  o.gc_threshold_k = 2;
  EpisodeStore store(o, [&] { return now; });
  ASSERT_TRUE(store.Record("old", MakeTurn({1}, {}, {2}, /*version=*/1)).ok());
  now += seconds(6);
  ASSERT_TRUE(store.Record("new", MakeTurn({1}, {}, {2}, /*version=*/3)).ok());
  now += seconds(6);  // "old" idle 12 s, "new" 6 s
  EXPECT_EQ(store.Export("old", false).status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(store.Export("new", false).ok());
  ASSERT_TRUE(store.Record("v1", MakeTurn({1}, {}, {2}, /*version=*/1)).ok());
  store.SetCurrentVersion(3);  // drops versions <= 1
  EXPECT_FALSE(store.Export("v1", false).ok());
  EXPECT_TRUE(store.Export("new", /*remove=*/true).ok());
  EXPECT_FALSE(store.Export("new", false).ok());
  EXPECT_EQ(store.GetStats().episodes, 0);
  EXPECT_EQ(store.GetStats().tokens, 0);
}

TEST(EpisodeStoreTest, StatsAndMetricsCountTurnsExportsAndCollection) {
  std::chrono::steady_clock::time_point now{};
  EpisodeOptions o;
  o.ttl = seconds(10);
  EpisodeStore store(o, [&] { return now; });
  MetricsRegistry registry;
  RegisterEpisodeMetrics(&registry, &store);
  ASSERT_TRUE(store.Record("a", MakeTurn({1}, {}, {2})).ok());
  ASSERT_TRUE(store.Record("a", MakeTurn({1, 2, 3}, {0, 1}, {4, 5})).ok());
  ASSERT_TRUE(store.Record("a", MakeTurn({1}, {}, {6})).ok());  // a second root: two samples
  ASSERT_TRUE(store.Record("b", MakeTurn({7}, {}, {8})).ok());
  EpisodeStats s = store.GetStats();
  EXPECT_EQ(s.episodes, 2);
  EXPECT_EQ(s.turns, 4);
  EXPECT_EQ(s.tokens, 2 + 5 + 2 + 2);
  EXPECT_EQ(s.recorded_turns, 4);
  ASSERT_TRUE(store.Export("a", false).ok());
  ASSERT_TRUE(store.Export("a", /*remove=*/true).ok());
  EXPECT_FALSE(store.Export("a", false).ok());  // NOT_FOUND is no export
  now += seconds(11);                           // "b" idle past the ttl
  s = store.GetStats();
  EXPECT_EQ(s.exports, 2);
  EXPECT_EQ(s.exported_samples, 4);
  EXPECT_EQ(s.removed, 1);
  EXPECT_EQ(s.recorded_turns, 4);
  EXPECT_EQ(s.turns, 1);  // "b" is collected on the next Record or Export
  EXPECT_FALSE(store.Export("b", false).ok());
  const std::string text = registry.RenderPrometheus();
  for (const char* line :
       {"rl_router_episodes_live 0", "rl_router_episodes_turns 0", "rl_router_episodes_tokens 0",
        "rl_router_episodes_turns_recorded_total 4", "rl_router_episodes_turns_refused_total 0",
        "rl_router_episodes_exports_total 2", "rl_router_episodes_exported_samples_total 4",
        "rl_router_episodes_removed_total 1", "rl_router_episodes_collected_total 1"}) {
    EXPECT_NE(text.find(std::string(line) + "\n"), std::string::npos) << line << "\n" << text;
  }
}

// R3: a routing over `t`'s tokens [start, size - 1) (the last output token never processed),
// [tokens, 2 layers, top-2], entry (position, layer, slot) = tag * 1000 + position * 10 + layer
// * 2 + slot, so the test can tell whose row a position got; weights tag + position / 100.
void AddRouting(EpisodeTurnRecord* t, int tag, int start = 0, bool weights = true) {
  rl::v1::RoutedExperts r;
  const int n = static_cast<int>(t->tokens.size()) - 1 - start;
  r.add_shape(n);
  r.add_shape(2);
  r.add_shape(2);
  r.set_start_pos(start);
  std::vector<int32_t> ids;
  std::vector<float> w;
  for (int p = start; p < start + n; ++p) {
    for (int l = 0; l < 2; ++l) {
      for (int k = 0; k < 2; ++k) {
        ids.push_back(tag * 1000 + p * 10 + l * 2 + k);
        w.push_back(static_cast<float>(tag) + static_cast<float>(p) / 100.0f);
      }
    }
  }
  r.set_expert_ids(std::string(reinterpret_cast<const char*>(ids.data()), ids.size() * 4));
  if (weights) {
    r.set_expert_weights(std::string(reinterpret_cast<const char*>(w.data()), w.size() * 4));
  }
  t->routing = r;
}

// The tag of every position's first entry in an exported routing.
std::vector<int> RowTags(const rl::v1::RoutedExperts& r) {
  std::vector<int> out;
  const auto* ids = reinterpret_cast<const int32_t*>(r.expert_ids().data());
  for (int i = 0; i < r.shape(0); ++i) {
    const int32_t v = ids[static_cast<size_t>(i) * 4];
    EXPECT_EQ(v % 1000, (r.start_pos() + i) * 10) << "row " << i << " is another position's";
    out.push_back(v / 1000);
  }
  return out;
}

TEST(EpisodeStoreTest, RoutingOfEachBranchComesFromTheTurnThatFirstProcessedEachToken) {
  EpisodeStore store(EpisodeOptions{});
  const std::vector<int32_t> p1 = {1, 10, 11};
  const std::vector<int32_t> o1 = {20, 21};
  EpisodeTurnRecord t1 = MakeTurn(p1, {}, o1);
  AddRouting(&t1, 1);  // positions 0..3 (21, the last, never processed by turn 1)
  ASSERT_TRUE(store.Record("ep", t1).ok());
  // Turn 2 re-sends turn 1's tokens (its own routing of them is recomputed: tag 2) and extends.
  const std::vector<int32_t> p2 = Concat(Concat(p1, o1), {12});
  EpisodeTurnRecord t2 = MakeTurn(p2, {0, 0, 0, 1, 1}, {30, 31});
  AddRouting(&t2, 2);
  ASSERT_TRUE(store.Record("ep", t2).ok());
  // Turn 3 forks from turn 1 (an edited history); its worker computed from position 2 on only.
  const std::vector<int32_t> p3 = Concat(Concat(p1, o1), {13, 14});
  EpisodeTurnRecord t3 = MakeTurn(p3, {0, 0, 0, 1, 1}, {40});
  AddRouting(&t3, 3, /*start=*/2);
  ASSERT_TRUE(store.Record("ep", t3).ok());

  // Without the flag: no routing, as before.
  auto plain = store.Export("ep", false);
  ASSERT_TRUE(plain.ok()) << plain.status();
  ASSERT_EQ(plain->samples_size(), 2);
  EXPECT_FALSE(plain->samples(0).has_routed_experts());
  EXPECT_TRUE(plain->turns(0).has_routed_experts());

  auto e = store.Export("ep", EpisodeExportOptions{.routed_experts = true, .expert_weights = true});
  ASSERT_TRUE(e.ok()) << e.status();
  ASSERT_EQ(e->samples_size(), 2);
  // Branch 1 (turns 0, 1): 8 tokens, 7 processed: 0..3 from turn 1, 4..6 from turn 2.
  const rl::v1::RoutedExperts& r1 = e->samples(0).routed_experts();
  ASSERT_EQ(r1.shape_size(), 3);
  EXPECT_EQ(r1.shape(0), 7);
  EXPECT_EQ(r1.shape(1), 2);
  EXPECT_EQ(r1.shape(2), 2);
  EXPECT_EQ(r1.start_pos(), 0);
  EXPECT_EQ(RowTags(r1), (std::vector<int>{1, 1, 1, 1, 2, 2, 2}));
  ASSERT_EQ(r1.expert_weights().size(), r1.expert_ids().size());
  float w4;
  std::memcpy(&w4, r1.expert_weights().data() + 4 * 4 * 4, 4);
  EXPECT_FLOAT_EQ(w4, 2.04f);
  // Branch 2 (turns 0, 2): 8 tokens: 0..3 from turn 1, 4..6 from turn 3.
  const rl::v1::RoutedExperts& r2 = e->samples(1).routed_experts();
  EXPECT_EQ(r2.shape(0), 7);
  EXPECT_EQ(RowTags(r2), (std::vector<int>{1, 1, 1, 1, 3, 3, 3}));

  // Weights asked of a turn recorded without them: refused, naming the turn.
  EpisodeTurnRecord t4 = MakeTurn(Concat(Concat(p2, {30, 31}), {15}), {}, {50});
  AddRouting(&t4, 4, 0, /*weights=*/false);
  ASSERT_TRUE(store.Record("ep", t4).ok());
  auto no_w =
      store.Export("ep", EpisodeExportOptions{.routed_experts = true, .expert_weights = true});
  EXPECT_EQ(no_w.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(no_w.status().message().find("turn 3 (request"), std::string::npos) << no_w.status();
  EXPECT_NE(no_w.status().message().find("return_expert_weights"), std::string::npos);
  auto ids_only = store.Export("ep", EpisodeExportOptions{.routed_experts = true});
  ASSERT_TRUE(ids_only.ok()) << ids_only.status();
  EXPECT_TRUE(ids_only->samples(1).routed_experts().expert_weights().empty());
  EXPECT_EQ(RowTags(ids_only->samples(1).routed_experts()),
            (std::vector<int>{1, 1, 1, 1, 2, 2, 2, 4, 4}));
  EXPECT_EQ(store.Export("ep", EpisodeExportOptions{.expert_weights = true}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(EpisodeStoreTest, ABranchWithATurnRecordedWithoutRoutingIsRefusedAndKept) {
  EpisodeStore store(EpisodeOptions{});
  EpisodeTurnRecord t1 = MakeTurn({1, 10}, {}, {20, 21});
  AddRouting(&t1, 1);
  ASSERT_TRUE(store.Record("ep", t1).ok());
  // Turn 2 sent without return_routed_experts; turn 3 (another branch) with a routing that does
  // not fit its trajectory: both recorded, without routing.
  ASSERT_TRUE(store.Record("ep", MakeTurn({1, 10, 20, 21, 5}, {}, {30})).ok());
  EpisodeTurnRecord t3 = MakeTurn({1, 10, 20, 21, 6}, {}, {31});
  AddRouting(&t3, 3);
  t3.routing->set_start_pos(3);  // rows past the trajectory's end
  ASSERT_TRUE(store.Record("ep", t3).ok());
  auto e = store.Export("ep", EpisodeExportOptions{.remove = true, .routed_experts = true});
  EXPECT_EQ(e.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(e.status().message().find("turn 1 (request r5, index 0) was recorded without routing"),
            std::string::npos)
      << e.status();
  // Not removed by the refused export; the plain export still works and says which turns have it.
  auto plain = store.Export("ep", false);
  ASSERT_TRUE(plain.ok());
  EXPECT_TRUE(plain->turns(0).has_routed_experts());
  EXPECT_FALSE(plain->turns(1).has_routed_experts());
  EXPECT_FALSE(plain->turns(2).has_routed_experts());
  EXPECT_EQ(plain->turns(2).parent(), 0);
  EpisodeStore other(EpisodeOptions{});
  ASSERT_TRUE(other.Record("ep", t1).ok());
  ASSERT_TRUE(other.Record("ep", t3).ok());
  e = other.Export("ep", EpisodeExportOptions{.routed_experts = true});
  EXPECT_EQ(e.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(e.status().message().find("did not fit"), std::string::npos) << e.status();
  // A later turn whose routing starts after the branch's ends leaves a gap: refused.
  EpisodeStore gap(EpisodeOptions{});
  ASSERT_TRUE(gap.Record("ep", t1).ok());
  EpisodeTurnRecord t5 = MakeTurn({1, 10, 20, 21, 7, 8}, {}, {32});
  AddRouting(&t5, 5, /*start=*/5);
  ASSERT_TRUE(gap.Record("ep", t5).ok());
  e = gap.Export("ep", EpisodeExportOptions{.routed_experts = true});
  EXPECT_EQ(e.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(e.status().message().find("starts at token 5"), std::string::npos) << e.status();
}

TEST(EpisodeStoreTest, RoutingCountsAgainstTheEpisodeMemoryBound) {
  EpisodeOptions o;
  o.max_episode_tokens = 45;  // 765 bytes
  EpisodeStore store(o);
  // 5 tokens (85 B) + 4 rows x 4 entries x 8 B (128 B) = 213 B per turn: three fit, not four.
  for (int i = 0; i < 3; ++i) {
    EpisodeTurnRecord t = MakeTurn({1, 10, 11}, {}, {20, 21});
    AddRouting(&t, 1);
    ASSERT_TRUE(store.Record("ep", t).ok()) << i;
  }
  EXPECT_EQ(store.GetStats().tokens, 15);
  EXPECT_EQ(store.GetStats().bytes, 3 * 213);
  EpisodeTurnRecord t = MakeTurn({1, 10, 11}, {}, {20, 21});
  AddRouting(&t, 1);
  const absl::Status full = store.Record("ep", t);
  EXPECT_EQ(full.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(full.message().find("bytes with routing"), std::string::npos) << full;
  // The same turn without routing (85 B) still fits: the routing is what was counted.
  t.routing.reset();
  EXPECT_TRUE(store.Record("ep", t).ok());
  ASSERT_TRUE(store.Export("ep", true).ok());
  EXPECT_EQ(store.GetStats().bytes, 0);
}

}  // namespace
}  // namespace rl::router
