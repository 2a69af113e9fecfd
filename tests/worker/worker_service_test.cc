// rl.v1.Worker and the pause/continue/flush part of rl.v1.Admin, driven by the generated C++
// client against an in-process rl-worker on stories260K.
#include <chrono>
#include <map>
#include <thread>

#include "httplib.h"
#include "tests/worker/worker_test_util.h"

namespace rl::worker::testing {
namespace {

using std::chrono::milliseconds;

class WorkerServiceTest : public WorkerFixture {
 protected:
  void SetUp() override { StartWorker(); }

  // Waits until the engine reports `n` running requests (bounded).
  bool WaitRunning(int n) {
    for (int i = 0; i < 2000; ++i) {
      if (ServerInfo().num_running() == n) return true;
      std::this_thread::sleep_for(milliseconds(5));
    }
    return false;
  }

  // A request that runs long enough to be caught by control calls.
  static rl::v1::GenerateRequest Long(const std::string& id) {
    rl::v1::GenerateRequest req = Greedy(kPromptIds, 400);
    req.set_request_id(id);
    req.mutable_sampling_params()->set_ignore_eos(true);
    return req;
  }
};

TEST_F(WorkerServiceTest, GreedyIdsMatchTheGolden) {
  rl::v1::GenerateFinal f;
  std::vector<rl::v1::GenerateChunk> chunks;
  ASSERT_TRUE(Generate(Greedy(kPromptIds, 20), &f, &chunks).ok());
  EXPECT_EQ(std::vector<int32_t>(f.output_ids().begin(), f.output_ids().end()), kGoldenIds);
  EXPECT_EQ(f.finish_reason(), rl::v1::FINISH_REASON_LENGTH);
  EXPECT_EQ(f.prompt_tokens(), 5);
  EXPECT_EQ(f.completion_tokens(), 20);
  EXPECT_EQ(f.weight_version(), 0);
  EXPECT_EQ(f.text(), ", there was a little girl named Lily. She loved to play outsid");
  // The streamed chunks carry every token once and their text adds up to the final text.
  std::vector<int32_t> streamed;
  std::string text;
  for (const auto& c : chunks) {
    streamed.insert(streamed.end(), c.token_ids().begin(), c.token_ids().end());
    text += c.text();
  }
  EXPECT_EQ(streamed, kGoldenIds);
  EXPECT_EQ(text, f.text());
}

// skip_detokenize (what the router sends): the same ids and logprobs, and no text decoded on
// the worker, in chunks or in the final message.
TEST_F(WorkerServiceTest, SkipDetokenizeSendsIdsWithoutText) {
  rl::v1::GenerateRequest req = Greedy(kPromptIds, 20);
  req.set_skip_detokenize(true);
  req.set_return_logprob(true);
  rl::v1::GenerateFinal f;
  std::vector<rl::v1::GenerateChunk> chunks;
  ASSERT_TRUE(Generate(req, &f, &chunks).ok());
  EXPECT_EQ(std::vector<int32_t>(f.output_ids().begin(), f.output_ids().end()), kGoldenIds);
  EXPECT_EQ(f.output_logprobs_size(), 20);
  EXPECT_TRUE(f.text().empty());
  std::vector<int32_t> streamed;
  for (const auto& c : chunks) {
    EXPECT_TRUE(c.text().empty());
    streamed.insert(streamed.end(), c.token_ids().begin(), c.token_ids().end());
  }
  EXPECT_EQ(streamed, kGoldenIds);
}

// Stop strings still end a skip_detokenize completion at the same token as with text.
TEST_F(WorkerServiceTest, SkipDetokenizeKeepsStopStrings) {
  rl::v1::GenerateRequest with_text = Greedy(kPromptIds, 20);
  with_text.mutable_sampling_params()->add_stop("little");
  rl::v1::GenerateFinal a;
  ASSERT_TRUE(Generate(with_text, &a).ok());
  rl::v1::GenerateRequest ids_only = with_text;
  ids_only.set_skip_detokenize(true);
  rl::v1::GenerateFinal b;
  ASSERT_TRUE(Generate(ids_only, &b).ok());
  EXPECT_EQ(b.finish_reason(), rl::v1::FINISH_REASON_STOP);
  EXPECT_EQ(b.matched_stop(), "little");
  EXPECT_EQ(std::vector<int32_t>(b.output_ids().begin(), b.output_ids().end()),
            std::vector<int32_t>(a.output_ids().begin(), a.output_ids().end()));
  EXPECT_FALSE(a.text().empty());
  EXPECT_TRUE(b.text().empty());
}

// The router's `rl-min-weight-version` (the fleet's recorded version): a worker below it
// (restarted at its start-up weights) refuses with UNAVAILABLE; at or above it, it serves.
TEST_F(WorkerServiceTest, MinWeightVersionFromTheRouterIsEnforced) {
  const int64_t version = ServerInfo().weight_version();
  auto run = [&](const std::string& min) {
    grpc::ClientContext ctx;
    ctx.AddMetadata("rl-min-weight-version", min);
    auto reader = worker_->Generate(&ctx, Greedy(kPromptIds, 2));
    rl::v1::GenerateResponse msg;
    while (reader->Read(&msg)) {
    }
    return reader->Finish();
  };
  grpc::Status s = run(std::to_string(version + 1));
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_NE(s.error_message().find("older than the fleet's"), std::string::npos)
      << s.error_message();
  EXPECT_TRUE(run(std::to_string(version)).ok());
  EXPECT_EQ(run("seven").error_code(), grpc::StatusCode::INVALID_ARGUMENT);
}

// The router's `rl-fleet-weight-version` (the version it routes to): a worker at any other
// version (ahead of it included: updated alone) refuses with UNAVAILABLE; at it, it serves.
TEST_F(WorkerServiceTest, FleetWeightVersionFromTheRouterIsEnforcedExactly) {
  const int64_t version = ServerInfo().weight_version();
  auto run = [&](const std::string& fleet) {
    grpc::ClientContext ctx;
    ctx.AddMetadata("rl-fleet-weight-version", fleet);
    auto reader = worker_->Generate(&ctx, Greedy(kPromptIds, 2));
    rl::v1::GenerateResponse msg;
    while (reader->Read(&msg)) {
    }
    return reader->Finish();
  };
  for (int64_t other : {version + 1, version - 1}) {
    grpc::Status s = run(std::to_string(other));
    EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE) << other;
    EXPECT_NE(s.error_message().find("not the fleet's"), std::string::npos) << s.error_message();
  }
  EXPECT_TRUE(run(std::to_string(version)).ok());
  EXPECT_EQ(run("x").error_code(), grpc::StatusCode::INVALID_ARGUMENT);
}

// The request's own min_weight_version / exact_weight_version (issue 30): a worker at a version
// the request does not accept refuses with UNAVAILABLE naming both; one it accepts serves it
// and the final states the end version; a constraint that no version satisfies is
// INVALID_ARGUMENT naming the field.
TEST_F(WorkerServiceTest, RequestVersionConstraintsAreEnforced) {
  const int64_t version = ServerInfo().weight_version();
  auto run = [&](std::optional<int64_t> min, std::optional<int64_t> exact,
                 rl::v1::GenerateFinal* f = nullptr) {
    rl::v1::GenerateRequest req = Greedy(kPromptIds, 2);
    if (min.has_value()) req.set_min_weight_version(*min);
    if (exact.has_value()) req.set_exact_weight_version(*exact);
    rl::v1::GenerateFinal ignored;
    return Generate(req, f != nullptr ? f : &ignored);
  };
  grpc::Status s = run(version + 1, std::nullopt);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE) << s.error_message();
  EXPECT_NE(s.error_message().find(absl::StrCat("serves weight version ", version)),
            std::string::npos)
      << s.error_message();
  EXPECT_NE(s.error_message().find(absl::StrCat(">= ", version + 1)), std::string::npos)
      << s.error_message();
  s = run(std::nullopt, version + 2);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE) << s.error_message();
  EXPECT_NE(s.error_message().find(absl::StrCat("== ", version + 2)), std::string::npos)
      << s.error_message();
  rl::v1::GenerateFinal f;
  ASSERT_TRUE(run(version, version, &f).ok());
  EXPECT_EQ(f.weight_version(), version);
  EXPECT_EQ(f.dispatch_weight_version(), version);
  EXPECT_EQ(run(-1, std::nullopt).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  s = run(version + 1, version);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
  EXPECT_NE(s.error_message().find("exact_weight_version"), std::string::npos) << s.error_message();
}

