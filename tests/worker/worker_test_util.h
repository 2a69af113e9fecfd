// Test helpers for the worker: an in-process WorkerServer on 127.0.0.1:0 with stubs, and
// checkpoint helpers (perturbed copies of stories260K).
#pragma once

#include <cstdlib>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/model_io/dtype.h"
#include "common/model_io/safetensors.h"
#include "common/weight_sync/bucket_plan.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "gtest/gtest.h"
#include "rl/v1/admin.grpc.pb.h"
#include "rl/v1/worker.grpc.pb.h"
#include "services/worker/weight_sync/weight_sync.h"
#include "services/worker/worker_server.h"
#include "tests/testing/test_data.h"

namespace rl::worker::testing {

using ::rl::testing::DataDir;
using ::rl::testing::Stories;
using ::rl::testing::TempDir;

inline const std::vector<int32_t> kPromptIds = {1, 403, 407, 261, 378};
inline const std::vector<int32_t> kGoldenIds = {432, 383, 286, 261, 376, 298, 315, 421, 395, 317,
                                                426, 338, 401, 396, 267, 337, 410, 408, 419, 292};

// Copies stories260K into `dir`, multiplying every tensor whose name contains `match` by
// `scale` (float32 checkpoint), and dropping `drop` if set.
inline void WritePerturbedStories(const std::string& dir, const std::string& match, float scale,
                                  const std::string& drop = "") {
  std::filesystem::create_directories(dir);
  std::filesystem::copy_file(Stories() + "/config.json", dir + "/config.json",
                             std::filesystem::copy_options::overwrite_existing);
  auto ckpt = model_io::OpenCheckpoint(Stories());
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  std::vector<std::vector<uint8_t>> storage;
  std::vector<model_io::TensorToWrite> out;
  for (const auto& [name, t] : ckpt->tensors()) {
    if (name == drop) continue;
    storage.emplace_back(t.data.begin(), t.data.end());
    if (name.find(match) != std::string::npos && t.dtype == model_io::DType::kF32) {
      auto* f = reinterpret_cast<float*>(storage.back().data());
      for (size_t i = 0; i < storage.back().size() / 4; ++i) f[i] *= scale;
    }
    out.push_back({name, t.dtype, t.shape, {}});
  }
  for (size_t i = 0; i < out.size(); ++i) out[i].data = storage[i];
  ASSERT_TRUE(model_io::WriteSafetensors(dir + "/model.safetensors", out).ok());
}

// Lists every bucket's tensors in a Prepare/ReceiveWeights request for group "train".
template <typename Request>
void AddBuckets(const std::vector<weight_sync::Bucket>& buckets, Request* req) {
  req->set_group_name("train");
  for (const auto& b : buckets) {
    rl::v1::WeightBucket* out = req->add_buckets();
    for (const auto& s : b.specs) {
      out->add_names(s.name);
      out->add_dtypes(s.dtype);
      out->add_shapes()->mutable_dims()->Assign(s.shape.begin(), s.shape.end());
    }
  }
}

// A checkpoint folder opened and planned into buckets of at most `bucket_bytes` (the buckets'
// spans point into `ckpt`'s shared file buffers, so moving it keeps them valid).
struct PlannedCheckpoint {
  model_io::Checkpoint ckpt;
  std::vector<weight_sync::Bucket> buckets;
};
inline std::optional<PlannedCheckpoint> PlanCheckpoint(const std::string& dir,
                                                       int64_t bucket_bytes) {
  auto ckpt = model_io::OpenCheckpoint(dir);
  EXPECT_TRUE(ckpt.ok()) << ckpt.status();
  if (!ckpt.ok()) return std::nullopt;
  auto buckets = weight_sync::PlanBuckets(*ckpt, bucket_bytes);
  EXPECT_TRUE(buckets.ok()) << buckets.status();
  if (!buckets.ok()) return std::nullopt;
  return PlannedCheckpoint{*std::move(ckpt), *std::move(buckets)};
}

// The trainer's side: broadcasts every bucket in order; the first error.
inline absl::Status BroadcastAll(weight_sync::WeightSender* sender,
                                 const std::vector<weight_sync::Bucket>& buckets) {
  for (const auto& b : buckets) {
    absl::Status s = sender->Broadcast(b.specs, b.data).status();
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

class WorkerFixture : public ::testing::Test {
 protected:
  void StartWorker(WorkerConfig config = {}) {
    if (config.model_path.empty()) config.model_path = Stories();
    config.port = 0;
    config.kv_cache_gb = 0.01;
    config.num_threads = 1;
    auto server = WorkerServer::Start(config);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    channel_ = grpc::CreateChannel(server_->address(), grpc::InsecureChannelCredentials());
    worker_ = rl::v1::Worker::NewStub(channel_);
    admin_ = rl::v1::Admin::NewStub(channel_);
  }

  void TearDown() override {
    if (server_) server_->Shutdown();
  }

  // Runs Generate to completion; returns the status, fills the final message and the chunks.
  grpc::Status Generate(const rl::v1::GenerateRequest& req, rl::v1::GenerateFinal* final_msg,
                        std::vector<rl::v1::GenerateChunk>* chunks = nullptr,
                        const std::string& key = "") {
    grpc::ClientContext ctx;
    if (!key.empty()) ctx.AddMetadata("authorization", "Bearer " + key);
    auto reader = worker_->Generate(&ctx, req);
    rl::v1::GenerateResponse msg;
    while (reader->Read(&msg)) {
      if (msg.has_chunk() && chunks) chunks->push_back(msg.chunk());
      if (msg.has_final() && final_msg) *final_msg = msg.final();
    }
    return reader->Finish();
  }

  static rl::v1::GenerateRequest Greedy(const std::vector<int32_t>& ids, int max_new_tokens) {
    rl::v1::GenerateRequest req;
    for (int32_t id : ids) req.mutable_input_ids()->add_ids(id);
    req.mutable_sampling_params()->set_temperature(0);
    req.mutable_sampling_params()->set_max_new_tokens(max_new_tokens);
    return req;
  }

  std::vector<int32_t> GreedyIds(int max_new_tokens = 20) {
    rl::v1::GenerateFinal f;
    grpc::Status s = Generate(Greedy(kPromptIds, max_new_tokens), &f);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return {f.output_ids().begin(), f.output_ids().end()};
  }

  template <typename Req, typename Resp, typename Fn>
  grpc::Status Call(Fn fn, const Req& req, Resp* resp, const std::string& key = "") {
    grpc::ClientContext ctx;
    if (!key.empty()) ctx.AddMetadata("authorization", "Bearer " + key);
    return (admin_.get()->*fn)(&ctx, req, resp);
  }

  rl::v1::GetServerInfoResponse ServerInfo() {
    rl::v1::GetServerInfoResponse info;
    grpc::ClientContext ctx;
    EXPECT_TRUE(admin_->GetServerInfo(&ctx, {}, &info).ok());
    return info;
  }

  std::unique_ptr<WorkerServer> server_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<rl::v1::Worker::Stub> worker_;
  std::unique_ptr<rl::v1::Admin::Stub> admin_;
};

}  // namespace rl::worker::testing
