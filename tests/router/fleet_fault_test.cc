// Fleet fault tolerance of the router over in-process rl-workers (stories260K): concurrent
// health checks, cancelling a dead worker's streams (retried elsewhere), catch-up of a worker
// that joins behind the fleet's weight version, STALE workers after a non-replayable update and
// their resync. Processes killed / stopped for real: tests/reliability.
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <set>
#include <thread>

#include "rl/v1/router.grpc.pb.h"
#include "services/router/router_server.h"
#include "tests/router/router_test_util.h"
#include "tests/worker/worker_test_util.h"

namespace rl::router {
namespace {

using worker::testing::Stories;

// A TCP listener that never accepts: connections hang in the backlog, calls time out.
class BlackHole {
 public:
  BlackHole() {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = 0;
    EXPECT_EQ(bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    EXPECT_EQ(listen(fd_, 64), 0);
    socklen_t len = sizeof(addr);
    getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len);
    port_ = ntohs(addr.sin_port);
  }
  ~BlackHole() { close(fd_); }
  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }

 private:
  int fd_ = -1;
  int port_ = 0;
};

std::unique_ptr<worker::WorkerServer> StartWorker() {
  auto w = testing::StartTestWorker();
  EXPECT_TRUE(w.ok()) << w.status();
  return w.ok() ? *std::move(w) : nullptr;
}

class FleetFaultTest : public ::testing::Test {
 protected:
  void StartFleet(int num_workers, RouterConfig config = {}) {
    for (int i = 0; i < num_workers; ++i) {
      workers_.push_back(StartWorker());
      ASSERT_NE(workers_.back(), nullptr);
      config.workers.push_back(workers_.back()->address());
    }
    auto r = testing::StartTestRouter(config);
    ASSERT_TRUE(r.ok()) << r.status();
    router_ = *std::move(r);
    auto channel = grpc::CreateChannel(router_->address(), grpc::InsecureChannelCredentials());
    stub_ = rl::v1::Router::NewStub(channel);
    admin_ = rl::v1::Admin::NewStub(channel);
  }

  void TearDown() override {
    if (router_) router_->Shutdown();
    for (auto& w : workers_) w->Shutdown();
  }

  grpc::Status Generate(const rl::v1::GenerateRequest& req, rl::v1::GenerateFinal* f) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(120));
    auto reader = stub_->Generate(&ctx, req);
    rl::v1::GenerateResponse msg;
    while (reader->Read(&msg)) {
      if (msg.has_final()) *f = msg.final();
    }
    return reader->Finish();
  }

  static rl::v1::GenerateRequest TextRequest(const std::string& text, int max_new_tokens) {
    rl::v1::GenerateRequest req;
    req.set_text(text);
    req.mutable_sampling_params()->set_temperature(0);
    req.mutable_sampling_params()->set_max_new_tokens(max_new_tokens);
    return req;
  }

  rl::v1::WorkerListResponse ListWorkers() {
    rl::v1::WorkerListResponse resp;
    grpc::ClientContext ctx;
    EXPECT_TRUE(stub_->ListWorkers(&ctx, {}, &resp).ok());
    return resp;
  }

  rl::v1::WorkerStatus Status(const std::string& address) {
    const rl::v1::WorkerListResponse listing = ListWorkers();
    for (const auto& w : listing.workers()) {
      if (w.address() == address) return w;
    }
    ADD_FAILURE() << "no worker " << address;
    return {};
  }

  // Polls until `pred` holds (bounded: 30 s).
  template <typename Pred>
  bool WaitFor(Pred pred) {
    for (int i = 0; i < 300; ++i) {
      if (pred()) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    return false;
  }

  void AddWorker(const std::string& address) {
    rl::v1::AddWorkerRequest req;
    req.set_address(address);
    rl::v1::WorkerListResponse resp;
    grpc::ClientContext ctx;
    ASSERT_TRUE(stub_->AddWorker(&ctx, req, &resp).ok());
  }

  std::vector<std::unique_ptr<worker::WorkerServer>> workers_;
  std::unique_ptr<RouterServer> router_;
  std::unique_ptr<rl::v1::Router::Stub> stub_;
  std::unique_ptr<rl::v1::Admin::Stub> admin_;
};

