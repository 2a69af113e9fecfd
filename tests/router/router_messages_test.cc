// What the router refuses and how it says so, with an in-process rl-router and fake workers:
// - AddWorker refuses the router's own address, a server that is not an rl-worker (another
//   router) and an address nothing answers at (within the health timeout, naming
//   allow_unreachable), which then registers it, listed DEAD; a real worker is added LIVE;
// - a worker call that fails mid-stream at the transport ("recvmsg:Connection reset by peer")
//   reaches the client with the worker's address.
#include <memory>
#include <string>

#include "common/server_runner.h"
#include "gmock/gmock.h"
#include "grpcpp/create_channel.h"
#include "gtest/gtest.h"
#include "rl/v1/router.grpc.pb.h"
#include "services/router/router_server.h"
#include "tests/testing/fake_pool_worker.h"
#include "tests/testing/router_fleet.h"
#include "tests/testing/test_data.h"

namespace rl::router {
namespace {

using testing::FakePoolWorker;
using ::testing::HasSubstr;

class RouterMessagesTest : public ::testing::Test {
 protected:
  void Start(const std::vector<std::string>& workers = {}) {
    RouterConfig config;
    config.workers = workers;
    config.health_timeout_ms = 500;
    auto r = testing::StartTestRouter(config);
    ASSERT_TRUE(r.ok()) << r.status();
    router_ = *std::move(r);
    stub_ = rl::v1::Router::NewStub(
        grpc::CreateChannel(router_->address(), grpc::InsecureChannelCredentials()));
  }
  void TearDown() override {
    if (router_) router_->Shutdown();
  }

  grpc::Status Add(const std::string& address, bool allow_unreachable = false,
                   rl::v1::WorkerListResponse* list = nullptr) {
    rl::v1::AddWorkerRequest req;
    req.set_address(address);
    req.set_allow_unreachable(allow_unreachable);
    rl::v1::WorkerListResponse resp;
    grpc::ClientContext ctx;
    const grpc::Status s = stub_->AddWorker(&ctx, req, &resp);
    if (list != nullptr) *list = resp;
    return s;
  }

  std::unique_ptr<RouterServer> router_;
  std::unique_ptr<rl::v1::Router::Stub> stub_;
};

TEST_F(RouterMessagesTest, AddWorkerRefusesItsOwnAddressOtherServersAndSilence) {
  Start();
  const std::string own = router_->address();
  const std::string port = own.substr(own.rfind(':') + 1);
  for (const std::string& address : {own, "localhost:" + port, "0.0.0.0:" + port}) {
    const grpc::Status s = Add(address, /*allow_unreachable=*/true);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << address;
    EXPECT_THAT(s.error_message(), HasSubstr("this router's own address")) << address;
  }
  // Another router answers gRPC health but is no rl-worker.
  auto other = testing::StartTestRouter(RouterConfig{});
  ASSERT_TRUE(other.ok()) << other.status();
  grpc::Status s = Add((*other)->address(), /*allow_unreachable=*/true);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("is not an rl-worker"));
  EXPECT_THAT(s.error_message(), HasSubstr("no rl.v1.Worker service"));
  (*other)->Shutdown();
  // Nothing listens there: refused within the health timeout, saying how to add it anyway.
  FakePoolWorker gone;
  ASSERT_TRUE(gone.ok());
  gone.Stop();
  s = Add(gone.address());
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_THAT(s.error_message(), HasSubstr("no rl-worker answered at '" + gone.address()));
  EXPECT_THAT(s.error_message(), HasSubstr("allow_unreachable"));
  EXPECT_TRUE(router_->pool().List().empty());
  rl::v1::WorkerListResponse list;
  ASSERT_TRUE(Add(gone.address(), /*allow_unreachable=*/true, &list).ok());
  ASSERT_EQ(list.workers_size(), 1);
  EXPECT_EQ(list.workers(0).state(), rl::v1::WORKER_STATE_DEAD);
  // A worker that answers is added live.
  FakePoolWorker up;
  ASSERT_TRUE(up.ok());
  ASSERT_TRUE(Add(up.address(), false, &list).ok());
  bool live = false;
  for (const auto& w : list.workers()) {
    live |= w.address() == up.address() && w.state() == rl::v1::WORKER_STATE_LIVE;
  }
  EXPECT_TRUE(live) << list.DebugString();
  EXPECT_TRUE(Add(up.address()).ok());  // again: nothing changes
}

// A worker whose Generate streams a chunk, then fails as a reset connection does.
class ResetWorker final : public rl::v1::Worker::CallbackService {
 public:
  grpc::ServerWriteReactor<rl::v1::GenerateResponse>* Generate(
      grpc::CallbackServerContext*, const rl::v1::GenerateRequest* req) override {
    return new Reactor(req->request_id());
  }
  grpc::ServerUnaryReactor* GetLoad(grpc::CallbackServerContext* ctx, const rl::v1::GetLoadRequest*,
                                    rl::v1::GetLoadResponse*) override {
    auto* r = ctx->DefaultReactor();
    r->Finish(grpc::Status::OK);
    return r;
  }

 private:
  class Reactor final : public grpc::ServerWriteReactor<rl::v1::GenerateResponse> {
   public:
    explicit Reactor(const std::string& id) {
      msg_.set_request_id(id);
      msg_.mutable_chunk()->add_token_ids(300);
      StartWrite(&msg_);
    }
    void OnWriteDone(bool) override {
      Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE, "recvmsg:Connection reset by peer"));
    }
    void OnDone() override { delete this; }

   private:
    rl::v1::GenerateResponse msg_;
  };
};

TEST_F(RouterMessagesTest, AWorkerFailingMidStreamIsNamed) {
  ResetWorker worker;
  auto server = GrpcServer::Start(ServerOptions{}, {&worker});
  ASSERT_TRUE(server.ok()) << server.status();
  Start({(*server)->address()});
  rl::v1::GenerateRequest req;
  for (int32_t id : {1, 403, 407}) req.mutable_input_ids()->add_ids(id);
  req.set_stream(true);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  auto reader = stub_->Generate(&ctx, req);
  rl::v1::GenerateResponse msg;
  int chunks = 0;
  while (reader->Read(&msg)) chunks += msg.has_chunk();
  const grpc::Status s = reader->Finish();
  EXPECT_GE(chunks, 1);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_THAT(s.error_message(), HasSubstr("worker " + (*server)->address()));
  EXPECT_THAT(s.error_message(), HasSubstr("recvmsg:Connection reset by peer"));
  router_->Shutdown();
  (*server)->Shutdown();
}

}  // namespace
}  // namespace rl::router
