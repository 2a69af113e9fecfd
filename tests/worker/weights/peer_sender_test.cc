// Peer catch-up on the worker side (services/worker/weights/peer_sender.h, issue 30): two
// in-process rl-workers (stories260K); the sender, serving perturbed weights at version 4, sends
// them to the receiver in small slices and chunks (many engine hops, tensors cut across both),
// and the receiver then serves version 4 with the sender's checksum and outputs. A send that is
// cut (cancelled, or the sender's weights change mid-send), a version the sender does not serve,
// a stream whose digest or coverage is wrong: nothing changes on the receiver. The RPC
// (Admin.SendWeightsToPeer) forwards the caller's key. The router's side: tests/router/admin.
#include "services/worker/weights/peer_sender.h"

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "services/worker/weights/weight_update_controller.h"
#include "tests/testing/tensor_stream.h"
#include "tests/worker/worker_test_util.h"

namespace rl::worker::testing {
namespace {

using Stub = rl::v1::Admin::Stub;

// One in-process worker and its admin stub.
struct Node {
  std::unique_ptr<WorkerServer> server;
  std::unique_ptr<Stub> admin;
  std::unique_ptr<rl::v1::Worker::Stub> data;

  static Node Start(const std::string& admin_key = "") {
    WorkerConfig config;
    config.model_path = Stories();
    config.port = 0;
    config.kv_cache_gb = 0.01;
    config.num_threads = 1;
    config.admin_api_key = admin_key;
    auto s = WorkerServer::Start(config);
    EXPECT_TRUE(s.ok()) << s.status();
    Node n;
    if (!s.ok()) return n;
    n.server = *std::move(s);
    auto channel = grpc::CreateChannel(n.server->address(), grpc::InsecureChannelCredentials());
    n.admin = rl::v1::Admin::NewStub(channel);
    n.data = rl::v1::Worker::NewStub(channel);
    return n;
  }
  std::string Checksum() {
    auto r = server->control().CheckWeights(CheckerAction::kChecksum);
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? r->rank_sha256 : "";
  }
  uint64_t Applies() { return dynamic_cast<WeightUpdateController&>(server->weights()).applies(); }
  std::vector<int32_t> Greedy() {
    rl::v1::GenerateRequest req;
    for (int32_t id : kPromptIds) req.mutable_input_ids()->add_ids(id);
    req.mutable_sampling_params()->set_temperature(0);
    req.mutable_sampling_params()->set_max_new_tokens(20);
    grpc::ClientContext ctx;
    auto reader = data->Generate(&ctx, req);
    rl::v1::GenerateResponse msg;
    std::vector<int32_t> ids;
    while (reader->Read(&msg)) {
      if (msg.has_final())
        ids.assign(msg.final().output_ids().begin(), msg.final().output_ids().end());
    }
    EXPECT_TRUE(reader->Finish().ok());
    return ids;
  }
};

class PeerSenderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    sender_ = Node::Start();
    receiver_ = Node::Start();
    ASSERT_NE(sender_.server, nullptr);
    ASSERT_NE(receiver_.server, nullptr);
    // The sender serves other weights than the receiver, at version 4.
    WritePerturbedStories(dir_.path(), "mlp.down_proj", 1.7f);
    auto out = sender_.server->weights().UpdateWeightsFromDisk(dir_.path(), {.weight_version = 4});
    ASSERT_TRUE(out.ok()) << out.status();
    ASSERT_NE(sender_.Checksum(), receiver_.Checksum());
  }
  void TearDown() override {
    if (sender_.server) sender_.server->Shutdown();
    if (receiver_.server) receiver_.server->Shutdown();
  }

  // A sender over the sending worker's engine with small slices.
  std::unique_ptr<PeerSender> MakeSender(int64_t slice_bytes) {
    return std::make_unique<PeerSender>(PeerSender::Deps{
        .engine = &sender_.server->engine(),
        .limits = {},
        .applies = [this] { return sender_.Applies(); },
        .slice_bytes = slice_bytes,
    });
  }
  PeerSender::Request ToReceiver(int64_t version = 4) {
    PeerSender::Request r;
    r.target = receiver_.server->address();
    r.weight_version = version;
    r.chunk_bytes = 4096;
    return r;
  }
  // The receiver is where it started: version 0, its own weights.
  // Every weight the sender serves, one chunk each, as a full-state stream carries them.
  bool SenderWeightChunks(std::vector<rl::v1::TensorChunk>* chunks) {
    return sender_.server->engine()
        .RunOnEngineThread([&](engine::EngineContext& c) {
          return c.runner().VisitWeights(
              [&](const model::TensorInfo& info, absl::Span<const uint8_t> bytes) {
                chunks->push_back(::rl::testing::Chunk(
                    info.name, info.shape, info.dtype,
                    std::string(reinterpret_cast<const char*>(bytes.data()), bytes.size())));
              });
        })
        .ok();
  }
  void ExpectReceiverUnchanged(const std::string& checksum) {
    EXPECT_EQ(receiver_.server->weight_version(), 0);
    EXPECT_EQ(receiver_.Checksum(), checksum);
    EXPECT_FALSE(receiver_.server->engine().GetServerInfo().paused);
  }

