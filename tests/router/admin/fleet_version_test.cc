// One weight version serving at a time (services/router/pool, services/router/admin) through a
// router over in-process rl-workers (stories260K): a resync only brings workers to the fleet's
// version and is refused with the reason otherwise (another checkpoint with no update recorded,
// another version, another folder than the fleet's replayable one); a resync of every live worker
// is a fleet-wide update; a worker whose version differs from the fleet's (updated behind the
// router's back) is never routed, from the first request on, is listed VERSION_MISMATCH with the
// reason and logged once. Each case checks four greedy generations: one version, one output.
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "rl/v1/router.grpc.pb.h"
#include "spdlog/sinks/ostream_sink.h"
#include "spdlog/spdlog.h"
#include "tests/testing/router_fleet.h"
#include "tests/worker/worker_test_util.h"

namespace rl::router {
namespace {

using rl::testing::Stories;
using rl::testing::TempDir;
using ::testing::HasSubstr;

class FleetVersionTest : public testing::RouterFleetTest {
 protected:
  // Another checkpoint of the same architecture: stories260K with its MLP scaled.
  void SetUp() override {
    other_ = std::make_unique<TempDir>();
    worker::testing::WritePerturbedStories(other_->path(), "mlp.down_proj", 1.7f);
  }

  grpc::Status Resync(const std::vector<std::string>& workers, const std::string& path,
                      rl::v1::AdminResponse* resp, int64_t version = -1) {
    rl::v1::UpdateWeightsFromDiskRequest req;
    req.set_model_path(path);
    if (version >= 0) req.set_weight_version(version);
    for (const auto& w : workers) req.add_workers(w);
    grpc::ClientContext ctx;
    return admin_->UpdateWeightsFromDisk(&ctx, req, resp);
  }

  // Four greedy generations through the router: (version, output, worker) of each.
  struct Served {
    int64_t version;
    std::vector<int32_t> ids;
    std::string worker;
  };
  std::vector<Served> FourGreedy() {
    std::vector<Served> out;
    for (int i = 0; i < 4; ++i) {
      rl::v1::GenerateFinal f;
      const grpc::Status s = Generate(TextRequest("Once upon a time", 8, false), &f);
      EXPECT_TRUE(s.ok()) << s.error_message();
      out.push_back(
          {f.weight_version(), {f.output_ids().begin(), f.output_ids().end()}, f.worker()});
    }
    return out;
  }

  static void ExpectOneVersion(const std::vector<Served>& served, int64_t version) {
    for (const Served& s : served) {
      EXPECT_EQ(s.version, version) << s.worker;
      EXPECT_EQ(s.ids, served[0].ids) << s.worker;
    }
  }

