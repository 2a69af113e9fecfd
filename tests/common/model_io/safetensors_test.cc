#include "common/model_io/safetensors.h"

#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/test_data.h"

namespace rl::model_io {
namespace {

using ::testing::HasSubstr;

std::string TempDir(const std::string& name) {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  return rl::testing::ProcessTempDir(
      absl::StrCat("model_io_", info->test_suite_name(), "_", info->name(), "_", name));
}

// Builds raw safetensors bytes from a header text and a data region.
std::vector<uint8_t> Raw(const std::string& header, size_t data_bytes, int64_t len_override = -1) {
  std::vector<uint8_t> out(8);
  uint64_t n = len_override >= 0 ? static_cast<uint64_t>(len_override) : header.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<uint8_t>(n >> (8 * i));
  out.insert(out.end(), header.begin(), header.end());
  out.resize(out.size() + data_bytes, 0x11);
  return out;
}

absl::Status Parse(const std::vector<uint8_t>& bytes) {
  return ParseSafetensors(absl::MakeConstSpan(bytes), "test.safetensors").status();
}

void ExpectError(const std::vector<uint8_t>& bytes, const std::string& substr) {
  absl::Status s = Parse(bytes);
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr(substr));
}

TEST(SafetensorsParseTest, ValidTwoTensors) {
  const std::string h =
      R"({"a":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]},)"
      R"("b":{"dtype":"BF16","shape":[3],"data_offsets":[16,22]},"__metadata__":{"k":"v"}})";
  auto views = ParseSafetensors(absl::MakeConstSpan(Raw(h, 22)), "x");
  ASSERT_TRUE(views.ok()) << views.status();
  ASSERT_EQ(views->size(), 2u);
}

TEST(SafetensorsParseTest, MalformedFilesAreClearErrors) {
  const std::string ok_entry = R"("a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]})";
  ExpectError({1, 2, 3}, "truncated");
  ExpectError(Raw("{" + ok_entry + "}", 8, 1 << 20), "header length");
  ExpectError(Raw("{" + ok_entry + "}", 8, int64_t{0x7fffffffffffffff}), "header length");
  ExpectError(Raw("{\"a\": [1, 2", 8), "not valid JSON");
  ExpectError(Raw("[1,2,3]", 0), "not a JSON object");
  ExpectError(Raw(R"({"a":{"dtype":"F33","shape":[2],"data_offsets":[0,8]}})", 8),
              "unknown dtype 'F33'");
  ExpectError(Raw(R"({"a":{"dtype":7,"shape":[2],"data_offsets":[0,8]}})", 8), "dtype");
  ExpectError(Raw(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,80]}})", 8), "out of range");
  ExpectError(Raw(R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8),
              "needs 12 bytes");
  ExpectError(Raw(R"({"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", 8), "non-negative");
  ExpectError(Raw(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})", 8), "reversed");
  ExpectError(Raw(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0]}})", 8), "data_offsets");
  ExpectError(Raw(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                  R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                  12),
              "overlap");
  ExpectError(Raw(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                  R"("b":{"dtype":"F32","shape":[2],"data_offsets":[12,20]}})",
                  20),
              "hole");
  ExpectError(Raw("{" + ok_entry + "}", 12), "trailing");
  ExpectError(
      Raw(R"({"a":{"dtype":"F32","shape":[4611686018427387904,4],"data_offsets":[0,8]}})", 8),
      "overflows");
  // 2^61 x 8 bytes wraps a uint64 to 0: must not pass as an empty tensor.
  ExpectError(Raw(R"({"a":{"dtype":"F64","shape":[2305843009213693952],"data_offsets":[0,0]}})", 0),
              "overflows a 64-bit byte size");
  ExpectError(Raw(R"({"a":"nope"})", 0), "not an object");
}

TEST(SafetensorsParseTest, TruncatedPrefixesNeverCrash) {
  const std::string h = R"({"a":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]},)"
                        R"("b":{"dtype":"F16","shape":[3],"data_offsets":[16,22]}})";
  const auto full = Raw(h, 22);
  for (size_t n = 0; n < full.size(); ++n) {
    std::vector<uint8_t> prefix(full.begin(), full.begin() + n);
    EXPECT_FALSE(Parse(prefix).ok()) << n;
  }
  EXPECT_TRUE(Parse(full).ok());
}

TEST(SafetensorsParseTest, I64IsListedButFlagged) {
  const std::string h = R"({"ids":{"dtype":"I64","shape":[2],"data_offsets":[0,16]}})";
  auto views = ParseSafetensors(absl::MakeConstSpan(Raw(h, 16)), "x");
  ASSERT_TRUE(views.ok());
  EXPECT_EQ((*views)[0].dtype, DType::kI64);
  EXPECT_FALSE(IsFloatWeightDType((*views)[0].dtype));
}

