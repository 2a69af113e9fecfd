// RouterService (services/router/router_service.h) on its own: the Router service alone on a
// GrpcServer, over a WorkerPool of in-process fake workers, with the stories260K tokenizer and
// a real text cache. Covers the keys (data plane vs admin calls), Generate through the fakes and
// the trajectory it leaves in the cache, RetrieveFromText (bounds, exact retrieval, the prompt a
// Generate would send), the worker-pool calls, GetMetrics' figures and Prometheus text, the
// client-id bound and admission's refusal past its bounds.
#include "services/router/router_service.h"

#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/synchronization/notification.h"
#include "common/server_runner.h"
#include "grpcpp/create_channel.h"
#include "gtest/gtest.h"
#include "tests/testing/fake_pool_worker.h"
#include "tests/testing/test_data.h"

namespace rl::router {
namespace {

using testing::FakePoolWorker;

struct Fleet {
  int num_workers = 2;
  std::string data_key;
  std::string admin_key;
  int max_in_flight = 64;
  int max_queued = 64;
  int64_t max_prompt_bytes = 4 << 20;
  testing::FakeWorkerOptions worker;
};

class RouterServiceTest : public ::testing::Test {
 protected:
  void Start(const Fleet& fleet = {}) {
    for (int i = 0; i < fleet.num_workers; ++i) {
      fakes_.push_back(std::make_unique<FakePoolWorker>(fleet.worker));
      ASSERT_TRUE(fakes_.back()->ok());
    }
    auto tok = tokenizer::Tokenizer::FromDir(rl::testing::Stories());
    ASSERT_TRUE(tok.ok()) << tok.status();
    tokenizer_ = *std::move(tok);
    auto cache = TextCache::Create(TextCacheOptions{});
    ASSERT_TRUE(cache.ok()) << cache.status();
    cache_ = *std::move(cache);
    PoolOptions po;
    po.health_interval = std::chrono::hours(1);
    pool_ = std::make_unique<WorkerPool>(po);
    for (const auto& f : fakes_) ASSERT_TRUE(pool_->Add(f->address()).ok());
    blocking_ = std::make_unique<BoundedExecutor>("rl-test-block", 2, 1024);
    admin_executor_ = std::make_unique<BoundedExecutor>("rl-test-admin", 2, 64);
    data_auth_ = std::make_unique<BearerAuth>(fleet.data_key);
    admin_auth_ = std::make_unique<BearerAuth>(fleet.admin_key);
    RouterServiceOptions o;
    o.retry.backoff = std::chrono::milliseconds(5);
    o.limits.max_prompt_bytes = fleet.max_prompt_bytes;
    o.admission.max_in_flight = fleet.max_in_flight;
    o.admission.max_queued = fleet.max_queued;
    o.blocking = blocking_.get();
    o.admin = admin_executor_.get();
    service_ = std::make_unique<RouterService>(pool_.get(), cache_.get(), tokenizer_.get(),
                                               data_auth_.get(), admin_auth_.get(), &metrics_, o);
    ServerOptions so;
    so.drain = std::chrono::milliseconds(100);
    auto server = GrpcServer::Start(so, {service_.get()});
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    stub_ = rl::v1::Router::NewStub(
        grpc::CreateChannel(server_->address(), grpc::InsecureChannelCredentials()));
  }

  void TearDown() override {
    // As RouterServer::Shutdown: no new calls, the generations wind down, then the pools.
    if (server_) server_->Shutdown();
    if (service_) service_->WaitForGenerations();
    blocking_.reset();
    admin_executor_.reset();
  }

  static void Key(grpc::ClientContext* ctx, const std::string& key) {
    if (!key.empty()) ctx->AddMetadata("authorization", "Bearer " + key);
  }