TEST_F(WorkerServiceTest, TextPromptIsTokenized) {
  rl::v1::GenerateRequest req = Greedy({}, 20);
  req.set_text("Once upon a time");
  rl::v1::GenerateFinal f;
  ASSERT_TRUE(Generate(req, &f).ok());
  EXPECT_EQ(std::vector<int32_t>(f.output_ids().begin(), f.output_ids().end()), kGoldenIds);
}

TEST_F(WorkerServiceTest, LogprobsAreReportedPerToken) {
  rl::v1::GenerateRequest req = Greedy(kPromptIds, 5);
  req.set_return_logprob(true);
  req.set_top_logprobs_num(2);
  req.set_logprob_start_len(1);
  rl::v1::GenerateFinal f;
  ASSERT_TRUE(Generate(req, &f).ok());
  ASSERT_EQ(f.output_logprobs_size(), 5);
  for (const auto& lp : f.output_logprobs()) {
    EXPECT_LE(lp.logprob(), 0.0f);
    ASSERT_EQ(lp.top_size(), 2);
    EXPECT_EQ(lp.top(0).token_id(), lp.token_id());  // greedy picks the top token
  }
  EXPECT_EQ(f.prompt_logprobs_size(), 4);
}

TEST_F(WorkerServiceTest, NCompletionsEachGetAFinalMessage) {
  rl::v1::GenerateRequest req = Greedy(kPromptIds, 6);
  req.mutable_sampling_params()->set_temperature(1.0);
  req.mutable_sampling_params()->set_seed(7);
  req.mutable_sampling_params()->set_n(3);
  grpc::ClientContext ctx;
  auto reader = worker_->Generate(&ctx, req);
  rl::v1::GenerateResponse msg;
  std::map<int, std::string> streamed, final_text;
  while (reader->Read(&msg)) {
    if (msg.has_chunk()) streamed[msg.index()] += msg.chunk().text();
    if (msg.has_final()) final_text[msg.index()] = msg.final().text();
  }
  ASSERT_TRUE(reader->Finish().ok());
  ASSERT_EQ(final_text.size(), 3u);
  for (const auto& [i, text] : final_text) EXPECT_EQ(streamed[i], text) << i;
}

