// Peer catch-up between CUDA workers (label gpu: skips cleanly without a device), issue 30: the
// sender reads its runner's host copy (the CUDA runner keeps one), so a CUDA worker sends the same
// stream a CPU one does; the receiving CUDA worker verifies the digest, copies the weights into
// its device mirror at the apply, and then serves the sender's version with the sender's
// checksum and greedy output. A CUDA sender to a CPU receiver gives the same checksum.
#include <memory>
#include <string>
#include <vector>

#include "services/worker/model/cuda_runner.h"
#include "tests/worker/worker_test_util.h"

namespace rl::worker::testing {
namespace {

std::unique_ptr<WorkerServer> Start(const std::string& backend) {
  WorkerConfig config;
  config.model_path = Stories();
  config.port = 0;
  config.kv_cache_gb = 0.01;
  config.num_threads = 1;
  config.backend = backend;
  auto s = WorkerServer::Start(config);
  EXPECT_TRUE(s.ok()) << s.status();
  return s.ok() ? *std::move(s) : nullptr;
}

std::string Checksum(WorkerServer& w) {
  auto r = w.control().CheckWeights(CheckerAction::kChecksum);
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? r->rank_sha256 : "";
}

TEST(PeerSenderCudaTest, CudaWorkersSendAndReceiveTheServedWeights) {
  if (model::NumCudaDevices() == 0) GTEST_SKIP() << "no CUDA device visible";
  auto sender = Start("cuda");
  auto receiver = Start("cuda");
  auto cpu = Start("cpu");
  ASSERT_NE(sender, nullptr);
  ASSERT_NE(receiver, nullptr);
  ASSERT_NE(cpu, nullptr);
  TempDir dir;
  WritePerturbedStories(dir.path(), "mlp.down_proj", 1.7f);
  ASSERT_TRUE(sender->weights().UpdateWeightsFromDisk(dir.path(), {.weight_version = 3}).ok());
  ASSERT_NE(Checksum(*sender), Checksum(*receiver));
  for (WorkerServer* target : {receiver.get(), cpu.get()}) {
    rl::v1::SendWeightsToPeerRequest req;
    req.set_target(target->address());
    req.set_weight_version(3);
    req.set_chunk_bytes(65536);
    rl::v1::AdminResponse resp;
    auto stub = rl::v1::Admin::NewStub(
        grpc::CreateChannel(sender->address(), grpc::InsecureChannelCredentials()));
    grpc::ClientContext ctx;
    const grpc::Status s = stub->SendWeightsToPeer(&ctx, req, &resp);
    ASSERT_TRUE(s.ok()) << s.error_message();
    EXPECT_EQ(resp.weights_sha256(), Checksum(*sender));
    EXPECT_EQ(Checksum(*target), Checksum(*sender));
    EXPECT_EQ(target->weight_version(), 3);
  }
  // The receiving CUDA worker serves the sent weights from its device mirror.
  auto greedy = [](WorkerServer& w) {
    auto stub = rl::v1::Worker::NewStub(
        grpc::CreateChannel(w.address(), grpc::InsecureChannelCredentials()));
    rl::v1::GenerateRequest req;
    for (int32_t id : kPromptIds) req.mutable_input_ids()->add_ids(id);
    req.mutable_sampling_params()->set_temperature(0);
    req.mutable_sampling_params()->set_max_new_tokens(20);
    grpc::ClientContext ctx;
    auto reader = stub->Generate(&ctx, req);
    rl::v1::GenerateResponse msg;
    std::vector<int32_t> ids;
    while (reader->Read(&msg)) {
      if (msg.has_final()) {
        ids.assign(msg.final().output_ids().begin(), msg.final().output_ids().end());
      }
    }
    EXPECT_TRUE(reader->Finish().ok());
    return ids;
  };
  EXPECT_EQ(greedy(*receiver), greedy(*sender));
  sender->Shutdown();
  receiver->Shutdown();
  cpu->Shutdown();
}

}  // namespace
}  // namespace rl::worker::testing
