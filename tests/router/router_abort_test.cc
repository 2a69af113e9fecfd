// Router.Abort over an in-process rl-router and rl-worker (stories260K): a request held in a
// paused worker's waiting queue is aborted by id through the router, its stream ends with
// FINISH_REASON_ABORT and is not retried; unknown / missing ids are errors; abort_all needs the
// admin key and reaches every worker. Generations the workers abort themselves are retried, and
// once the attempts are used up the last attempt's final message (partial output) is returned.
// Forwarded aborts in flight are capped (RESOURCE_EXHAUSTED past the cap).
#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "common/request_limits.h"
#include "common/server_runner.h"
#include "common/tokenizer/tokenizer.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/health_check_service_interface.h"
#include "rl/v1/router.grpc.pb.h"
#include "rl/v1/worker.grpc.pb.h"
#include "services/router/request_table.h"
#include "services/router/router_server.h"
#include "tests/testing/fake_worker.h"
#include "tests/testing/router_fleet.h"
#include "tests/worker/worker_test_util.h"

namespace rl::router {
namespace {

constexpr char kKey[] = "abort-test-key";

class RouterAbortTest : public ::testing::Test {
 protected:
  void StartFleet(int num_workers, const std::string& admin_key = "", int max_in_flight = 0) {
    RouterConfig config;
    if (max_in_flight > 0) config.max_in_flight = max_in_flight;
    for (int i = 0; i < num_workers; ++i) {
      worker::WorkerConfig wc;
      wc.admin_api_key = admin_key;
      auto w = testing::StartTestWorker(wc);
      ASSERT_TRUE(w.ok()) << w.status();
      config.workers.push_back((*w)->address());
      auto ch = grpc::CreateChannel((*w)->address(), grpc::InsecureChannelCredentials());
      worker_admin_.push_back(rl::v1::Admin::NewStub(ch));
      workers_.push_back(*std::move(w));
    }
    config.admin_api_key = admin_key;
    auto r = testing::StartTestRouter(config);
    ASSERT_TRUE(r.ok()) << r.status();
    router_ = *std::move(r);
    stub_ = rl::v1::Router::NewStub(
        grpc::CreateChannel(router_->address(), grpc::InsecureChannelCredentials()));
  }

  void TearDown() override {
    if (router_) router_->Shutdown();
    for (auto& w : workers_) w->Shutdown();
  }

  // Pauses the fleet in place through the router: new requests wait in the workers' queues (a
  // worker paused behind the router's back would refuse them instead: worker_service.cc).
  void PauseFleet(const std::string& key = "") {
    grpc::ClientContext ctx;
    if (!key.empty()) ctx.AddMetadata("authorization", std::string("Bearer ") + key);
    rl::v1::PauseGenerationRequest req;
    req.set_mode(rl::v1::PAUSE_MODE_IN_PLACE);
    rl::v1::AdminResponse resp;
    auto admin = rl::v1::Admin::NewStub(
        grpc::CreateChannel(router_->address(), grpc::InsecureChannelCredentials()));
    const grpc::Status s = admin->PauseGeneration(&ctx, req, &resp);
    ASSERT_TRUE(s.ok()) << s.error_message();
  }

  // Waits (bounded) until the workers hold `n` waiting requests in all.
  bool WaitForWaiting(int n, const std::string& key = "") {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (std::chrono::steady_clock::now() < deadline) {
      int waiting = 0;
      for (auto& admin : worker_admin_) {
        grpc::ClientContext ctx;
        if (!key.empty()) ctx.AddMetadata("authorization", std::string("Bearer ") + key);
        rl::v1::GetServerInfoResponse info;
        if (admin->GetServerInfo(&ctx, {}, &info).ok()) waiting += info.num_waiting();
      }
      if (waiting == n) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return false;
  }

  struct Outcome {
    grpc::Status status;
    rl::v1::GenerateFinal final;
    std::string request_id;
  };

  std::thread GenerateAsync(const std::string& request_id, Outcome* out) {
    return std::thread([this, request_id, out] {
      rl::v1::GenerateRequest req;
      req.set_request_id(request_id);
      req.set_text("Once upon a time");
      req.mutable_sampling_params()->set_temperature(0);
      req.mutable_sampling_params()->set_max_new_tokens(16);
      grpc::ClientContext ctx;
      ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(120));
      auto reader = stub_->Generate(&ctx, req);
      rl::v1::GenerateResponse msg;
      while (reader->Read(&msg)) {
        out->request_id = msg.request_id();
        if (msg.has_final()) out->final = msg.final();
      }
      out->status = reader->Finish();
    });
  }

