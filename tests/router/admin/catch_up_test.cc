// Catch-up of workers that join behind the fleet (services/router/admin/catch_up.h) through a
// router over in-process rl-workers (stories260K): a worker joining behind a disk update is
// caught up from the fleet's folder before it is routed; after a tensor update (not replayable)
// with no peer at its version it is STALE, never routed, until resynced; a worker whose weights
// may be partial (failed group init) stays out of routing until a resync; a worker joining
// behind a delta publication replays the fleet's disk chain from a folder it can load, or is
// sent the version by a live peer when no folder of the chain applies. Processes killed /
// stopped for real: tests/reliability.
#include <filesystem>
#include <optional>
#include <set>
#include <string>

#include "common/weight_sync/delta_file.h"
#include "common/weight_sync/manifest.h"
#include "grpcpp/create_channel.h"
#include "rl/v1/router.grpc.pb.h"
#include "services/router/router_server.h"
#include "tests/testing/publications.h"
#include "tests/testing/router_fleet.h"
#include "tests/testing/tensor_stream.h"
#include "tests/testing/test_data.h"

namespace rl::router {
namespace {

using rl::testing::Stories;

class CatchUpTest : public testing::RouterFleetTest {
 protected:
  // Two trainer steps of stories260K published as deltas: d1 (version 1, of version 0) and d2
  // (version 2, of version 1), and the fleet updated with both through the router.
  void PublishTwoDeltas() {
    ASSERT_TRUE(::rl::testing::WriteTrainerStep(Stories(), v1_.path(), 0.02, 1).ok());
    ASSERT_TRUE(::rl::testing::WriteTrainerStep(v1_.path(), v2_.path(), 0.02, 2).ok());
    ASSERT_TRUE(weight_sync::WriteDeltaPublication(Stories(), v1_.path(), d1_.path(), 1, 0).ok());
    ASSERT_TRUE(::rl::testing::WriteManifestOf(v1_.path(), 1).ok());
    ASSERT_TRUE(
        weight_sync::WriteDeltaPublication(v1_.path(), v2_.path(), d2_.path(), 2, std::nullopt)
            .ok());
    for (const std::string& dir : {d1_.path(), d2_.path()}) {
      rl::v1::UpdateWeightsFromDiskRequest update;
      update.set_model_path(dir);
      rl::v1::AdminResponse resp;
      grpc::ClientContext ctx;
      ASSERT_TRUE(admin_->UpdateWeightsFromDisk(&ctx, update, &resp).ok());
      ASSERT_TRUE(resp.success()) << resp.message();
    }
    ASSERT_EQ(ListWorkers().fleet_weight_version(), 2);
  }
  void SetEnabled(const std::string& address, bool enabled) {
    rl::v1::SetWorkerEnabledRequest req;
    req.set_address(address);
    req.set_enabled(enabled);
    rl::v1::WorkerListResponse listing;
    grpc::ClientContext ctx;
    ASSERT_TRUE(stub_->SetWorkerEnabled(&ctx, req, &listing).ok());
  }
  // The worker's own checksum of what it serves.
  static std::string Checksum(const std::string& address) {
    auto admin =
        rl::v1::Admin::NewStub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
    rl::v1::WeightsCheckerRequest req;
    req.set_action(rl::v1::WEIGHTS_CHECKER_ACTION_CHECKSUM);
    rl::v1::WeightsCheckerResponse resp;
    grpc::ClientContext ctx;
    EXPECT_TRUE(admin->WeightsChecker(&ctx, req, &resp).ok());
    return resp.rank_sha256();
  }
  // A worker started at version 0, added to the fleet, must reach version 2 with d2's digest.
  void ExpectLateWorkerCaughtUp() {
    auto late = StartWorker();
    ASSERT_NE(late, nullptr);
    ASSERT_EQ(late->weight_version(), 0);
    AddWorker(late->address());
    ASSERT_TRUE(WaitFor([&] {
      const auto w = Status(late->address());
      return w.state() == rl::v1::WORKER_STATE_LIVE && w.weight_version() == 2 &&
             w.reason().empty();
    })) << Status(late->address()).DebugString();
    auto manifest = weight_sync::ReadManifest(d2_.path());
    ASSERT_TRUE(manifest.ok() && manifest->has_value());
    EXPECT_EQ(Checksum(late->address()), (*manifest)->sha256);
    rl::v1::GenerateFinal f;
    ASSERT_TRUE(Generate(TextRequest("Once", 2), &f).ok());
    EXPECT_EQ(f.weight_version(), 2);
    late->Shutdown();
  }

