// UpdateWeightsFromTensor streams cut short (label reliability), with real rl-worker and rl-router
// processes (staged streams too, issue 30): a stream applies only when it ends with its explicit
// end (the `end` message, then the half-close). Cut at every point (the client cancels, its
// deadline passes, a message that does not parse, a half-close without the end, the sending process
// SIGKILLed) directly to a worker and through the router, it leaves every worker's weight version
// and checksum (WeightsChecker) unchanged, and the router keeps every worker in routing; the same
// stream sent whole then applies (the cut streams carried a whole tensor: applying them would have
// shown). Also: non-finite values are refused, a first message may carry the options alone, a
// worker that dies mid-stream is dropped from the update without stalling the others, and 8 GiB
// streamed through the router never makes it hold more than its limits (its peak RSS, VmHWM,
// against in-process fake workers that discard what they receive).
#include "tests/testing/tensor_stream.h"

#include <signal.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/server_runner.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "rl/v1/admin.grpc.pb.h"
#include "rl/v1/router.grpc.pb.h"
#include "rl/v1/worker.grpc.pb.h"
#include "tests/testing/process_util.h"
#include "tests/testing/test_data.h"

namespace rl::testing {
namespace {

using grpc::StatusCode;
using ::testing::HasSubstr;
using Request = rl::v1::UpdateWeightsFromTensorRequest;

constexpr char kNorm[] = "model.norm.weight";  // [64] F32 in stories260K
constexpr char kMethod[] = "/rl.v1.Admin/UpdateWeightsFromTensor";

std::string Floats(const std::vector<float>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
}

// The options and one whole tensor: what a cut stream carried before it was cut.
Request NormMessage(float value) {
  Request m;
  m.set_weight_version(41);
  *m.mutable_chunk() = Chunk(kNorm, {64}, "F32", Floats(std::vector<float>(64, value)));
  return m;
}

struct WorkerWeights {
  int64_t version = -1;
  std::string checksum;
  bool operator==(const WorkerWeights& o) const {
    return version == o.version && checksum == o.checksum;
  }
};

void PrintTo(const WorkerWeights& w, std::ostream* os) {
  *os << "v" << w.version << " " << w.checksum;
}

enum class Cut { kCancel, kDeadline, kGarbage, kNoEnd, kSigkill };
const char* CutName(Cut c) {
  switch (c) {
    case Cut::kCancel:
      return "cancel";
    case Cut::kDeadline:
      return "deadline";
    case Cut::kGarbage:
      return "garbage message";
    case Cut::kNoEnd:
      return "half-close without the end";
    case Cut::kSigkill:
      return "SIGKILL of the sender";
  }
  return "?";
}

// Two workers and a router, started for each test (some tests change or kill them).
class TensorStreamTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (int i = 0; i < 2; ++i) {
      workers_.push_back(std::make_unique<Process>(
          "rl-worker", std::vector<std::string>{"--model", Stories(), "--port", "0",
                                                "--kv-cache-gb", "0.02", "--threads", "1"}));
      const std::string addr = StartServer(*workers_.back());
      ASSERT_FALSE(addr.empty()) << workers_.back()->Log();
      worker_addrs_.push_back(addr);
      worker_channels_.push_back(grpc::CreateChannel(addr, grpc::InsecureChannelCredentials()));
      worker_admin_.push_back(rl::v1::Admin::NewStub(worker_channels_.back()));
    }
    router_ = std::make_unique<Process>(
        "rl-router",
        std::vector<std::string>{"--tokenizer", Stories(), "--port", "0", "--worker",
                                 worker_addrs_[0], "--worker", worker_addrs_[1],
                                 "--health-interval-ms", "100", "--retry-backoff-ms", "20"});
    router_addr_ = StartServer(*router_);
    ASSERT_FALSE(router_addr_.empty()) << router_->Log();
    router_channel_ = grpc::CreateChannel(router_addr_, grpc::InsecureChannelCredentials());
    router_admin_ = rl::v1::Admin::NewStub(router_channel_);
    router_stub_ = rl::v1::Router::NewStub(router_channel_);
    ASSERT_TRUE(WaitBothRoutable());
  }