  TempDir dir_;
  Node sender_, receiver_;
};

TEST_F(PeerSenderTest, ReceiverServesTheSendersVersionWithItsChecksum) {
  const std::vector<int32_t> sender_ids = sender_.Greedy();
  ASSERT_NE(sender_ids, receiver_.Greedy());
  auto sender = MakeSender(10000);  // slices cut tensors; chunks cut slices
  auto out = sender->Send(ToReceiver(), nullptr);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(out->admin.weight_version, 4);
  EXPECT_EQ(out->rank_sha256, sender_.Checksum());
  EXPECT_GT(out->num_tensors, 10);
  EXPECT_GT(out->num_bytes, 100000);
  EXPECT_NE(out->admin.message.find("slices"), std::string::npos) << out->admin.message;
  EXPECT_EQ(receiver_.server->weight_version(), 4);
  EXPECT_EQ(receiver_.Checksum(), sender_.Checksum());
  EXPECT_EQ(receiver_.Greedy(), sender_ids);
  // GetLoad reports the digest the stream was verified against: the served weights' own.
  grpc::ClientContext ctx;
  rl::v1::GetLoadResponse load;
  ASSERT_TRUE(receiver_.data->GetLoad(&ctx, rl::v1::GetLoadRequest(), &load).ok());
  EXPECT_EQ(load.weights_sha256(), sender_.Checksum());
  EXPECT_EQ(receiver_.server->weights().served_sha256(), sender_.Checksum());
  // The sender kept its version and its weights, and serves.
  EXPECT_EQ(sender_.server->weight_version(), 4);
  EXPECT_EQ(sender_.Greedy(), sender_ids);
}

TEST_F(PeerSenderTest, KeepPauseLeavesTheReceiverPaused) {
  auto sender = MakeSender(1 << 20);
  PeerSender::Request r = ToReceiver();
  r.keep_pause = true;
  r.chunk_bytes = 0;  // the default, 1 MiB
  auto out = sender->Send(r, nullptr);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_TRUE(receiver_.server->engine().GetServerInfo().paused);
  EXPECT_EQ(receiver_.Checksum(), sender_.Checksum());
}

TEST_F(PeerSenderTest, AVersionTheSenderDoesNotServeSendsNothing) {
  const std::string before = receiver_.Checksum();
  auto out = MakeSender(10000)->Send(ToReceiver(/*version=*/5), nullptr);
  ASSERT_EQ(out.status().code(), absl::StatusCode::kFailedPrecondition) << out.status();
  EXPECT_NE(out.status().message().find("serves weight_version 4, not 5"), std::string::npos)
      << out.status();
  ExpectReceiverUnchanged(before);
}

TEST_F(PeerSenderTest, AnUpdateOnTheSenderMidSendCutsItAndNothingIsApplied) {
  const std::string before = receiver_.Checksum();
  auto sender = MakeSender(10000);
  std::atomic<int> polls{0};
  // Polled between messages on the sending thread: after a few, the sender's weights change
  // (a disk update of the same folder: same contents, a new apply, version 4 kept).
  auto out = sender->Send(ToReceiver(), [&] {
    if (polls.fetch_add(1) == 5) {
      auto u = sender_.server->weights().UpdateWeightsFromDisk(dir_.path(), {.weight_version = 4});
      EXPECT_TRUE(u.ok()) << u.status();
    }
    return false;
  });
  ASSERT_EQ(out.status().code(), absl::StatusCode::kAborted) << out.status();
  EXPECT_NE(out.status().message().find("changed during the send"), std::string::npos)
      << out.status();
  ExpectReceiverUnchanged(before);
  // The next send goes through.
  ASSERT_TRUE(sender->Send(ToReceiver(), nullptr).ok());
  EXPECT_EQ(receiver_.Checksum(), sender_.Checksum());
}