  grpc::Status Generate(const rl::v1::GenerateRequest& req, rl::v1::GenerateFinal* f,
                        const std::string& key = "", const std::string& client_id = "") {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
    Key(&ctx, key);
    if (!client_id.empty()) ctx.AddMetadata(kClientIdHeader, client_id);
    auto reader = stub_->Generate(&ctx, req);
    rl::v1::GenerateResponse msg;
    while (reader->Read(&msg)) {
      if (msg.has_final()) *f = msg.final();
    }
    return reader->Finish();
  }

  static rl::v1::GenerateRequest Text(const std::string& text) {
    rl::v1::GenerateRequest req;
    req.set_text(text);
    req.set_return_logprob(true);
    req.set_return_trajectory(true);
    return req;
  }

  grpc::Status Retrieve(const rl::v1::RetrieveFromTextRequest& req,
                        rl::v1::RetrieveFromTextResponse* resp, const std::string& key = "") {
    grpc::ClientContext ctx;
    Key(&ctx, key);
    return stub_->RetrieveFromText(&ctx, req, resp);
  }

  rl::v1::GetMetricsResponse Metrics(const std::string& key = "") {
    grpc::ClientContext ctx;
    Key(&ctx, key);
    rl::v1::GetMetricsResponse m;
    EXPECT_TRUE(stub_->GetMetrics(&ctx, {}, &m).ok());
    return m;
  }