  // Every worker's weight version and checksum, asked of the worker itself.
  std::vector<WorkerWeights> Fleet() {
    std::vector<WorkerWeights> out;
    for (auto& stub : worker_admin_) {
      WorkerWeights w;
      {
        grpc::ClientContext ctx;
        rl::v1::GetServerInfoResponse info;
        EXPECT_TRUE(stub->GetServerInfo(&ctx, rl::v1::GetServerInfoRequest(), &info).ok());
        w.version = info.weight_version();
      }
      grpc::ClientContext ctx;
      rl::v1::WeightsCheckerRequest req;
      req.set_action(rl::v1::WEIGHTS_CHECKER_ACTION_CHECKSUM);
      rl::v1::WeightsCheckerResponse resp;
      EXPECT_TRUE(stub->WeightsChecker(&ctx, req, &resp).ok());
      w.checksum = resp.rank_sha256();
      out.push_back(w);
    }
    return out;
  }

  bool WaitBothRoutable() {
    for (int i = 0; i < 300; ++i) {
      grpc::ClientContext ctx;
      rl::v1::WorkerListResponse list;
      if (router_stub_->ListWorkers(&ctx, rl::v1::ListWorkersRequest(), &list).ok()) {
        int live = 0;
        for (const auto& w : list.workers()) {
          live += w.state() == rl::v1::WORKER_STATE_LIVE && w.enabled() && w.reason().empty();
        }
        if (live == 2) return true;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    return false;
  }

  // Cuts one stream to `stub` (a worker's or the router's Admin) after it carried the options
  // and a whole tensor; returns the status the sender saw (OK for a SIGKILLed sender).
  grpc::Status CutStream(rl::v1::Admin::Stub& stub, const std::shared_ptr<grpc::Channel>& channel,
                         const std::string& address, Cut cut) {
    Request first = NormMessage(0.5f);
    first.set_stage(stage_);
    switch (cut) {
      case Cut::kCancel: {
        grpc::ClientContext ctx;
        rl::v1::AdminResponse resp;
        auto writer = stub.UpdateWeightsFromTensor(&ctx, &resp);
        EXPECT_TRUE(writer->Write(first));
        std::this_thread::sleep_for(std::chrono::milliseconds(300));  // read by the server
        ctx.TryCancel();
        return writer->Finish();
      }
      case Cut::kDeadline: {
        grpc::ClientContext ctx;
        ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(700));
        rl::v1::AdminResponse resp;
        auto writer = stub.UpdateWeightsFromTensor(&ctx, &resp);
        EXPECT_TRUE(writer->Write(first));
        std::this_thread::sleep_for(std::chrono::milliseconds(1200));
        writer->WritesDone();
        return writer->Finish();
      }
      case Cut::kGarbage:
        return RawStream(
            channel, kMethod,
            {first.SerializeAsString(), std::string("\xff\xff\xff\xff\x0f garbage", 13)});
      case Cut::kNoEnd: {
        grpc::ClientContext ctx;
        rl::v1::AdminResponse resp;
        return SendMessages(stub, &ctx, {first}, &resp);
      }
      case Cut::kSigkill: {
        Process sender(BuildDir() + "/tests/tensor_sender", {address});
        EXPECT_EQ(sender.WaitForLine("sent", std::chrono::seconds(60)), "") << sender.Log();
        std::this_thread::sleep_for(std::chrono::milliseconds(300));  // read by the server
        kill(sender.pid(), SIGKILL);
        for (int i = 0; i < 100 && sender.Alive(); ++i) {
          std::this_thread::sleep_for(std::chrono::milliseconds(10));
        }
        return grpc::Status::OK;
      }
    }
    return grpc::Status::OK;
  }

  static void ExpectCutStatus(Cut cut, const grpc::Status& s) {
    switch (cut) {
      case Cut::kCancel:
        EXPECT_EQ(s.error_code(), StatusCode::CANCELLED) << s.error_message();
        break;
      case Cut::kDeadline:
        EXPECT_EQ(s.error_code(), StatusCode::DEADLINE_EXCEEDED) << s.error_message();
        break;
      case Cut::kGarbage:
      case Cut::kNoEnd:
        EXPECT_EQ(s.error_code(), StatusCode::INVALID_ARGUMENT) << s.error_message();
        EXPECT_THAT(s.error_message(), HasSubstr("end message")) << s.error_message();
        EXPECT_THAT(s.error_message(), HasSubstr("nothing applied"));
        break;
      case Cut::kSigkill:
        break;
    }
  }

  // A whole stream: the options alone first, the tensor, the end alone last.
  static std::vector<Request> WholeStream(float value, int64_t version) {
    Request options;
    options.set_weight_version(version);
    const std::vector<rl::v1::TensorChunk> chunks = {
        Chunk(kNorm, {64}, "F32", Floats(std::vector<float>(64, value)))};
    std::vector<Request> out = {options};
    for (Request m : StreamMessages(chunks)) {
      m.clear_end();
      if (m.has_chunk()) out.push_back(m);
    }
    Request end;
    *end.mutable_end() = StreamEnd(chunks);
    out.push_back(end);
    return out;
  }

  // A NaN in an otherwise whole stream: refused, naming the value and where it is.
  static void ExpectNonFiniteRefused(rl::v1::Admin::Stub& stub) {
    std::vector<float> values(64, 1.0f);
    values[63] = std::numeric_limits<float>::quiet_NaN();
    grpc::ClientContext ctx;
    rl::v1::AdminResponse resp;
    const grpc::Status s =
        SendTensorStream(stub, &ctx, {Chunk(kNorm, {64}, "F32", Floats(values))}, &resp);
    if (resp.results_size() == 0) {  // a worker
      EXPECT_EQ(s.error_code(), StatusCode::INVALID_ARGUMENT) << s.error_message();
      EXPECT_THAT(s.error_message(), HasSubstr("NaN at element 63"));
      EXPECT_THAT(s.error_message(), HasSubstr("--allow-non-finite-weights"));
      return;
    }
    // The router: every worker refused it.
    ASSERT_TRUE(s.ok()) << s.error_message();
    EXPECT_FALSE(resp.success());
    EXPECT_THAT(resp.message(), HasSubstr("failed on all 2 workers"));
    for (const auto& r : resp.results()) {
      EXPECT_EQ(r.code(), "INVALID_ARGUMENT");
      EXPECT_THAT(r.message(), HasSubstr("NaN at element 63"));
      EXPECT_FALSE(r.left_out());
    }
  }

  // Every worker's (has staged weights, staging), asked of the worker itself.
  std::vector<std::pair<bool, bool>> Staged() {
    std::vector<std::pair<bool, bool>> out;
    for (auto& stub : worker_admin_) {
      grpc::ClientContext ctx;
      rl::v1::GetServerInfoResponse info;
      EXPECT_TRUE(stub->GetServerInfo(&ctx, rl::v1::GetServerInfoRequest(), &info).ok());
      out.emplace_back(info.has_staged_weights(), info.staging());
    }
    return out;
  }

  bool stage_ = false;  // CutStream: the first message asks for a staged stream
  std::vector<std::unique_ptr<Process>> workers_;
  std::vector<std::string> worker_addrs_;
  std::vector<std::shared_ptr<grpc::Channel>> worker_channels_;
  std::vector<std::unique_ptr<rl::v1::Admin::Stub>> worker_admin_;
  std::unique_ptr<Process> router_;
  std::string router_addr_;
  std::shared_ptr<grpc::Channel> router_channel_;
  std::unique_ptr<rl::v1::Admin::Stub> router_admin_;
  std::unique_ptr<rl::v1::Router::Stub> router_stub_;
};

const Cut kCuts[] = {Cut::kCancel, Cut::kDeadline, Cut::kGarbage, Cut::kNoEnd, Cut::kSigkill};

TEST_F(TensorStreamTest, ACutStreamToAWorkerChangesNothing) {
  const std::vector<WorkerWeights> before = Fleet();
  ASSERT_EQ(before[0], before[1]);
  for (Cut cut : kCuts) {
    SCOPED_TRACE(CutName(cut));
    ExpectCutStatus(cut, CutStream(*worker_admin_[0], worker_channels_[0], worker_addrs_[0], cut));
    std::this_thread::sleep_for(std::chrono::milliseconds(300));  // the worker saw the cut
    ASSERT_TRUE(workers_[0]->Alive()) << workers_[0]->Log();
    EXPECT_EQ(Fleet(), before);
  }
  ExpectNonFiniteRefused(*worker_admin_[0]);
  EXPECT_EQ(Fleet(), before);
  // The same tensor sent whole (the options alone first, the end alone last) applies.
  for (size_t i = 0; i < 2; ++i) {
    grpc::ClientContext ctx;
    rl::v1::AdminResponse resp;
    const grpc::Status s = SendMessages(*worker_admin_[i], &ctx, WholeStream(0.5f, 41), &resp);
    ASSERT_TRUE(s.ok()) << s.error_message();
    EXPECT_EQ(resp.weight_version(), 41);
  }
  const std::vector<WorkerWeights> after = Fleet();
  EXPECT_EQ(after[0].version, 41);
  EXPECT_NE(after[0].checksum, before[0].checksum);
  EXPECT_EQ(after[0], after[1]);
}

TEST_F(TensorStreamTest, ACutStreamThroughTheRouterChangesNothingOnAnyWorker) {
  const std::vector<WorkerWeights> before = Fleet();
  ASSERT_EQ(before[0], before[1]);
  for (Cut cut : kCuts) {
    SCOPED_TRACE(CutName(cut));
    const grpc::Status s = CutStream(*router_admin_, router_channel_, router_addr_, cut);
    ExpectCutStatus(cut, s);
    if (cut == Cut::kGarbage || cut == Cut::kNoEnd) {
      EXPECT_THAT(s.error_message(), HasSubstr("cut on every worker")) << s.error_message();
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(300));  // the workers saw the cut
    ASSERT_TRUE(router_->Alive()) << router_->Log();
    EXPECT_EQ(Fleet(), before);
    // Nothing was partial: every worker stays in routing.
    EXPECT_TRUE(WaitBothRoutable());
  }
  ExpectNonFiniteRefused(*router_admin_);
  EXPECT_EQ(Fleet(), before);
  EXPECT_TRUE(WaitBothRoutable());
  // Sent whole, with the options alone in the first message, it applies on every worker.
  grpc::ClientContext ctx;
  rl::v1::AdminResponse resp;
  const grpc::Status s = SendMessages(*router_admin_, &ctx, WholeStream(0.5f, 41), &resp);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_TRUE(resp.success()) << resp.message();
  EXPECT_EQ(resp.message(), "UpdateWeightsFromTensor: ok on all 2 workers");
  const std::vector<WorkerWeights> after = Fleet();
  EXPECT_EQ(after[0].version, 41);
  EXPECT_NE(after[0].checksum, before[0].checksum);
  EXPECT_EQ(after[0], after[1]);
}

// A worker killed mid-stream is dropped from the update (its result says why, naming it); the
// other gets every chunk and applies.
TEST_F(TensorStreamTest, AWorkerThatDiesMidStreamIsDroppedWithoutStallingTheOthers) {
  const std::string name = "model.embed_tokens.weight";  // [512, 64] F32: 128 KiB
  std::vector<float> values(512 * 64, 0.25f);
  const std::string bytes = Floats(values);
  std::vector<rl::v1::TensorChunk> chunks;
  for (size_t off = 0; off < bytes.size(); off += 4096) {
    chunks.push_back(Chunk(name, {512, 64}, "F32", bytes.substr(off, 4096), off));
  }
  Request options;
  options.set_weight_version(9);
  const std::vector<Request> messages = StreamMessages(chunks, options);
  grpc::ClientContext ctx;
  rl::v1::AdminResponse resp;
  auto writer = router_admin_->UpdateWeightsFromTensor(&ctx, &resp);
  for (size_t i = 0; i < messages.size(); ++i) {
    if (i == messages.size() / 2) {
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      kill(workers_[1]->pid(), SIGKILL);
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
    ASSERT_TRUE(writer->Write(messages[i])) << "message " << i;
  }
  writer->WritesDone();
  const grpc::Status s = writer->Finish();
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_FALSE(resp.success());
  EXPECT_EQ(resp.message(), "UpdateWeightsFromTensor: failed on 1 of 2 workers");
  ASSERT_EQ(resp.results_size(), 2);
  for (const auto& r : resp.results()) {
    if (r.worker() == worker_addrs_[0]) {
      EXPECT_TRUE(r.success()) << r.message();
      EXPECT_EQ(r.weight_version(), 9);
    } else {
      EXPECT_EQ(r.worker(), worker_addrs_[1]);
      EXPECT_FALSE(r.success());
      EXPECT_FALSE(r.message().empty());
    }
  }
  grpc::ClientContext info_ctx;
  rl::v1::GetServerInfoResponse info;
  ASSERT_TRUE(
      worker_admin_[0]->GetServerInfo(&info_ctx, rl::v1::GetServerInfoRequest(), &info).ok());
  EXPECT_EQ(info.weight_version(), 9);
}

// Staged streams (issue 30) cut at every point, to a worker and through the router, stage
// nothing anywhere (and serve nothing new); a worker killed mid staged stream through the router
// makes the other drop what it staged (all or none).
TEST_F(TensorStreamTest, ACutStagedStreamStagesNothingAnywhere) {
  stage_ = true;
  const std::vector<WorkerWeights> before = Fleet();
  const std::vector<std::pair<bool, bool>> nothing(2, {false, false});
  for (Cut cut : {Cut::kCancel, Cut::kDeadline, Cut::kGarbage, Cut::kNoEnd}) {
    SCOPED_TRACE(CutName(cut));
    ExpectCutStatus(cut, CutStream(*worker_admin_[0], worker_channels_[0], worker_addrs_[0], cut));
    ExpectCutStatus(cut, CutStream(*router_admin_, router_channel_, router_addr_, cut));
    std::this_thread::sleep_for(std::chrono::milliseconds(300));  // the workers saw the cut
    EXPECT_EQ(Staged(), nothing);
    EXPECT_EQ(Fleet(), before);
  }
  EXPECT_TRUE(WaitBothRoutable());
  // Whole, it stages on both; the router's activation then serves it on both.
  std::vector<Request> whole = WholeStream(0.5f, 41);
  whole.front().set_stage(true);
  {
    grpc::ClientContext ctx;
    rl::v1::AdminResponse resp;
    const grpc::Status s = SendMessages(*router_admin_, &ctx, whole, &resp);
    ASSERT_TRUE(s.ok()) << s.error_message();
    EXPECT_TRUE(resp.success()) << resp.message();
  }
  const std::vector<std::pair<bool, bool>> staged(2, {true, false});
  EXPECT_EQ(Staged(), staged);
  EXPECT_EQ(Fleet(), before);
  {
    grpc::ClientContext ctx;
    rl::v1::ActivateWeightsRequest activate;
    activate.set_weight_version(41);
    rl::v1::AdminResponse resp;
    const grpc::Status s = router_admin_->ActivateWeights(&ctx, activate, &resp);
    ASSERT_TRUE(s.ok()) << s.error_message();
    EXPECT_TRUE(resp.success()) << resp.message();
  }
  const std::vector<WorkerWeights> after = Fleet();
  EXPECT_EQ(after[0].version, 41);
  EXPECT_NE(after[0].checksum, before[0].checksum);
  EXPECT_EQ(after[0], after[1]);
}

TEST_F(TensorStreamTest, AWorkerKilledMidStagedStreamMakesTheOtherDropIt) {
  const std::string name = "model.embed_tokens.weight";  // [512, 64] F32: 128 KiB
  const std::string bytes = Floats(std::vector<float>(512 * 64, 0.25f));
  std::vector<rl::v1::TensorChunk> chunks;
  for (size_t off = 0; off < bytes.size(); off += 4096) {
    chunks.push_back(Chunk(name, {512, 64}, "F32", bytes.substr(off, 4096), off));
  }
  Request options;
  options.set_weight_version(9);
  options.set_stage(true);
  const std::vector<Request> messages = StreamMessages(chunks, options);
  grpc::ClientContext ctx;
  rl::v1::AdminResponse resp;
  auto writer = router_admin_->UpdateWeightsFromTensor(&ctx, &resp);
  for (size_t i = 0; i < messages.size(); ++i) {
    if (i == messages.size() / 2) {
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      kill(workers_[1]->pid(), SIGKILL);
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
    ASSERT_TRUE(writer->Write(messages[i])) << "message " << i;
  }
  writer->WritesDone();
  const grpc::Status s = writer->Finish();
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_FALSE(resp.success());
  EXPECT_THAT(resp.message(), HasSubstr("staging failed on 1 of 2 workers"));
  for (const auto& r : resp.results()) {
    if (r.worker() == worker_addrs_[0]) {
      EXPECT_TRUE(r.success()) << r.message();
      EXPECT_THAT(r.message(), HasSubstr("dropped"));
    } else {
      EXPECT_FALSE(r.success());
    }
  }
  grpc::ClientContext info_ctx;
  rl::v1::GetServerInfoResponse info;
  ASSERT_TRUE(
      worker_admin_[0]->GetServerInfo(&info_ctx, rl::v1::GetServerInfoRequest(), &info).ok());
  EXPECT_FALSE(info.has_staged_weights());
  EXPECT_EQ(info.weight_version(), 0);
}

// ---- memory: 8 GiB through the router ----

// A worker whose Admin service reads tensor streams and drops the data (counting it), and whose
// Worker service answers GetLoad: enough for the router to route and broadcast to it.
class DiscardingWorker final : public rl::v1::Admin::CallbackService,
                               public rl::v1::Worker::CallbackService {
 public:
  grpc::ServerReadReactor<Request>* UpdateWeightsFromTensor(grpc::CallbackServerContext*,
                                                            rl::v1::AdminResponse* resp) override {
    return new Reader(this, resp);
  }
  grpc::ServerUnaryReactor* GetLoad(grpc::CallbackServerContext* ctx, const rl::v1::GetLoadRequest*,
                                    rl::v1::GetLoadResponse*) override {
    auto* r = ctx->DefaultReactor();
    r->Finish(grpc::Status::OK);
    return r;
  }
  std::atomic<int64_t> bytes{0};
  std::atomic<bool> ended{false};

 private:
  class Reader final : public grpc::ServerReadReactor<Request> {
   public:
    Reader(DiscardingWorker* w, rl::v1::AdminResponse* resp) : w_(w), resp_(resp) {
      StartRead(&msg_);
    }
    void OnReadDone(bool ok) override {
      if (!ok) {
        resp_->set_success(w_->ended.load());
        resp_->set_weight_version(1);
        Finish(w_->ended.load() ? grpc::Status::OK
                                : grpc::Status(grpc::StatusCode::ABORTED, "no end"));
        return;
      }
      w_->bytes.fetch_add(static_cast<int64_t>(msg_.chunk().data().size()));
      if (msg_.has_end()) w_->ended.store(true);
      StartRead(&msg_);
    }
    void OnDone() override { delete this; }

   private:
    DiscardingWorker* w_;
    rl::v1::AdminResponse* resp_;
    Request msg_;
  };
};

TEST(TensorRelayMemoryTest, EightGibibytesThroughTheRouterInBoundedMemory) {
  constexpr int64_t kChunk = 1 << 20;
  constexpr int64_t kTotal = int64_t{8} << 30;
  std::vector<std::unique_ptr<DiscardingWorker>> fakes;
  std::vector<std::unique_ptr<GrpcServer>> servers;
  std::vector<std::string> args = {"--tokenizer",
                                   Stories(),
                                   "--port",
                                   "0",
                                   "--health-interval-ms",
                                   "200",
                                   "--max-tensor-chunk-bytes",
                                   absl::StrCat(kChunk),
                                   "--max-update-bytes",
                                   absl::StrCat(int64_t{16} << 30)};
  for (int i = 0; i < 2; ++i) {
    fakes.push_back(std::make_unique<DiscardingWorker>());
    ServerOptions options;
    options.max_message_bytes = 64 << 20;
    auto server = GrpcServer::Start(
        options, {static_cast<rl::v1::Admin::CallbackService*>(fakes.back().get()),
                  static_cast<rl::v1::Worker::CallbackService*>(fakes.back().get())});
    ASSERT_TRUE(server.ok()) << server.status();
    args.push_back("--worker");
    args.push_back((*server)->address());
    servers.push_back(*std::move(server));
  }
  Process router("rl-router", args);
  const std::string address = StartServer(router);
  ASSERT_FALSE(address.empty()) << router.Log();
  auto admin =
      rl::v1::Admin::NewStub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  const int64_t rss_before = router.PeakRssMiB();

  // A chunk over the router's --max-tensor-chunk-bytes is refused before it is forwarded.
  {
    grpc::ClientContext ctx;
    rl::v1::AdminResponse resp;
    const grpc::Status s = SendTensorStream(
        *admin, &ctx, {Chunk("w", {kChunk}, "F32", std::string(kChunk + 4, '\0'))}, &resp);
    EXPECT_EQ(s.error_code(), StatusCode::INVALID_ARGUMENT) << s.error_message();
  }
  // 8 GiB of one tensor, 1 MiB at a time.
  grpc::ClientContext ctx;
  rl::v1::AdminResponse resp;
  auto writer = admin->UpdateWeightsFromTensor(&ctx, &resp);
  Request m;
  *m.mutable_chunk() = Chunk("w", {kTotal / 4}, "F32", std::string(kChunk, '\x3f'));
  for (int64_t off = 0; off < kTotal; off += kChunk) {
    m.mutable_chunk()->set_offset(static_cast<uint64_t>(off));
    if (off + kChunk == kTotal) {
      m.mutable_end()->set_num_tensors(1);
      m.mutable_end()->set_num_bytes(kTotal);
    }
    ASSERT_TRUE(writer->Write(m)) << "at offset " << off;
  }
  writer->WritesDone();
  const grpc::Status s = writer->Finish();
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_TRUE(resp.success()) << resp.message();
  for (const auto& f : fakes) {
    EXPECT_EQ(f->bytes.load(), kTotal);
    EXPECT_TRUE(f->ended.load());
  }
  const int64_t rss_after = router.PeakRssMiB();
  std::printf("[router-rss] peak %lld MiB before the 8 GiB stream, %lld MiB after\n",
              static_cast<long long>(rss_before), static_cast<long long>(rss_after));
  // One 1 MiB message at a time plus a serialized copy per worker and the transports' windows:
  // a few MiB, nowhere near the stream's 8 GiB (buffering it whole took 8.7 GB).
  EXPECT_LT(rss_after - rss_before, 256);
  EXPECT_TRUE(router.Alive());
  router.Stop();
  for (auto& server : servers) server->Shutdown();
}

}  // namespace
}  // namespace rl::testing
