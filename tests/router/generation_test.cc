// Generation (services/router/generation.h) stepped by hand, without gRPC calls: a fake worker
// source, the stories260K tokenizer and a real TextCache. Covers the attempt plan (retries with
// backoff, no retry after output, worker aborts retried and the last one returned, the hold
// during admin broadcasts, Router.Abort and client cancel), message handling (text deltas,
// final fields, trajectory) and the cache insert of a text prompt.
#include "services/router/generation.h"

#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "tests/worker/worker_test_util.h"

namespace rl::router {
namespace {

using Kind = Generation::Step::Kind;

class FakeWorkers final : public WorkerSource {
 public:
  explicit FakeWorkers(const std::vector<std::string>& addresses) {
    for (const std::string& a : addresses) workers_.push_back(std::make_shared<Worker>(a));
  }
  Lease Pick(const PickRequest& request) override {
    if (!available) return Lease();
    for (const auto& w : workers_) {
      if (!request.versions.Accepts(VersionOf(w->address()))) continue;
      if (request.exclude == nullptr || request.exclude->count(w->address()) == 0) {
        return Lease(w);
      }
    }
    return Lease();
  }
  std::vector<int64_t> RoutableVersions() const override {
    std::set<int64_t> out;
    for (const auto& w : workers_) out.insert(VersionOf(w->address()));
    return {out.begin(), out.end()};
  }
  int64_t VersionOf(const std::string& address) const {
    auto it = versions.find(address);
    return it == versions.end() ? 0 : it->second;
  }
  bool held() const override { return is_held; }
  void ReportFailure(Worker*) override { ++failures; }
  void ReportVersion(Worker*, int64_t version) override { last_version = version; }

  bool available = true;
  bool is_held = false;
  int failures = 0;
  int64_t last_version = -1;
  std::map<std::string, int64_t> versions;  // per address; 0 when not set

 private:
  std::vector<std::shared_ptr<Worker>> workers_;
};

class GenerationTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto tok = tokenizer::Tokenizer::FromDir(worker::testing::Stories());
    ASSERT_TRUE(tok.ok()) << tok.status();
    tokenizer_ = *std::move(tok);
    auto cache = TextCache::Create(TextCacheOptions{});
    ASSERT_TRUE(cache.ok()) << cache.status();
    cache_ = *std::move(cache);
    env_.workers = &workers_;
    env_.cache = cache_.get();
    env_.tokenizer = tokenizer_.get();
    env_.seam_counters = &seam_;
    env_.requests = &requests_;
    env_.retry.max_attempts = 3;
    env_.retry.backoff = std::chrono::milliseconds(10);
    env_.retry.hold_poll = std::chrono::milliseconds(5);
    env_.retry.version_poll = std::chrono::milliseconds(5);
  }

  std::unique_ptr<Generation> Make(const rl::v1::GenerateRequest& req) {
    auto g = Generation::Create(req, &env_);
    EXPECT_TRUE(g.ok()) << g.status();
    return g.ok() ? *std::move(g) : nullptr;
  }

  static rl::v1::GenerateRequest IdsRequest() {
    rl::v1::GenerateRequest req;
    for (int32_t id : worker::testing::kPromptIds) req.mutable_input_ids()->add_ids(id);
    return req;
  }

  static rl::v1::GenerateResponse Chunk(std::vector<int32_t> ids) {
    rl::v1::GenerateResponse msg;
    for (int32_t id : ids) msg.mutable_chunk()->add_token_ids(id);
    return msg;
  }

  static rl::v1::GenerateResponse Final(
      std::vector<int32_t> ids, rl::v1::FinishReason reason = rl::v1::FINISH_REASON_LENGTH) {
    rl::v1::GenerateResponse msg;
    rl::v1::GenerateFinal* f = msg.mutable_final();
    for (int32_t id : ids) {
      f->add_output_ids(id);
      f->add_output_logprobs()->set_logprob(-1.0f);
    }
    f->set_finish_reason(reason);
    f->set_weight_version(7);
    f->set_dispatch_weight_version(6);
    return msg;
  }