  std::unique_ptr<TempDir> other_;
};

// The case: no update recorded, one worker resynced from another checkpoint. Refused,
// with the reason; the same folder the fleet was started with is accepted; the fleet serves one
// version throughout.
TEST_F(FleetVersionTest, WithNoUpdateRecordedAResyncToAnotherCheckpointIsRefused) {
  StartFleet(2);
  const std::string w0 = workers_[0]->address();
  rl::v1::AdminResponse resp;
  grpc::Status s = Resync({w0}, other_->path(), &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(s.error_message(), HasSubstr("no fleet update is recorded"));
  EXPECT_THAT(s.error_message(), HasSubstr(Stories()));
  EXPECT_THAT(s.error_message(), HasSubstr("update every worker instead"));
  EXPECT_EQ(workers_[0]->weight_version(), 0);
  s = Resync({w0}, Stories(), &resp, /*version=*/3);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(s.error_message(), HasSubstr("fleet's version (0)"));
  // The folder the fleet serves, at its version: accepted.
  s = Resync({w0}, Stories(), &resp);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_TRUE(resp.success()) << resp.message();
  EXPECT_EQ(resp.weight_version(), 0);
  ASSERT_TRUE(WaitFor([&] { return Status(w0).state() == rl::v1::WORKER_STATE_LIVE; }));
  const std::vector<Served> served = FourGreedy();
  ExpectOneVersion(served, 0);
  std::set<std::string> workers;
  for (const Served& x : served) workers.insert(x.worker);
  EXPECT_EQ(workers.size(), 2u);  // both serve: same version, same weights
}

// A resync naming every live worker moves the whole fleet: recorded like an update, at a new
// version since the folder differs from what the fleet served.
TEST_F(FleetVersionTest, AResyncOfEveryLiveWorkerIsAFleetUpdate) {
  StartFleet(2);
  rl::v1::AdminResponse resp;
  const grpc::Status s =
      Resync({workers_[0]->address(), workers_[1]->address()}, other_->path(), &resp);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_TRUE(resp.success()) << resp.message();
  EXPECT_EQ(resp.weight_version(), 1);
  const rl::v1::WorkerListResponse list = ListWorkers();
  EXPECT_EQ(list.fleet_weight_version(), 1);
  EXPECT_EQ(list.fleet_weight_source(), "disk:" + other_->path());
  ASSERT_TRUE(WaitFor([&] {
    const rl::v1::WorkerListResponse now = ListWorkers();
    for (const auto& w : now.workers()) {
      if (w.state() != rl::v1::WORKER_STATE_LIVE) return false;
    }
    return true;
  }));
  ExpectOneVersion(FourGreedy(), 1);
}

// With a fleet version recorded from a folder, a resync to another version or from another
// folder is refused; the fleet's folder at its version is accepted.
TEST_F(FleetVersionTest, WithAFleetVersionAResyncOnlyBringsAWorkerToIt) {
  StartFleet(2);
  rl::v1::UpdateWeightsFromDiskRequest update;
  update.set_model_path(Stories());
  update.set_weight_version(3);
  rl::v1::AdminResponse resp;
  {
    grpc::ClientContext ctx;
    ASSERT_TRUE(admin_->UpdateWeightsFromDisk(&ctx, update, &resp).ok());
    ASSERT_TRUE(resp.success()) << resp.message();
  }
  const std::string w0 = workers_[0]->address();
  grpc::Status s = Resync({w0}, Stories(), &resp, /*version=*/5);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(s.error_message(), HasSubstr("fleet's version (3)"));
  s = Resync({w0}, other_->path(), &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(s.error_message(), HasSubstr("came from " + Stories()));
  EXPECT_EQ(workers_[0]->weight_version(), 3);
  s = Resync({w0}, Stories(), &resp);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_TRUE(resp.success()) << resp.message();
  EXPECT_EQ(resp.weight_version(), 3);
  ASSERT_TRUE(WaitFor([&] { return Status(w0).state() == rl::v1::WORKER_STATE_LIVE; }));
  ExpectOneVersion(FourGreedy(), 3);
}

// A worker updated behind the router's back (its own Admin service) serves another version: the
// router never routes to it, from the first request on (the worker refuses a request carrying
// the fleet's version, and the router retries elsewhere), lists it VERSION_MISMATCH with the
// reason and logs it once.
TEST_F(FleetVersionTest, AWorkerAtAnotherVersionIsNeverRouted) {
  std::ostringstream log;
  auto sink = std::make_shared<spdlog::sinks::ostream_sink_mt>(log);
  spdlog::default_logger()->sinks().push_back(sink);
  StartFleet(2);
  {
    rl::v1::UpdateWeightsFromDiskRequest update;
    update.set_model_path(Stories());
    update.set_weight_version(3);
    rl::v1::AdminResponse resp;
    grpc::ClientContext ctx;
    ASSERT_TRUE(admin_->UpdateWeightsFromDisk(&ctx, update, &resp).ok());
    ASSERT_TRUE(resp.success()) << resp.message();
  }
  const std::string w1 = workers_[1]->address();
  {
    auto direct =
        rl::v1::Admin::NewStub(grpc::CreateChannel(w1, grpc::InsecureChannelCredentials()));
    rl::v1::UpdateWeightsFromDiskRequest update;
    update.set_model_path(other_->path());
    update.set_weight_version(4);
    rl::v1::AdminResponse resp;
    grpc::ClientContext ctx;
    ASSERT_TRUE(direct->UpdateWeightsFromDisk(&ctx, update, &resp).ok());
    ASSERT_EQ(workers_[1]->weight_version(), 4);
  }
  // At once, before any health check could notice.
  const std::vector<Served> served = FourGreedy();
  ExpectOneVersion(served, 3);
  for (const Served& x : served) EXPECT_EQ(x.worker, workers_[0]->address());
  ASSERT_TRUE(WaitFor([&] { return Status(w1).state() == rl::v1::WORKER_STATE_VERSION_MISMATCH; }))
      << Status(w1).DebugString();
  const rl::v1::WorkerStatus st = Status(w1);
  EXPECT_TRUE(st.version_mismatch());
  EXPECT_THAT(st.reason(), HasSubstr("weight_version 4 is ahead of the fleet's 3"));
  EXPECT_THAT(st.reason(), HasSubstr("rlctl workers resync " + w1));
  EXPECT_THAT(st.reason(), HasSubstr("rlctl workers adopt " + w1));
  // Logged once, however many health checks see it.
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  ExpectOneVersion(FourGreedy(), 3);
  const std::string text = log.str();
  const std::string line = "worker " + w1 + " is not routed";
  size_t count = 0;
  for (size_t at = text.find(line); at != std::string::npos; at = text.find(line, at + 1)) ++count;
  EXPECT_EQ(count, 1u) << text;
  auto& sinks = spdlog::default_logger()->sinks();
  sinks.erase(std::remove(sinks.begin(), sinks.end(), sink), sinks.end());
}

// With no update recorded, the fleet's version is the newest among live workers: a worker left
// behind it is not routed, so the fleet still serves one version.
TEST_F(FleetVersionTest, WithNoUpdateRecordedTheNewestLiveVersionIsServedAlone) {
  StartFleet(2);
  {
    auto direct = rl::v1::Admin::NewStub(
        grpc::CreateChannel(workers_[1]->address(), grpc::InsecureChannelCredentials()));
    rl::v1::UpdateWeightsFromDiskRequest update;
    update.set_model_path(Stories());
    update.set_weight_version(2);
    rl::v1::AdminResponse resp;
    grpc::ClientContext ctx;
    ASSERT_TRUE(direct->UpdateWeightsFromDisk(&ctx, update, &resp).ok());
  }
  ASSERT_TRUE(WaitFor([&] {
    return Status(workers_[0]->address()).state() == rl::v1::WORKER_STATE_VERSION_MISMATCH;
  }));
  EXPECT_THAT(Status(workers_[0]->address()).reason(), HasSubstr("newest version among live"));
  const std::vector<Served> served = FourGreedy();
  ExpectOneVersion(served, 2);
  for (const Served& x : served) EXPECT_EQ(x.worker, workers_[1]->address());
}

}  // namespace
}  // namespace rl::router