TEST_F(PeerSenderTest, ACancelledSendAppliesNothing) {
  const std::string before = receiver_.Checksum();
  auto sender = MakeSender(10000);
  std::atomic<int> polls{0};
  auto out = sender->Send(ToReceiver(), [&] { return polls.fetch_add(1) >= 20; });
  ASSERT_EQ(out.status().code(), absl::StatusCode::kCancelled) << out.status();
  ExpectReceiverUnchanged(before);
  // After Shutdown nothing is sent.
  sender->Shutdown();
  EXPECT_EQ(sender->Send(ToReceiver(), nullptr).status().code(), absl::StatusCode::kCancelled);
  ExpectReceiverUnchanged(before);
}

TEST_F(PeerSenderTest, BadRequestsAreRefusedBeforeAnythingIsSent) {
  auto sender = MakeSender(10000);
  for (const std::string& target :
       {std::string(""), std::string("no-port"), std::string("h:0"), std::string("h:99999"),
        std::string("a b:1"), std::string(300, 'x') + ":1"}) {
    PeerSender::Request r = ToReceiver();
    r.target = target;
    EXPECT_EQ(sender->Send(r, nullptr).status().code(), absl::StatusCode::kInvalidArgument)
        << target;
  }
  PeerSender::Request r = ToReceiver();
  r.chunk_bytes = 100;
  EXPECT_EQ(sender->Send(r, nullptr).status().code(), absl::StatusCode::kInvalidArgument);
  r = ToReceiver();
  r.weight_version = -1;
  EXPECT_EQ(sender->Send(r, nullptr).status().code(), absl::StatusCode::kInvalidArgument);
  r = ToReceiver();
  r.timeout = std::chrono::hours(2);
  EXPECT_EQ(sender->Send(r, nullptr).status().code(), absl::StatusCode::kInvalidArgument);
  // Nobody listens there: the receiver's failure, nothing else.
  r = ToReceiver();
  r.target = "127.0.0.1:1";
  r.timeout = std::chrono::milliseconds(2000);
  EXPECT_FALSE(sender->Send(r, nullptr).ok());
}

// The receiving side's check of TensorStreamEnd.rank_sha256: a stream that does not carry every
// served weight, or whose digest differs, is refused and nothing is applied.
TEST_F(PeerSenderTest, TheReceiverRefusesAFullStateStreamMissingAWeight) {
  const std::string before = receiver_.Checksum();
  const std::vector<float> ones(64, 1.0f);
  const auto chunk =
      ::rl::testing::Chunk("model.norm.weight", {64}, "F32",
                           std::string(reinterpret_cast<const char*>(ones.data()), 256));
  auto messages = ::rl::testing::StreamMessages({chunk});
  messages.back().mutable_end()->set_rank_sha256(std::string(64, 'a'));
  rl::v1::AdminResponse resp;
  grpc::ClientContext ctx;
  const grpc::Status s = ::rl::testing::SendMessages(*receiver_.admin, &ctx, messages, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("every served weight"), std::string::npos) << s.error_message();
  ExpectReceiverUnchanged(before);
}

// Every served weight, but a digest that is not theirs.
TEST_F(PeerSenderTest, TheReceiverRefusesAWrongDigest) {
  const std::string before = receiver_.Checksum();
  std::vector<rl::v1::TensorChunk> chunks;
  ASSERT_TRUE(SenderWeightChunks(&chunks));
  auto messages = ::rl::testing::StreamMessages(chunks);
  messages.back().mutable_end()->set_rank_sha256(receiver_.Checksum());  // not what is sent
  rl::v1::AdminResponse resp;
  {
    grpc::ClientContext ctx;
    const grpc::Status s = ::rl::testing::SendMessages(*receiver_.admin, &ctx, messages, &resp);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_NE(s.error_message().find("digest to"), std::string::npos) << s.error_message();
  }
  ExpectReceiverUnchanged(before);
  // With the right digest the same stream applies, and the answer carries it.
  messages.back().mutable_end()->set_rank_sha256(sender_.Checksum());
  grpc::ClientContext ctx;
  const grpc::Status s = ::rl::testing::SendMessages(*receiver_.admin, &ctx, messages, &resp);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(resp.weights_sha256(), sender_.Checksum());
  EXPECT_EQ(receiver_.Checksum(), sender_.Checksum());
}

