// Bad weights to real processes: tensor-update headers checked before any allocation, broken
// checkpoints on disk (each leaves the old weights serving), and a checkpoint rewritten or
// truncated after it was loaded (the worker owns its copy).
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "tests/reliability/bad_input_test_util.h"

namespace rl::testing {
namespace {

namespace fs = std::filesystem;
using grpc::StatusCode;

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
      over_budget.push_back(
          chunk(absl::StrCat("model.layers.", l, ".mlp.", p, ".weight"), {172, 64}));
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
    const grpc::Status s = SendChunks(chunks);
    ExpectError(s, {StatusCode::INVALID_ARGUMENT}, name);
    if (name == "offset wraps") {  // checked without a sum that wraps, and never printing one
      EXPECT_THAT(s.error_message(),
                  ::testing::HasSubstr("8 bytes at offset 18446744073709551613 do not fit"));
      EXPECT_THAT(s.error_message(), ::testing::Not(::testing::HasSubstr(", 5)")));
    }
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
      Json c = Json::parse(ReadFile(dir + "/config.json"));
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
      {"deep JSON header", file_case([&] {
         std::string h = std::string(100000, '[') + std::string(100000, ']');
         std::string out(8, '\0');
         for (int i = 0; i < 8; ++i) out[i] = static_cast<char>(h.size() >> (8 * i));
         return out + h;
       }()),
       kInvalid},
      {"offsets past the end",
       file_case(with([&](Json& h) { h[first]["data_offsets"][1] = base.data.size() * 4; })),
       kInvalid},
      {"overlapping offsets", file_case(with([&](Json& h) {
         h[base.order[1]]["data_offsets"] = h[first]["data_offsets"];
       })),
       kInvalid},
      {"reversed offsets", file_case(with([&](Json& h) {
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
      {"overflowing shape", file_case(with([&](Json& h) {
         h[first]["shape"] = {int64_t{1} << 40, int64_t{1} << 40, int64_t{1} << 40};
       })),
       kInvalid},
      {"wrong shape, same bytes", file_case(with([&](Json& h) {
         auto s = h["model.embed_tokens.weight"]["shape"];
         h["model.embed_tokens.weight"]["shape"] = {s[1], s[0]};
       })),
       kInvalid},
      {"missing tensor", file_case([&] {
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
      {"no config.json", config_case([](const std::string& d) { fs::remove(d + "/config.json"); }),
       kInvalidOrMissing},
      {"config.json not JSON",
       config_case([](const std::string& d) { WriteText(d + "/config.json", "{not json"); }),
       kInvalid},
      {"config.json deep JSON", config_case([](const std::string& d) {
         WriteText(d + "/config.json", std::string(50000, '[') + std::string(50000, ']'));
       }),
       kInvalid},
      {"config.json is a directory", config_case([](const std::string& d) {
         fs::remove(d + "/config.json");
         fs::create_directory(d + "/config.json");
       }),
       kInvalid},
      {"config.json is a FIFO", config_case([](const std::string& d) {
         fs::remove(d + "/config.json");
         mkfifo((d + "/config.json").c_str(), 0600);
       }),
       kInvalid},
      {"model.safetensors is a directory", config_case([](const std::string& d) {
         fs::remove(d + "/model.safetensors");
         fs::create_directory(d + "/model.safetensors");
       }),
       kInvalid},
      {"model.safetensors is a FIFO", config_case([](const std::string& d) {
         fs::remove(d + "/model.safetensors");
         mkfifo((d + "/model.safetensors").c_str(), 0600);
       }),
       kInvalid},
      {"index names a missing shard", config_case([](const std::string& d) {
         WriteText(d + "/model.safetensors.index.json",
                   R"({"weight_map": {"model.norm.weight": "model-00009.safetensors"}})");
       }),
       kInvalidOrMissing},
      {"index escapes the folder", config_case([](const std::string& d) {
         WriteText(d + "/model.safetensors.index.json",
                   R"({"weight_map": {"model.norm.weight": "../../etc/passwd"}})");
       }),
       kInvalid},
      {"index deep JSON", config_case([](const std::string& d) {
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

// A checkpoint rewritten or truncated after it was loaded changes nothing and never faults:
// for --model and for an UpdateWeightsFromDisk folder.
TEST(WeightsOwnedTest, CheckpointRewrittenAfterLoad) {
  const std::string dir = TempPath("owned-model");
  fs::create_directories(dir);
  for (const char* f : {"config.json", "model.safetensors", "tokenizer.json"}) {
    fs::copy_file(Stories() + "/" + f, dir + "/" + f, fs::copy_options::overwrite_existing);
  }
  Process worker("rl-worker",
                 {"--model", dir, "--port", "0", "--kv-cache-gb", "0.02", "--threads", "1"});
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

}  // namespace
}  // namespace rl::testing
