// Issue 34 through rl-router over two in-process rl-workers (stories260K):
// - PauseGeneration(drain) is broadcast like every pause: the running requests finish, the
//   answer says drained (per worker and summed), requests sent meanwhile wait (the router's hold,
//   then the paused workers' held queue) and finish only after ContinueGeneration; the
//   per-worker deadline covers drain_timeout_ms (the router's control deadline is shorter here);
// - --max-version-lag is the fleet's staleness bound: a request crossed by an update ends
//   FINISH_REASON_STALE with its partial output after one attempt (never retried).
// Waits are bounded (hang guards); no timed assertion.
#include <memory>
#include <thread>

#include "absl/synchronization/mutex.h"
#include "tests/testing/generate_stream.h"
#include "tests/testing/router_fleet.h"
#include "tests/worker/worker_test_util.h"

namespace rl::router::testing {
namespace {

using Stream = ::rl::testing::GenerateStream<rl::v1::Router::Stub>;

using Stub = rl::v1::Admin::Stub;

constexpr int kLong = 400;

class AsyncRlRouterTest : public RouterFleetTest {
 protected:
  static rl::v1::GenerateRequest Long(const std::string& text, int max_new = kLong) {
    rl::v1::GenerateRequest req = TextRequest(text, max_new, /*trajectory=*/false);
    req.mutable_sampling_params()->set_ignore_eos(true);
    return req;
  }
  grpc::Status Admin(rl::v1::PauseMode mode, rl::v1::AdminResponse* resp) {
    rl::v1::PauseGenerationRequest req;
    req.set_mode(mode);
    req.set_drain_timeout_ms(60000);
    grpc::ClientContext ctx;
    return admin_->PauseGeneration(&ctx, req, resp);
  }
  int Running() {
    grpc::ClientContext ctx;
    rl::v1::GetServerInfoResponse info;
    EXPECT_TRUE(admin_->GetServerInfo(&ctx, rl::v1::GetServerInfoRequest(), &info).ok());
    int n = 0;
    for (const auto& w : info.workers()) n += w.info().num_running();
    return n;
  }
  grpc::Status Continue() {
    grpc::ClientContext ctx;
    rl::v1::AdminResponse resp;
    return admin_->ContinueGeneration(&ctx, rl::v1::ContinueGenerationRequest(), &resp);
  }
};

TEST_F(AsyncRlRouterTest, DrainThroughTheRouterFinishesRunningAndHoldsArrivals) {
  RouterConfig config;
  config.admin_call_timeout_ms = 1000;  // shorter than a drain may take: the drain extends it
  ASSERT_NO_FATAL_FAILURE(StartFleet(2, config));
  Stream a(stub_.get(), Long("Once upon a time")), b(stub_.get(), Long("The little dog"));
  ASSERT_TRUE(a.WaitTokens(1));
  ASSERT_TRUE(b.WaitTokens(1));
  rl::v1::AdminResponse drained;
  std::thread drain([&] {
    grpc::Status s = Admin(rl::v1::PAUSE_MODE_DRAIN, &drained);
    EXPECT_TRUE(s.ok()) << s.error_message();
  });
  // Arrivals once every worker is in the drain (while it runs, or just after it: the workers
  // stay paused either way).
  ASSERT_TRUE(WaitFor([&] {
    grpc::ClientContext ctx;
    rl::v1::GetServerInfoResponse info;
    if (!admin_->GetServerInfo(&ctx, rl::v1::GetServerInfoRequest(), &info).ok()) return false;
    int draining = 0;
    for (const auto& w : info.workers()) {
      draining += w.info().paused() && w.info().pause_mode() == rl::v1::PAUSE_MODE_DRAIN;
    }
    return draining == 2;
  }));
  Stream c(stub_.get(), Long("A cat", 8)), d(stub_.get(), Long("A bird", 8));
  drain.join();
  EXPECT_TRUE(drained.success()) << drained.message();
  EXPECT_TRUE(drained.drained()) << drained.DebugString();
  EXPECT_EQ(drained.num_still_active(), 0);
  ASSERT_EQ(drained.results_size(), 2);
  ASSERT_TRUE(a.Wait().ok());
  ASSERT_TRUE(b.Wait().ok());
  EXPECT_EQ(a.final_msg().completion_tokens(), kLong);
  EXPECT_EQ(b.final_msg().finish_reason(), rl::v1::FINISH_REASON_LENGTH);
  // Paused (drain): the arrivals cannot finish before the continue.
  EXPECT_FALSE(c.done());
  EXPECT_FALSE(d.done());
  ASSERT_TRUE(Continue().ok());
  ASSERT_TRUE(c.Wait().ok());
  ASSERT_TRUE(d.Wait().ok());
  EXPECT_EQ(c.final_msg().completion_tokens(), 8);
  EXPECT_EQ(d.final_msg().finish_reason(), rl::v1::FINISH_REASON_LENGTH);
}

TEST_F(AsyncRlRouterTest, FleetStalenessBoundEndsACrossedRequestWithoutRetry) {
  RouterConfig config;
  config.max_version_lag = 0;
  ASSERT_NO_FATAL_FAILURE(StartFleet(1, config));
  rl::testing::TempDir dir;
  worker::testing::WritePerturbedStories(dir.path(), "mlp.down_proj", 1.7f);
  // Caught running by an in-place pause (a request can finish before the pause lands: then it
  // is started again, a precondition, not a timing assertion), then retracted.
  std::unique_ptr<Stream> caught;
  rl::v1::AdminResponse resp;
  for (int attempt = 0; attempt < 20 && caught == nullptr; ++attempt) {
    auto a = std::make_unique<Stream>(stub_.get(), Long("Once upon a time"));
    a->WaitTokens(1);
    ASSERT_TRUE(Admin(rl::v1::PAUSE_MODE_IN_PLACE, &resp).ok());
    if (!a->done() && Running() == 1) {
      caught = std::move(a);
    } else {
      ASSERT_TRUE(Continue().ok());
      a->Wait();
    }
  }
  ASSERT_NE(caught, nullptr) << "never caught running";
  Stream& a = *caught;
  ASSERT_TRUE(Admin(rl::v1::PAUSE_MODE_RETRACT, &resp).ok());
  rl::v1::UpdateWeightsFromDiskRequest update;
  update.set_model_path(dir.path());
  {
    grpc::ClientContext ctx;
    grpc::Status s = admin_->UpdateWeightsFromDisk(&ctx, update, &resp);
    ASSERT_TRUE(s.ok()) << s.error_message();
  }
  ASSERT_TRUE(a.Wait().ok());
  const rl::v1::GenerateFinal f = a.final_msg();
  EXPECT_EQ(f.finish_reason(), rl::v1::FINISH_REASON_STALE) << f.abort_message();
  EXPECT_EQ(f.attempts(), 1);
  EXPECT_GE(f.completion_tokens(), 1);
  EXPECT_LT(f.completion_tokens(), kLong);
  EXPECT_NE(f.abort_message().find("max_version_lag 0"), std::string::npos) << f.abort_message();
}

}  // namespace
}  // namespace rl::router::testing