  FakeWorkers workers_{{"10.0.0.1:1", "10.0.0.2:1"}};
  std::unique_ptr<tokenizer::Tokenizer> tokenizer_;
  std::unique_ptr<TextCache> cache_;
  SeamCounters seam_;
  RequestTable requests_;
  GenerationEnv env_;
};

TEST_F(GenerationTest, OneAttemptStreamsChunksAndCompletesTheFinal) {
  rl::v1::GenerateRequest req = IdsRequest();
  req.set_return_trajectory(true);
  auto g = Make(req);
  ASSERT_NE(g, nullptr);
  Generation::Step step = g->Next();
  ASSERT_EQ(step.kind, Kind::kCall);
  EXPECT_EQ(step.worker->address(), "10.0.0.1:1");
  const rl::v1::GenerateRequest wreq = g->WorkerRequest();
  EXPECT_EQ(wreq.input_ids().ids_size(), static_cast<int>(worker::testing::kPromptIds.size()));
  EXPECT_TRUE(wreq.return_logprob());
  EXPECT_TRUE(wreq.stream());
  EXPECT_FALSE(wreq.return_trajectory());
  EXPECT_EQ(wreq.request_id(), g->request_id());
  EXPECT_EQ(requests_.size(), 1u);

  const std::vector<int32_t> out = {432, 383, 286};
  std::vector<rl::v1::GenerateResponse> sent;
  EXPECT_TRUE(g->OnMessage(Chunk({432, 383}), &sent));
  EXPECT_FALSE(g->FinalBlocks(Final(out)));  // input ids: no cache insert
  EXPECT_TRUE(g->OnMessage(Chunk({286}), &sent));
  EXPECT_TRUE(g->OnMessage(Final(out), &sent));
  ASSERT_GE(sent.size(), 3u);
  std::string streamed;
  for (const auto& m : sent) {
    if (m.has_chunk()) streamed += m.chunk().text();
  }
  const rl::v1::GenerateFinal& f = sent.back().final();
  EXPECT_EQ(streamed, f.text());
  auto decoded = tokenizer_->Decode(out);
  ASSERT_TRUE(decoded.ok());
  EXPECT_FALSE(f.text().empty());
  EXPECT_EQ(f.worker(), "10.0.0.1:1");
  EXPECT_EQ(f.attempts(), 1);
  EXPECT_EQ(workers_.last_version, 7);
  // Trajectory: prompt tokens mask 0 at the dispatch version, output mask 1 at the final's.
  const rl::v1::Trajectory& t = f.trajectory();
  ASSERT_EQ(t.tokens_size(), 8);
  EXPECT_EQ(t.loss_mask(0), 0u);
  EXPECT_EQ(t.loss_mask(7), 1u);
  EXPECT_EQ(t.token_weight_versions(0), 6);
  EXPECT_EQ(t.token_weight_versions(7), 7);
  EXPECT_FLOAT_EQ(t.rollout_logp(7), -1.0f);
  EXPECT_TRUE(f.output_logprobs().empty());  // return_logprob was not asked for

  g->EndAttempt(absl::OkStatus(), std::nullopt);
  step = g->Next();
  EXPECT_EQ(step.kind, Kind::kDone);
  EXPECT_TRUE(step.status.ok()) << step.status;
  EXPECT_EQ(requests_.size(), 0u);  // the id is released when the generation is done
}

