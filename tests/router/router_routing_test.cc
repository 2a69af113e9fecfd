// Routing policies end to end: rl-router over in-process rl-workers (stories260K). affinity
// keeps a key's requests (field or rl-routing-key header) and a group's on one worker and a
// keyless episode's turns on the worker that served its previous turn, whose prefix cache then
// serves the prompt; cache_aware does the same from the text cache alone; the routing metrics
// (picks, keyed picks, prefix hit rate as the workers report it, per-worker counters) follow;
// the samples of a group sent at once meet on one worker (the bound's slack, key placement).
#include <map>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "rl/v1/router.grpc.pb.h"
#include "tests/testing/router_fleet.h"

namespace rl::router {
namespace {

class RouterRoutingTest : public testing::RouterFleetTest {
 protected:
  void StartPolicy(const std::string& policy, int workers = 3) {
    RouterConfig config;
    config.policy = policy;
    worker::WorkerConfig wc;
    wc.page_size = 4;  // short prompts still fill whole cache pages
    StartFleet(workers, config, wc);
  }

  // One greedy generation; its final (the test fails on an error).
  rl::v1::GenerateFinal Run(rl::v1::GenerateRequest req, const std::string& header_key = "") {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
    if (!header_key.empty()) ctx.AddMetadata("rl-routing-key", header_key);
    auto reader = stub_->Generate(&ctx, req);
    rl::v1::GenerateResponse msg;
    rl::v1::GenerateFinal f;
    while (reader->Read(&msg)) {
      if (msg.has_final()) f = msg.final();
    }
    const grpc::Status s = reader->Finish();
    EXPECT_TRUE(s.ok()) << s.error_message();
    return f;
  }

  // 2 groups of 8 first turns sent at once: each group's 8 served by one worker.
  void CheckConcurrentGroupsMeet() {
    std::vector<std::vector<std::string>> workers(2, std::vector<std::string>(8));
    std::vector<std::thread> threads;
    for (int g = 0; g < 2; ++g) {
      for (int s = 0; s < 8; ++s) {
        threads.emplace_back([this, &workers, g, s] {
          rl::v1::GenerateRequest req = TextRequest(
              absl::StrCat("Once upon a time a cat named Tim found ", g, " red hats."), 24,
              /*trajectory=*/false);
          req.set_group_id(absl::StrCat("step-group-", g));
          workers[static_cast<size_t>(g)][static_cast<size_t>(s)] = Run(req).worker();
        });
      }
    }
    for (auto& t : threads) t.join();
    for (const auto& group : workers) {
      EXPECT_EQ(std::set<std::string>(group.begin(), group.end()).size(), 1u);
    }
    EXPECT_EQ(Metrics().routing().keyed_picks(), 16);
  }

  rl::v1::GetMetricsResponse Metrics() {
    rl::v1::GetMetricsResponse m;
    grpc::ClientContext ctx;
    EXPECT_TRUE(stub_->GetMetrics(&ctx, {}, &m).ok());
    return m;
  }