  ::rl::testing::TempDir v1_, v2_, d1_, d2_;
};

// A worker that joins behind the fleet's version is caught up from the fleet's disk source
// before it is routed.
TEST_F(CatchUpTest, JoiningWorkerIsCaughtUpFromTheFleetsDiskSource) {
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

// After an update from a tensor stream (not replayable from disk) a worker joining behind it,
// with no live peer at that version to send it (the only one is disabled), is STALE, never
// routed, until the documented resync (UpdateWeightsFromDisk with `workers`). With a peer it is
// caught up from the peer: peer_catch_up_test.cc.
TEST_F(CatchUpTest, StaleAfterATensorUpdateUntilResynced) {
  StartFleet(1);
  rl::v1::AdminResponse resp;
  {
    grpc::ClientContext ctx;
    const std::vector<float> ones(64, 1.0f);
    const grpc::Status s = ::rl::testing::SendTensorStream(
        *admin_, &ctx,
        {::rl::testing::Chunk("model.norm.weight", {64}, "F32",
                              std::string(reinterpret_cast<const char*>(ones.data()), 64 * 4))},
        &resp);
    ASSERT_TRUE(s.ok()) << s.error_message();
  }
  ASSERT_TRUE(resp.success()) << resp.message();
  EXPECT_EQ(ListWorkers().fleet_weight_source(), "tensor");
  auto set_enabled = [&](bool enabled) {
    rl::v1::SetWorkerEnabledRequest req;
    req.set_address(workers_[0]->address());
    req.set_enabled(enabled);
    rl::v1::WorkerListResponse listing;
    grpc::ClientContext ctx;
    ASSERT_TRUE(stub_->SetWorkerEnabled(&ctx, req, &listing).ok());
  };
  set_enabled(false);  // no peer holds the fleet's version now
  auto late = StartWorker();
  ASSERT_NE(late, nullptr);
  AddWorker(late->address());
  const auto stale = Status(late->address());
  EXPECT_EQ(stale.state(), rl::v1::WORKER_STATE_STALE);
  EXPECT_NE(stale.reason().find("resync"), std::string::npos) << stale.reason();
  {
    rl::v1::GenerateFinal f;  // nothing routable: the stale worker is never picked
    EXPECT_EQ(Generate(TextRequest("Once", 2), &f).error_code(), grpc::StatusCode::UNAVAILABLE);
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
  set_enabled(true);
  // An unknown address is refused.
  resync.set_workers(0, "127.0.0.1:1");
  grpc::ClientContext ctx;
  EXPECT_EQ(admin_->UpdateWeightsFromDisk(&ctx, resync, &resp).error_code(),
            grpc::StatusCode::NOT_FOUND);
  late->Shutdown();
}

// A failed group init may leave a worker's weights partial: it stays out of routing with the
// reason until a resync loads known weights and puts it back.
TEST_F(CatchUpTest, PartialWeightsStayOutUntilResynced) {
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

// The fleet's folder is a delta of version 1; a worker joining at version 0 cannot load it
// (FAILED_PRECONDITION, nothing applied), so catch-up replays the chain the router recorded:
// d1 (a delta of the version it holds), then d2. The only other worker is disabled: no peer
// could send the version.
TEST_F(CatchUpTest, AWorkerBehindADeltaReplaysTheFleetsDiskChain) {
  StartFleet(1);
  PublishTwoDeltas();
  SetEnabled(workers_[0]->address(), false);
  ExpectLateWorkerCaughtUp();
}

// d1 is gone from disk: no folder of the chain applies to version 0, and a live peer at the
// fleet's version sends it instead.
TEST_F(CatchUpTest, AChainThatNoLongerAppliesFallsBackToALivePeer) {
  StartFleet(1);
  PublishTwoDeltas();
  std::filesystem::remove_all(d1_.path());
  ExpectLateWorkerCaughtUp();
}

// AdoptWorkerVersion takes the admin lock: while a tensor stream through the router holds it
// (the update's broadcast and its record of the fleet's version), an adopt waits for it and
// then gives up, UNAVAILABLE, changing nothing; once the stream is gone it goes through.
TEST_F(CatchUpTest, AdoptWaitsForTheAdminLock) {
  RouterConfig config;
  config.admin_lock_timeout_ms = 300;
  StartFleet(1, config);
  rl::v1::AdoptWorkerVersionRequest adopt;
  adopt.set_address(workers_[0]->address());
  {
    grpc::ClientContext stream_ctx;
    rl::v1::AdminResponse resp;
    auto writer = admin_->UpdateWeightsFromTensor(&stream_ctx, &resp);
    rl::v1::UpdateWeightsFromTensorRequest first;
    const std::vector<float> ones(64, 1.0f);
    *first.mutable_chunk() =
        ::rl::testing::Chunk("model.norm.weight", {64}, "F32",
                             std::string(reinterpret_cast<const char*>(ones.data()), 64 * 4));
    ASSERT_TRUE(writer->Write(first));
    // The relay's broadcast has the lock once it holds the worker out of routing.
    ASSERT_TRUE(WaitFor([&] {
      return Status(workers_[0]->address()).reason().find("held out of routing") !=
             std::string::npos;
    })) << Status(workers_[0]->address()).DebugString();
    rl::v1::WorkerListResponse listing;
    grpc::ClientContext ctx;
    const grpc::Status s = stub_->AdoptWorkerVersion(&ctx, adopt, &listing);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE) << s.error_message();
    EXPECT_NE(s.error_message().find("admin lock"), std::string::npos) << s.error_message();
    EXPECT_EQ(ListWorkers().fleet_weight_version(), -1);  // nothing adopted
    stream_ctx.TryCancel();
    writer->Finish().IgnoreError();
  }
  ASSERT_TRUE(WaitFor([&] {
    rl::v1::WorkerListResponse listing;
    grpc::ClientContext ctx;
    return stub_->AdoptWorkerVersion(&ctx, adopt, &listing).ok();
  }));
  EXPECT_EQ(ListWorkers().fleet_weight_version(), 0);
}

}  // namespace
}  // namespace rl::router