TEST_F(WorkerServiceTest, StopStringEndsTheCompletion) {
  rl::v1::GenerateRequest req = Greedy(kPromptIds, 20);
  req.mutable_sampling_params()->add_stop("little");
  rl::v1::GenerateFinal f;
  ASSERT_TRUE(Generate(req, &f).ok());
  EXPECT_EQ(f.finish_reason(), rl::v1::FINISH_REASON_STOP);
  EXPECT_EQ(f.matched_stop(), "little");
  EXPECT_LT(f.completion_tokens(), 20);
}

// A stop string spanning several tokens (with their leading spaces) stops at the token that
// completes it; the text (not trimmed) ends there.
TEST_F(WorkerServiceTest, StopStringSpanningTokens) {
  rl::v1::GenerateRequest req = Greedy(kPromptIds, 20);
  req.mutable_sampling_params()->add_stop(" girl named");
  rl::v1::GenerateFinal f;
  ASSERT_TRUE(Generate(req, &f).ok());
  EXPECT_EQ(f.finish_reason(), rl::v1::FINISH_REASON_STOP);
  EXPECT_EQ(f.matched_stop(), " girl named");
  EXPECT_EQ(f.text(), ", there was a little girl named");
  EXPECT_EQ(std::vector<int32_t>(f.output_ids().begin(), f.output_ids().end()),
            std::vector<int32_t>(kGoldenIds.begin(), kGoldenIds.begin() + f.output_ids_size()));
}

