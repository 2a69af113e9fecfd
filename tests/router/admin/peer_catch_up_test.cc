// Peer catch-up through a router over in-process rl-workers (stories260K), issue 30: a tensor
// update moves the fleet to a version that exists only in memory; a worker that restarts (or is
// added) behind it reaches that version with the checksum of the workers that hold it, sent by
// a live peer, with no admin call from the test; a peer that dies mid-send leaves the lagging
// worker at its old weights, out of routing, and the next peer finishes the job; with no peer
// left the worker is STALE until resynced (catch_up_test.cc). Processes killed for real during
// refits: tests/reliability/test_chaos.py.
#include <atomic>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "common/server_runner.h"
#include "rl/v1/router.grpc.pb.h"
#include "tests/testing/fake_pool_worker.h"
#include "tests/testing/router_fleet.h"
#include "tests/testing/tensor_stream.h"
#include "tests/testing/test_data.h"

namespace rl::router {
namespace {

using rl::testing::Stories;

constexpr int64_t kVersion = 7;

std::string RankChecksum(worker::WorkerServer& w) {
  auto r = w.control().CheckWeights(worker::CheckerAction::kChecksum);
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? r->rank_sha256 : "";
}

// 64 values of `v` for model.norm.weight (F32 [64] in stories260K).
rl::v1::TensorChunk NormChunk(float v) {
  const std::vector<float> values(64, v);
  return ::rl::testing::Chunk(
      "model.norm.weight", {64}, "F32",
      std::string(reinterpret_cast<const char*>(values.data()), values.size() * 4));
}

class PeerCatchUpTest : public testing::RouterFleetTest {
 protected:
  // A tensor update through the router: the fleet serves kVersion, which exists only in memory.
  void TensorUpdate() {
    rl::v1::UpdateWeightsFromTensorRequest options;
    options.set_weight_version(kVersion);
    rl::v1::AdminResponse resp;
    grpc::ClientContext ctx;
    const grpc::Status s =
        ::rl::testing::SendTensorStream(*admin_, &ctx, {NormChunk(0.5f)}, &resp, options);
    ASSERT_TRUE(s.ok()) << s.error_message();
    ASSERT_TRUE(resp.success()) << resp.message();
    const auto listing = ListWorkers();
    ASSERT_EQ(listing.fleet_weight_source(), "tensor");
    ASSERT_EQ(listing.fleet_weight_version(), kVersion);
  }
  // Waits until `address` is listed LIVE at kVersion with no reason.
  bool WaitLive(const std::string& address) {
    return WaitFor([&] {
      const auto w = Status(address);
      return w.state() == rl::v1::WORKER_STATE_LIVE && w.weight_version() == kVersion &&
             w.reason().empty();
    });
  }
};

// The restarted worker (same address, version 0, the checkpoint's weights) is caught up from the
// live peer by the router alone, and serves the fleet's version with the peer's checksum.
TEST_F(PeerCatchUpTest, RestartedWorkerCatchesUpFromAPeerAfterATensorUpdate) {
  StartFleet(2);
  TensorUpdate();
  const std::string fleet_sum = RankChecksum(*workers_[0]);
  ASSERT_EQ(RankChecksum(*workers_[1]), fleet_sum);
  // Restart worker 1 on its port: it comes back at version 0 with the checkpoint's weights.
  const std::string address = workers_[1]->address();
  int port = 0;
  ASSERT_TRUE(absl::SimpleAtoi(address.substr(address.rfind(':') + 1), &port));
  workers_[1]->Shutdown();
  workers_[1].reset();
  ASSERT_TRUE(WaitFor([&] { return Status(address).state() == rl::v1::WORKER_STATE_DEAD; }));
  worker::WorkerConfig wc;
  wc.model_path = Stories();
  wc.port = port;
  wc.kv_cache_gb = 0.01;
  wc.num_threads = 1;
  auto restarted = worker::WorkerServer::Start(wc);
  for (int i = 0; i < 50 && !restarted.ok(); ++i) {  // the port may take a moment to free
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    restarted = worker::WorkerServer::Start(wc);
  }
  ASSERT_TRUE(restarted.ok()) << restarted.status();
  workers_[1] = *std::move(restarted);
  ASSERT_EQ(workers_[1]->address(), address);
  // No admin call from here on: the router catches it up by itself.
  ASSERT_TRUE(WaitLive(address)) << Status(address).DebugString();
  EXPECT_EQ(workers_[1]->weight_version(), kVersion);
  EXPECT_EQ(RankChecksum(*workers_[1]), fleet_sum);
  EXPECT_FALSE(workers_[1]->engine().GetServerInfo().paused);  // the fleet is not paused
  // Both serve kVersion, with the same greedy output.
  std::set<std::string> served;
  std::set<std::string> texts;
  for (int i = 0; i < 8; ++i) {
    rl::v1::GenerateFinal f;
    ASSERT_TRUE(Generate(TextRequest("Once", 6), &f).ok());
    EXPECT_EQ(f.weight_version(), kVersion);
    served.insert(f.worker());
    texts.insert(f.text());
  }
  EXPECT_EQ(served.size(), 2u);
  EXPECT_EQ(texts.size(), 1u);
}

// A worker added behind the fleet's in-memory version is caught up the same way.
TEST_F(PeerCatchUpTest, AddedWorkerCatchesUpFromAPeer) {
  StartFleet(1);
  TensorUpdate();
  auto late = StartWorker();
  ASSERT_NE(late, nullptr);
  ASSERT_NE(RankChecksum(*late), RankChecksum(*workers_[0]));
  AddWorker(late->address());
  ASSERT_TRUE(WaitLive(late->address())) << Status(late->address()).DebugString();
  EXPECT_EQ(RankChecksum(*late), RankChecksum(*workers_[0]));
  late->Shutdown();
}

// A peer (fake rl-worker at the fleet's version) that streams part of the weights to the lagging
// worker and dies mid-send.
class DyingPeer final : public rl::v1::Admin::CallbackService {
 public:
  grpc::ServerUnaryReactor* SendWeightsToPeer(grpc::CallbackServerContext* ctx,
                                              const rl::v1::SendWeightsToPeerRequest* req,
                                              rl::v1::AdminResponse*) override {
    auto* reactor = ctx->DefaultReactor();
    const std::string target = req->target();
    const int64_t version = req->weight_version();
    std::thread([this, reactor, target, version] {
      auto stub =
          rl::v1::Admin::NewStub(grpc::CreateChannel(target, grpc::InsecureChannelCredentials()));
      grpc::ClientContext out;
      rl::v1::AdminResponse resp;
      auto writer = stub->UpdateWeightsFromTensor(&out, &resp);
      rl::v1::UpdateWeightsFromTensorRequest m;
      m.set_weight_version(version);
      *m.mutable_chunk() = NormChunk(9.0f);  // would change the served weights if applied
      const bool wrote = writer->Write(m);
      // Dies: the stream is cut before its end, the call to it fails.
      out.TryCancel();
      const grpc::Status cut = writer->Finish();
      (void)cut;  // CANCELLED: the receiver applies nothing
      sends.fetch_add(wrote ? 1 : 0);
      calls.fetch_add(1);
      reactor->Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE, "peer died mid-send"));
    }).detach();
    return reactor;
  }
  std::atomic<int> calls{0};
  std::atomic<int> sends{0};
};