  // Three-turn episodes, each turn extending the previous one's text and output; the worker of
  // every turn, per episode.
  std::vector<std::vector<std::string>> Episodes(int n, const std::string& key_prefix) {
    std::vector<std::vector<std::string>> workers(static_cast<size_t>(n));
    for (int e = 0; e < n; ++e) {
      std::string text = absl::StrCat("Once upon a time there was a girl named Sue number ", e,
                                      ". She had a big red ball and a small dog.");
      for (int turn = 0; turn < 3; ++turn) {
        rl::v1::GenerateRequest req = TextRequest(text, 12, /*trajectory=*/false);
        if (!key_prefix.empty()) req.set_routing_key(absl::StrCat(key_prefix, e));
        const rl::v1::GenerateFinal f = Run(req);
        workers[static_cast<size_t>(e)].push_back(f.worker());
        if (turn > 0) EXPECT_GT(f.cached_tokens(), 0) << "episode " << e << " turn " << turn;
        text += f.text() + " Then Tom came. He said hello.";
      }
    }
    return workers;
  }
};

TEST_F(RouterRoutingTest, AffinityKeepsAKeysRequestsOnOneWorker) {
  StartPolicy("affinity");
  std::map<std::string, std::set<std::string>> by_key;
  std::set<std::string> used;
  for (int k = 0; k < 12; ++k) {
    for (int i = 0; i < 3; ++i) {
      rl::v1::GenerateRequest req;
      req.mutable_input_ids()->add_ids(1);
      req.mutable_input_ids()->add_ids(400 + i);
      req.mutable_sampling_params()->set_max_new_tokens(2);
      const std::string key = absl::StrCat("episode-", k);
      std::string worker;
      if (i == 0) {
        req.set_routing_key(key);
        worker = Run(req).worker();
      } else if (i == 1) {
        worker = Run(req, key).worker();  // the header instead of the field
      } else {
        req.set_group_id(key);  // another key space: group ids
        worker = Run(req).worker();
      }
      if (i < 2) by_key[key].insert(worker);
      used.insert(worker);
    }
  }
  for (const auto& [key, workers] : by_key) EXPECT_EQ(workers.size(), 1u) << key;
  EXPECT_GE(used.size(), 2u);
  const rl::v1::RoutingMetrics r = Metrics().routing();
  EXPECT_EQ(r.policy(), "affinity");
  EXPECT_DOUBLE_EQ(r.load_factor(), 1.25);
  EXPECT_EQ(r.load_slack(), 8);
  EXPECT_EQ(r.picks(), 36);
  EXPECT_EQ(r.keyed_picks(), 36);
  EXPECT_EQ(r.key_moves(), 0);  // one request at a time: never over the bound
}

// An agent episode's turns (Generate's episode_id, as the router's SGLang path sets it from
// the gateway's request id) are keyed by the episode when no routing key is given: the turns
// here share no prefix, so only the key can keep them on one worker.
TEST_F(RouterRoutingTest, AffinityKeepsAnEpisodesTurnsOnOneWorker) {
  StartPolicy("affinity");
  std::map<std::string, std::set<std::string>> by_episode;
  std::set<std::string> used;
  for (int e = 0; e < 12; ++e) {
    for (int turn = 0; turn < 3; ++turn) {
      rl::v1::GenerateRequest req;
      req.mutable_input_ids()->add_ids(1);
      req.mutable_input_ids()->add_ids(300 + 10 * turn + e);
      req.mutable_sampling_params()->set_max_new_tokens(2);
      req.set_episode_id(absl::StrCat("ep_", e));
      const std::string worker = Run(req).worker();
      by_episode[req.episode_id()].insert(worker);
      used.insert(worker);
    }
  }
  for (const auto& [episode, workers] : by_episode) EXPECT_EQ(workers.size(), 1u) << episode;
  EXPECT_GE(used.size(), 2u);
  EXPECT_EQ(Metrics().routing().keyed_picks(), 36);
}

TEST_F(RouterRoutingTest, AffinityFollowsAKeylessEpisodesTrajectory) {
  StartPolicy("affinity");
  const auto episodes = Episodes(6, "");
  std::set<std::string> used;
  for (const auto& turns : episodes) {
    EXPECT_EQ(turns[1], turns[0]);
    EXPECT_EQ(turns[2], turns[0]);
    used.insert(turns[0]);
  }
  EXPECT_GE(used.size(), 2u);  // first turns go by least load (in turn when idle)
  const rl::v1::GetMetricsResponse m = Metrics();
  EXPECT_EQ(m.routing().picks(), 18);
  EXPECT_EQ(m.routing().keyed_picks(), 12);  // every later turn
  EXPECT_GT(m.routing().prefix_hit_rate(), 0.3);
  int64_t prompt = 0;
  for (const auto& w : m.workers()) {
    prompt += w.prompt_tokens();
    EXPECT_LE(w.cached_prompt_tokens(), w.prompt_tokens());
  }
  EXPECT_EQ(prompt, m.routing().prompt_tokens());
  EXPECT_NE(m.prometheus_text().find("rl_router_routing_picks_total{policy=\"affinity\"} 18"),
            std::string::npos);
  EXPECT_NE(m.prometheus_text().find("rl_router_worker_cached_tokens_total{worker=\""),
            std::string::npos);
  EXPECT_NE(m.prometheus_text().find("rl_router_routing_prefix_hit_ratio"), std::string::npos);
}

TEST_F(RouterRoutingTest, CacheAwareRoutesToTheLongestCachedPrefix) {
  StartPolicy("cache_aware");
  const auto episodes = Episodes(6, "ignored-key-");
  for (const auto& turns : episodes) {
    EXPECT_EQ(turns[1], turns[0]);
    EXPECT_EQ(turns[2], turns[0]);
  }
  const rl::v1::RoutingMetrics r = Metrics().routing();
  EXPECT_EQ(r.policy(), "cache_aware");
  EXPECT_GT(r.prefix_hit_rate(), 0.3);
  EXPECT_GE(r.keyed_picks(), 12);
}

// A GRPO step's first turns, all in flight at once: the 8 samples of each group (separate
// requests sharing its group_id) meet on one worker under cache_aware (its key on a first turn)
// and affinity, where least load would spread them (the tree cannot see a question no sample
// has finished yet).
TEST_F(RouterRoutingTest, CacheAwareSendsAGroupsConcurrentFirstTurnsToOneWorker) {
  StartPolicy("cache_aware");
  CheckConcurrentGroupsMeet();
}

TEST_F(RouterRoutingTest, AffinitySendsAGroupsConcurrentFirstTurnsToOneWorker) {
  StartPolicy("affinity");
  CheckConcurrentGroupsMeet();
}

TEST_F(RouterRoutingTest, RoundRobinScattersEpisodesAndHitsLess) {
  StartPolicy("round_robin");
  int same = 0;
  std::vector<std::vector<std::string>> workers(4);
  for (int e = 0; e < 4; ++e) {
    std::string text = absl::StrCat("Once upon a time there was a boy named Max number ", e,
                                    ". He had a blue kite and a tall tree.");
    for (int turn = 0; turn < 3; ++turn) {
      const rl::v1::GenerateFinal f = Run(TextRequest(text, 12, false));
      workers[static_cast<size_t>(e)].push_back(f.worker());
      text += f.text() + " Then Tom came. He said hello.";
    }
    same += workers[static_cast<size_t>(e)][1] == workers[static_cast<size_t>(e)][0];
  }
  EXPECT_EQ(same, 0);  // one request at a time over three workers: the next turn is elsewhere
  EXPECT_EQ(Metrics().routing().keyed_picks(), 0);
}

TEST_F(RouterRoutingTest, OversizedKeysAreRefusedNamingTheField) {
  StartPolicy("affinity", 1);
  rl::v1::GenerateRequest req = TextRequest("Once upon a time", 2);
  req.set_routing_key(std::string(300, 'k'));
  grpc::ClientContext ctx;
  auto reader = stub_->Generate(&ctx, req);
  rl::v1::GenerateResponse msg;
  while (reader->Read(&msg)) {
  }
  grpc::Status s = reader->Finish();
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("routing_key"), std::string::npos);
  grpc::ClientContext ctx2;
  ctx2.AddMetadata("rl-routing-key", std::string(300, 'h'));
  req.clear_routing_key();
  auto reader2 = stub_->Generate(&ctx2, req);
  while (reader2->Read(&msg)) {
  }
  s = reader2->Finish();
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("rl-routing-key"), std::string::npos);
  req.set_group_id(std::string(257, 'g'));
  grpc::ClientContext ctx3;
  auto reader3 = stub_->Generate(&ctx3, req);
  while (reader3->Read(&msg)) {
  }
  s = reader3->Finish();
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("group_id"), std::string::npos);
}

TEST_F(RouterRoutingTest, ABadPolicyFlagStopsTheRouter) {
  RouterConfig config;
  config.policy = "random";
  config.tokenizer_path = rl::testing::Stories();
  auto r = RouterServer::Start(config);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  config.policy = "affinity";
  config.load_factor = 0.9;
  r = RouterServer::Start(config);
  EXPECT_NE(r.status().message().find("--load-factor"), std::string::npos);
}

}  // namespace
}  // namespace rl::router