TEST_F(WorkerServiceTest, InvalidRequestsNameTheField) {
  struct Case {
    std::function<void(rl::v1::GenerateRequest*)> edit;
    grpc::StatusCode code;
    std::string field;
  };
  const std::vector<Case> cases = {
      {[](auto* r) { r->mutable_input_ids()->clear_ids(); }, grpc::INVALID_ARGUMENT, "input_ids"},
      {[](auto* r) { r->mutable_input_ids()->add_ids(100000); }, grpc::INVALID_ARGUMENT,
       "input_ids"},
      {[](auto* r) { r->mutable_sampling_params()->set_top_p(1.5); }, grpc::INVALID_ARGUMENT,
       "top_p"},
      {[](auto* r) { r->mutable_sampling_params()->set_top_p(0); }, grpc::INVALID_ARGUMENT,
       "top_p"},
      {[](auto* r) { r->mutable_sampling_params()->set_max_new_tokens(-1); },
       grpc::INVALID_ARGUMENT, "max_new_tokens"},
      {[](auto* r) { r->mutable_sampling_params()->set_temperature(-1); }, grpc::INVALID_ARGUMENT,
       "temperature"},
      {[](auto* r) { r->mutable_sampling_params()->set_max_new_tokens(1 << 20); },
       grpc::RESOURCE_EXHAUSTED, ""},
      {[](auto* r) { r->clear_input_ids(); }, grpc::INVALID_ARGUMENT, "prompt"},
      {[](auto* r) { r->set_top_logprobs_num(3); }, grpc::INVALID_ARGUMENT, "top_logprobs_num"},
  };
  for (const Case& c : cases) {
    rl::v1::GenerateRequest req = Greedy(kPromptIds, 4);
    c.edit(&req);
    grpc::Status s = Generate(req, nullptr);
    EXPECT_EQ(s.error_code(), c.code) << s.error_message();
    EXPECT_NE(s.error_message().find(c.field), std::string::npos) << s.error_message();
  }
}

TEST_F(WorkerServiceTest, AbortByIdEndsTheStreamWithAbort) {
  rl::v1::GenerateFinal f;
  std::jthread t([&] { EXPECT_TRUE(Generate(Long("long-1"), &f).ok()); });
  ASSERT_TRUE(WaitRunning(1));
  rl::v1::AbortRequest req;
  req.set_request_id("long-1");
  rl::v1::AbortResponse resp;
  grpc::ClientContext ctx;
  ASSERT_TRUE(worker_->Abort(&ctx, req, &resp).ok());
  t.join();
  EXPECT_EQ(resp.num_aborted(), 1);
  EXPECT_EQ(f.finish_reason(), rl::v1::FINISH_REASON_ABORT);
  EXPECT_LT(f.completion_tokens(), 400);
}

TEST_F(WorkerServiceTest, ClientCancelAbortsTheRequest) {
  grpc::ClientContext ctx;
  auto reader = worker_->Generate(&ctx, Long("cancel-me"));
  rl::v1::GenerateResponse msg;
  ASSERT_TRUE(reader->Read(&msg));  // the first chunk arrived
  ctx.TryCancel();
  while (reader->Read(&msg)) {
  }
  EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::CANCELLED);
  EXPECT_TRUE(WaitRunning(0));
  EXPECT_EQ(ServerInfo().num_waiting(), 0);
}

TEST_F(WorkerServiceTest, PauseInPlaceHoldsNewRequestsUntilContinue) {
  rl::v1::AdminResponse resp;
  rl::v1::PauseGenerationRequest pause;
  pause.set_mode(rl::v1::PAUSE_MODE_IN_PLACE);
  ASSERT_TRUE(Call(&rl::v1::Admin::Stub::PauseGeneration, pause, &resp).ok());
  EXPECT_TRUE(ServerInfo().paused());
  rl::v1::GenerateFinal f;
  std::jthread t([&] { EXPECT_TRUE(Generate(Greedy(kPromptIds, 20), &f).ok()); });
  for (int i = 0; i < 2000 && ServerInfo().num_waiting() != 1; ++i) {
    std::this_thread::sleep_for(milliseconds(5));
  }
  EXPECT_EQ(ServerInfo().num_waiting(), 1);  // waits, not rejected
  ASSERT_TRUE(
      Call(&rl::v1::Admin::Stub::ContinueGeneration, rl::v1::ContinueGenerationRequest(), &resp)
          .ok());
  t.join();
  EXPECT_EQ(std::vector<int32_t>(f.output_ids().begin(), f.output_ids().end()), kGoldenIds);
}

