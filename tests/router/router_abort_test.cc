// Router.Abort over an in-process rl-router and rl-worker (stories260K): a request held in a
// paused worker's waiting queue is aborted by id through the router, its stream ends with
// FINISH_REASON_ABORT and is not retried; unknown / missing ids are errors; abort_all needs the
// admin key and reaches every worker.
#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "common/server_runner.h"
#include "rl/v1/worker.grpc.pb.h"

#include "rl/v1/router.grpc.pb.h"
#include "common/request_limits.h"
#include "services/router/request_table.h"
#include "services/router/router_server.h"
#include "tests/router/router_test_util.h"
#include "tests/worker/worker_test_util.h"

namespace rl::router {
namespace {

constexpr char kKey[] = "abort-test-key";

class RouterAbortTest : public ::testing::Test {
 protected:
  void StartFleet(int num_workers, const std::string& admin_key = "") {
    RouterConfig config;
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

  // Pauses worker i in place: new requests wait in its queue.
  void PauseWorker(size_t i, const std::string& key = "") {
    grpc::ClientContext ctx;
    if (!key.empty()) ctx.AddMetadata("authorization", std::string("Bearer ") + key);
    rl::v1::PauseGenerationRequest req;
    req.set_mode(rl::v1::PAUSE_MODE_IN_PLACE);
    rl::v1::AdminResponse resp;
    ASSERT_TRUE(worker_admin_[i]->PauseGeneration(&ctx, req, &resp).ok());
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
  PauseWorker(0);
  PauseWorker(1);
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
  PauseWorker(0, kKey);
  PauseWorker(1, kKey);
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

// A stand-in worker: gRPC health SERVING, GetLoad answered, and every Abort held open until
// Release(): Router.Abort calls forwarded to it stay in flight.
class HoldingAbortWorker final : public rl::v1::Worker::CallbackService {
 public:
  grpc::ServerUnaryReactor* GetLoad(grpc::CallbackServerContext* context,
                                    const rl::v1::GetLoadRequest*,
                                    rl::v1::GetLoadResponse*) override {
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }

  grpc::ServerUnaryReactor* Abort(grpc::CallbackServerContext* context,
                                  const rl::v1::AbortRequest*, rl::v1::AbortResponse*) override {
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    absl::MutexLock lock(&mu_);
    ++calls_;
    if (released_) {
      reactor->Finish(grpc::Status::OK);
    } else {
      held_.push_back(reactor);
    }
    return reactor;
  }

  // Waits (bounded) until `n` Abort calls are held.
  bool WaitHeld(size_t n) {
    absl::MutexLock lock(&mu_);
    auto enough = [&]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return held_.size() >= n; };
    return mu_.AwaitWithTimeout(absl::Condition(&enough), absl::Seconds(60));
  }

  int calls() {
    absl::MutexLock lock(&mu_);
    return calls_;
  }

  void Release() {
    absl::MutexLock lock(&mu_);
    released_ = true;
    for (grpc::ServerUnaryReactor* r : held_) r->Finish(grpc::Status::OK);
    held_.clear();
  }

 private:
  absl::Mutex mu_;
  std::vector<grpc::ServerUnaryReactor*> held_ ABSL_GUARDED_BY(mu_);
  int calls_ ABSL_GUARDED_BY(mu_) = 0;
  bool released_ ABSL_GUARDED_BY(mu_) = false;
};

// Router.Abort forwards on a thread per call, at most 64 at once (kMaxAbortsInFlight in
// router_abort.cc): the 65th is refused with RESOURCE_EXHAUSTED without reaching a worker, and
// the slots come back when the forwarded calls finish.
TEST(RouterAbortCapTest, SixtyFifthAbortInFlightIsRefusedAndSlotsComeBack) {
  constexpr int kCap = 64;
  HoldingAbortWorker fake;
  ServerOptions so;
  so.drain = std::chrono::milliseconds(100);
  auto worker = GrpcServer::Start(so, {&fake});
  ASSERT_TRUE(worker.ok()) << worker.status();
  RouterConfig config;
  config.workers.push_back((*worker)->address());
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
  ASSERT_TRUE(fake.WaitHeld(kCap)) << fake.calls() << " aborts reached the worker";

  // Every slot is taken: one more is refused at once and never forwarded.
  {
    grpc::ClientContext ctx;
    rl::v1::AbortResponse resp;
    grpc::Status s = stub->Abort(&ctx, all, &resp);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << s.error_message();
    EXPECT_NE(s.error_message().find("64 aborts are in flight"), std::string::npos)
        << s.error_message();
    EXPECT_EQ(fake.calls(), kCap);
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
    EXPECT_EQ(fake.calls(), kCap + 1);
  }
  (*router)->Shutdown();
  (*worker)->Shutdown();
}

TEST(RequestTableTest, RegistersMarksAndForgets) {
  RequestTable table;
  {
    RequestTable::Handle h = table.Add("a");
    EXPECT_FALSE(h.aborted());
    RequestTable::Handle dup = table.Add("a");  // already in flight: not registered
    h.SetWorker("127.0.0.1:1");
    auto w = table.MarkAborted("a");
    ASSERT_TRUE(w.ok());
    EXPECT_EQ(*w, "127.0.0.1:1");
    EXPECT_TRUE(h.aborted());
    EXPECT_FALSE(dup.aborted());
    EXPECT_EQ(table.size(), 1u);
  }
  EXPECT_EQ(table.size(), 0u);
  EXPECT_EQ(table.MarkAborted("a").status().code(), absl::StatusCode::kNotFound);
  RequestTable::Handle x = table.Add("x"), y = table.Add("y");
  EXPECT_EQ(table.MarkAllAborted(), 2);
  EXPECT_TRUE(x.aborted() && y.aborted());
  EXPECT_NE(RequestTable::NewId(), RequestTable::NewId());
}

}  // namespace
}  // namespace rl::router