  std::vector<std::unique_ptr<FakePoolWorker>> fakes_;
  std::unique_ptr<tokenizer::Tokenizer> tokenizer_;
  std::unique_ptr<TextCache> cache_;
  std::unique_ptr<WorkerPool> pool_;
  std::unique_ptr<BoundedExecutor> blocking_;
  std::unique_ptr<BoundedExecutor> admin_executor_;
  std::unique_ptr<BearerAuth> data_auth_;
  std::unique_ptr<BearerAuth> admin_auth_;
  MetricsRegistry metrics_;
  std::unique_ptr<RouterService> service_;
  std::unique_ptr<GrpcServer> server_;
  std::unique_ptr<rl::v1::Router::Stub> stub_;
};

TEST_F(RouterServiceTest, GenerateRunsOnAWorkerAndItsTrajectoryIsRetrievedExactly) {
  Start();
  rl::v1::GenerateFinal f;
  grpc::Status s = Generate(Text("Once upon a time"), &f);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_TRUE(f.worker() == fakes_[0]->address() || f.worker() == fakes_[1]->address())
      << f.worker();
  EXPECT_EQ(f.completion_tokens(), 16);
  EXPECT_EQ(f.attempts(), 1);
  ASSERT_FALSE(f.text().empty());
  const rl::v1::Trajectory& t = f.trajectory();
  ASSERT_EQ(t.tokens_size(), t.loss_mask_size());
  ASSERT_GT(t.tokens_size(), 16);

  // The whole text (prompt + completion) comes back exactly as the model saw it.
  rl::v1::RetrieveFromTextRequest req;
  req.set_text("Once upon a time" + f.text());
  rl::v1::RetrieveFromTextResponse r;
  ASSERT_TRUE(Retrieve(req, &r).ok());
  EXPECT_EQ(r.matched_bytes(), static_cast<int64_t>(req.text().size()));
  EXPECT_EQ(std::vector<int32_t>(r.trajectory().tokens().begin(), r.trajectory().tokens().end()),
            std::vector<int32_t>(t.tokens().begin(), t.tokens().end()));
  EXPECT_EQ(
      std::vector<int32_t>(r.trajectory().loss_mask().begin(), r.trajectory().loss_mask().end()),
      std::vector<int32_t>(t.loss_mask().begin(), t.loss_mask().end()));
  EXPECT_EQ(r.trajectory().loss_mask(t.loss_mask_size() - 1), 1);  // generated

  // With tokenize_remainder: the prompt a Generate of a longer text would send, reusing the
  // cached tokens.
  req.set_text(req.text() + " and then");
  req.set_tokenize_remainder(true);
  ASSERT_TRUE(Retrieve(req, &r).ok());
  EXPECT_EQ(r.cached_tokens(), t.tokens_size());
  EXPECT_GT(r.trajectory().tokens_size(), t.tokens_size());
  EXPECT_EQ(r.trajectory().loss_mask(r.trajectory().loss_mask_size() - 1), 0);  // new prompt
}

TEST_F(RouterServiceTest, DataAndAdminCallsNeedTheirOwnKeys) {
  Fleet fleet;
  fleet.data_key = "data-key";
  fleet.admin_key = "admin-key";
  Start(fleet);
  rl::v1::GenerateFinal f;
  EXPECT_EQ(Generate(Text("Once"), &f).error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_TRUE(Generate(Text("Once"), &f, "data-key").ok());
  rl::v1::RetrieveFromTextRequest req;
  req.set_text("Once");
  rl::v1::RetrieveFromTextResponse r;
  EXPECT_EQ(Retrieve(req, &r).error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_TRUE(Retrieve(req, &r, "data-key").ok());
  // No key: UNAUTHENTICATED; the data-plane key: PERMISSION_DENIED for admin calls.
  for (const auto& [key, code] :
       {std::pair<std::string, grpc::StatusCode>{"", grpc::StatusCode::UNAUTHENTICATED},
        {"data-key", grpc::StatusCode::PERMISSION_DENIED}}) {
    grpc::ClientContext ctx;
    Key(&ctx, key);
    rl::v1::WorkerListResponse list;
    EXPECT_EQ(stub_->ListWorkers(&ctx, {}, &list).error_code(), code) << key;
    grpc::ClientContext mctx;
    Key(&mctx, key);
    rl::v1::GetMetricsResponse m;
    EXPECT_EQ(stub_->GetMetrics(&mctx, {}, &m).error_code(), code) << key;
  }
  grpc::ClientContext ctx;
  Key(&ctx, "admin-key");
  rl::v1::WorkerListResponse list;
  EXPECT_TRUE(stub_->ListWorkers(&ctx, {}, &list).ok());
  EXPECT_EQ(list.workers_size(), 2);
}

TEST_F(RouterServiceTest, RetrieveChecksItsText) {
  Fleet fleet;
  fleet.max_prompt_bytes = 64;
  Start(fleet);
  rl::v1::RetrieveFromTextRequest req;
  rl::v1::RetrieveFromTextResponse r;
  grpc::Status s = Retrieve(req, &r);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(s.error_message(), "text: must not be empty");
  req.set_text(std::string(65, 'a'));
  s = Retrieve(req, &r);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("--max-prompt-bytes"), std::string::npos) << s.error_message();
  req.set_text("nothing cached yet");
  ASSERT_TRUE(Retrieve(req, &r).ok());
  EXPECT_EQ(r.matched_bytes(), 0);
  EXPECT_EQ(r.trajectory().tokens_size(), 0);
}

TEST_F(RouterServiceTest, WorkerPoolCalls) {
  Start();
  FakePoolWorker extra;
  ASSERT_TRUE(extra.ok());
  rl::v1::WorkerListResponse list;
  {
    rl::v1::AddWorkerRequest req;
    req.set_address("no-port");
    grpc::ClientContext ctx;
    EXPECT_EQ(stub_->AddWorker(&ctx, req, &list).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  }
  {
    rl::v1::AddWorkerRequest req;
    req.set_address(extra.address());
    grpc::ClientContext ctx;
    ASSERT_TRUE(stub_->AddWorker(&ctx, req, &list).ok());
    ASSERT_EQ(list.workers_size(), 3);
    for (const auto& w : list.workers()) EXPECT_EQ(w.state(), rl::v1::WORKER_STATE_LIVE);
  }
  {
    rl::v1::SetWorkerEnabledRequest req;
    req.set_address("127.0.0.1:1");
    grpc::ClientContext ctx;
    EXPECT_EQ(stub_->SetWorkerEnabled(&ctx, req, &list).error_code(), grpc::StatusCode::NOT_FOUND);
  }
  {
    rl::v1::SetWorkerEnabledRequest req;
    req.set_address(extra.address());
    req.set_enabled(false);
    grpc::ClientContext ctx;
    ASSERT_TRUE(stub_->SetWorkerEnabled(&ctx, req, &list).ok());
    bool found = false;
    for (const auto& w : list.workers()) {
      if (w.address() != extra.address()) continue;
      found = true;
      EXPECT_FALSE(w.enabled());
      EXPECT_EQ(w.reason(), "disabled by an operator");
    }
    EXPECT_TRUE(found);
  }
  {
    rl::v1::RemoveWorkerRequest req;
    req.set_address(extra.address());
    grpc::ClientContext ctx;
    ASSERT_TRUE(stub_->RemoveWorker(&ctx, req, &list).ok());
    EXPECT_EQ(list.workers_size(), 2);
    grpc::ClientContext again;
    EXPECT_EQ(stub_->RemoveWorker(&again, req, &list).error_code(), grpc::StatusCode::NOT_FOUND);
  }
}

TEST_F(RouterServiceTest, MetricsCountRequestsAndShowTheFleetAndCache) {
  Start();
  for (int i = 0; i < 3; ++i) {
    rl::v1::GenerateFinal f;
    ASSERT_TRUE(Generate(Text("Once upon a time"), &f).ok());
  }
  const rl::v1::GetMetricsResponse m = Metrics();
  EXPECT_EQ(m.requests_total(), 3);
  EXPECT_EQ(m.failures_total(), 0);
  EXPECT_EQ(m.active_workers(), 2);
  EXPECT_EQ(m.total_workers(), 2);
  EXPECT_EQ(m.in_flight(), 0);
  EXPECT_EQ(m.workers_size(), 2);
  EXPECT_GT(m.cache().entries(), 0);
  EXPECT_GT(m.cache().size_tokens(), 0);
  EXPECT_FALSE(m.weight_version_mismatch());
  const std::string& text = m.prometheus_text();
  EXPECT_NE(text.find("rl_router_requests_total 3"), std::string::npos) << text;
  EXPECT_NE(text.find("rl_router_live_workers 2"), std::string::npos) << text;
  EXPECT_NE(text.find("rl_router_in_flight_requests 0"), std::string::npos) << text;
  EXPECT_NE(text.find("rl_router_cache_entries"), std::string::npos) << text;
}

TEST_F(RouterServiceTest, ClientIdsAreBounded) {
  Start();
  rl::v1::GenerateFinal f;
  EXPECT_TRUE(Generate(Text("Once"), &f, "", std::string(kMaxClientIdBytes, 'c')).ok());
  const grpc::Status s = Generate(Text("Once"), &f, "", std::string(kMaxClientIdBytes + 1, 'c'));
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find(kClientIdHeader), std::string::npos) << s.error_message();
}

// Past --max-in-flight with no queue a request is refused at once, and counted.
TEST_F(RouterServiceTest, AdmissionRefusesPastItsBounds) {
  Fleet fleet;
  fleet.num_workers = 1;
  fleet.max_in_flight = 1;
  fleet.max_queued = 0;
  fleet.worker.delay = std::chrono::milliseconds(500);
  Start(fleet);
  grpc::Status first;
  absl::Notification first_done;
  std::thread holder([&] {
    rl::v1::GenerateFinal f;
    first = Generate(Text("Once"), &f);
    first_done.Notify();
  });
  // The first request holds the one slot once its worker call started.
  for (int i = 0; i < 3000 && fakes_[0]->service().generate().started.load() == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  ASSERT_EQ(fakes_[0]->service().generate().started.load(), 1);
  rl::v1::GenerateFinal f;
  const grpc::Status refused = Generate(Text("Once"), &f);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << refused.error_message();
  holder.join();
  EXPECT_TRUE(first.ok()) << first.error_message();
  EXPECT_NE(Metrics().prometheus_text().find("rl_router_rejected_total 1"), std::string::npos);
}

}  // namespace
}  // namespace rl::router