// The router's `rl-fleet-running` (its fleet is not paused): a paused worker refuses with
// UNAVAILABLE (the router retries elsewhere) instead of holding the request until a continue
// the router will not send; running, it serves.
TEST_F(WorkerServiceTest, APausedWorkerRefusesARouterWhoseFleetRuns) {
  auto run = [&] {
    grpc::ClientContext ctx;
    ctx.AddMetadata("rl-fleet-running", "1");
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    auto reader = worker_->Generate(&ctx, Greedy(kPromptIds, 2));
    rl::v1::GenerateResponse msg;
    while (reader->Read(&msg)) {
    }
    return reader->Finish();
  };
  EXPECT_TRUE(run().ok());
  rl::v1::AdminResponse resp;
  rl::v1::PauseGenerationRequest pause;
  pause.set_mode(rl::v1::PAUSE_MODE_IN_PLACE);
  ASSERT_TRUE(Call(&rl::v1::Admin::Stub::PauseGeneration, pause, &resp).ok());
  const grpc::Status s = run();
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_NE(s.error_message().find("paused while the router's fleet is running"), std::string::npos)
      << s.error_message();
  EXPECT_EQ(ServerInfo().num_waiting(), 0);  // refused, not queued
  ASSERT_TRUE(
      Call(&rl::v1::Admin::Stub::ContinueGeneration, rl::v1::ContinueGenerationRequest(), &resp)
          .ok());
  EXPECT_TRUE(run().ok());
}

TEST_F(WorkerServiceTest, RetractThenContinueEqualsAnUninterruptedRun) {
  rl::v1::GenerateRequest req = Greedy(kPromptIds, 400);
  req.mutable_sampling_params()->set_ignore_eos(true);
  rl::v1::GenerateFinal reference;
  ASSERT_TRUE(Generate(req, &reference).ok());
  rl::v1::GenerateFinal f;
  std::jthread t([&] { EXPECT_TRUE(Generate(req, &f).ok()); });
  ASSERT_TRUE(WaitRunning(1));
  rl::v1::AdminResponse resp;
  rl::v1::PauseGenerationRequest pause;
  pause.set_mode(rl::v1::PAUSE_MODE_RETRACT);
  ASSERT_TRUE(Call(&rl::v1::Admin::Stub::PauseGeneration, pause, &resp).ok());
  const auto info = ServerInfo();
  EXPECT_EQ(info.pause_mode(), rl::v1::PAUSE_MODE_RETRACT);
  EXPECT_EQ(info.num_running(), 0);
  ASSERT_TRUE(
      Call(&rl::v1::Admin::Stub::ContinueGeneration, rl::v1::ContinueGenerationRequest(), &resp)
          .ok());
  t.join();
  EXPECT_EQ(std::vector<int32_t>(f.output_ids().begin(), f.output_ids().end()),
            std::vector<int32_t>(reference.output_ids().begin(), reference.output_ids().end()));
}

TEST_F(WorkerServiceTest, PauseAbortEndsEverything) {
  rl::v1::GenerateFinal f;
  std::jthread t([&] { EXPECT_TRUE(Generate(Long("a"), &f).ok()); });
  ASSERT_TRUE(WaitRunning(1));
  rl::v1::AdminResponse resp;
  rl::v1::PauseGenerationRequest pause;
  pause.set_mode(rl::v1::PAUSE_MODE_ABORT);
  ASSERT_TRUE(Call(&rl::v1::Admin::Stub::PauseGeneration, pause, &resp).ok());
  t.join();
  EXPECT_EQ(f.finish_reason(), rl::v1::FINISH_REASON_ABORT);
  EXPECT_EQ(resp.num_aborted(), 1);
  pause.set_mode(rl::v1::PAUSE_MODE_UNSPECIFIED);
  grpc::Status s = Call(&rl::v1::Admin::Stub::PauseGeneration, pause, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("mode"), std::string::npos);
}