  grpc::Status Abort(const rl::v1::AbortRequest& req, rl::v1::AbortResponse* resp,
                     const std::string& key = "") {
    grpc::ClientContext ctx;
    if (!key.empty()) ctx.AddMetadata("authorization", std::string("Bearer ") + key);
    return stub_->Abort(&ctx, req, resp);
  }

  std::vector<std::unique_ptr<worker::WorkerServer>> workers_;
  std::vector<std::unique_ptr<rl::v1::Admin::Stub>> worker_admin_;
  std::unique_ptr<RouterServer> router_;
  std::unique_ptr<rl::v1::Router::Stub> stub_;
};

TEST_F(RouterAbortTest, AbortByIdReachesTheWorkerAndIsNotRetried) {
  StartFleet(2);
  PauseFleet();
  Outcome out;
  std::thread t = GenerateAsync("trainer-req-1", &out);
  ASSERT_TRUE(WaitForWaiting(1));
  rl::v1::AbortRequest req;
  req.set_request_id("trainer-req-1");
  rl::v1::AbortResponse resp;
  grpc::Status s = Abort(req, &resp);
  t.join();
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(resp.num_aborted(), 1);
  ASSERT_TRUE(out.status.ok()) << out.status.error_message();
  EXPECT_EQ(out.final.finish_reason(), rl::v1::FINISH_REASON_ABORT);
  EXPECT_EQ(out.final.attempts(), 1);
  EXPECT_EQ(out.final.completion_tokens(), 0);
  EXPECT_EQ(out.request_id, "trainer-req-1");
  // Nothing is left waiting anywhere: the abort was not retried on the other worker.
  EXPECT_TRUE(WaitForWaiting(0));
  // The id is no longer in flight.
  s = Abort(req, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND) << s.error_message();
  EXPECT_NE(s.error_message().find("trainer-req-1"), std::string::npos);
}

// A request still waiting for admission (the one slot is held) is in flight for Router.Abort
// too: abort by id finds it, and once admitted it ends ABORTED without reaching a worker.
TEST_F(RouterAbortTest, AbortReachesARequestQueuedForAdmission) {
  StartFleet(1, "", /*max_in_flight=*/1);
  PauseFleet();
  Outcome holder, queued;
  std::thread t1 = GenerateAsync("holds-the-slot", &holder);
  ASSERT_TRUE(WaitForWaiting(1));
  std::thread t2 = GenerateAsync("queued", &queued);
  rl::v1::AbortRequest req;
  req.set_request_id("queued");
  rl::v1::AbortResponse resp;
  grpc::Status s;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  do {  // until the router has taken the call (NOT_FOUND before that)
    resp.Clear();
    s = Abort(req, &resp);
    if (s.ok()) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  } while (std::chrono::steady_clock::now() < deadline);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(resp.num_aborted(), 0);  // no worker held it: the router's mark alone stops it
  req.set_request_id("holds-the-slot");
  ASSERT_TRUE(Abort(req, &resp).ok());  // frees the slot: the queued request is admitted
  t1.join();
  t2.join();
  EXPECT_EQ(holder.final.finish_reason(), rl::v1::FINISH_REASON_ABORT);
  EXPECT_EQ(queued.status.error_code(), grpc::StatusCode::ABORTED) << queued.status.error_message();
  EXPECT_TRUE(WaitForWaiting(0));  // the queued request never reached the worker
}

TEST_F(RouterAbortTest, BadRequestsAreRefusedWithTheFieldNamed) {
  StartFleet(1);
  rl::v1::AbortResponse resp;
  grpc::Status s = Abort(rl::v1::AbortRequest(), &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("request_id"), std::string::npos);
  rl::v1::AbortRequest req;
  req.set_request_id(std::string(RequestLimits{}.max_request_id_bytes + 1, 'x'));
  s = Abort(req, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  req.set_request_id("nobody");
  s = Abort(req, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND);
}

TEST_F(RouterAbortTest, AbortAllNeedsTheAdminKeyAndReachesEveryWorker) {
  StartFleet(2, kKey);
  PauseFleet(kKey);
  Outcome a, b;
  std::thread ta = GenerateAsync("", &a);
  std::thread tb = GenerateAsync("", &b);
  ASSERT_TRUE(WaitForWaiting(2, kKey));
  rl::v1::AbortRequest req;
  req.set_abort_all(true);
  rl::v1::AbortResponse resp;
  grpc::Status s = Abort(req, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  s = Abort(req, &resp, kKey);
  ta.join();
  tb.join();
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(resp.num_aborted(), 2);
  for (const Outcome* o : {&a, &b}) {
    ASSERT_TRUE(o->status.ok()) << o->status.error_message();
    EXPECT_EQ(o->final.finish_reason(), rl::v1::FINISH_REASON_ABORT);
    // The router assigned an unguessable id in its own namespace and returned it.
    EXPECT_EQ(o->request_id.rfind(kRouterRequestIdPrefix, 0), 0u) << o->request_id;
    EXPECT_EQ(o->request_id.size(), 4u + 32u) << o->request_id;
  }
}

// A fake rl.v1.Worker (with the standard health service) whose every generation is aborted
// by the worker itself, as a PauseGeneration(abort) or a weight update with abort_all_requests
// ends it: optionally some output streamed first, then a final message with
// FINISH_REASON_ABORT carrying that partial output.
class AbortingWorker final : public rl::v1::Worker::Service {
 public:
  explicit AbortingWorker(std::vector<int32_t> partial) : partial_(std::move(partial)) {}

  absl::Status Start() {
    grpc::EnableDefaultHealthCheckService(true);
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
    builder.RegisterService(this);
    server_ = builder.BuildAndStart();
    if (server_ == nullptr || port_ == 0) return absl::InternalError("fake worker did not start");
    return absl::OkStatus();
  }
  void Shutdown() {
    if (server_) server_->Shutdown();
  }
  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }
  int calls() const { return calls_.load(); }

  grpc::Status Generate(grpc::ServerContext*, const rl::v1::GenerateRequest* req,
                        grpc::ServerWriter<rl::v1::GenerateResponse>* writer) override {
    calls_.fetch_add(1);
    rl::v1::GenerateResponse msg;
    msg.set_request_id(req->request_id());
    if (!partial_.empty()) {
      for (int32_t id : partial_) {
        msg.mutable_chunk()->add_token_ids(id);
        msg.mutable_chunk()->add_logprobs()->set_logprob(-0.5f);
      }
      writer->Write(msg);
    }
    rl::v1::GenerateResponse fin;
    fin.set_request_id(req->request_id());
    rl::v1::GenerateFinal* f = fin.mutable_final();
    f->set_finish_reason(rl::v1::FINISH_REASON_ABORT);
    f->set_abort_message("aborted by PauseGeneration(abort)");
    for (int32_t id : partial_) {
      f->add_output_ids(id);
      f->add_output_logprobs()->set_logprob(-0.5f);
    }
    f->set_prompt_tokens(req->input_ids().ids_size());
    f->set_completion_tokens(static_cast<int32_t>(partial_.size()));
    if (!partial_.empty()) {
      rl::v1::VersionSegment* seg = f->add_weight_version_segments();
      seg->set_num_tokens(static_cast<int32_t>(partial_.size()));
    }
    writer->Write(fin);
    return grpc::Status::OK;
  }
  grpc::Status Abort(grpc::ServerContext*, const rl::v1::AbortRequest*,
                     rl::v1::AbortResponse*) override {
    return grpc::Status::OK;
  }
  grpc::Status GetLoad(grpc::ServerContext*, const rl::v1::GetLoadRequest*,
                       rl::v1::GetLoadResponse*) override {
    return grpc::Status::OK;
  }

 private:
  const std::vector<int32_t> partial_;
  int port_ = 0;
  std::unique_ptr<grpc::Server> server_;
  std::atomic<int> calls_{0};
};

// Seed behaviour: when every retry of a generation the worker aborted is used up, the router
// returns the last attempt's final message (finish reason abort, the partial output, attempts),
// not an error, so the trainer keeps the partial trajectory.
TEST(RouterAbortRetryTest, LastAttemptsAbortIsReturnedWithItsPartialOutput) {
  auto tok = tokenizer::Tokenizer::FromDir(worker::testing::Stories());
  ASSERT_TRUE(tok.ok()) << tok.status();
  auto partial = (*tok)->EncodeContinuation(" upon a");
  ASSERT_TRUE(partial.ok());
  // Streaming: nothing may reach the client before the abort, else it is not retried; so
  // the workers abort before any output there.
  for (const bool stream : {false, true}) {
    SCOPED_TRACE(stream ? "streaming" : "not streaming");
    const std::vector<int32_t> output = stream ? std::vector<int32_t>() : partial->ids;
    std::vector<std::unique_ptr<AbortingWorker>> workers;
    RouterConfig config;
    for (int i = 0; i < 2; ++i) {
      workers.push_back(std::make_unique<AbortingWorker>(output));
      ASSERT_TRUE(workers.back()->Start().ok());
      config.workers.push_back(workers.back()->address());
    }
    config.max_attempts = 3;
    auto router = testing::StartTestRouter(config);
    ASSERT_TRUE(router.ok()) << router.status();
    auto stub = rl::v1::Router::NewStub(
        grpc::CreateChannel((*router)->address(), grpc::InsecureChannelCredentials()));
    // Both workers live (bounded wait), so every attempt reaches a worker.
    bool live = false;
    for (int i = 0; i < 300 && !live; ++i) {
      rl::v1::WorkerListResponse listing;
      grpc::ClientContext ctx;
      live = stub->ListWorkers(&ctx, {}, &listing).ok() && listing.workers_size() == 2 &&
             listing.workers(0).state() == rl::v1::WORKER_STATE_LIVE &&
             listing.workers(1).state() == rl::v1::WORKER_STATE_LIVE;
      if (!live) std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    ASSERT_TRUE(live);

    rl::v1::GenerateRequest req;
    req.set_text("Once");
    req.set_stream(stream);
    req.set_return_logprob(true);
    req.mutable_sampling_params()->set_max_new_tokens(16);
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
    auto reader = stub->Generate(&ctx, req);
    rl::v1::GenerateResponse msg;
    rl::v1::GenerateFinal final;
    int finals = 0;
    std::string streamed;
    while (reader->Read(&msg)) {
      if (msg.has_chunk()) streamed += msg.chunk().text();
      if (msg.has_final()) {
        final = msg.final();
        ++finals;
      }
    }
    const grpc::Status status = reader->Finish();
    ASSERT_TRUE(status.ok()) << status.error_message();
    EXPECT_EQ(finals, 1);
    EXPECT_EQ(final.finish_reason(), rl::v1::FINISH_REASON_ABORT);
    EXPECT_EQ(final.attempts(), 3);
    EXPECT_EQ(final.abort_message(), "aborted by PauseGeneration(abort)");
    EXPECT_EQ(std::vector<int32_t>(final.output_ids().begin(), final.output_ids().end()), output);
    EXPECT_EQ(final.completion_tokens(), static_cast<int32_t>(output.size()));
    EXPECT_EQ(final.output_logprobs_size(), static_cast<int>(output.size()));
    // The partial output's text in the prompt's context, from the last attempt only.
    EXPECT_EQ(final.text(), stream ? "" : " upon a");
    EXPECT_EQ(streamed, stream ? final.text() : "");  // not streaming: the final message only
    EXPECT_EQ(workers[0]->calls() + workers[1]->calls(), 3);
    EXPECT_GE(workers[0]->calls(), 1);
    EXPECT_GE(workers[1]->calls(), 1);
    (*router)->Shutdown();
    for (auto& w : workers) w->Shutdown();
  }
}

// Router.Abort forwards asynchronously, at most 64 at once (kMaxAbortsInFlight in
// router_abort.cc): the 65th is refused with RESOURCE_EXHAUSTED without reaching a worker, and
// the slots come back when the forwarded calls finish.
TEST(RouterAbortCapTest, SixtyFifthAbortInFlightIsRefusedAndSlotsComeBack) {
  constexpr int kCap = 64;
  testing::HoldingWorker fake;
  ServerOptions so;
  so.drain = std::chrono::milliseconds(100);
  auto worker = GrpcServer::Start(so, {&fake});
  ASSERT_TRUE(worker.ok()) << worker.status();
  RouterConfig config;
  config.workers.push_back((*worker)->address());
  // Forwarding holds no thread: all 64 reach the worker at once with a single admin thread.
  config.admin_threads = 1;
  auto router = testing::StartTestRouter(config);
  ASSERT_TRUE(router.ok()) << router.status();
  auto stub = rl::v1::Router::NewStub(
      grpc::CreateChannel((*router)->address(), grpc::InsecureChannelCredentials()));
  // Until the health check has seen the worker live, abort_all reaches nobody.
  const auto live_deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  bool live = false;
  while (!live && std::chrono::steady_clock::now() < live_deadline) {
    grpc::ClientContext ctx;
    rl::v1::WorkerListResponse list;
    live = stub->ListWorkers(&ctx, rl::v1::ListWorkersRequest(), &list).ok() &&
           list.workers_size() == 1 && list.workers(0).state() == rl::v1::WORKER_STATE_LIVE;
    if (!live) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_TRUE(live);

  rl::v1::AbortRequest all;
  all.set_abort_all(true);
  struct Call {
    grpc::ClientContext ctx;
    rl::v1::AbortResponse response;
    grpc::Status status;
  };
  std::vector<std::unique_ptr<Call>> calls;
  std::atomic<int> done{0};
  for (int i = 0; i < kCap; ++i) {
    calls.push_back(std::make_unique<Call>());
    Call* c = calls.back().get();
    c->ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
    stub->async()->Abort(&c->ctx, &all, &c->response, [c, &done](grpc::Status s) {
      c->status = std::move(s);
      done.fetch_add(1);
    });
  }
  ASSERT_TRUE(fake.aborts.WaitHeld(kCap)) << fake.aborts.calls() << " aborts reached the worker";

  // Every slot is taken: one more is refused at once and never forwarded.
  {
    grpc::ClientContext ctx;
    rl::v1::AbortResponse resp;
    grpc::Status s = stub->Abort(&ctx, all, &resp);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << s.error_message();
    EXPECT_NE(s.error_message().find("64 aborts are in flight"), std::string::npos)
        << s.error_message();
    EXPECT_EQ(fake.aborts.calls(), kCap);
  }

  fake.Release();
  const auto done_deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (done.load() < kCap && std::chrono::steady_clock::now() < done_deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_EQ(done.load(), kCap);
  for (const auto& c : calls) EXPECT_TRUE(c->status.ok()) << c->status.error_message();

  // The slots came back: the next abort is forwarded and answered. (The in-flight count drops
  // just before each call finishes, so by now all 64 are free.)
  {
    grpc::ClientContext ctx;
    rl::v1::AbortResponse resp;
    grpc::Status s = stub->Abort(&ctx, all, &resp);
    EXPECT_TRUE(s.ok()) << s.error_message();
    EXPECT_EQ(fake.aborts.calls(), kCap + 1);
  }
  (*router)->Shutdown();
  (*worker)->Shutdown();
}

}  // namespace
}  // namespace rl::router