TEST_F(PeerCatchUpTest, APeerThatDiesMidSendActivatesNothingAndTheNextPeerFinishes) {
  StartFleet(1);
  TensorUpdate();
  const std::string fleet_sum = RankChecksum(*workers_[0]);
  // The fake peer: gRPC health, GetLoad at the fleet's version, the dying send.
  testing::VersionedFakeWorker data;
  data.weight_version.store(kVersion);
  DyingPeer dying;
  ServerOptions so;
  so.drain = std::chrono::milliseconds(100);
  auto fake = GrpcServer::Start(so, {&data, &dying});
  ASSERT_TRUE(fake.ok()) << fake.status();
  AddWorker((*fake)->address());
  ASSERT_TRUE(
      WaitFor([&] { return Status((*fake)->address()).state() == rl::v1::WORKER_STATE_LIVE; }));
  // The real peer is out (an operator disabled it) until the fake has died.
  {
    rl::v1::SetWorkerEnabledRequest req;
    req.set_address(workers_[0]->address());
    req.set_enabled(false);
    rl::v1::WorkerListResponse resp;
    grpc::ClientContext ctx;
    ASSERT_TRUE(stub_->SetWorkerEnabled(&ctx, req, &resp).ok());
  }
  auto late = StartWorker();
  ASSERT_NE(late, nullptr);
  const std::string late_sum = RankChecksum(*late);
  AddWorker(late->address());
  ASSERT_TRUE(WaitFor([&] { return dying.calls.load() >= 1; }));
  (*fake)->Shutdown();               // gone for good
  EXPECT_EQ(dying.sends.load(), 1);  // it had started streaming
  // Nothing of the cut stream was applied; the worker is behind and not routed.
  EXPECT_EQ(late->weight_version(), 0);
  EXPECT_EQ(RankChecksum(*late), late_sum);
  const auto behind = Status(late->address());
  EXPECT_NE(behind.state(), rl::v1::WORKER_STATE_LIVE) << behind.DebugString();
  // The real peer is back: it finishes the job.
  {
    rl::v1::SetWorkerEnabledRequest req;
    req.set_address(workers_[0]->address());
    req.set_enabled(true);
    rl::v1::WorkerListResponse resp;
    grpc::ClientContext ctx;
    ASSERT_TRUE(stub_->SetWorkerEnabled(&ctx, req, &resp).ok());
  }
  ASSERT_TRUE(WaitLive(late->address())) << Status(late->address()).DebugString();
  EXPECT_EQ(late->weight_version(), kVersion);
  EXPECT_EQ(RankChecksum(*late), fleet_sum);
  late->Shutdown();
}