TEST_F(GenerationTest, UnavailableBeforeOutputIsRetriedWithBackoffThenFails) {
  auto g = Make(IdsRequest());
  ASSERT_NE(g, nullptr);
  std::vector<std::string> called;
  std::vector<int64_t> waits;
  for (int i = 0; i < 10; ++i) {
    Generation::Step step = g->Next();
    if (step.kind == Kind::kDone) {
      EXPECT_EQ(step.status.code(), absl::StatusCode::kUnavailable) << step.status;
      break;
    }
    if (step.kind == Kind::kWait) {
      waits.push_back(step.wait.count());
      continue;
    }
    called.push_back(step.worker->address());
    (void)g->WorkerRequest();
    g->EndAttempt(absl::UnavailableError("connection refused"), std::nullopt);
  }
  // Another worker first, then any; backoff doubles.
  EXPECT_EQ(called, (std::vector<std::string>{"10.0.0.1:1", "10.0.0.2:1", "10.0.0.1:1"}));
  EXPECT_EQ(waits, (std::vector<int64_t>{10, 20}));
  EXPECT_EQ(workers_.failures, 3);
}

TEST_F(GenerationTest, FailureAfterOutputIsNotRetried) {
  auto g = Make(IdsRequest());
  ASSERT_NE(g, nullptr);
  ASSERT_EQ(g->Next().kind, Kind::kCall);
  (void)g->WorkerRequest();
  std::vector<rl::v1::GenerateResponse> sent;
  EXPECT_TRUE(g->OnMessage(Chunk({432}), &sent));
  EXPECT_TRUE(g->sent_any());
  g->EndAttempt(absl::UnavailableError("gone"), std::string("health check failed"));
  Generation::Step step = g->Next();
  ASSERT_EQ(step.kind, Kind::kDone);
  EXPECT_EQ(step.status.code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(step.status.message().find("not retried"), std::string::npos) << step.status;
  EXPECT_EQ(workers_.failures, 0);  // the pool marked it dead itself
}

TEST_F(GenerationTest, WorkerAbortsAreRetriedAndTheLastFinalIsReturned) {
  auto g = Make(IdsRequest());
  ASSERT_NE(g, nullptr);
  std::vector<rl::v1::GenerateResponse> sent;
  for (int attempt = 1; attempt <= 3; ++attempt) {
    Generation::Step step = g->Next();
    if (step.kind == Kind::kWait) step = g->Next();
    ASSERT_EQ(step.kind, Kind::kCall) << "attempt " << attempt;
    (void)g->WorkerRequest();
    const bool go_on = g->OnMessage(Final({}, rl::v1::FINISH_REASON_ABORT), &sent);
    EXPECT_EQ(go_on, attempt == 3) << "attempt " << attempt;
    g->EndAttempt(go_on ? absl::OkStatus() : absl::CancelledError("cancelled"), std::nullopt);
  }
  Generation::Step step = g->Next();
  ASSERT_EQ(step.kind, Kind::kDone);
  EXPECT_TRUE(step.status.ok()) << step.status;
  ASSERT_EQ(sent.size(), 1u);
  EXPECT_EQ(sent[0].final().finish_reason(), rl::v1::FINISH_REASON_ABORT);
  EXPECT_EQ(sent[0].final().attempts(), 3);
}

TEST_F(GenerationTest, HoldWaitsWithoutSpendingAnAttempt) {
  workers_.available = false;
  workers_.is_held = true;
  auto g = Make(IdsRequest());
  ASSERT_NE(g, nullptr);
  std::vector<int64_t> waits;
  for (int i = 0; i < 6; ++i) {
    Generation::Step step = g->Next();
    ASSERT_EQ(step.kind, Kind::kWait);
    waits.push_back(step.wait.count());
  }
  EXPECT_EQ(waits, (std::vector<int64_t>{5, 10, 20, 40, 40, 40}));
  workers_.available = true;
  workers_.is_held = false;
  ASSERT_EQ(g->Next().kind, Kind::kCall);
  (void)g->WorkerRequest();
  std::vector<rl::v1::GenerateResponse> sent;
  EXPECT_TRUE(g->OnMessage(Final({432}), &sent));
  EXPECT_EQ(sent.back().final().attempts(), 1);
}

TEST_F(GenerationTest, NoWorkerWithoutHoldFailsUnavailable) {
  workers_.available = false;
  auto g = Make(IdsRequest());
  ASSERT_NE(g, nullptr);
  Generation::Step step = g->Next();
  for (int i = 0; i < 10 && step.kind != Kind::kDone; ++i) step = g->Next();
  ASSERT_EQ(step.kind, Kind::kDone);
  EXPECT_EQ(step.status.code(), absl::StatusCode::kUnavailable);
}

TEST_F(GenerationTest, RouterAbortAndClientCancelEndIt) {
  rl::v1::GenerateRequest req = IdsRequest();
  req.set_request_id("my-id");
  auto g = Make(req);
  ASSERT_NE(g, nullptr);
  ASSERT_EQ(g->Next().kind, Kind::kCall);
  (void)g->WorkerRequest();
  auto worker = requests_.MarkAborted("my-id");
  ASSERT_TRUE(worker.ok());
  EXPECT_EQ(*worker, "10.0.0.1:1");
  // The worker answers the forwarded abort with an abort final: passed on, not retried.
  std::vector<rl::v1::GenerateResponse> sent;
  EXPECT_TRUE(g->OnMessage(Final({}, rl::v1::FINISH_REASON_ABORT), &sent));
  ASSERT_EQ(sent.size(), 1u);
  EXPECT_EQ(sent[0].final().finish_reason(), rl::v1::FINISH_REASON_ABORT);
  g->EndAttempt(absl::OkStatus(), std::nullopt);
  EXPECT_TRUE(g->Next().status.ok());
  // Aborted between attempts: no further attempt.
  auto a = Make(IdsRequest());
  ASSERT_NE(a, nullptr);
  ASSERT_EQ(a->Next().kind, Kind::kCall);
  (void)a->WorkerRequest();
  a->EndAttempt(absl::UnavailableError("refused"), std::nullopt);
  ASSERT_TRUE(requests_.MarkAborted(a->request_id()).ok());
  EXPECT_EQ(a->Next().status.code(), absl::StatusCode::kAborted);

  auto h = Make(IdsRequest());
  ASSERT_NE(h, nullptr);
  ASSERT_EQ(h->Next().kind, Kind::kCall);
  (void)h->WorkerRequest();
  h->Cancel();
  h->EndAttempt(absl::CancelledError("cancelled"), std::nullopt);
  EXPECT_EQ(h->Next().status.code(), absl::StatusCode::kCancelled);
}

TEST_F(GenerationTest, TextPromptFinalIsInsertedIntoTheCache) {
  rl::v1::GenerateRequest req;
  req.set_text("Once upon a time");
  auto g = Make(req);
  ASSERT_NE(g, nullptr);
  EXPECT_TRUE(g->prompt().from_text);
  ASSERT_EQ(g->Next().kind, Kind::kCall);
  (void)g->WorkerRequest();
  auto cont = tokenizer_->Encode(" there was a girl", false);
  ASSERT_TRUE(cont.ok());
  std::vector<rl::v1::GenerateResponse> sent;
  EXPECT_TRUE(g->OnMessage(Chunk(cont->ids), &sent));
  const rl::v1::GenerateResponse final = Final(cont->ids);
  EXPECT_TRUE(g->FinalBlocks(final));
  EXPECT_TRUE(g->OnMessage(final, &sent));
  const std::string text = sent.back().final().text();
  ASSERT_FALSE(text.empty());
  CacheRetrieval r = cache_->Retrieve("Once upon a time" + text);
  EXPECT_EQ(r.matched_bytes, std::string("Once upon a time").size() + text.size());
  ASSERT_GE(r.tokens.size(), cont->ids.size());
  EXPECT_EQ(r.loss_mask.back(), 1u);
  EXPECT_EQ(r.weight_version, 7);
}

TEST_F(GenerationTest, BadRequestsAreRefusedBeforeAnyAttempt) {
  rl::v1::GenerateRequest reserved = IdsRequest();
  reserved.set_request_id(std::string(kRouterRequestIdPrefix) + "x");
  EXPECT_EQ(Generation::Create(reserved, &env_).status().code(),
            absl::StatusCode::kInvalidArgument);
  rl::v1::GenerateRequest empty;
  empty.mutable_input_ids();
  EXPECT_EQ(Generation::Create(empty, &env_).status().code(), absl::StatusCode::kInvalidArgument);
  rl::v1::GenerateRequest none;
  EXPECT_EQ(Generation::Create(none, &env_).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(requests_.size(), 0u);
}

// Versions a request accepts (issue 30): only a worker serving one is called.
TEST_F(GenerationTest, OnlyAWorkerAtAnAcceptedVersionIsCalled) {
  workers_.versions["10.0.0.1:1"] = 3;
  workers_.versions["10.0.0.2:1"] = 5;
  rl::v1::GenerateRequest req = IdsRequest();
  req.set_min_weight_version(4);
  auto g = Make(req);
  ASSERT_NE(g, nullptr);
  Generation::Step step = g->Next();
  ASSERT_EQ(step.kind, Kind::kCall);
  EXPECT_EQ(step.worker->address(), "10.0.0.2:1");
  // The worker hears of the constraint too (it enforces it across updates).
  const rl::v1::GenerateRequest wreq = g->WorkerRequest();
  EXPECT_EQ(wreq.min_weight_version(), 4);
  EXPECT_FALSE(wreq.has_exact_weight_version());
}

// None qualifies: the request waits (not an attempt) for one until the wait runs out, then
// ends UNAVAILABLE naming what it asked for and the versions there are.
TEST_F(GenerationTest, NoWorkerAtAnAcceptedVersionIsUnavailableNamingTheVersions) {
  workers_.versions["10.0.0.1:1"] = 3;
  workers_.versions["10.0.0.2:1"] = 5;
  env_.retry.version_wait = std::chrono::milliseconds(60);
  rl::v1::GenerateRequest req = IdsRequest();
  req.set_exact_weight_version(9);
  auto g = Make(req);
  ASSERT_NE(g, nullptr);
  int waits = 0;
  Generation::Step step;
  for (step = g->Next(); step.kind == Kind::kWait; step = g->Next()) {
    ++waits;
    std::this_thread::sleep_for(step.wait);
  }
  EXPECT_GT(waits, 0);
  ASSERT_EQ(step.kind, Kind::kDone);
  EXPECT_EQ(step.status.code(), absl::StatusCode::kUnavailable) << step.status;
  EXPECT_NE(step.status.message().find("weight version == 9"), std::string::npos) << step.status;
  EXPECT_NE(step.status.message().find("version(s) 3, 5"), std::string::npos) << step.status;
}

// A worker reaching the version during the wait gets the request.
TEST_F(GenerationTest, AWorkerReachingTheVersionDuringTheWaitIsCalled) {
  env_.retry.version_wait = std::chrono::seconds(60);
  rl::v1::GenerateRequest req = IdsRequest();
  req.set_min_weight_version(2);
  auto g = Make(req);
  ASSERT_NE(g, nullptr);
  ASSERT_EQ(g->Next().kind, Kind::kWait);
  ASSERT_EQ(g->Next().kind, Kind::kWait);
  workers_.versions["10.0.0.2:1"] = 2;
  Generation::Step step = g->Next();
  ASSERT_EQ(step.kind, Kind::kCall);
  EXPECT_EQ(step.worker->address(), "10.0.0.2:1");
}

// The client's deadline shortens the wait: with one already past, the answer comes at once.
TEST_F(GenerationTest, TheClientDeadlineBoundsTheVersionWait) {
  env_.retry.version_wait = std::chrono::seconds(60);
  rl::v1::GenerateRequest req = IdsRequest();
  req.set_min_weight_version(2);
  auto g = Make(req);
  ASSERT_NE(g, nullptr);
  g->SetDeadline(std::chrono::system_clock::now() - std::chrono::seconds(1));
  Generation::Step step = g->Next();
  ASSERT_EQ(step.kind, Kind::kDone);
  EXPECT_EQ(step.status.code(), absl::StatusCode::kUnavailable) << step.status;
  EXPECT_NE(step.status.message().find(">= 2"), std::string::npos) << step.status;
}

// The worker finished the request because an update moved it to a version the request does
// not accept (before any output): retried on a worker that serves an accepted one.
TEST_F(GenerationTest, AVersionAbortBeforeOutputIsRetriedOnAQualifyingWorker) {
  workers_.versions["10.0.0.1:1"] = 4;
  workers_.versions["10.0.0.2:1"] = 4;
  rl::v1::GenerateRequest req = IdsRequest();
  req.set_exact_weight_version(4);
  auto g = Make(req);
  ASSERT_NE(g, nullptr);
  Generation::Step step = g->Next();
  ASSERT_EQ(step.kind, Kind::kCall);
  EXPECT_EQ(step.worker->address(), "10.0.0.1:1");
  g->WorkerRequest();
  workers_.versions["10.0.0.1:1"] = 5;  // updated under the request
  std::vector<rl::v1::GenerateResponse> sent;
  rl::v1::GenerateResponse abort = Final({}, rl::v1::FINISH_REASON_ABORT);
  abort.mutable_final()->set_abort_message("weight version: this worker now serves version 5");
  EXPECT_FALSE(g->OnMessage(abort, &sent));
  EXPECT_TRUE(sent.empty());
  g->EndAttempt(absl::CancelledError("cancelled by the router"), std::nullopt);
  for (step = g->Next(); step.kind == Kind::kWait; step = g->Next()) {
    std::this_thread::sleep_for(step.wait);
  }
  ASSERT_EQ(step.kind, Kind::kCall);
  EXPECT_EQ(step.worker->address(), "10.0.0.2:1");
}

// Issue 34: a stale final (the request's max_version_lag was crossed) is never retried, even
// with no output and attempts left; the fleet's default bound (--max-version-lag) is sent with
// a request that sets none, and a request's own bound (or -1) is kept.
TEST_F(GenerationTest, AStaleFinalIsNeverRetriedAndTheFleetBoundIsSent) {
  env_.max_version_lag = 2;
  auto g = Make(IdsRequest());
  ASSERT_NE(g, nullptr);
  Generation::Step step = g->Next();
  ASSERT_EQ(step.kind, Kind::kCall);
  const rl::v1::GenerateRequest wreq = g->WorkerRequest();
  ASSERT_TRUE(wreq.has_max_version_lag());
  EXPECT_EQ(wreq.max_version_lag(), 2);
  std::vector<rl::v1::GenerateResponse> sent;
  rl::v1::GenerateResponse stale = Final({}, rl::v1::FINISH_REASON_STALE);
  stale.mutable_final()->set_abort_message("stale: the weight version moved from 4 to 7");
  EXPECT_TRUE(g->OnMessage(stale, &sent));
  g->EndAttempt(absl::OkStatus(), std::nullopt);
  step = g->Next();
  ASSERT_EQ(step.kind, Kind::kDone);
  EXPECT_TRUE(step.status.ok()) << step.status;
  ASSERT_EQ(sent.size(), 1u);
  EXPECT_EQ(sent[0].final().finish_reason(), rl::v1::FINISH_REASON_STALE);
  EXPECT_EQ(sent[0].final().attempts(), 1);

  for (int32_t own : {-1, 0, 5}) {
    rl::v1::GenerateRequest req = IdsRequest();
    req.set_max_version_lag(own);
    auto h = Make(req);
    ASSERT_NE(h, nullptr);
    ASSERT_EQ(h->Next().kind, Kind::kCall);
    EXPECT_EQ(h->WorkerRequest().max_version_lag(), own);
  }
  env_.max_version_lag = -1;
  auto none = Make(IdsRequest());
  ASSERT_NE(none, nullptr);
  ASSERT_EQ(none->Next().kind, Kind::kCall);
  EXPECT_FALSE(none->WorkerRequest().has_max_version_lag());
}

}  // namespace
}  // namespace rl::router
