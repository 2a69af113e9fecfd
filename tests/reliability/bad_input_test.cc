// Bad-input suite: real rl-worker and rl-router processes fed what a careless or hostile client
// sends. Every case asserts the status code, that both processes are still alive, and that the
// old weights still serve (same greedy output, same weights checksum). The peak RSS of both
// processes is printed ("[peak-rss]") and bounded.
#include <sys/stat.h>
#include <sys/socket.h>
#include <netinet/in.h>
#include <arpa/inet.h>

#include <atomic>
#include <cmath>
#include <filesystem>
#include <functional>
#include <limits>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/model_io/safetensors.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "httplib.h"
#include "nlohmann/json.hpp"
#include "rl/v1/admin.grpc.pb.h"
#include "rl/v1/router.grpc.pb.h"
#include "rl/v1/worker.grpc.pb.h"
#include "tests/testing/loopback.h"
#include "tests/testing/process_util.h"

namespace rl::testing {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;
using grpc::StatusCode;

constexpr char kAdminKey[] = "admin-secret-key";
constexpr char kDataKey[] = "data-secret-key";
const std::vector<int32_t> kPrompt = {1, 403, 407, 261, 378};
constexpr int64_t kMaxPeakRssMiB = 2048;

std::string TempPath(const std::string& name) {
  static const std::string root = [] {
    std::string tmpl = (fs::temp_directory_path() / "rl-bad-input-XXXXXX").string();
    return std::string(mkdtemp(tmpl.data()));
  }();
  return root + "/" + name;
}

void WriteText(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
}

std::string ReadText(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// stories260K as a header (JSON, data_offsets in stored order) plus a data region.
struct RawCheckpoint {
  Json header = Json::object();
  std::string data;
  std::vector<std::string> order;
};

RawCheckpoint LoadStories() {
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

std::string Serialize(const Json& header, const std::string& data,
                      std::optional<uint64_t> len_override = std::nullopt) {
  const std::string text = header.dump();
  const uint64_t n = len_override.value_or(text.size());
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>(n >> (8 * i));
  return out + text + data;
}

// Makes DIR with stories260K's config.json and `safetensors` bytes as model.safetensors.
std::string MakeFolder(const std::string& name, const std::string& safetensors) {
  const std::string dir = TempPath(name);
  fs::create_directories(dir);
  fs::copy_file(Stories() + "/config.json", dir + "/config.json",
                fs::copy_options::overwrite_existing);
  WriteText(dir + "/model.safetensors", safetensors);
  return dir;
}

template <typename Stub>
grpc::Status Generate(Stub* stub, const rl::v1::GenerateRequest& req, rl::v1::GenerateFinal* fin,
                      std::string* request_id = nullptr, const std::string& key = kDataKey) {
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

rl::v1::GenerateRequest Greedy(int max_new_tokens = 16) {
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
    std::vector<std::string> wargs = {"--model",       Stories(), "--port", "0",
                                      "--kv-cache-gb", "0.02",    "--threads", "1",
                                      "--metrics-port", "0", "--admin-api-key-file", key_file_};
    wargs.insert(wargs.end(), limits.begin(), limits.end());
    worker_ = new Process("rl-worker", wargs, {{"RL_API_KEY", kDataKey}});
    worker_addr_ = StartServer(*worker_);
    if (worker_addr_.empty()) return;
    std::vector<std::string> rargs = {"--tokenizer", Stories(), "--port", "0", "--worker",
                                      worker_addr_, "--admin-api-key-file", key_file_,
                                      "--health-interval-ms", "200"};
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

  static void ExpectError(const grpc::Status& s, std::vector<StatusCode> codes,
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
    auto writer = admin_->UpdateWeightsFromTensor(&ctx, &resp);
    for (const auto& c : chunks) {
      rl::v1::UpdateWeightsFromTensorRequest msg;
      *msg.mutable_chunk() = c;
      if (!writer->Write(msg)) break;
    }
    writer->WritesDone();
    return writer->Finish();
  }

  static Process* worker_;
  static Process* router_;
  static std::string worker_addr_, router_addr_, key_file_;
  std::shared_ptr<grpc::Channel> wch_, rch_;
  std::unique_ptr<rl::v1::Worker::Stub> worker_stub_;
  std::unique_ptr<rl::v1::Admin::Stub> admin_;
  std::unique_ptr<rl::v1::Router::Stub> router_stub_, router_admin_;
  std::vector<int32_t> baseline_ids_;
  std::string baseline_sum_;
};

Process* BadInputTest::worker_ = nullptr;
Process* BadInputTest::router_ = nullptr;
std::string BadInputTest::worker_addr_;
std::string BadInputTest::router_addr_;
std::string BadInputTest::key_file_;

TEST_F(BadInputTest, GenerateLimitsAndSamplingValues) {
  struct Case {
    std::string name;
    std::function<void(rl::v1::GenerateRequest&)> mutate;
  };
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  auto sp = [](rl::v1::GenerateRequest& r) { return r.mutable_sampling_params(); };
  const std::vector<Case> cases = {
      {"n=2^31-1", [&](auto& r) { sp(r)->set_n(2147483647); }},
      {"n=10^7", [&](auto& r) { sp(r)->set_n(10000000); }},
      {"n=65", [&](auto& r) { sp(r)->set_n(65); }},
      {"n=0", [&](auto& r) { sp(r)->set_n(0); }},
      {"n=-1", [&](auto& r) { sp(r)->set_n(-1); }},
      {"text 50 MB", [&](auto& r) { r.set_text(std::string(50 << 20, 'a')); }},
      {"text 70 KB", [&](auto& r) { r.set_text(std::string(70000, 'a')); }},
      {"text over prompt tokens", [&](auto& r) {
         std::string t;
         for (int i = 0; i < 3000; ++i) t += "a b ";
         r.set_text(t);
       }},
      {"input_ids 200k", [&](auto& r) {
         r.mutable_input_ids()->clear_ids();
         for (int i = 0; i < 200000; ++i) r.mutable_input_ids()->add_ids(5);
       }},
      {"empty text", [&](auto& r) { r.set_text(""); }},
      {"empty ids", [&](auto& r) { r.mutable_input_ids()->clear_ids(); }},
      {"no prompt", [&](auto& r) { r.clear_prompt(); }},
      {"ids outside vocab", [&](auto& r) { r.mutable_input_ids()->add_ids(1 << 30); }},
      {"negative id", [&](auto& r) { r.mutable_input_ids()->add_ids(-1); }},
      {"max_new_tokens 2^31-1", [&](auto& r) { sp(r)->set_max_new_tokens(2147483647); }},
      {"max_new_tokens over context", [&](auto& r) { sp(r)->set_max_new_tokens(100000); }},
      {"max_new_tokens -1", [&](auto& r) { sp(r)->set_max_new_tokens(-1); }},
      {"min_new_tokens > max", [&](auto& r) { sp(r)->set_min_new_tokens(100); }},
      {"temperature NaN", [&](auto& r) { sp(r)->set_temperature(nan); }},
      {"temperature -1", [&](auto& r) { sp(r)->set_temperature(-1); }},
      {"temperature inf", [&](auto& r) { sp(r)->set_temperature(inf); }},
      {"top_p 0", [&](auto& r) { sp(r)->set_top_p(0); }},
      {"top_p 2", [&](auto& r) { sp(r)->set_top_p(2); }},
      {"top_p NaN", [&](auto& r) { sp(r)->set_top_p(nan); }},
      {"top_k -5", [&](auto& r) { sp(r)->set_top_k(-5); }},
      {"min_p 2", [&](auto& r) { sp(r)->set_min_p(2); }},
      {"repetition_penalty 0", [&](auto& r) { sp(r)->set_repetition_penalty(0); }},
      {"frequency_penalty 10", [&](auto& r) { sp(r)->set_frequency_penalty(10); }},
      {"presence_penalty -inf", [&](auto& r) { sp(r)->set_presence_penalty(-inf); }},
      {"1000 stop strings", [&](auto& r) {
         for (int i = 0; i < 1000; ++i) sp(r)->add_stop("x");
       }},
      {"1 MB stop string", [&](auto& r) { sp(r)->add_stop(std::string(1 << 20, 's')); }},
      {"empty stop string", [&](auto& r) { sp(r)->add_stop(""); }},
      {"10k stop token ids", [&](auto& r) {
         for (int i = 0; i < 10000; ++i) sp(r)->add_stop_token_ids(2);
       }},
      {"stop token outside vocab", [&](auto& r) { sp(r)->add_stop_token_ids(99999); }},
      {"top_logprobs 1000", [&](auto& r) {
         r.set_return_logprob(true);
         r.set_top_logprobs_num(1000);
       }},
      {"top_logprobs -1", [&](auto& r) {
         r.set_return_logprob(true);
         r.set_top_logprobs_num(-1);
       }},
      {"logprob_start_len without logprobs", [&](auto& r) { r.set_logprob_start_len(1); }},
      {"request_id 10 KB", [&](auto& r) { r.set_request_id(std::string(10240, 'i')); }},
      {"request_id in the server namespace", [&](auto& r) { r.set_request_id("srv-0123"); }},
  };
  for (const Case& c : cases) {
    rl::v1::GenerateRequest req = Greedy();
    c.mutate(req);
    ExpectError(Generate(worker_stub_.get(), req, nullptr), {StatusCode::INVALID_ARGUMENT,
                StatusCode::RESOURCE_EXHAUSTED}, "worker: " + c.name);
    ExpectError(Generate(router_stub_.get(), req, nullptr), {StatusCode::INVALID_ARGUMENT,
                StatusCode::RESOURCE_EXHAUSTED, StatusCode::FAILED_PRECONDITION},
                "router: " + c.name);
  }
  // Limits are named in the error.
  rl::v1::GenerateRequest big_n = Greedy();
  big_n.mutable_sampling_params()->set_n(2147483647);
  EXPECT_THAT(Generate(router_stub_.get(), big_n, nullptr).error_message(),
              ::testing::HasSubstr("--max-n"));
  EXPECT_THAT(Generate(worker_stub_.get(), big_n, nullptr).error_message(),
              ::testing::HasSubstr("--max-n"));
  ExpectHealthy("after generate limits");
}

TEST_F(BadInputTest, InvalidUtf8AndMalformedMessages) {
  // Invalid UTF-8 in a proto3 string does not parse on the server: INVALID_ARGUMENT.
  rl::v1::GenerateRequest bad_utf8 = Greedy();
  bad_utf8.set_text("abc\xff\xfe\xc3");
  for (auto* ch : {&wch_, &rch_}) {
    const std::string method =
        ch == &wch_ ? "/rl.v1.Worker/Generate" : "/rl.v1.Router/Generate";
    ExpectError(RawCall(*ch, method, bad_utf8.SerializeAsString(), kDataKey),
                {StatusCode::INVALID_ARGUMENT, StatusCode::INTERNAL}, method + " invalid UTF-8");
  }
  rl::v1::GenerateRequest good = Greedy();
  good.set_text("Once upon a time there was a little girl");
  const std::string full = good.SerializeAsString();
  const std::string truncated = full.substr(0, full.size() - 7);
  const std::string garbage = "\xff\xff\xff\xff\xff\xff\x0f\x0a\x80";
  struct Raw {
    std::shared_ptr<grpc::Channel>* channel;
    std::string method;
    std::string key;
  };
  const std::vector<Raw> methods = {
      {&wch_, "/rl.v1.Worker/Generate", kDataKey},
      {&wch_, "/rl.v1.Worker/Abort", kDataKey},
      {&wch_, "/rl.v1.Worker/GetLoad", kDataKey},
      {&wch_, "/rl.v1.Admin/GetServerInfo", kAdminKey},
      {&wch_, "/rl.v1.Admin/UpdateWeightsFromDisk", kAdminKey},
      {&wch_, "/rl.v1.Admin/PauseGeneration", kAdminKey},
      {&rch_, "/rl.v1.Router/Generate", kDataKey},
      {&rch_, "/rl.v1.Router/RetrieveFromText", kDataKey},
      {&rch_, "/rl.v1.Router/AddWorker", kAdminKey},
  };
  for (const Raw& m : methods) {
    for (const std::string* body : {&garbage, &truncated}) {
      const grpc::Status s = RawCall(*m.channel, m.method, *body, m.key);
      if (s.ok()) continue;  // some bodies happen to parse for some messages
      ExpectError(s, {StatusCode::INVALID_ARGUMENT, StatusCode::INTERNAL}, m.method);
    }
    ExpectError(RawCall(*m.channel, m.method, garbage, m.key),
                {StatusCode::INVALID_ARGUMENT, StatusCode::INTERNAL}, m.method + " garbage");
  }
  // A garbage chunk in a client stream.
  const grpc::Status stream =
      RawCall(wch_, "/rl.v1.Admin/UpdateWeightsFromTensor", garbage, kAdminKey);
  EXPECT_FALSE(stream.ok());
  EXPECT_NE(stream.error_code(), StatusCode::UNIMPLEMENTED) << stream.error_message();
  // A method that really does not exist stays UNIMPLEMENTED.
  EXPECT_EQ(RawCall(wch_, "/rl.v1.Worker/NoSuchMethod", full, kDataKey).error_code(),
            StatusCode::UNIMPLEMENTED);
  ExpectHealthy("after malformed messages");
}

TEST_F(BadInputTest, RouterAddressesBounded) {
  for (const std::string& address : {std::string(10240, 'h'), std::string()}) {
    rl::v1::AddWorkerRequest req;
    req.set_address(address);
    rl::v1::WorkerListResponse resp;
    grpc::ClientContext ctx;
    ctx.AddMetadata("authorization", std::string("Bearer ") + kAdminKey);
    ExpectError(router_admin_->AddWorker(&ctx, req, &resp), {StatusCode::INVALID_ARGUMENT},
                "AddWorker " + std::to_string(address.size()));
  }
  ExpectHealthy("after addresses");
}

TEST_F(BadInputTest, TensorUpdateHeadersCheckedBeforeAllocation) {
  auto chunk = [](const std::string& name, std::vector<int64_t> shape, std::string dtype = "F32",
                  std::string data = "", uint64_t offset = 0) {
    rl::v1::TensorChunk c;
    c.set_name(name);
    c.set_dtype(dtype);
    for (int64_t d : shape) c.add_shape(d);
    c.set_data(data);
    c.set_offset(offset);
    return c;
  };
  const std::string norm = "model.norm.weight";  // [64] F32
  std::vector<rl::v1::TensorChunk> over_budget = {chunk("model.embed_tokens.weight", {512, 64})};
  for (int l = 0; l < 5; ++l) {
    for (const char* p : {"gate_proj", "up_proj"}) {
      over_budget.push_back(chunk(absl::StrCat("model.layers.", l, ".mlp.", p, ".weight"),
                                  {172, 64}));
    }
  }
  std::vector<int64_t> rank100(100, 1);
  const std::vector<std::pair<std::string, std::vector<rl::v1::TensorChunk>>> cases = {
      {"[2^28] f32", {chunk(norm, {int64_t{1} << 28})}},
      {"[2^33] f32", {chunk(norm, {int64_t{1} << 33})}},
      {"overflowing shape", {chunk(norm, {int64_t{1} << 40, int64_t{1} << 40})}},
      {"rank 100", {chunk(norm, rank100)}},
      {"negative dim", {chunk(norm, {-64})}},
      {"unknown tensor", {chunk("model.no_such.weight", {64})}},
      {"10 KB name", {chunk(std::string(10240, 'n'), {64})}},
      {"int dtype", {chunk(norm, {64}, "I32", std::string(256, '\0'))}},
      {"empty dtype", {chunk(norm, {64}, "")}},
      {"chunk over --max-tensor-chunk-bytes",
       {chunk("model.embed_tokens.weight", {512, 64}, "F32", std::string(100000, '\0'))}},
      {"incomplete tensor", {chunk(norm, {64}, "F32", std::string(100, '\0'))}},
      {"offset past end", {chunk(norm, {64}, "F32", std::string(8, '\0'), 1 << 20)}},
      {"offset wraps", {chunk(norm, {64}, "F32", std::string(8, '\0'), ~uint64_t{0} - 2)}},
      {"overlapping chunks",
       {chunk(norm, {64}, "F32", std::string(200, '\0')),
        chunk(norm, {64}, "F32", std::string(200, '\0'), 100)}},
      {"dtype changes between chunks",
       {chunk(norm, {64}, "F32", std::string(128, '\0')),
        chunk(norm, {64}, "BF16", std::string(64, '\0'), 128)}},
      {"over --max-update-bytes", over_budget},
      {"empty stream", {}},
  };
  for (const auto& [name, chunks] : cases) {
    ExpectError(SendChunks(chunks), {StatusCode::INVALID_ARGUMENT}, name);
    ASSERT_TRUE(worker_->Alive()) << name;
  }
  ExpectHealthy("after tensor updates");
}

TEST_F(BadInputTest, BrokenCheckpointsLeaveOldWeightsServing) {
  const RawCheckpoint base = LoadStories();
  const std::string good = Serialize(base.header, base.data);
  const std::string first = base.order.front();
  auto with = [&](const std::function<void(Json&)>& fn) {
    Json h = base.header;
    fn(h);
    return Serialize(h, base.data);
  };
  struct Case {
    std::string name;
    std::function<std::string(const std::string& dir)> make;  // returns the path to update from
    std::vector<StatusCode> codes;
  };
  const std::vector<StatusCode> kInvalid = {StatusCode::INVALID_ARGUMENT};
  const std::vector<StatusCode> kInvalidOrMissing = {StatusCode::INVALID_ARGUMENT,
                                                     StatusCode::NOT_FOUND};
  auto file_case = [&](std::string bytes) {
    return [bytes](const std::string& dir) { return MakeFolder(dir, bytes); };
  };
  auto config_case = [&](std::function<void(const std::string&)> fn) {
    return [&good, fn](const std::string& dir) {
      const std::string path = MakeFolder(dir, good);
      fn(path);
      return path;
    };
  };
  auto edit_config = [](const std::string& key, Json value) {
    return [key, value](const std::string& dir) {
      Json c = Json::parse(ReadText(dir + "/config.json"));
      c[key] = value;
      WriteText(dir + "/config.json", c.dump());
    };
  };
  const std::vector<Case> cases = {
      {"truncated to half", file_case(good.substr(0, good.size() / 2)), kInvalid},
      {"truncated to 4 bytes", file_case(good.substr(0, 4)), kInvalid},
      {"empty file", file_case(""), kInvalid},
      {"header length 2^64-1", file_case(Serialize(base.header, base.data, ~uint64_t{0})),
       kInvalid},
      {"header length 0", file_case(Serialize(base.header, base.data, 0)), kInvalid},
      {"header length past the file",
       file_case(Serialize(base.header, base.data, good.size() + 10)), kInvalid},
      {"header not JSON", file_case(Serialize(Json("x"), base.data).replace(8, 3, "{{{")),
       kInvalid},
      {"header is an array", file_case(Serialize(Json::array({1, 2}), base.data)), kInvalid},
      {"deep JSON header",
       file_case([&] {
         std::string h = std::string(100000, '[') + std::string(100000, ']');
         std::string out(8, '\0');
         for (int i = 0; i < 8; ++i) out[i] = static_cast<char>(h.size() >> (8 * i));
         return out + h;
       }()),
       kInvalid},
      {"offsets past the end",
       file_case(with([&](Json& h) { h[first]["data_offsets"][1] = base.data.size() * 4; })),
       kInvalid},
      {"overlapping offsets",
       file_case(with([&](Json& h) {
         h[base.order[1]]["data_offsets"] = h[first]["data_offsets"];
       })),
       kInvalid},
      {"reversed offsets",
       file_case(with([&](Json& h) {
         auto o = h[first]["data_offsets"];
         h[first]["data_offsets"] = {o[1], o[0]};
       })),
       kInvalid},
      {"trailing bytes", file_case(good + std::string(64, '\0')), kInvalid},
      {"dtype mismatch (size)", file_case(with([&](Json& h) { h[first]["dtype"] = "F16"; })),
       kInvalid},
      {"unknown dtype", file_case(with([&](Json& h) { h[first]["dtype"] = "F99"; })), kInvalid},
      {"integer dtype", file_case(with([&](Json& h) { h[first]["dtype"] = "I32"; })), kInvalid},
      {"negative dim", file_case(with([&](Json& h) { h[first]["shape"][0] = -1; })), kInvalid},
      {"overflowing shape",
       file_case(with([&](Json& h) {
         h[first]["shape"] = {int64_t{1} << 40, int64_t{1} << 40, int64_t{1} << 40};
       })),
       kInvalid},
      {"wrong shape, same bytes",
       file_case(with([&](Json& h) {
         auto s = h["model.embed_tokens.weight"]["shape"];
         h["model.embed_tokens.weight"]["shape"] = {s[1], s[0]};
       })),
       kInvalid},
      {"missing tensor",
       file_case([&] {
         RawCheckpoint c;
         for (const auto& n : base.order) {
           if (n == "model.norm.weight") continue;
           const auto o = base.header[n]["data_offsets"];
           const uint64_t b = o[0].get<uint64_t>(), e = o[1].get<uint64_t>();
           const uint64_t begin = c.data.size();
           c.data += base.data.substr(b, e - b);
           c.header[n] = base.header[n];
           c.header[n]["data_offsets"] = {begin, c.data.size()};
         }
         return Serialize(c.header, c.data);
       }()),
       kInvalid},
      {"other architecture", config_case(edit_config("architectures", {"Qwen2ForCausalLM"})),
       kInvalid},
      {"other hidden size", config_case(edit_config("hidden_size", 128)), kInvalid},
      {"other vocabulary", config_case(edit_config("vocab_size", 1024)), kInvalid},
      {"other layer count", config_case(edit_config("num_hidden_layers", 6)), kInvalid},
      {"no config.json",
       config_case([](const std::string& d) { fs::remove(d + "/config.json"); }),
       kInvalidOrMissing},
      {"config.json not JSON",
       config_case([](const std::string& d) { WriteText(d + "/config.json", "{not json"); }),
       kInvalid},
      {"config.json deep JSON",
       config_case([](const std::string& d) {
         WriteText(d + "/config.json", std::string(50000, '[') + std::string(50000, ']'));
       }),
       kInvalid},
      {"config.json is a directory",
       config_case([](const std::string& d) {
         fs::remove(d + "/config.json");
         fs::create_directory(d + "/config.json");
       }),
       kInvalid},
      {"config.json is a FIFO",
       config_case([](const std::string& d) {
         fs::remove(d + "/config.json");
         mkfifo((d + "/config.json").c_str(), 0600);
       }),
       kInvalid},
      {"model.safetensors is a directory",
       config_case([](const std::string& d) {
         fs::remove(d + "/model.safetensors");
         fs::create_directory(d + "/model.safetensors");
       }),
       kInvalid},
      {"model.safetensors is a FIFO",
       config_case([](const std::string& d) {
         fs::remove(d + "/model.safetensors");
         mkfifo((d + "/model.safetensors").c_str(), 0600);
       }),
       kInvalid},
      {"index names a missing shard",
       config_case([](const std::string& d) {
         WriteText(d + "/model.safetensors.index.json",
                   R"({"weight_map": {"model.norm.weight": "model-00009.safetensors"}})");
       }),
       kInvalidOrMissing},
      {"index escapes the folder",
       config_case([](const std::string& d) {
         WriteText(d + "/model.safetensors.index.json",
                   R"({"weight_map": {"model.norm.weight": "../../etc/passwd"}})");
       }),
       kInvalid},
      {"index deep JSON",
       config_case([](const std::string& d) {
         WriteText(d + "/model.safetensors.index.json",
                   std::string(50000, '{') + std::string(50000, '}'));
       }),
       kInvalid},
      {"no safetensors at all",
       config_case([](const std::string& d) { fs::remove(d + "/model.safetensors"); }),
       kInvalidOrMissing},
      {"path is a file",
       [&](const std::string& dir) { return MakeFolder(dir, good) + "/config.json"; }, kInvalid},
      {"path does not exist", [](const std::string&) { return std::string("/no/such/dir"); },
       kInvalid},
      {"path over --max-path-bytes", [](const std::string&) { return std::string(5000, 'p'); },
       kInvalid},
      {"empty path", [](const std::string&) { return std::string(); }, kInvalid},
  };
  ASSERT_GE(cases.size(), 25u);
  int n = 0;
  for (const Case& c : cases) {
    const std::string path = c.make(absl::StrCat("ckpt-", n++));
    ExpectError(UpdateFromDisk(path), c.codes, c.name);
    ASSERT_TRUE(worker_->Alive()) << c.name << "\n" << worker_->Log();
    EXPECT_EQ(GreedyIds(worker_stub_.get()), baseline_ids_) << c.name;
    EXPECT_EQ(Checksum(), baseline_sum_) << c.name;
  }
  // Control: the same checkpoint, well formed, is accepted and serves the same output.
  EXPECT_TRUE(UpdateFromDisk(MakeFolder("ckpt-good", good)).ok());
  ExpectHealthy("after broken checkpoints");
}

TEST_F(BadInputTest, RequestIdsAndAbortAll) {
  // Server-assigned ids: unguessable, in their own namespace, distinct.
  std::string a, b;
  ASSERT_TRUE(Generate(worker_stub_.get(), Greedy(2), nullptr, &a).ok());
  ASSERT_TRUE(Generate(worker_stub_.get(), Greedy(2), nullptr, &b).ok());
  EXPECT_THAT(a, ::testing::MatchesRegex("srv-[0-9a-f]{32}"));
  EXPECT_NE(a, b);
  // A client's own id stays unique: a second request with an in-flight id is ALREADY_EXISTS.
  auto admin_call = [&](auto fn, const auto& req, const std::string& key) {
    rl::v1::AdminResponse resp;
    grpc::ClientContext ctx;
    ctx.AddMetadata("authorization", "Bearer " + key);
    return (admin_.get()->*fn)(&ctx, req, &resp);
  };
  rl::v1::PauseGenerationRequest pause;
  pause.set_mode(rl::v1::PAUSE_MODE_IN_PLACE);
  ASSERT_TRUE(admin_call(&rl::v1::Admin::Stub::PauseGeneration, pause, kAdminKey).ok());
  rl::v1::GenerateRequest mine = Greedy(4);
  mine.set_request_id("client-7");
  std::thread first([&] { EXPECT_TRUE(Generate(worker_stub_.get(), mine, nullptr).ok()); });
  bool waiting = false;
  for (int i = 0; i < 300 && !waiting; ++i) {
    rl::v1::GetServerInfoResponse info;
    grpc::ClientContext ctx;
    ctx.AddMetadata("authorization", std::string("Bearer ") + kAdminKey);
    waiting = admin_->GetServerInfo(&ctx, {}, &info).ok() && info.num_waiting() == 1;
    if (!waiting) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ASSERT_TRUE(waiting);
  EXPECT_EQ(Generate(worker_stub_.get(), mine, nullptr).error_code(), StatusCode::ALREADY_EXISTS);
  // abort_all needs the admin key: the data-plane key and no key are refused.
  rl::v1::AbortRequest all;
  all.set_abort_all(true);
  rl::v1::AbortResponse aresp;
  {
    grpc::ClientContext ctx;
    ctx.AddMetadata("authorization", std::string("Bearer ") + kDataKey);
    ExpectError(worker_stub_->Abort(&ctx, all, &aresp),
                {StatusCode::PERMISSION_DENIED, StatusCode::UNAUTHENTICATED}, "abort_all data key");
  }
  {
    grpc::ClientContext ctx;
    ExpectError(worker_stub_->Abort(&ctx, all, &aresp), {StatusCode::UNAUTHENTICATED},
                "abort_all no key");
  }
  {
    rl::v1::AbortRequest one;
    one.set_request_id(std::string(10240, 'x'));
    grpc::ClientContext ctx;
    ctx.AddMetadata("authorization", std::string("Bearer ") + kDataKey);
    ExpectError(worker_stub_->Abort(&ctx, one, &aresp), {StatusCode::INVALID_ARGUMENT},
                "abort 10 KB id");
  }
  EXPECT_TRUE(
      admin_call(&rl::v1::Admin::Stub::ContinueGeneration, rl::v1::ContinueGenerationRequest(),
                 kAdminKey)
          .ok());
  first.join();
  {
    grpc::ClientContext ctx;
    ctx.AddMetadata("authorization", std::string("Bearer ") + kAdminKey);
    EXPECT_TRUE(worker_stub_->Abort(&ctx, all, &aresp).ok());
  }
  ExpectHealthy("after ids");
}

// Slow and idle clients on the metrics port never starve /healthz (the liveness probe).
TEST_F(BadInputTest, MetricsPortSurvivesSlowloris) {
  std::string port_text = worker_->WaitForLine("metrics on http://127.0.0.1:",
                                               std::chrono::seconds(10));
  const int port = std::atoi(port_text.c_str());
  ASSERT_GT(port, 0) << worker_->Log();
  auto connect_to = [&]() {
    const int fd = ConnectLoopback(port);
    EXPECT_GE(fd, 0);
    return fd;
  };
  std::vector<int> slow, idle;
  for (int i = 0; i < 16; ++i) {
    slow.push_back(connect_to());
    idle.push_back(connect_to());
    const char* start = "GET /healthz HTTP/1.1\r\nHost: x\r\n";
    (void)!send(slow.back(), start, strlen(start), MSG_NOSIGNAL);
  }
  std::atomic<bool> stop{false};
  std::thread dripper([&] {
    // One header byte per connection every 500 ms: under the read timeout, never finished.
    while (!stop) {
      for (int fd : slow) (void)!send(fd, "X", 1, MSG_NOSIGNAL);
      std::this_thread::sleep_for(std::chrono::milliseconds(500));
    }
  });
  httplib::Client client("127.0.0.1", port);
  client.set_connection_timeout(10);
  client.set_read_timeout(10);
  int ok = 0;
  for (int i = 0; i < 20; ++i) {
    auto res = client.Get(i % 4 == 3 ? "/metrics" : "/healthz");
    if (res && res->status == 200) ++ok;
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  EXPECT_EQ(ok, 20);
  // Idle connections are closed by the server (read timeout), not held forever.
  char byte;
  timeval tv{15, 0};
  setsockopt(idle[0], SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  EXPECT_EQ(recv(idle[0], &byte, 1, 0), 0);
  stop = true;
  dripper.join();
  for (int fd : slow) close(fd);
  for (int fd : idle) close(fd);
  ExpectHealthy("after slowloris");
}

// Open descriptors of a process (its /proc/PID/fd entries).
int CountFds(pid_t pid) {
  std::error_code ec;
  int n = 0;
  for (fs::directory_iterator it(absl::StrCat("/proc/", pid, "/fd"), ec), end; !ec && it != end;
       it.increment(ec)) {
    ++n;
  }
  return n;
}

// A flood of 320 slow and idle connections, replaced as soon as the server cuts them (as a
// slowloris tool does), on the metrics port: every /healthz probe with the kubelet's default
// probe timeout (1 s) is answered, and the worker's open descriptors stay bounded (at most the
// connection cap of 128 + 17 waiting, never one per flood connection). Before the listen backlog
// was raised, a burst of connects overflowed httplib's backlog of 5 and SYNs were dropped.
TEST_F(BadInputTest, MetricsPortBoundsAFloodOfSlowAndIdleConnections) {
  std::string port_text = worker_->WaitForLine("metrics on http://127.0.0.1:",
                                               std::chrono::seconds(10));
  const int port = std::atoi(port_text.c_str());
  ASSERT_GT(port, 0) << worker_->Log();
  const int baseline_fds = CountFds(worker_->pid());
  ASSERT_GT(baseline_fds, 0);
  constexpr int kFlood = 320;
  std::vector<int> fds(kFlood, -1);
  std::atomic<bool> stop{false};
  std::atomic<int64_t> reconnects{0};
  // Even slots trickle a request head one byte at a time, odd slots send nothing.
  auto open_slot = [&](int i) {
    fds[i] = ConnectLoopback(port, /*timeout_s=*/1);
    if (fds[i] >= 0 && i % 2 == 0) {
      const char* start = "GET /healthz HTTP/1.1\r\nHost: x\r\n";
      (void)!send(fds[i], start, strlen(start), MSG_NOSIGNAL);
    }
  };
  for (int i = 0; i < kFlood; ++i) open_slot(i);
  std::thread flood([&] {
    // Bounded: at most 200 rounds of 100 ms.
    for (int round = 0; round < 200 && !stop; ++round) {
      for (int i = 0; i < kFlood && !stop; ++i) {
        char byte;
        const bool cut =
            fds[i] < 0 ||
            (i % 2 == 0 ? send(fds[i], "X", 1, MSG_NOSIGNAL | MSG_DONTWAIT) < 0
                        : recv(fds[i], &byte, 1, MSG_DONTWAIT) == 0);
        if (cut) {
          if (fds[i] >= 0) close(fds[i]);
          open_slot(i);
          reconnects.fetch_add(1);
        }
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  });
  // The worker's open descriptors, sampled every 10 ms while the flood runs.
  std::atomic<int> max_fds{0};
  std::thread sampler([&] {
    for (int i = 0; i < 3000 && !stop; ++i) {
      const int n = CountFds(worker_->pid());
      if (n > max_fds.load()) max_fds = n;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  httplib::Client client("127.0.0.1", port);
  client.set_connection_timeout(1);
  client.set_read_timeout(1);
  client.set_keep_alive(false);
  int answered = 0;
  for (int i = 0; i < 20; ++i) {
    auto res = client.Get("/healthz");
    if (res && res->status == 200 && res->body == "ok\n") {
      ++answered;
    } else {
      ADD_FAILURE() << "probe " << i << ": "
                    << (res ? absl::StrCat("status ", res->status) : httplib::to_string(res.error()));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(150));
  }
  stop = true;
  flood.join();
  sampler.join();
  for (int fd : fds) {
    if (fd >= 0) close(fd);
  }
  std::cout << "[metrics-flood] " << answered << "/20 probes answered, worker fds " << baseline_fds
            << " -> max " << max_fds.load() << ", " << reconnects.load()
            << " flood connections cut and replaced\n";
  EXPECT_EQ(answered, 20);
  // The flood really exceeded the cap: the server cut connections to stay under it.
  EXPECT_GT(reconnects.load(), 0);
  // Connections: 128 served + 17 waiting for a thread + 1 being accepted; a few more for the
  // worker's own transient descriptors.
  EXPECT_LE(max_fds.load(), baseline_fds + 128 + 17 + 1 + 16);
  ExpectHealthy("after the connection flood");
}

// A checkpoint rewritten or truncated after it was loaded changes nothing and never faults:
// for --model and for an UpdateWeightsFromDisk folder.
TEST(WeightsOwnedTest, CheckpointRewrittenAfterLoad) {
  const std::string dir = TempPath("owned-model");
  fs::create_directories(dir);
  for (const char* f : {"config.json", "model.safetensors", "tokenizer.json"}) {
    fs::copy_file(Stories() + "/" + f, dir + "/" + f, fs::copy_options::overwrite_existing);
  }
  Process worker("rl-worker", {"--model", dir, "--port", "0", "--kv-cache-gb", "0.02",
                               "--threads", "1"});
  const std::string addr = StartServer(worker);
  ASSERT_FALSE(addr.empty()) << worker.Log();
  auto ch = grpc::CreateChannel(addr, grpc::InsecureChannelCredentials());
  auto stub = rl::v1::Worker::NewStub(ch);
  auto admin = rl::v1::Admin::NewStub(ch);
  auto greedy = [&] {
    rl::v1::GenerateFinal f;
    EXPECT_TRUE(Generate(stub.get(), Greedy(), &f, nullptr, "").ok());
    return std::vector<int32_t>(f.output_ids().begin(), f.output_ids().end());
  };
  auto checksum = [&] {
    rl::v1::WeightsCheckerRequest req;
    req.set_action(rl::v1::WEIGHTS_CHECKER_ACTION_CHECKSUM);
    rl::v1::WeightsCheckerResponse resp;
    grpc::ClientContext ctx;
    EXPECT_TRUE(admin->WeightsChecker(&ctx, req, &resp).ok());
    return resp.rank_sha256();
  };
  const auto ids = greedy();
  const auto sum = checksum();
  const std::string file = dir + "/model.safetensors";
  const auto size = fs::file_size(file);
  WriteText(file, std::string(size, '\0'));  // the usual open("wb") save over `latest/`
  EXPECT_EQ(greedy(), ids);
  EXPECT_EQ(checksum(), sum);
  fs::resize_file(file, 0);
  EXPECT_EQ(greedy(), ids);
  EXPECT_EQ(checksum(), sum);
  ASSERT_TRUE(worker.Alive());

  // An update folder: load a perturbed copy, then wreck its file.
  RawCheckpoint c = LoadStories();
  {
    const auto o = c.header["model.embed_tokens.weight"]["data_offsets"];
    float* p = reinterpret_cast<float*>(c.data.data() + o[0].get<uint64_t>());
    for (uint64_t i = 0; i < (o[1].get<uint64_t>() - o[0].get<uint64_t>()) / 4; ++i) p[i] *= -1;
  }
  const std::string upd = MakeFolder("owned-update", Serialize(c.header, c.data));
  rl::v1::UpdateWeightsFromDiskRequest req;
  req.set_model_path(upd);
  rl::v1::AdminResponse resp;
  grpc::ClientContext ctx;
  ASSERT_TRUE(admin->UpdateWeightsFromDisk(&ctx, req, &resp).ok());
  const auto new_ids = greedy();
  const auto new_sum = checksum();
  EXPECT_NE(new_sum, sum);
  WriteText(upd + "/model.safetensors", std::string(100, '\0'));
  EXPECT_EQ(greedy(), new_ids);
  EXPECT_EQ(checksum(), new_sum);
  fs::resize_file(upd + "/model.safetensors", 0);
  EXPECT_EQ(greedy(), new_ids);
  ASSERT_TRUE(worker.Alive()) << worker.Log();
  std::printf("[peak-rss] worker (owned weights) %lld MiB\n",
              static_cast<long long>(worker.PeakRssMiB()));
}

// Keys from files and the environment; a key on the command line is scrubbed and warned about.
TEST(KeySourcesTest, FilesEnvironmentAndCommandLine) {
  Process flagged("rl-worker", {"--model", Stories(), "--port", "0", "--kv-cache-gb", "0.02",
                                "--threads", "1", "--admin-api-key", "plain-cmdline-secret"});
  ASSERT_FALSE(StartServer(flagged).empty()) << flagged.Log();
  EXPECT_THAT(flagged.Cmdline(), ::testing::Not(::testing::HasSubstr("plain-cmdline-secret")));
  EXPECT_THAT(flagged.Log(), ::testing::HasSubstr("given on the command line"));
  EXPECT_THAT(flagged.Log(), ::testing::Not(::testing::HasSubstr("plain-cmdline-secret")));

  Process missing("rl-worker", {"--model", Stories(), "--admin-api-key-file", "/no/such/key"});
  for (int i = 0; i < 200 && missing.Alive(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_FALSE(missing.Alive());
  EXPECT_NE(missing.exit_status(), 0);
  EXPECT_THAT(missing.Log(), ::testing::HasSubstr("--admin-api-key-file"));

  const std::string key_file = TempPath("router.key");
  WriteText(key_file, "router-file-key\n");
  Process router("rl-router", {"--tokenizer", Stories(), "--port", "0", "--admin-api-key-file",
                               key_file},
                 {{"RL_API_KEY", "router-env-key"}});
  const std::string addr = StartServer(router);
  ASSERT_FALSE(addr.empty()) << router.Log();
  auto stub = rl::v1::Router::NewStub(grpc::CreateChannel(addr, grpc::InsecureChannelCredentials()));
  rl::v1::WorkerListResponse resp;
  {
    grpc::ClientContext ctx;
    ctx.AddMetadata("authorization", "Bearer router-file-key");
    EXPECT_TRUE(stub->ListWorkers(&ctx, {}, &resp).ok());
  }
  {
    grpc::ClientContext ctx;
    ctx.AddMetadata("authorization", "Bearer router-env-key");
    EXPECT_EQ(stub->ListWorkers(&ctx, {}, &resp).error_code(), StatusCode::PERMISSION_DENIED);
  }
  {
    rl::v1::RetrieveFromTextRequest req;
    req.set_text("hi");
    rl::v1::RetrieveFromTextResponse r;
    grpc::ClientContext ctx;
    ctx.AddMetadata("authorization", "Bearer router-env-key");
    EXPECT_TRUE(stub->RetrieveFromText(&ctx, req, &r).ok());
  }
}

}  // namespace
}  // namespace rl::testing
