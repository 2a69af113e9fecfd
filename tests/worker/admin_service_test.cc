// rl.v1.Admin on the worker. The executor's behaviour over fake control and weight units: a
// full admin executor answers RESOURCE_EXHAUSTED at once and runs nothing more; a server shut
// down with calls running and queued answers every one of them (none hangs, none is lost).
// Then, on an in-process rl-worker: sleep / wake through the Admin calls, and the admin and
// data-plane keys.
#include "services/worker/admin_service.h"

#include <atomic>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/server_runner.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "services/worker/engine/engine.h"
#include "services/worker/weights/weights_checker.h"
#include "tests/testing/fake_runner.h"
#include "tests/testing/tensor_stream.h"
#include "tests/worker/worker_test_util.h"

namespace rl::worker::testing {
namespace {

using ::testing::HasSubstr;
using Stub = rl::v1::Admin::Stub;

// Only a hang guard, never a speed assertion.
constexpr absl::Duration kHangGuard = absl::Seconds(60);

// Waits (polling, bounded by the hang guard) until `done` holds.
template <typename Fn>
bool WaitUntil(Fn done) {
  const absl::Time end = absl::Now() + kHangGuard;
  while (!done()) {
    if (absl::Now() > end) return false;
    absl::SleepFor(absl::Milliseconds(2));
  }
  return true;
}

// A control plane whose Pause blocks until the test opens its gate: it holds admin executor
// threads the way a stuck engine would.
class GatedControl final : public WorkerControl {
 public:
  GatedControl() { identity_.backend = "cpu"; }

  void Open() {
    absl::MutexLock lock(&mu_);
    open_ = true;
  }
  int entered() {
    absl::MutexLock lock(&mu_);
    return entered_;
  }

  absl::StatusOr<AdminOutcome> Pause(engine::PauseMode) override {
    absl::MutexLock lock(&mu_);
    ++entered_;
    auto open = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return open_; };
    if (!mu_.AwaitWithTimeout(absl::Condition(&open), kHangGuard)) {
      return absl::DeadlineExceededError("fake control: the gate never opened");
    }
    AdminOutcome out;
    out.message = "paused (fake)";
    return out;
  }
  absl::StatusOr<AdminOutcome> Continue() override { return AdminOutcome{}; }
  absl::StatusOr<AdminOutcome> FlushCache() override { return AdminOutcome{}; }
  absl::StatusOr<AdminOutcome> ReleaseMemory() override { return AdminOutcome{}; }
  absl::StatusOr<AdminOutcome> ResumeMemory() override { return AdminOutcome{}; }
  absl::StatusOr<CheckerResult> CheckWeights(CheckerAction) override { return CheckerResult{}; }
  bool asleep() const override { return false; }
  ServingState serving_state() const override { return ServingState::kServing; }
  absl::Status CheckAdmission() const override { return absl::OkStatus(); }
  WorkerInfo worker_info() const override {
    WorkerInfo info;
    info.backend = "fake";
    return info;
  }
  const ModelIdentity& model_identity() const override { return identity_; }

 private:
  ModelIdentity identity_;
  absl::Mutex mu_;
  bool open_ ABSL_GUARDED_BY(mu_) = false;
  int entered_ ABSL_GUARDED_BY(mu_) = 0;
};

// A weight-update unit serving one weight "w" of shape [2] that counts applied tensor updates.
class CountingWeights final : public WeightUpdates {
 public:
  int applied() const { return applied_.load(); }

