// The bad-input suite's fixture: real rl-worker and rl-router processes (started once per test
// process, with small --max-* limits and key files) and what the cases need to build hostile
// input: stories260K as a raw safetensors header + data, folders made from bytes, greedy
// requests. ExpectHealthy checks that both processes live and the old weights still serve (same
// greedy output directly and through the router, same weights checksum); the peak RSS of both
// is printed ("[peak-rss]") and bounded at the end.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "common/model_io/safetensors.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "rl/v1/admin.grpc.pb.h"
#include "rl/v1/router.grpc.pb.h"
#include "rl/v1/worker.grpc.pb.h"
#include "tests/testing/process_util.h"
#include "tests/testing/tensor_stream.h"
#include "tests/testing/test_data.h"

namespace rl::testing {

using Json = nlohmann::json;

inline constexpr char kAdminKey[] = "admin-secret-key";
inline constexpr char kDataKey[] = "data-secret-key";
inline const std::vector<int32_t> kPrompt = {1, 403, 407, 261, 378};
inline constexpr int64_t kMaxPeakRssMiB = 2048;

// `name` inside this process's bad-input folder (removed at exit).
inline std::string TempPath(const std::string& name) {
  static const std::string root = ProcessTempDir("bad-input");
  return root + "/" + name;
}

inline void WriteText(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
}

// stories260K as a header (JSON, data_offsets in stored order) plus a data region.
struct RawCheckpoint {
  Json header = Json::object();
  std::string data;
  std::vector<std::string> order;
};

inline RawCheckpoint LoadStories() {
  RawCheckpoint c;
  auto ckpt = model_io::OpenCheckpoint(Stories());
  EXPECT_TRUE(ckpt.ok()) << ckpt.status();
  for (const auto& [name, t] : ckpt->tensors()) {
    const uint64_t begin = c.data.size();
    c.data.append(reinterpret_cast<const char*>(t.data.data()), t.data.size());
    c.header[name] = {{"dtype", std::string(model_io::DTypeName(t.dtype))},
                      {"shape", t.shape},
                      {"data_offsets", {begin, c.data.size()}}};
    c.order.push_back(name);
  }
  return c;
}

inline std::string Serialize(const Json& header, const std::string& data,
                             std::optional<uint64_t> len_override = std::nullopt) {
  const std::string text = header.dump();
  const uint64_t n = len_override.value_or(text.size());
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>(n >> (8 * i));
  return out + text + data;
}

// Makes DIR with stories260K's config.json and `safetensors` bytes as model.safetensors.
inline std::string MakeFolder(const std::string& name, const std::string& safetensors) {
  const std::string dir = TempPath(name);
  std::filesystem::create_directories(dir);
  std::filesystem::copy_file(Stories() + "/config.json", dir + "/config.json",
                             std::filesystem::copy_options::overwrite_existing);
  WriteText(dir + "/model.safetensors", safetensors);
  return dir;
}

template <typename Stub>
inline grpc::Status Generate(Stub* stub, const rl::v1::GenerateRequest& req,
                             rl::v1::GenerateFinal* fin, std::string* request_id = nullptr,
                             const std::string& key = kDataKey) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
  if (!key.empty()) ctx.AddMetadata("authorization", "Bearer " + key);
  auto reader = stub->Generate(&ctx, req);
  rl::v1::GenerateResponse msg;
  while (reader->Read(&msg)) {
    if (msg.has_final() && fin != nullptr) *fin = msg.final();
    if (request_id != nullptr) *request_id = msg.request_id();
  }
  return reader->Finish();
}

inline rl::v1::GenerateRequest Greedy(int max_new_tokens = 16) {
  rl::v1::GenerateRequest req;
  for (int32_t id : kPrompt) req.mutable_input_ids()->add_ids(id);
  req.mutable_sampling_params()->set_temperature(0);
  req.mutable_sampling_params()->set_max_new_tokens(max_new_tokens);
  return req;
}

class BadInputTest : public ::testing::Test {
 protected:
  // Started from the first SetUp (not SetUpTestSuite: a failure there would turn the tests
  // into skips, which ctest does not count as failures).
  static void StartProcesses() {
    key_file_ = TempPath("admin.key");
    WriteText(key_file_, std::string(kAdminKey) + "\n");
    const std::vector<std::string> limits = {
        "--max-prompt-bytes",       "65536", "--max-prompt-tokens", "512",
        "--max-tensor-chunk-bytes", "65536", "--max-update-bytes",  "400000",
        "--max-path-bytes",         "1024"};
    std::vector<std::string> wargs = {
        "--model",   Stories(), "--port",         "0", "--kv-cache-gb",        "0.02",
        "--threads", "1",       "--metrics-port", "0", "--admin-api-key-file", key_file_};
    wargs.insert(wargs.end(), limits.begin(), limits.end());
    worker_ = new Process("rl-worker", wargs, {{"RL_API_KEY", kDataKey}});
    worker_addr_ = StartServer(*worker_);
    if (worker_addr_.empty()) return;
    std::vector<std::string> rargs = {"--tokenizer",
                                      Stories(),
                                      "--port",
                                      "0",
                                      "--worker",
                                      worker_addr_,
                                      "--admin-api-key-file",
                                      key_file_,
                                      "--health-interval-ms",
                                      "200"};
    rargs.insert(rargs.end(), limits.begin(), limits.begin() + 4);
    router_ = new Process("rl-router", rargs, {{"RL_API_KEY", kDataKey}});
    router_addr_ = StartServer(*router_);
  }