// One health round costs one health timeout whatever the pool size: sequential checks of N
// black holes would take at least N timeouts.
TEST(WorkerPoolHealth, ChecksRunConcurrently) {
  constexpr int kHoles = 10;
  PoolOptions options;
  options.health_interval = std::chrono::milliseconds(600000);  // rounds run by the test
  options.health_timeout = std::chrono::milliseconds(300);
  options.failure_threshold = 1;
  WorkerPool pool(options);
  auto live = StartWorker();
  ASSERT_NE(live, nullptr);
  ASSERT_TRUE(pool.Add(live->address()).ok());
  std::vector<std::unique_ptr<BlackHole>> holes;
  for (int i = 0; i < kHoles; ++i) {
    holes.push_back(std::make_unique<BlackHole>());
    ASSERT_TRUE(pool.Add(holes.back()->address()).ok());
  }
  const auto start = std::chrono::steady_clock::now();
  pool.CheckAll();
  const auto elapsed = std::chrono::steady_clock::now() - start;
  EXPECT_LT(elapsed, kHoles * options.health_timeout);
  int live_count = 0;
  for (const auto& w : pool.List()) {
    if (w.address() == live->address()) {
      EXPECT_EQ(w.state(), rl::v1::WORKER_STATE_LIVE);
      ++live_count;
    } else {
      EXPECT_EQ(w.state(), rl::v1::WORKER_STATE_DEAD);
      EXPECT_NE(w.reason().find("health check"), std::string::npos) << w.reason();
    }
  }
  EXPECT_EQ(live_count, 1);
  live->Shutdown();
}

// A request waiting on a worker the pool marks dead is cancelled at once and retried on
// another worker (nothing was streamed yet).
TEST_F(FleetFaultTest, MarkingAWorkerDeadCancelsItsStreamsAndRetriesThem) {
  StartFleet(2);
  WorkerPool& pool = router_->pool();
  const std::string stuck = workers_[0]->address();
  const std::string good = workers_[1]->address();
  // The stuck worker holds requests (paused in place); the good one is out of routing for now.
  ASSERT_TRUE(workers_[0]->control().Pause(rl::engine::PauseMode::kInPlace).ok());
  ASSERT_TRUE(pool.SetEnabled(good, false).ok());
  grpc::Status status;
  rl::v1::GenerateFinal f;
  std::thread client([&] { status = Generate(TextRequest("Once upon a time", 4), &f); });
  ASSERT_TRUE(WaitFor([&] { return Status(stuck).in_flight() == 1; }));
  ASSERT_TRUE(pool.SetEnabled(good, true).ok());
  pool.MarkDead(pool.Find(stuck).get(), "test: hung");
  client.join();
  EXPECT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(f.worker(), good);
  EXPECT_EQ(f.attempts(), 2);
  EXPECT_EQ(f.completion_tokens(), 4);
  ASSERT_TRUE(workers_[0]->control().Continue().ok());
}

// A worker that joins behind the fleet's version is caught up from the fleet's disk source
// before it is routed.
TEST_F(FleetFaultTest, JoiningWorkerIsCaughtUpFromTheFleetsDiskSource) {
  StartFleet(2);
  rl::v1::UpdateWeightsFromDiskRequest update;
  update.set_model_path(Stories());
  update.set_weight_version(5);
  rl::v1::AdminResponse resp;
  {
    grpc::ClientContext ctx;
    ASSERT_TRUE(admin_->UpdateWeightsFromDisk(&ctx, update, &resp).ok());
  }
  ASSERT_TRUE(resp.success()) << resp.message();
  auto late = StartWorker();
  ASSERT_NE(late, nullptr);
  ASSERT_EQ(late->weight_version(), 0);
  AddWorker(late->address());
  ASSERT_TRUE(WaitFor([&] {
    const auto w = Status(late->address());
    return w.state() == rl::v1::WORKER_STATE_LIVE && w.weight_version() == 5 && w.reason().empty();
  })) << Status(late->address()).DebugString();
  EXPECT_EQ(late->weight_version(), 5);
  EXPECT_FALSE(late->engine().GetServerInfo().paused);  // the fleet is not paused
  std::set<std::string> served;
  for (int i = 0; i < 6; ++i) {
    rl::v1::GenerateFinal f;
    ASSERT_TRUE(Generate(TextRequest("Once", 2), &f).ok());
    EXPECT_EQ(f.weight_version(), 5);
    served.insert(f.worker());
  }
  EXPECT_TRUE(served.contains(late->address()));
  late->Shutdown();
}

