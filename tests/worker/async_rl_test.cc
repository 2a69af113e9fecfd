// Issue 34 on an in-process rl-worker (stories260K) through rl.v1.Worker / rl.v1.Admin:
// - PauseGeneration(drain): running requests finish, requests that arrive meanwhile are held
//   (GetServerInfo.num_held) and run only after ContinueGeneration; none hangs;
// - an update while paused in place with a running request: refused without keep_kv (as
//   before), applied with keep_kv (disk and staged activation): the request goes on with its KV,
//   its final says kv_from_older_version and its segments split at the update;
// - staleness bound: FINISH_REASON_STALE with the partial output, the worker's default applies
//   to a request that sets none, -1 opts out;
// - Abort of a running and of a queued request: the stream ends OK with a final carrying what
//   was generated (empty for the queued one) and the reason.
// Order is fixed by pauses, not by timing: a request "running" is paused in place before the
// admin call that must find it running.
#include <atomic>
#include <functional>
#include <future>
#include <memory>
#include <thread>

#include "absl/synchronization/mutex.h"
#include "tests/testing/generate_stream.h"
#include "tests/worker/worker_test_util.h"

namespace rl::worker::testing {
namespace {

using Stub = rl::v1::Admin::Stub;

// Only a hang guard, never a speed assertion.
constexpr auto kHangGuard = std::chrono::seconds(60);
// Long enough that a request is still running when the test pauses it (the context is 512).
constexpr int kLong = 400;

using Stream = ::rl::testing::GenerateStream<rl::v1::Worker::Stub>;

class AsyncRlTest : public WorkerFixture {
 protected:
  rl::v1::GenerateRequest Long(const std::string& id, int max_new = kLong) {
    rl::v1::GenerateRequest req = Greedy(kPromptIds, max_new);
    req.set_request_id(id);
    req.mutable_sampling_params()->set_ignore_eos(true);
    req.set_return_logprob(true);
    return req;
  }
  grpc::Status Pause(rl::v1::PauseMode mode, rl::v1::AdminResponse* resp,
                     int drain_timeout_ms = -1) {
    rl::v1::PauseGenerationRequest req;
    req.set_mode(mode);
    if (drain_timeout_ms >= 0) req.set_drain_timeout_ms(drain_timeout_ms);
    return Call(&Stub::PauseGeneration, req, resp);
  }
  grpc::Status Continue() {
    rl::v1::AdminResponse resp;
    return Call(&Stub::ContinueGeneration, rl::v1::ContinueGenerationRequest(), &resp);
  }
  // Waits (hang guard) until GetServerInfo satisfies `pred`.
  template <typename Pred>
  bool WaitInfo(Pred pred) {
    const auto end = std::chrono::steady_clock::now() + kHangGuard;
    while (std::chrono::steady_clock::now() < end) {
      if (pred(ServerInfo())) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    return false;
  }
  // Starts the requests `make` returns and pauses in place once each streamed a token; returns
  // their streams once the pause caught all of them running (holding their KV). A request can
  // finish before the pause lands (stories260K is fast): then the round is continued, finished
  // and started again, up to 20 times (a precondition, not a timing assertion).
  std::vector<std::unique_ptr<Stream>> StartCaughtRunning(
      const std::function<std::vector<rl::v1::GenerateRequest>()>& make) {
    for (int attempt = 0; attempt < 20; ++attempt) {
      std::vector<std::unique_ptr<Stream>> streams;
      for (rl::v1::GenerateRequest& req : make()) {
        streams.push_back(std::make_unique<Stream>(worker_.get(), std::move(req)));
      }
      for (auto& st : streams) st->WaitTokens(1);
      rl::v1::AdminResponse resp;
      EXPECT_TRUE(Pause(rl::v1::PAUSE_MODE_IN_PLACE, &resp).ok());
      bool running = ServerInfo().num_running() == static_cast<int>(streams.size());
      for (auto& st : streams) running = running && !st->done();
      if (running) return streams;
      EXPECT_TRUE(Continue().ok());
      for (auto& st : streams) st->Wait();
    }
    ADD_FAILURE() << "no request was still running when the pause landed, 20 times";
    return {};
  }
  std::unique_ptr<Stream> StartCaughtRunning(const std::string& id) {
    auto streams = StartCaughtRunning([&] { return std::vector{Long(id)}; });
    return streams.empty() ? nullptr : std::move(streams[0]);
  }
  // Checks an in-flight update's final: every token there, the segments split at the update,
  // the first segment the old weights' greedy tokens.
  void ExpectKeptKv(const rl::v1::GenerateFinal& f, int64_t v0, int64_t v1,
                    const std::vector<int32_t>& reference) {
    EXPECT_EQ(f.finish_reason(), rl::v1::FINISH_REASON_LENGTH);
    ASSERT_EQ(f.output_ids_size(), kLong);
    EXPECT_TRUE(f.kv_from_older_version());
    EXPECT_EQ(f.oldest_kv_weight_version(), v0);
    EXPECT_EQ(f.dispatch_weight_version(), v0);
    EXPECT_EQ(f.weight_version(), v1);
    ASSERT_EQ(f.weight_version_segments_size(), 2);
    EXPECT_EQ(f.weight_version_segments(0).weight_version(), v0);
    EXPECT_EQ(f.weight_version_segments(1).weight_version(), v1);
    const int k = f.weight_version_segments(0).num_tokens();
    EXPECT_EQ(k + f.weight_version_segments(1).num_tokens(), kLong);
    ASSERT_GE(k, 1);
    for (int i = 0; i < k; ++i) EXPECT_EQ(f.output_ids(i), reference[i]) << "token " << i;
  }
};

// Issue 34's drain test: a drain with requests arriving during it; none hangs, the running ones
// finish before the call returns, the arrivals finish after the continue.
TEST_F(AsyncRlTest, DrainFinishesRunningRequestsAndHoldsArrivalsUntilContinue) {
  StartWorker();
  Stream a(worker_.get(), Long("a")), b(worker_.get(), Long("b"));
  ASSERT_TRUE(a.WaitTokens(4));
  ASSERT_TRUE(b.WaitTokens(4));
  rl::v1::AdminResponse drained;
  auto drain =
      std::async(std::launch::async, [&] { return Pause(rl::v1::PAUSE_MODE_DRAIN, &drained); });
  ASSERT_TRUE(WaitInfo([](const rl::v1::GetServerInfoResponse& i) {
    return i.paused() && i.pause_mode() == rl::v1::PAUSE_MODE_DRAIN;
  }));
  Stream c(worker_.get(), Long("c", 16)), d(worker_.get(), Long("d", 16));
  ASSERT_TRUE(WaitInfo([](const rl::v1::GetServerInfoResponse& i) { return i.num_held() == 2; }));
  grpc::Status s = drain.get();
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_TRUE(drained.drained()) << drained.message();
  EXPECT_EQ(drained.num_still_active(), 0);
  EXPECT_EQ(drained.num_held(), 2);
  // The requests admitted before the drain ran to their end.
  ASSERT_TRUE(a.Wait().ok());
  ASSERT_TRUE(b.Wait().ok());
  EXPECT_EQ(a.final_msg().output_ids_size(), kLong);
  EXPECT_EQ(b.final_msg().finish_reason(), rl::v1::FINISH_REASON_LENGTH);
  // The arrivals wait for the continue (held: not running, not waiting).
  const rl::v1::GetServerInfoResponse info = ServerInfo();
  EXPECT_EQ(info.num_held(), 2);
  EXPECT_EQ(info.num_running(), 0);
  EXPECT_EQ(info.num_waiting(), 0);
  EXPECT_FALSE(c.done());
  EXPECT_FALSE(d.done());
  ASSERT_TRUE(Continue().ok());
  ASSERT_TRUE(c.Wait().ok());
  ASSERT_TRUE(d.Wait().ok());
  EXPECT_EQ(c.final_msg().output_ids_size(), 16);
  EXPECT_EQ(d.final_msg().finish_reason(), rl::v1::FINISH_REASON_LENGTH);
}

// A drain that cannot finish in its timeout answers with what is still active; the engine
// stays paused (drain) until the continue. A bad timeout is refused before anything changes.
TEST_F(AsyncRlTest, DrainTimeoutAnswersWithWhatStillRuns) {
  StartWorker();
  std::unique_ptr<Stream> held = StartCaughtRunning("slow");
  ASSERT_NE(held, nullptr);
  Stream& a = *held;
  rl::v1::AdminResponse resp;
  // A drain under an in-place pause (stronger) never drains: it answers at once.
  ASSERT_TRUE(Pause(rl::v1::PAUSE_MODE_DRAIN, &resp, 20).ok());
  EXPECT_FALSE(resp.drained());
  EXPECT_EQ(resp.num_still_active(), 1);
  ASSERT_EQ(resp.still_active_ids_size(), 1);
  EXPECT_EQ(resp.still_active_ids(0), "slow");
  grpc::Status bad = Pause(rl::v1::PAUSE_MODE_DRAIN, &resp, 600001);
  EXPECT_EQ(bad.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(bad.error_message().find("drain_timeout_ms"), std::string::npos);
  ASSERT_TRUE(Continue().ok());
  ASSERT_TRUE(a.Wait().ok());
  EXPECT_EQ(a.final_msg().output_ids_size(), kLong);
}

// Today's rule stays for the default update: paused in place with a running request, an update
// is refused. keep_kv lifts it: the request keeps its KV and finishes on the new weights.
TEST_F(AsyncRlTest, InFlightDiskUpdateKeepsTheRunningRequestsKv) {
  StartWorker();
  const std::vector<int32_t> reference = GreedyIds(kLong);
  TempDir dir;
  WritePerturbedStories(dir.path(), "mlp.down_proj", 1.7f);
  std::unique_ptr<Stream> held = StartCaughtRunning("inflight");
  ASSERT_NE(held, nullptr);
  Stream& a = *held;
  rl::v1::UpdateWeightsFromDiskRequest req;
  req.set_model_path(dir.path());
  req.set_weight_version(5);
  rl::v1::AdminResponse resp;
  grpc::Status refused = Call(&Stub::UpdateWeightsFromDisk, req, &resp);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_EQ(server_->weight_version(), 0);
  req.set_keep_kv(true);
  grpc::Status s = Call(&Stub::UpdateWeightsFromDisk, req, &resp);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_NE(resp.message().find("1 requests kept their KV"), std::string::npos) << resp.message();
  EXPECT_EQ(resp.weight_version(), 5);
  ASSERT_TRUE(a.Wait().ok());
  ExpectKeptKv(a.final_msg(), 0, 5, reference);
  // A request admitted afterwards: new weights only, the old prefix never reused.
  rl::v1::GenerateFinal f;
  ASSERT_TRUE(Generate(Greedy(kPromptIds, 4), &f).ok());
  EXPECT_FALSE(f.kv_from_older_version());
  EXPECT_EQ(f.cached_tokens(), 0);
  EXPECT_EQ(f.weight_version(), 5);
}

// The keep-KV update as the activation of a staged version (issue 30's ActivateWeights).
TEST_F(AsyncRlTest, InFlightStagedActivationKeepsTheRunningRequestsKv) {
  StartWorker();
  const std::vector<int32_t> reference = GreedyIds(kLong);
  TempDir dir;
  WritePerturbedStories(dir.path(), "mlp.up_proj", 0.5f);
  rl::v1::StageWeightsRequest stage;
  stage.set_model_path(dir.path());
  stage.set_weight_version(3);
  rl::v1::AdminResponse resp;
  ASSERT_TRUE(Call(&Stub::StageWeights, stage, &resp).ok());
  std::unique_ptr<Stream> held = StartCaughtRunning("staged");
  ASSERT_NE(held, nullptr);
  Stream& a = *held;
  rl::v1::ActivateWeightsRequest activate;
  activate.set_keep_kv(true);
  grpc::Status s = Call(&Stub::ActivateWeights, activate, &resp);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(resp.weight_version(), 3);
  EXPECT_FALSE(ServerInfo().paused());
  ASSERT_TRUE(a.Wait().ok());
  ExpectKeptKv(a.final_msg(), 0, 3, reference);
}

// Staleness bound through the worker: the worker's --max-version-lag (0 here) applies to a
// request that sets none; -1 opts out. The stale one ends with its partial output.
TEST_F(AsyncRlTest, StaleRequestEndsWithItsPartialOutput) {
  WorkerConfig config;
  config.max_version_lag = 0;
  StartWorker(config);
  TempDir dir;
  WritePerturbedStories(dir.path(), "mlp.down_proj", 1.7f);
  rl::v1::GenerateRequest opt_out = Long("opt-out");
  opt_out.set_max_version_lag(-1);
  auto streams = StartCaughtRunning([&] { return std::vector{Long("stale"), opt_out}; });
  ASSERT_EQ(streams.size(), 2u);
  Stream &stale = *streams[0], &kept = *streams[1];
  rl::v1::AdminResponse resp;
  ASSERT_TRUE(Pause(rl::v1::PAUSE_MODE_RETRACT, &resp).ok());
  rl::v1::UpdateWeightsFromDiskRequest req;
  req.set_model_path(dir.path());
  ASSERT_TRUE(Call(&Stub::UpdateWeightsFromDisk, req, &resp).ok());
  ASSERT_TRUE(stale.Wait().ok());
  const rl::v1::GenerateFinal f = stale.final_msg();
  EXPECT_EQ(f.finish_reason(), rl::v1::FINISH_REASON_STALE);
  EXPECT_NE(f.abort_message().find("max_version_lag 0"), std::string::npos) << f.abort_message();
  EXPECT_EQ(std::vector<int32_t>(f.output_ids().begin(), f.output_ids().end()), stale.tokens());
  EXPECT_GE(f.output_ids_size(), 1);
  EXPECT_LT(f.output_ids_size(), kLong);
  EXPECT_EQ(f.output_logprobs_size(), f.output_ids_size());
  ASSERT_EQ(f.weight_version_segments_size(), 1);
  EXPECT_EQ(f.weight_version_segments(0).weight_version(), 0);
  ASSERT_TRUE(kept.Wait().ok());
  EXPECT_EQ(kept.final_msg().finish_reason(), rl::v1::FINISH_REASON_LENGTH);
  EXPECT_EQ(kept.final_msg().weight_version(), 1);
  rl::v1::GenerateRequest bad = Long("bad");
  bad.set_max_version_lag(-2);
  grpc::Status s = Generate(bad, nullptr);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("max_version_lag"), std::string::npos) << s.error_message();
}

// Aborts return what was generated: a running request its tokens, a queued one an empty output
// and the reason; both streams end OK with their final.
TEST_F(AsyncRlTest, AbortedRunningAndQueuedRequestsReturnTheirOutput) {
  StartWorker();
  std::unique_ptr<Stream> held = StartCaughtRunning("running");
  ASSERT_NE(held, nullptr);
  Stream& running = *held;
  Stream queued(worker_.get(), Long("queued"));
  ASSERT_TRUE(
      WaitInfo([](const rl::v1::GetServerInfoResponse& i) { return i.num_waiting() == 1; }));
  for (const char* id : {"running", "queued"}) {
    grpc::ClientContext ctx;
    rl::v1::AbortRequest req;
    req.set_request_id(id);
    rl::v1::AbortResponse resp;
    ASSERT_TRUE(worker_->Abort(&ctx, req, &resp).ok());
    EXPECT_EQ(resp.num_aborted(), 1) << id;
  }
  ASSERT_TRUE(running.Wait().ok());
  ASSERT_TRUE(queued.Wait().ok());
  const rl::v1::GenerateFinal r = running.final_msg();
  EXPECT_EQ(r.finish_reason(), rl::v1::FINISH_REASON_ABORT);
  EXPECT_GE(r.output_ids_size(), 1);
  EXPECT_EQ(std::vector<int32_t>(r.output_ids().begin(), r.output_ids().end()), running.tokens());
  EXPECT_EQ(r.output_logprobs_size(), r.output_ids_size());
  const rl::v1::GenerateFinal q = queued.final_msg();
  EXPECT_EQ(q.finish_reason(), rl::v1::FINISH_REASON_ABORT);
  EXPECT_EQ(q.output_ids_size(), 0);
  EXPECT_FALSE(q.abort_message().empty());
  EXPECT_EQ(q.prompt_tokens(), static_cast<int>(kPromptIds.size()));
  ASSERT_TRUE(Continue().ok());
}

}  // namespace
}  // namespace rl::worker::testing