  bool updating() const override { return false; }
  WeightUpdateStatus status() const override { return {}; }
  const WeightShapes& served_shapes() const override { return shapes_; }
  absl::StatusOr<AdminOutcome> UpdateWeightsFromTensors(std::vector<NamedTensor> tensors,
                                                        const UpdatePolicy&) override {
    applied_ += static_cast<int>(tensors.size());
    return AdminOutcome{};
  }
  absl::StatusOr<AdminOutcome> UpdateWeightsFromDisk(const std::string&,
                                                     const UpdatePolicy&) override {
    return absl::UnimplementedError("fake");
  }
  absl::StatusOr<AdminOutcome> UpdateWeightsFromDistributed(const std::string&,
                                                            std::vector<model::TensorInfo>,
                                                            const UpdatePolicy&) override {
    return absl::UnimplementedError("fake");
  }
  absl::StatusOr<AdminOutcome> PrepareWeightsUpdate(const std::string&, WeightBuckets) override {
    return absl::UnimplementedError("fake");
  }
  absl::StatusOr<AdminOutcome> CompleteWeightsUpdate(const std::string&,
                                                     const UpdatePolicy&) override {
    return absl::UnimplementedError("fake");
  }
  absl::StatusOr<AdminOutcome> ReceiveWeights(const std::string&, WeightBuckets,
                                              const UpdatePolicy&) override {
    return absl::UnimplementedError("fake");
  }
  absl::StatusOr<AdminOutcome> InitWeightsUpdateGroup(const GroupRequest&) override {
    return absl::UnimplementedError("fake");
  }
  absl::StatusOr<AdminOutcome> DestroyWeightsUpdateGroup(const std::string&) override {
    return absl::UnimplementedError("fake");
  }
  absl::StatusOr<std::vector<model::TensorInfo>> ListWeights() override {
    return std::vector<model::TensorInfo>{{"w", "F32", {2}}};
  }

 private:
  WeightShapes shapes_ = {{"w", {2}}};
  std::atomic<int> applied_{0};
};

// The data plane's host over an engine on the fake runner (GetServerInfo reads it).
class FakeHost final : public GenerateHost {
 public:
  FakeHost() {
    auto engine = engine::Engine::Create(std::make_unique<engine::testing::FakeRunner>(),
                                         engine::EngineOptions{});
    EXPECT_TRUE(engine.ok()) << engine.status();
    if (engine.ok()) engine_ = *std::move(engine);
  }
  engine::Engine& engine() override { return *engine_; }
  const tokenizer::Tokenizer* tokenizer() const override { return nullptr; }
  absl::Status Submit(engine::GenerateRequest request,
                      engine::RequestCallbacks callbacks) override {
    return engine_->Submit(std::move(request), std::move(callbacks));
  }
  std::string NextRequestId() override { return "srv-fake"; }
  const RequestLimits& limits() const override { return limits_; }
  int64_t context_len() const override { return 2048; }
  int64_t weight_version() const override { return engine_->weight_version(); }
  const BearerAuth& admin_auth() const override { return auth_; }
  void RecordFinished(const engine::GenerateResult&) override {}
  void RunOnStreamThread(absl::AnyInvocable<void() &&> task) override { std::move(task)(); }

 private:
  std::unique_ptr<engine::Engine> engine_;
  RequestLimits limits_;
  BearerAuth auth_{""};
};

// An Admin service alone on 127.0.0.1:0 over the fakes, with an admin executor of `threads`
// threads and `queued` queue slots.
class AdminExecutorTest : public ::testing::Test {
 protected:
  void Start(int threads, size_t queued) {
    executor_ = std::make_unique<BoundedExecutor>("rl-admin-test", threads, queued);
    service_ = std::make_unique<AdminService>(host_, control_, weights_, *executor_, auth_);
    ServerOptions options;
    options.port = 0;
    auto server = GrpcServer::Start(options, {service_.get()});
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    stub_ = rl::v1::Admin::NewStub(
        grpc::CreateChannel(server_->address(), grpc::InsecureChannelCredentials()));
  }

  // The composition root's order: the server drains (every call finishes), then the executor
  // joins, then the service goes.
  void TearDown() override {
    control_.Open();
    if (server_) server_->Shutdown();
    executor_.reset();
    service_.reset();
  }

  std::future<grpc::Status> PauseAsync() {
    return std::async(std::launch::async, [this] {
      grpc::ClientContext ctx;
      rl::v1::PauseGenerationRequest req;
      req.set_mode(rl::v1::PAUSE_MODE_IN_PLACE);
      rl::v1::AdminResponse resp;
      return stub_->PauseGeneration(&ctx, req, &resp);
    });
  }