TEST_F(WorkerServiceTest, FlushIsRefusedWhileBusyAndWorksWhenIdle) {
  GreedyIds();
  EXPECT_GT(ServerInfo().tree_cache_tokens(), 0);
  rl::v1::AdminResponse resp;
  ASSERT_TRUE(Call(&rl::v1::Admin::Stub::FlushCache, rl::v1::FlushCacheRequest(), &resp).ok());
  EXPECT_EQ(ServerInfo().tree_cache_tokens(), 0);

  rl::v1::PauseGenerationRequest pause;
  pause.set_mode(rl::v1::PAUSE_MODE_IN_PLACE);
  rl::v1::GenerateFinal f;
  std::jthread t([&] { EXPECT_TRUE(Generate(Long("busy"), &f).ok()); });
  ASSERT_TRUE(WaitRunning(1));
  ASSERT_TRUE(Call(&rl::v1::Admin::Stub::PauseGeneration, pause, &resp).ok());
  grpc::Status s = Call(&rl::v1::Admin::Stub::FlushCache, rl::v1::FlushCacheRequest(), &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  pause.set_mode(rl::v1::PAUSE_MODE_ABORT);
  ASSERT_TRUE(Call(&rl::v1::Admin::Stub::PauseGeneration, pause, &resp).ok());
  t.join();
  ASSERT_TRUE(
      Call(&rl::v1::Admin::Stub::ContinueGeneration, rl::v1::ContinueGenerationRequest(), &resp)
          .ok());
}

TEST_F(WorkerServiceTest, GetLoadAndServerInfo) {
  rl::v1::GetLoadResponse load;
  grpc::ClientContext ctx;
  ASSERT_TRUE(worker_->GetLoad(&ctx, {}, &load).ok());
  EXPECT_EQ(load.num_running(), 0);
  EXPECT_FALSE(load.paused());
  const auto info = ServerInfo();
  EXPECT_GT(info.kv_tokens_total(), 0);
  EXPECT_EQ(info.backend(), "cpu");
}

class WorkerMetricsTest : public WorkerFixture {
 protected:
  void SetUp() override {
    WorkerConfig config;
    config.metrics_port = 0;
    StartWorker(config);
  }
};

TEST_F(WorkerMetricsTest, PrometheusEndpointServesTheWorkerTable) {
  rl::v1::GenerateFinal fin;
  ASSERT_TRUE(Generate(Greedy(kPromptIds, 8), &fin).ok());
  httplib::Client client("127.0.0.1", server_->metrics_port());
  auto res = client.Get("/metrics");
  ASSERT_TRUE(res);
  for (const char* name :
       {"rl_worker_requests_total 1", "rl_worker_generated_tokens_total 8",
        "rl_worker_weight_version 0", "rl_worker_running_requests 0", "rl_worker_kv_usage_ratio",
        "rl_worker_time_to_first_token_seconds_bucket", "rl_worker_cache_hit_ratio"}) {
    EXPECT_NE(res->body.find(name), std::string::npos) << name;
  }
}

TEST_F(WorkerServiceTest, ManyConcurrentStreamsAllFinish) {
  std::vector<std::thread> threads;
  std::vector<rl::v1::GenerateFinal> finals(8);
  for (int i = 0; i < 8; ++i) {
    threads.emplace_back(
        [&, i] { EXPECT_TRUE(Generate(Greedy(kPromptIds, 20), &finals[i]).ok()); });
  }
  for (auto& t : threads) t.join();
  for (const auto& f : finals) {
    EXPECT_EQ(std::vector<int32_t>(f.output_ids().begin(), f.output_ids().end()), kGoldenIds);
  }
}

}  // namespace
}  // namespace rl::worker::testing
