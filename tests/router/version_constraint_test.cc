// Version-constrained requests through a router over in-process rl-workers (stories260K), issue
// 30: a request that accepts only versions no worker serves waits for one within its deadline,
// then gets a retryable UNAVAILABLE naming the requested and available versions; a fleet update
// that reaches the version in time serves it at that version (start and end); exact versions
// are honoured after the update; a bad constraint is INVALID_ARGUMENT before any worker call.
#include <chrono>
#include <future>
#include <string>

#include "gmock/gmock.h"
#include "rl/v1/router.grpc.pb.h"
#include "tests/testing/router_fleet.h"

namespace rl::router {
namespace {

using ::testing::HasSubstr;

class VersionConstraintTest : public testing::RouterFleetTest {
 protected:
  // A generation with the given client deadline.
  grpc::Status GenerateWithin(const rl::v1::GenerateRequest& req, std::chrono::milliseconds within,
                              rl::v1::GenerateFinal* f) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + within);
    auto reader = stub_->Generate(&ctx, req);
    rl::v1::GenerateResponse msg;
    while (reader->Read(&msg)) {
      if (msg.has_final()) *f = msg.final();
    }
    return reader->Finish();
  }

  grpc::Status UpdateFleet(int64_t version) {
    rl::v1::UpdateWeightsFromDiskRequest req;
    req.set_model_path(rl::testing::Stories());
    req.set_weight_version(version);
    grpc::ClientContext ctx;
    rl::v1::AdminResponse resp;
    return admin_->UpdateWeightsFromDisk(&ctx, req, &resp);
  }
};

TEST_F(VersionConstraintTest, NoWorkerAtTheVersionIsUnavailableNamingBoth) {
  StartFleet(2);
  rl::v1::GenerateRequest req = TextRequest("Once upon a time", 4, false);
  req.set_min_weight_version(3);
  rl::v1::GenerateFinal f;
  const grpc::Status s = GenerateWithin(req, std::chrono::seconds(3), &f);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE) << s.error_message();
  EXPECT_THAT(s.error_message(), HasSubstr("weight version >= 3"));
  EXPECT_THAT(s.error_message(), HasSubstr("version(s) 0"));
  // The same request accepting version 0 is served, and the final states start and end.
  req.set_min_weight_version(0);
  ASSERT_TRUE(Generate(req, &f).ok());
  EXPECT_EQ(f.weight_version(), 0);
  EXPECT_EQ(f.dispatch_weight_version(), 0);
  req.clear_min_weight_version();
  req.set_exact_weight_version(-2);
  const grpc::Status bad = Generate(req, &f);
  EXPECT_EQ(bad.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << bad.error_message();
  EXPECT_THAT(bad.error_message(), HasSubstr("exact_weight_version"));
}

TEST_F(VersionConstraintTest, ARequestWaitingForAVersionIsServedOnceTheFleetReachesIt) {
  StartFleet(2);
  rl::v1::GenerateRequest req = TextRequest("Once upon a time", 4, false);
  req.set_min_weight_version(1);
  rl::v1::GenerateFinal f;
  std::future<grpc::Status> waiting = std::async(
      std::launch::async, [&] { return GenerateWithin(req, std::chrono::seconds(60), &f); });
  // It is waiting (no worker at version 1) when the update lands, whenever that is.
  ASSERT_TRUE(UpdateFleet(1).ok());
  const grpc::Status s = waiting.get();
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(f.weight_version(), 1);
  EXPECT_EQ(f.dispatch_weight_version(), 1);
  for (const auto& seg : f.weight_version_segments()) EXPECT_EQ(seg.weight_version(), 1);
  // Exact versions after the update: the current one is served, the old one is not.
  rl::v1::GenerateRequest exact = TextRequest("Once upon a time", 4, false);
  exact.set_exact_weight_version(1);
  ASSERT_TRUE(Generate(exact, &f).ok());
  EXPECT_EQ(f.weight_version(), 1);
  exact.set_exact_weight_version(0);
  const grpc::Status old = GenerateWithin(exact, std::chrono::seconds(3), &f);
  EXPECT_EQ(old.error_code(), grpc::StatusCode::UNAVAILABLE) << old.error_message();
  EXPECT_THAT(old.error_message(), HasSubstr("weight version == 0"));
  EXPECT_THAT(old.error_message(), HasSubstr("version(s) 1"));
}

}  // namespace
}  // namespace rl::router