// A full-state stream's per-tensor digests, computed once by the rank_sha256 check,
// are reused: a staged one is not hashed again when committed, and a one-call one keeps them as
// the base of the served digest, so a partial update after it still knows the digest.
TEST_F(PeerSenderTest, AFullStateStreamIsHashedOnceAndItsDigestsOutliveIt) {
  std::vector<rl::v1::TensorChunk> chunks;
  ASSERT_TRUE(SenderWeightChunks(&chunks));
  auto& receiver = dynamic_cast<WeightUpdateController&>(receiver_.server->weights());
  const std::string sent = sender_.Checksum();
  // Staged: committed with the check's digests (nothing hashed by the controller), known staged.
  rl::v1::UpdateWeightsFromTensorRequest stage;
  stage.set_stage(true);
  auto messages = ::rl::testing::StreamMessages(chunks, stage);
  messages.back().mutable_end()->set_rank_sha256(sent);
  rl::v1::AdminResponse resp;
  const int64_t hashed = receiver.hashed_bytes();
  {
    grpc::ClientContext ctx;
    const grpc::Status s = ::rl::testing::SendMessages(*receiver_.admin, &ctx, messages, &resp);
    ASSERT_TRUE(s.ok()) << s.error_message();
  }
  EXPECT_EQ(receiver.hashed_bytes(), hashed);  // the stage reused the check's digests
  EXPECT_EQ(receiver.status().staged.sha256, sent);
  ASSERT_TRUE(receiver.DropStagedWeights().ok());
  // One call: served with the digest and the per-tensor digests behind it.
  messages = ::rl::testing::StreamMessages(chunks);
  messages.back().mutable_end()->set_rank_sha256(sent);
  {
    grpc::ClientContext ctx;
    const grpc::Status s = ::rl::testing::SendMessages(*receiver_.admin, &ctx, messages, &resp);
    ASSERT_TRUE(s.ok()) << s.error_message();
  }
  EXPECT_EQ(receiver.hashed_bytes(), hashed);
  EXPECT_EQ(receiver.served_sha256(), sent);
  // A partial update on it: its digest is known (the base's per-tensor digests were kept).
  const std::vector<float> ones(64, 1.0f);
  std::vector<NamedTensor> partial;
  partial.push_back({{"model.norm.weight", "F32", {64}},
                     std::vector<uint8_t>(reinterpret_cast<const uint8_t*>(ones.data()),
                                          reinterpret_cast<const uint8_t*>(ones.data()) + 256)});
  ASSERT_TRUE(receiver.UpdateWeightsFromTensors(std::move(partial), {}).ok());
  receiver.WaitForServedDigest();
  EXPECT_NE(receiver.served_sha256(), "");
  EXPECT_NE(receiver.served_sha256(), sent);
  EXPECT_EQ(receiver.served_sha256(), receiver_.Checksum());
}

// Admin.SendWeightsToPeer: a control call on the sender, with the caller's key forwarded to the
// receiver (both keyed alike).
TEST(PeerSenderRpcTest, SendWeightsToPeerForwardsTheKey) {
  Node sender = Node::Start("k3y");
  Node receiver = Node::Start("k3y");
  ASSERT_NE(sender.server, nullptr);
  ASSERT_NE(receiver.server, nullptr);
  const std::vector<float> ones(64, 1.0f);
  std::vector<NamedTensor> update(1);
  update[0].info = {"model.norm.weight", "F32", {64}};
  update[0].bytes.assign(reinterpret_cast<const uint8_t*>(ones.data()),
                         reinterpret_cast<const uint8_t*>(ones.data()) + 256);
  ASSERT_TRUE(
      sender.server->weights().UpdateWeightsFromTensors(update, {.weight_version = 9}).ok());
  rl::v1::SendWeightsToPeerRequest req;
  req.set_target(receiver.server->address());
  req.set_weight_version(9);
  rl::v1::AdminResponse resp;
  {
    grpc::ClientContext ctx;  // no key: refused by the sender
    EXPECT_EQ(sender.admin->SendWeightsToPeer(&ctx, req, &resp).error_code(),
              grpc::StatusCode::UNAUTHENTICATED);
  }
  grpc::ClientContext ctx;
  ctx.AddMetadata("authorization", "Bearer k3y");
  const grpc::Status s = sender.admin->SendWeightsToPeer(&ctx, req, &resp);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_TRUE(resp.success());
  EXPECT_EQ(resp.weight_version(), 9);
  EXPECT_EQ(resp.weights_sha256(), sender.Checksum());
  EXPECT_EQ(receiver.Checksum(), sender.Checksum());
  EXPECT_EQ(receiver.server->weight_version(), 9);
  sender.server->Shutdown();
  receiver.server->Shutdown();
}

}  // namespace
}  // namespace rl::worker::testing
