// Router data plane under load (label reliability): an in-process rl-router in front of fast
// in-process fake workers (tests/router/fake_worker.h), driven by asynchronous clients.
// - 2,000 concurrent streams all complete while the process's thread count stays bounded (the
//   router runs no thread per stream);
// - a client flooding the router with thousands of streams does not starve another client:
//   the second client's requests are served (within their deadline) while most of the flood is
//   still waiting;
// - past --max-in-flight + --max-queued, requests are refused RESOURCE_EXHAUSTED at once,
//   naming the flags;
// - a client that stops reading has the worker's request cancelled once the router's bound is
//   passed; when it reads again it gets what its transport held, then RESOURCE_EXHAUSTED naming
//   --max-stream-buffer-bytes.
// Every wait is bounded (deadlines on calls, at most 60 s per wait).
#include <atomic>
#include <chrono>
#include <deque>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "common/server_runner.h"
#include "grpcpp/create_channel.h"
#include "gtest/gtest.h"
#include "services/router/router_server.h"
#include "tests/testing/fake_worker.h"
#include "tests/testing/router_fleet.h"
#include "tests/worker/worker_test_util.h"

namespace rl::router {
namespace {

using testing::AsyncGenerate;
using testing::CountThreads;
using testing::FakeWorker;
using testing::FakeWorkerOptions;
using RouterCall = AsyncGenerate<rl::v1::Router::Stub>;
using rl::v1::GenerateResponse;

// Counts finished calls; Wait blocks (bounded) until `n` are done.
class Tally {
 public:
  RouterCall::Done Callback() {
    return [this](const grpc::Status& s, bool final_seen) {
      absl::MutexLock lock(&mu_);
      ++done_;
      if (s.ok() && final_seen) ++ok_;
      if (s.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED) {
        ++exhausted_;
        last_exhausted_ = s.error_message();
      }
    };
  }
  bool Wait(int n, std::chrono::seconds limit = std::chrono::seconds(60)) {
    absl::MutexLock lock(&mu_);
    auto reached = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return done_ >= n; };
    return mu_.AwaitWithTimeout(absl::Condition(&reached), absl::FromChrono(limit));
  }
  int done() {
    absl::MutexLock lock(&mu_);
    return done_;
  }
  int ok() {
    absl::MutexLock lock(&mu_);
    return ok_;
  }
  int exhausted() {
    absl::MutexLock lock(&mu_);
    return exhausted_;
  }
  std::string last_exhausted() {
    absl::MutexLock lock(&mu_);
    return last_exhausted_;
  }

 private:
  absl::Mutex mu_;
  int done_ ABSL_GUARDED_BY(mu_) = 0;
  int ok_ ABSL_GUARDED_BY(mu_) = 0;
  int exhausted_ ABSL_GUARDED_BY(mu_) = 0;
  std::string last_exhausted_ ABSL_GUARDED_BY(mu_);
};

class RouterLoadTest : public ::testing::Test {
 protected:
  void Start(FakeWorkerOptions worker_options, RouterConfig config, int num_workers = 2) {
    for (int i = 0; i < num_workers; ++i) {
      workers_.push_back(std::make_unique<FakeWorker>(worker_options));
      auto server = GrpcServer::Start(ServerOptions{}, {workers_.back().get()});
      ASSERT_TRUE(server.ok()) << server.status();
      config.workers.push_back((*server)->address());
      servers_.push_back(*std::move(server));
    }
    config.tokenizer_path = worker::testing::Stories();
    config.health_interval_ms = 200;
    auto router = RouterServer::Start(config);
    ASSERT_TRUE(router.ok()) << router.status();
    router_ = *std::move(router);
  }

  // A stub on a channel of its own (its own connection: a distinct peer for admission).
  // `small_window`: the client's transport takes at most 64 KiB it was not asked to read.
  std::unique_ptr<rl::v1::Router::Stub> NewStub(bool small_window = false) {
    grpc::ChannelArguments args;
    args.SetInt("rl-test-channel", next_channel_++);  // no subchannel sharing
    if (small_window) {
      args.SetInt(GRPC_ARG_HTTP2_BDP_PROBE, 0);
      args.SetInt(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, 64 << 10);
    }
    return rl::v1::Router::NewStub(
        grpc::CreateCustomChannel(router_->address(), grpc::InsecureChannelCredentials(), args));
  }

  static rl::v1::GenerateRequest Request() {
    rl::v1::GenerateRequest req;
    for (int32_t id : worker::testing::kPromptIds) req.mutable_input_ids()->add_ids(id);
    return req;
  }

  void TearDown() override {
    if (router_) router_->Shutdown();
    for (auto& s : servers_) s->Shutdown();
  }