// After an update from a tensor stream (not replayable) a worker joining behind it is STALE,
// never routed, until the documented resync (UpdateWeightsFromDisk with `workers`).
TEST_F(FleetFaultTest, StaleAfterATensorUpdateUntilResynced) {
  StartFleet(1);
  rl::v1::AdminResponse resp;
  {
    grpc::ClientContext ctx;
    auto writer = admin_->UpdateWeightsFromTensor(&ctx, &resp);
    rl::v1::UpdateWeightsFromTensorRequest m;
    m.mutable_chunk()->set_name("model.norm.weight");
    m.mutable_chunk()->set_dtype("F32");
    m.mutable_chunk()->add_shape(64);
    const std::vector<float> ones(64, 1.0f);
    m.mutable_chunk()->set_data(std::string(reinterpret_cast<const char*>(ones.data()), 64 * 4));
    ASSERT_TRUE(writer->Write(m));
    writer->WritesDone();
    ASSERT_TRUE(writer->Finish().ok());
  }
  ASSERT_TRUE(resp.success()) << resp.message();
  EXPECT_EQ(ListWorkers().fleet_weight_source(), "tensor");
  auto late = StartWorker();
  ASSERT_NE(late, nullptr);
  AddWorker(late->address());
  const auto stale = Status(late->address());
  EXPECT_EQ(stale.state(), rl::v1::WORKER_STATE_STALE);
  EXPECT_NE(stale.reason().find("resync"), std::string::npos) << stale.reason();
  for (int i = 0; i < 4; ++i) {
    rl::v1::GenerateFinal f;
    ASSERT_TRUE(Generate(TextRequest("Once", 2), &f).ok());
    EXPECT_EQ(f.worker(), workers_[0]->address());
  }
  rl::v1::UpdateWeightsFromDiskRequest resync;
  resync.set_model_path(Stories());
  resync.add_workers(late->address());
  {
    grpc::ClientContext ctx;
    ASSERT_TRUE(admin_->UpdateWeightsFromDisk(&ctx, resync, &resp).ok());
  }
  ASSERT_EQ(resp.results_size(), 1);  // only the named worker
  EXPECT_TRUE(resp.results(0).success()) << resp.results(0).message();
  EXPECT_EQ(resp.results(0).weight_version(), 1);  // the fleet's version
  const auto listing = ListWorkers();
  EXPECT_EQ(listing.fleet_weight_version(), 1);
  EXPECT_EQ(listing.fleet_weight_source(), "disk:" + Stories());
  EXPECT_EQ(Status(late->address()).state(), rl::v1::WORKER_STATE_LIVE);
  // An unknown address is refused.
  resync.set_workers(0, "127.0.0.1:1");
  grpc::ClientContext ctx;
  EXPECT_EQ(admin_->UpdateWeightsFromDisk(&ctx, resync, &resp).error_code(),
            grpc::StatusCode::NOT_FOUND);
  late->Shutdown();
}

// A failed group init may leave a worker's weights partial: it stays out of routing with the
// reason until a resync loads known weights and puts it back.
TEST_F(FleetFaultTest, PartialWeightsStayOutUntilResynced) {
  StartFleet(2);
  rl::v1::InitWeightsUpdateGroupRequest init;
  init.set_master_address("127.0.0.1");
  init.set_master_port(1);  // nothing listens there
  init.set_world_size(3);
  init.set_rank_offset(1);
  init.set_group_name("g");
  init.set_backend(rl::v1::GROUP_BACKEND_TCP);
  init.set_timeout_ms(300);
  rl::v1::AdminResponse resp;
  {
    grpc::ClientContext ctx;
    ASSERT_TRUE(admin_->InitWeightsUpdateGroup(&ctx, init, &resp).ok());
  }
  ASSERT_EQ(resp.results_size(), 2);
  for (const auto& r : resp.results()) {
    EXPECT_FALSE(r.success());
    EXPECT_TRUE(r.left_out());
  }
  const rl::v1::WorkerListResponse listing = ListWorkers();
  for (const auto& w : listing.workers()) {
    EXPECT_FALSE(w.enabled());
    EXPECT_NE(w.reason().find("weights may be partial"), std::string::npos) << w.reason();
  }
  rl::v1::GenerateFinal f;
  EXPECT_EQ(Generate(TextRequest("Once", 2), &f).error_code(), grpc::StatusCode::UNAVAILABLE);
  rl::v1::UpdateWeightsFromDiskRequest resync;
  resync.set_model_path(Stories());
  resync.add_workers(workers_[1]->address());
  {
    grpc::ClientContext ctx;
    ASSERT_TRUE(admin_->UpdateWeightsFromDisk(&ctx, resync, &resp).ok());
  }
  ASSERT_TRUE(resp.success()) << resp.message();
  const auto back = Status(workers_[1]->address());
  EXPECT_TRUE(back.enabled());
  EXPECT_EQ(back.reason(), "");
  EXPECT_FALSE(Status(workers_[0]->address()).enabled());
  ASSERT_TRUE(Generate(TextRequest("Once", 2), &f).ok());
  EXPECT_EQ(f.worker(), workers_[1]->address());
}

}  // namespace
}  // namespace rl::router