  static void TearDownTestSuite() {
    if (worker_ == nullptr || router_ == nullptr) return;
    const int64_t w = worker_->PeakRssMiB(), r = router_->PeakRssMiB();
    std::printf("[peak-rss] worker %lld MiB, router %lld MiB\n", static_cast<long long>(w),
                static_cast<long long>(r));
    EXPECT_LT(w, kMaxPeakRssMiB);
    EXPECT_LT(r, kMaxPeakRssMiB);
    delete router_;
    delete worker_;
    router_ = worker_ = nullptr;
  }

  void SetUp() override {
    if (worker_ == nullptr) StartProcesses();
    ASSERT_FALSE(worker_addr_.empty()) << worker_->Log();
    ASSERT_FALSE(router_addr_.empty()) << router_->Log();
    wch_ = grpc::CreateChannel(worker_addr_, grpc::InsecureChannelCredentials());
    rch_ = grpc::CreateChannel(router_addr_, grpc::InsecureChannelCredentials());
    worker_stub_ = rl::v1::Worker::NewStub(wch_);
    admin_ = rl::v1::Admin::NewStub(wch_);
    router_stub_ = rl::v1::Router::NewStub(rch_);
    router_admin_ = rl::v1::Router::NewStub(rch_);
    baseline_ids_ = GreedyIds(worker_stub_.get());
    ASSERT_FALSE(baseline_ids_.empty());
    baseline_sum_ = Checksum();
    ASSERT_FALSE(baseline_sum_.empty());
    // The router sees the worker live within a few health checks.
    std::vector<int32_t> via_router;
    for (int i = 0; i < 100 && via_router.empty(); ++i) {
      rl::v1::GenerateFinal f;
      if (Generate(router_stub_.get(), Greedy(), &f).ok()) {
        via_router.assign(f.output_ids().begin(), f.output_ids().end());
      } else {
        std::this_thread::sleep_for(std::chrono::milliseconds(200));
      }
    }
    ASSERT_EQ(via_router, baseline_ids_);
  }

  template <typename Stub>
  std::vector<int32_t> GreedyIds(Stub* stub) {
    rl::v1::GenerateFinal f;
    grpc::Status s = Generate(stub, Greedy(), &f);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return {f.output_ids().begin(), f.output_ids().end()};
  }

  std::string Checksum() {
    rl::v1::WeightsCheckerRequest req;
    req.set_action(rl::v1::WEIGHTS_CHECKER_ACTION_CHECKSUM);
    rl::v1::WeightsCheckerResponse resp;
    grpc::ClientContext ctx;
    ctx.AddMetadata("authorization", std::string("Bearer ") + kAdminKey);
    grpc::Status s = admin_->WeightsChecker(&ctx, req, &resp);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return resp.rank_sha256();
  }

  // Both processes alive, the old weights still serving (direct and through the router).
  void ExpectHealthy(const std::string& what) {
    SCOPED_TRACE(what);
    ASSERT_TRUE(worker_->Alive()) << "worker died: " << worker_->Log();
    ASSERT_TRUE(router_->Alive()) << "router died: " << router_->Log();
    EXPECT_EQ(GreedyIds(worker_stub_.get()), baseline_ids_);
    EXPECT_EQ(GreedyIds(router_stub_.get()), baseline_ids_);
    EXPECT_EQ(Checksum(), baseline_sum_);
  }

  static void ExpectError(const grpc::Status& s, std::vector<grpc::StatusCode> codes,
                          const std::string& what) {
    EXPECT_FALSE(s.ok()) << what;
    EXPECT_THAT(codes, ::testing::Contains(s.error_code()))
        << what << ": got " << s.error_code() << " " << s.error_message();
    EXPECT_FALSE(s.error_message().empty()) << what;
    // Errors never echo unbounded input.
    EXPECT_LT(s.error_message().size(), 1024u) << what;
  }

  grpc::Status UpdateFromDisk(const std::string& path) {
    rl::v1::UpdateWeightsFromDiskRequest req;
    req.set_model_path(path);
    rl::v1::AdminResponse resp;
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
    ctx.AddMetadata("authorization", std::string("Bearer ") + kAdminKey);
    return admin_->UpdateWeightsFromDisk(&ctx, req, &resp);
  }

  grpc::Status SendChunks(const std::vector<rl::v1::TensorChunk>& chunks) {
    rl::v1::AdminResponse resp;
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
    ctx.AddMetadata("authorization", std::string("Bearer ") + kAdminKey);
    // A complete stream (with its end): each case is refused for its own reason.
    return SendTensorStream(*admin_, &ctx, chunks, &resp);
  }

  inline static Process* worker_ = nullptr;
  inline static Process* router_ = nullptr;
  inline static std::string worker_addr_, router_addr_, key_file_;
  std::shared_ptr<grpc::Channel> wch_, rch_;
  std::unique_ptr<rl::v1::Worker::Stub> worker_stub_;
  std::unique_ptr<rl::v1::Admin::Stub> admin_;
  std::unique_ptr<rl::v1::Router::Stub> router_stub_, router_admin_;
  std::vector<int32_t> baseline_ids_;
  std::string baseline_sum_;
};

}  // namespace rl::testing