  std::vector<std::unique_ptr<FakeWorker>> workers_;
  std::vector<std::unique_ptr<GrpcServer>> servers_;
  std::unique_ptr<RouterServer> router_;
  int next_channel_ = 0;
};

TEST_F(RouterLoadTest, TwoThousandConcurrentStreamsOnABoundedNumberOfThreads) {
  constexpr int kStreams = 2000;
  FakeWorkerOptions wo;
  wo.delay = std::chrono::milliseconds(300);  // streams overlap
  Start(wo, RouterConfig{});
  const int threads_before = CountThreads();
  std::vector<std::unique_ptr<rl::v1::Router::Stub>> stubs;
  for (int i = 0; i < 4; ++i) stubs.push_back(NewStub());
  Tally tally;
  for (int i = 0; i < kStreams; ++i) {
    RouterCall::Start(stubs[i % stubs.size()].get(), Request(), tally.Callback(), "", true,
                      std::chrono::seconds(60));
  }
  int peak_threads = 0;
  const auto limit = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (tally.done() < kStreams && std::chrono::steady_clock::now() < limit) {
    peak_threads = std::max(peak_threads, CountThreads());
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_TRUE(tally.Wait(kStreams));
  EXPECT_EQ(tally.ok(), kStreams);
  int started = 0;
  for (const auto& w : workers_) started += w->started.load();
  EXPECT_EQ(started, kStreams);
  // Router, fake workers and clients share this process: a thread per stream would add 2,000.
  std::printf("threads: %d before the load, peak %d during %d streams\n", threads_before,
              peak_threads, kStreams);
  EXPECT_LE(peak_threads, threads_before + 64);
}

TEST_F(RouterLoadTest, AFloodingClientDoesNotStarveAnother) {
  constexpr int kFlood = 3000;
  FakeWorkerOptions wo;
  wo.delay = std::chrono::milliseconds(20);
  RouterConfig config;
  config.max_in_flight = 32;
  config.max_queued = 10000;
  Start(wo, config);
  auto flood_stub = NewStub();
  auto other_stub = NewStub();
  Tally flood;
  for (int i = 0; i < kFlood; ++i) {
    RouterCall::Start(flood_stub.get(), Request(), flood.Callback(), "", true,
                      std::chrono::seconds(120));
  }
  // The other client's requests, one after another, each with a deadline.
  for (int i = 0; i < 5; ++i) {
    Tally other;
    RouterCall::Start(other_stub.get(), Request(), other.Callback(), "", true,
                      std::chrono::seconds(30));
    ASSERT_TRUE(other.Wait(1));
    EXPECT_EQ(other.ok(), 1) << "request " << i;
  }
  // Served in turn with the flood, not behind it: most of the flood is still waiting.
  EXPECT_LT(flood.done(), kFlood / 2);
  ASSERT_TRUE(flood.Wait(kFlood, std::chrono::seconds(120)));
  EXPECT_EQ(flood.ok(), kFlood);
}

TEST_F(RouterLoadTest, PastTheBoundsRequestsAreRefusedAtOnce) {
  FakeWorkerOptions wo;
  wo.delay = std::chrono::milliseconds(3000);  // the admitted ones outlast the burst
  RouterConfig config;
  config.max_in_flight = 4;
  config.max_queued = 4;
  Start(wo, config);
  auto stub = NewStub();
  Tally tally;
  for (int i = 0; i < 40; ++i) {
    RouterCall::Start(stub.get(), Request(), tally.Callback(), "", true, std::chrono::seconds(60));
  }
  // The refusals come at once, before any admitted request is done.
  ASSERT_TRUE(tally.Wait(32));
  EXPECT_EQ(tally.exhausted(), 32);
  EXPECT_EQ(tally.ok(), 0);
  ASSERT_TRUE(tally.Wait(40));
  EXPECT_EQ(tally.ok(), 8);
  EXPECT_EQ(tally.exhausted(), 32);
  EXPECT_NE(tally.last_exhausted().find("--max-queued 4"), std::string::npos)
      << tally.last_exhausted();
  EXPECT_NE(tally.last_exhausted().find("--max-in-flight 4"), std::string::npos);
}

TEST_F(RouterLoadTest, AClientThatStopsReadingIsCutOffAndTheWorkerRequestCancelled) {
  FakeWorkerOptions wo;
  wo.chunks = 20000;  // ~6 MB: far more than the client's window and the router's bound
  wo.tokens_per_chunk = 64;
  RouterConfig config;
  config.max_stream_buffer_bytes = 64 << 10;
  Start(wo, config, /*num_workers=*/1);
  auto stub = NewStub(/*small_window=*/true);
  Tally tally;
  RouterCall* call = RouterCall::Start(stub.get(), Request(), tally.Callback(), "",
                                       /*read=*/false, std::chrono::seconds(60));
  // The router cancels the worker's request once its bound is passed, not at the stream's end.
  const auto limit = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (workers_[0]->cancelled.load() == 0 && std::chrono::steady_clock::now() < limit) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(workers_[0]->cancelled.load(), 1);
  EXPECT_EQ(workers_[0]->finished.load(), 0);
  // The client reads again: what its transport held, then the status naming the bound.
  call->ResumeReading();
  ASSERT_TRUE(tally.Wait(1));
  EXPECT_EQ(tally.exhausted(), 1);
  EXPECT_NE(tally.last_exhausted().find("--max-stream-buffer-bytes"), std::string::npos)
      << tally.last_exhausted();
}

TEST_F(RouterLoadTest, LongTextPromptsAndRetrievesRunOnTheBlockingPool) {
  Start(FakeWorkerOptions{}, RouterConfig{}, /*num_workers=*/1);
  auto stub = NewStub();
  std::string text;
  while (text.size() <= 3 * kInlinePromptBytes) text += "Once upon a time there was a girl. ";
  rl::v1::GenerateRequest req;
  req.set_text(text);
  Tally tally;
  for (int i = 0; i < 8; ++i) {
    RouterCall::Start(stub.get(), req, tally.Callback(), "", true, std::chrono::seconds(60));
  }
  ASSERT_TRUE(tally.Wait(8));
  EXPECT_EQ(tally.ok(), 8);
  grpc::ClientContext ctx;
  rl::v1::RetrieveFromTextRequest retrieve;
  retrieve.set_text(text);
  retrieve.set_tokenize_remainder(true);
  rl::v1::RetrieveFromTextResponse resp;
  ASSERT_TRUE(stub->RetrieveFromText(&ctx, retrieve, &resp).ok());
  EXPECT_GT(resp.trajectory().tokens_size(), 100);
  EXPECT_EQ(resp.trajectory().tokens_size(), resp.trajectory().loss_mask_size());
}

// A worker as its engine schedules: at most kCapacity requests run (it reports that as GetLoad's
// max_running_requests), the others wait in one FIFO queue; the test finishes the oldest running
// request (ReleaseOldest) and the next waiting one starts. `order` is the order requests started
// running, by their first prompt id.
class FifoWorker final : public rl::v1::Worker::CallbackService {
 public:
  static constexpr int kCapacity = 8;

  grpc::ServerWriteReactor<GenerateResponse>* Generate(
      grpc::CallbackServerContext*, const rl::v1::GenerateRequest* req) override {
    auto* r = new Reactor(req->request_id());
    absl::MutexLock lock(&mu_);
    if (open_) {
      r->Answer();
    } else {
      queue_.push_back({r, req->input_ids().ids(1)});
      StartRunningLocked();
    }
    return r;
  }
  grpc::ServerUnaryReactor* GetLoad(grpc::CallbackServerContext* ctx, const rl::v1::GetLoadRequest*,
                                    rl::v1::GetLoadResponse* resp) override {
    resp->set_max_running_requests(kCapacity);
    auto* r = ctx->DefaultReactor();
    r->Finish(grpc::Status::OK);
    return r;
  }
  // Finishes the oldest running request; the next waiting one starts.
  void ReleaseOldest() {
    absl::MutexLock lock(&mu_);
    if (running_.empty()) return;
    running_.front()->Answer();
    running_.pop_front();
    StartRunningLocked();
  }
  // Answers everything now and from now on.
  void ReleaseAll() {
    absl::MutexLock lock(&mu_);
    open_ = true;
    for (Reactor* r : running_) r->Answer();
    for (auto& [r, id] : queue_) r->Answer();
    running_.clear();
    queue_.clear();
  }
  std::vector<int32_t> order() {
    absl::MutexLock lock(&mu_);
    return order_;
  }
  int arrived() {
    absl::MutexLock lock(&mu_);
    return static_cast<int>(order_.size() + queue_.size());
  }

 private:
  class Reactor final : public grpc::ServerWriteReactor<GenerateResponse> {
   public:
    explicit Reactor(const std::string& id) { msg_.set_request_id(id); }
    void Answer() {
      if (done_.exchange(true)) return;
      msg_.mutable_final()->set_finish_reason(rl::v1::FINISH_REASON_LENGTH);
      StartWrite(&msg_);
    }
    void OnWriteDone(bool) override { Finish(grpc::Status::OK); }
    void OnCancel() override {
      if (!done_.exchange(true)) Finish(grpc::Status::CANCELLED);
    }
    void OnDone() override { delete this; }

   private:
    GenerateResponse msg_;
    std::atomic<bool> done_{false};
  };

  void StartRunningLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    while (static_cast<int>(running_.size()) < kCapacity && !queue_.empty()) {
      running_.push_back(queue_.front().first);
      order_.push_back(queue_.front().second);
      queue_.pop_front();
    }
  }

  absl::Mutex mu_;
  bool open_ ABSL_GUARDED_BY(mu_) = false;
  std::deque<Reactor*> running_ ABSL_GUARDED_BY(mu_);
  std::deque<std::pair<Reactor*, int32_t>> queue_ ABSL_GUARDED_BY(mu_);
  std::vector<int32_t> order_ ABSL_GUARDED_BY(mu_);
};

// The README's promise with the defaults (--max-in-flight 0: the workers' capacity): while one
// client has thousands of requests queued, another client's small request runs after about one
// generation, not behind them. Asserted on order: it starts running among the first requests
// after the worker's running batch, not after the flood (with a fixed --max-in-flight above the
// workers' capacity the flood sat in the worker's FIFO queue and it ran 3,000th).
TEST_F(RouterLoadTest, BehindAFloodAnotherClientRunsWithinAboutOneGenerationByDefault) {
  constexpr int kFlood = 3000;
  constexpr int32_t kFloodId = 403, kOtherId = 407;
  FifoWorker worker;
  auto server = GrpcServer::Start(ServerOptions{}, {&worker});
  ASSERT_TRUE(server.ok()) << server.status();
  RouterConfig config;
  config.workers = {(*server)->address()};
  config.tokenizer_path = worker::testing::Stories();
  config.health_interval_ms = 200;
  auto router = RouterServer::Start(config);  // --max-in-flight left at its default
  ASSERT_TRUE(router.ok()) << router.status();
  router_ = *std::move(router);
  auto request = [](int32_t id) {
    rl::v1::GenerateRequest req;
    req.mutable_input_ids()->add_ids(1);
    req.mutable_input_ids()->add_ids(id);
    return req;
  };
  auto flood_stub = NewStub();
  auto other_stub = NewStub();
  Tally flood;
  for (int i = 0; i < kFlood; ++i) {
    RouterCall::Start(flood_stub.get(), request(kFloodId), flood.Callback(), "flooder", true,
                      std::chrono::seconds(120));
  }
  // Every flood request is either running on the worker or waiting somewhere.
  auto queued_in_router = [&] {
    rl::v1::GetMetricsResponse m;
    grpc::ClientContext ctx;
    EXPECT_TRUE(other_stub->GetMetrics(&ctx, rl::v1::GetMetricsRequest(), &m).ok());
    const std::string key = "\nrl_router_admission_queued ";  // the sample, not # HELP
    const size_t at = m.prometheus_text().find(key);
    return at == std::string::npos ? -1
                                   : static_cast<int>(std::strtod(
                                         m.prometheus_text().c_str() + at + key.size(), nullptr));
  };
  const auto limit = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (worker.arrived() + queued_in_router() < kFlood &&
         std::chrono::steady_clock::now() < limit) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_EQ(static_cast<int>(worker.order().size()), FifoWorker::kCapacity);
  Tally other;
  RouterCall::Start(other_stub.get(), request(kOtherId), other.Callback(), "other", true,
                    std::chrono::seconds(120));
  // It waits in the router (its own queue), not behind the flood in the worker.
  const auto queued = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (queued_in_router() + worker.arrived() < kFlood + 1 &&
         std::chrono::steady_clock::now() < queued) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  // Finish one running request at a time until the other client's request runs.
  int position = -1;
  for (int released = 0; released < 2 * FifoWorker::kCapacity && position < 0; ++released) {
    const size_t before = worker.order().size();
    worker.ReleaseOldest();
    const auto wait = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (worker.order().size() == before && std::chrono::steady_clock::now() < wait) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    const std::vector<int32_t> order = worker.order();
    for (size_t i = 0; i < order.size(); ++i) {
      if (order[i] == kOtherId) position = static_cast<int>(i);
    }
  }
  ASSERT_GE(position, 0) << "the other client's request was not among the first "
                         << worker.order().size() << " to run";
  std::printf("the other client's request ran after %d flood requests\n", position);
  // Right after the batch running when it arrived, give or take one turn of the flooder.
  EXPECT_GE(position, FifoWorker::kCapacity);
  EXPECT_LE(position, FifoWorker::kCapacity + 1);
  worker.ReleaseAll();
  ASSERT_TRUE(other.Wait(1));
  EXPECT_EQ(other.ok(), 1);
  ASSERT_TRUE(flood.Wait(kFlood, std::chrono::seconds(120)));
  EXPECT_EQ(flood.ok(), kFlood);
  router_->Shutdown();
  (*server)->Shutdown();
}

}  // namespace
}  // namespace rl::router