  // `running` Pause calls held in the gate, then `queued` more waiting in the executor's
  // queue: one call at a time, each seen where it belongs before the next is sent.
  std::vector<std::future<grpc::Status>> Hold(int running, size_t queued) {
    std::vector<std::future<grpc::Status>> calls;
    for (int i = 1; i <= running; ++i) {
      calls.push_back(PauseAsync());
      EXPECT_TRUE(WaitUntil([&] { return control_.entered() == i; })) << "call " << i;
    }
    for (size_t i = 1; i <= queued; ++i) {
      calls.push_back(PauseAsync());
      EXPECT_TRUE(WaitUntil([&] { return executor_->queued() == i; })) << "queued call " << i;
    }
    return calls;
  }

  grpc::Status SendTensor() {
    grpc::ClientContext ctx;
    rl::v1::AdminResponse resp;
    return ::rl::testing::SendTensorStream(
        *stub_, &ctx, {::rl::testing::Chunk("w", {2}, "F32", std::string(8, '\0'))}, &resp);
  }

  FakeHost host_;
  GatedControl control_;
  CountingWeights weights_;
  BearerAuth auth_{""};
  std::unique_ptr<BoundedExecutor> executor_;
  std::unique_ptr<AdminService> service_;
  std::unique_ptr<GrpcServer> server_;
  std::unique_ptr<rl::v1::Admin::Stub> stub_;
};

// Two threads held by a stuck engine and one queued call fill the executor: the next calls are
// refused at once with RESOURCE_EXHAUSTED saying why, run nothing, and make no thread; calls
// that never wait (GetServerInfo) still answer. Once the engine moves, everything queued runs
// and the executor takes calls again.
TEST_F(AdminExecutorTest, AFullExecutorAnswersResourceExhaustedAtOnce) {
  Start(/*threads=*/2, /*queued=*/1);
  std::vector<std::future<grpc::Status>> held = Hold(/*running=*/2, /*queued=*/1);

  grpc::Status refused = PauseAsync().get();
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(refused.error_message(), HasSubstr("PauseGeneration"));
  EXPECT_THAT(refused.error_message(), HasSubstr("admin executor is full"));
  // A tensor stream's apply is refused the same way, and nothing is applied.
  grpc::Status tensor = SendTensor();
  EXPECT_EQ(tensor.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(tensor.error_message(), HasSubstr("UpdateWeightsFromTensor"));
  EXPECT_EQ(weights_.applied(), 0);
  EXPECT_EQ(control_.entered(), 2);  // the refused calls ran nothing
  EXPECT_EQ(executor_->num_threads(), 2);
  {
    grpc::ClientContext ctx;
    rl::v1::GetServerInfoResponse info;
    EXPECT_TRUE(stub_->GetServerInfo(&ctx, {}, &info).ok());
    EXPECT_EQ(info.backend(), "fake");
  }

  control_.Open();
  for (auto& f : held) {
    grpc::Status s = f.get();
    EXPECT_TRUE(s.ok()) << s.error_message();
  }
  EXPECT_EQ(control_.entered(), 3);
  EXPECT_TRUE(PauseAsync().get().ok());
  EXPECT_TRUE(SendTensor().ok());
  EXPECT_EQ(weights_.applied(), 1);
}

// Shutting the server down while calls run and wait in the queue: the drain waits for them,
// every call is answered (none hangs, none is dropped), and the executor and the service go
// only after the last task finished.
TEST_F(AdminExecutorTest, ShutdownWithCallsInFlightAnswersEveryCall) {
  Start(/*threads=*/2, /*queued=*/4);
  std::vector<std::future<grpc::Status>> calls = Hold(/*running=*/2, /*queued=*/3);

  std::thread shutdown([this] { server_->Shutdown(); });
  absl::SleepFor(absl::Milliseconds(50));  // the drain has begun (not needed for correctness)
  control_.Open();
  shutdown.join();
  for (auto& f : calls) {
    grpc::Status s = f.get();
    EXPECT_TRUE(s.ok()) << s.error_message();
  }
  EXPECT_EQ(control_.entered(), 5);
  EXPECT_EQ(executor_->queued(), 0u);
  executor_.reset();  // joins; nothing is left to run
  service_.reset();
  // The server refuses new calls.
  EXPECT_FALSE(PauseAsync().get().ok());
}

class SleepWakeTest : public WorkerFixture {
 protected:
  void SetUp() override { StartWorker(); }

  rl::v1::WeightsCheckerResponse Check(rl::v1::WeightsCheckerAction action) {
    rl::v1::WeightsCheckerRequest req;
    req.set_action(action);
    rl::v1::WeightsCheckerResponse resp;
    EXPECT_TRUE(Call(&Stub::WeightsChecker, req, &resp).ok());
    return resp;
  }

  grpc::Status UpdateFromDisk(const std::string& path, rl::v1::AdminResponse* resp) {
    rl::v1::UpdateWeightsFromDiskRequest req;
    req.set_model_path(path);
    return Call(&Stub::UpdateWeightsFromDisk, req, resp);
  }
};

TEST_F(SleepWakeTest, ReleaseAndResumeMemory) {
  const std::vector<int32_t> before = GreedyIds();
  // Changed-in-memory weights survive a sleep (spilled and restored).
  Check(rl::v1::WEIGHTS_CHECKER_ACTION_RESET_TENSORS);
  const auto sums = Check(rl::v1::WEIGHTS_CHECKER_ACTION_CHECKSUM);
  rl::v1::AdminResponse resp;
  ASSERT_TRUE(Call(&Stub::ReleaseMemory, rl::v1::ReleaseMemoryRequest(), &resp).ok());
  EXPECT_TRUE(ServerInfo().asleep());
  rl::v1::GenerateFinal f;
  EXPECT_EQ(Generate(Greedy(kPromptIds, 4), &f).error_code(),
            grpc::StatusCode::FAILED_PRECONDITION);
  ASSERT_TRUE(Call(&Stub::ResumeMemory, rl::v1::ResumeMemoryRequest(), &resp).ok());
  EXPECT_FALSE(ServerInfo().asleep());
  EXPECT_EQ(Check(rl::v1::WEIGHTS_CHECKER_ACTION_CHECKSUM).rank_sha256(), sums.rank_sha256());
  ASSERT_TRUE(UpdateFromDisk(Stories(), &resp).ok());
  ASSERT_TRUE(Call(&Stub::ReleaseMemory, rl::v1::ReleaseMemoryRequest(), &resp).ok());
  ASSERT_TRUE(Call(&Stub::ResumeMemory, rl::v1::ResumeMemoryRequest(), &resp).ok());
  EXPECT_EQ(GreedyIds(), before);
}

class AuthTest : public WorkerFixture {
 protected:
  void SetUp() override {
    WorkerConfig c;
    c.admin_api_key = "admin-key";
    c.api_key = "data-key";
    StartWorker(c);
  }
};

TEST_F(AuthTest, AdminAndDataKeys) {
  rl::v1::GetModelInfoResponse info;
  EXPECT_EQ(Call(&Stub::GetModelInfo, rl::v1::GetModelInfoRequest(), &info).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(
      Call(&Stub::GetModelInfo, rl::v1::GetModelInfoRequest(), &info, "data-key").error_code(),
      grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_TRUE(Call(&Stub::GetModelInfo, rl::v1::GetModelInfoRequest(), &info, "admin-key").ok());
  rl::v1::AdminResponse resp;
  rl::v1::PauseGenerationRequest pause;
  pause.set_mode(rl::v1::PAUSE_MODE_IN_PLACE);
  EXPECT_EQ(Call(&Stub::PauseGeneration, pause, &resp).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_FALSE(server_->engine().GetServerInfo().paused);
  rl::v1::GenerateFinal f;
  EXPECT_EQ(Generate(Greedy(kPromptIds, 2), &f).error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_TRUE(Generate(Greedy(kPromptIds, 2), &f, nullptr, "data-key").ok());
}

}  // namespace
}  // namespace rl::worker::testing