// With no live worker at the fleet's in-memory version the lagging worker is STALE, with the
// resync advice; once a peer serves it again, it is caught up.
TEST_F(PeerCatchUpTest, StaleWithoutAPeerThenCaughtUpWhenOneIsBack) {
  StartFleet(1);
  TensorUpdate();
  {
    rl::v1::SetWorkerEnabledRequest req;
    req.set_address(workers_[0]->address());
    req.set_enabled(false);
    rl::v1::WorkerListResponse resp;
    grpc::ClientContext ctx;
    ASSERT_TRUE(stub_->SetWorkerEnabled(&ctx, req, &resp).ok());
  }
  auto late = StartWorker();
  ASSERT_NE(late, nullptr);
  AddWorker(late->address());
  const auto stale = Status(late->address());
  EXPECT_EQ(stale.state(), rl::v1::WORKER_STATE_STALE) << stale.DebugString();
  EXPECT_NE(stale.reason().find("no live worker serves it"), std::string::npos) << stale.reason();
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_EQ(late->weight_version(), 0);
  {
    rl::v1::SetWorkerEnabledRequest req;
    req.set_address(workers_[0]->address());
    req.set_enabled(true);
    rl::v1::WorkerListResponse resp;
    grpc::ClientContext ctx;
    ASSERT_TRUE(stub_->SetWorkerEnabled(&ctx, req, &resp).ok());
  }
  ASSERT_TRUE(WaitLive(late->address())) << Status(late->address()).DebugString();
  EXPECT_EQ(RankChecksum(*late), RankChecksum(*workers_[0]));
  late->Shutdown();
}

}  // namespace
}  // namespace rl::router