TEST(SafetensorsFileTest, WriterReaderRoundTrip) {
  const std::string dir = TempDir("rt");
  std::vector<float> a = {1.0f, -2.0f, 3.5f, 0.25f, 7.0f, 8.0f};
  std::vector<uint16_t> b = {F32ToBf16(1.5f), F32ToBf16(-0.75f)};
  std::vector<uint8_t> empty;
  std::vector<TensorToWrite> tensors = {
      {"w.a", DType::kF32, {2, 3}, {reinterpret_cast<uint8_t*>(a.data()), a.size() * 4}},
      {"w.b", DType::kBF16, {2}, {reinterpret_cast<uint8_t*>(b.data()), b.size() * 2}},
      {"w.empty", DType::kF32, {0, 4}, absl::MakeConstSpan(empty)},
  };
  const std::string path = dir + "/model.safetensors";
  ASSERT_TRUE(WriteSafetensors(path, tensors, {{"format", "pt"}}).ok());
  auto ckpt = OpenSafetensorsFile(path);
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  ASSERT_EQ(ckpt->tensors().size(), 3u);
  const TensorView* va = ckpt->Find("w.a");
  ASSERT_NE(va, nullptr);
  EXPECT_EQ(va->shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(std::memcmp(va->data.data(), a.data(), 24), 0);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(va->data.data()) % 8, 0u);
  const TensorView* vb = ckpt->Find("w.b");
  ASSERT_NE(vb, nullptr);
  EXPECT_EQ(vb->dtype, DType::kBF16);
  std::vector<float> bf(2);
  ConvertToF32(DType::kBF16, vb->data.data(), 2, bf.data());
  EXPECT_EQ(bf, (std::vector<float>{1.5f, -0.75f}));
  EXPECT_EQ(ckpt->Find("missing"), nullptr);
  EXPECT_EQ(ckpt->Find("w.empty")->NumElements(), 0);

  // Wrong byte count is refused by the writer.
  tensors[0].shape = {7};
  EXPECT_FALSE(WriteSafetensors(dir + "/bad.safetensors", tensors).ok());
  std::filesystem::remove_all(dir);
}

TEST(SafetensorsFileTest, ShardedIndex) {
  const std::string dir = TempDir("sharded");
  std::vector<std::vector<float>> data;
  std::vector<TensorToWrite> tensors;
  for (int i = 0; i < 5; ++i) data.push_back(std::vector<float>(100, static_cast<float>(i)));
  for (int i = 0; i < 5; ++i) {
    tensors.push_back({absl::StrCat("t", i),
                       DType::kF32,
                       {10, 10},
                       {reinterpret_cast<uint8_t*>(data[i].data()), 400}});
  }
  ASSERT_TRUE(WriteCheckpoint(dir, tensors, /*max_shard_bytes=*/900).ok());
  EXPECT_TRUE(std::filesystem::exists(dir + "/model.safetensors.index.json"));
  EXPECT_TRUE(std::filesystem::exists(dir + "/model-00003-of-00003.safetensors"));
  auto ckpt = OpenCheckpoint(dir);
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  EXPECT_EQ(ckpt->tensors().size(), 5u);
  EXPECT_EQ(ckpt->files().size(), 3u);
  for (int i = 0; i < 5; ++i) {
    const TensorView* v = ckpt->Find(absl::StrCat("t", i));
    ASSERT_NE(v, nullptr);
    EXPECT_EQ(reinterpret_cast<const float*>(v->data.data())[99], static_cast<float>(i));
  }

  // An index naming a tensor its shard lacks is an error that names the tensor.
  {
    std::ofstream out(dir + "/model.safetensors.index.json");
    out << R"({"weight_map": {"t0": "model-00001-of-00003.safetensors",
                              "ghost": "model-00001-of-00003.safetensors"}})";
  }
  auto bad = OpenCheckpoint(dir);
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("ghost"));
  {
    std::ofstream out(dir + "/model.safetensors.index.json");
    out << R"({"weight_map": {"t0": "../etc/passwd"}})";
  }
  EXPECT_FALSE(OpenCheckpoint(dir).ok());
  {
    std::ofstream out(dir + "/model.safetensors.index.json");
    out << R"({"weight_map": )";
  }
  EXPECT_FALSE(OpenCheckpoint(dir).ok());
  std::filesystem::remove_all(dir);
}

TEST(SafetensorsFileTest, MissingAndCorruptFiles) {
  EXPECT_EQ(OpenCheckpoint("/nonexistent/dir").status().code(), absl::StatusCode::kNotFound);
  const std::string dir = TempDir("corrupt");
  {
    std::ofstream out(dir + "/model.safetensors", std::ios::binary);
    out << "garbage!garbage!";
  }
  auto ckpt = OpenCheckpoint(dir);
  ASSERT_FALSE(ckpt.ok());
  EXPECT_THAT(std::string(ckpt.status().message()), HasSubstr("model.safetensors"));
  std::filesystem::remove_all(dir);
}

TEST(SafetensorsFileTest, ReadsSharedStoriesCheckpoint) {
  const std::string data = rl::testing::DataDir();
  auto ckpt = OpenCheckpoint(data + "/stories260K");
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  const TensorView* e = ckpt->Find("model.embed_tokens.weight");
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(e->shape, (std::vector<int64_t>{512, 64}));
  EXPECT_EQ(e->dtype, DType::kF32);
  auto bf = OpenCheckpoint(data + "/stories260K-bf16");
  ASSERT_TRUE(bf.ok()) << bf.status();
  EXPECT_EQ(bf->Find("model.embed_tokens.weight")->dtype, DType::kBF16);
}

}  // namespace
}  // namespace rl::model_io
