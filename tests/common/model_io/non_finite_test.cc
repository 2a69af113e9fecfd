// Non-finite weights: OpenCheckpoint refuses NaN / ±Inf in F32, F16 and BF16 tensors, naming the
// tensor, the value and the first bad element, found while the file is read (pieces on several
// threads, misaligned tensors after); SetNonFiniteWeightsAllowed and the scoped override accept
// them. FindNonFinite against a plain per-element reference.
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <mutex>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/model_io/dtype.h"
#include "common/model_io/file_read.h"
#include "common/model_io/safetensors.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/test_data.h"

namespace rl::model_io {
namespace {

using ::testing::HasSubstr;

std::string TempDir() {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  return rl::testing::ProcessTempDir(absl::StrCat("non_finite_", info->name()));
}

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

// `n` finite values of `dtype` (1 + i / n), with `bad` values put at the given indices.
std::vector<uint8_t> Values(DType dtype, int64_t n, std::vector<std::pair<int64_t, float>> bad) {
  std::vector<float> f(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) f[i] = 1.0f + static_cast<float>(i) / static_cast<float>(n);
  for (auto [i, v] : bad) f[static_cast<size_t>(i)] = v;
  std::vector<uint8_t> out(static_cast<size_t>(n * DTypeSize(dtype)));
  ConvertFromF32(f.data(), n, dtype, out.data());
  return out;
}

// Writes DIR/model.safetensors with a small finite tensor "a" first and `t` after it.
std::string WriteModel(const std::string& name, DType dtype, std::vector<int64_t> shape,
                       const std::vector<uint8_t>& bytes) {
  const std::string dir = TempDir() + "/" + name;
  std::filesystem::create_directories(dir);
  const std::vector<uint8_t> a = Values(DType::kF32, 16, {});
  EXPECT_TRUE(WriteSafetensors(dir + "/model.safetensors",
                               {{"a", DType::kF32, {16}, a}, {"t", dtype, std::move(shape), bytes}})
                  .ok());
  return dir;
}

absl::Status Open(const std::string& dir) { return OpenCheckpoint(dir).status(); }

TEST(FindNonFiniteTest, MatchesPerElementReference) {
  for (DType dtype : {DType::kF32, DType::kBF16, DType::kF16}) {
    for (int64_t n : {0, 1, 127, 128, 129, 1000}) {
      EXPECT_EQ(FindNonFinite(dtype, Values(dtype, n, {}).data(), n), -1);
      for (int64_t at : {int64_t{0}, n / 2, n - 1}) {
        if (n == 0) continue;
        for (float v : {kNaN, kInf, -kInf}) {
          const std::vector<uint8_t> b = Values(dtype, n, {{at, v}});
          EXPECT_EQ(FindNonFinite(dtype, b.data(), n), at) << DTypeName(dtype) << " n " << n;
          EXPECT_STREQ(NonFiniteName(dtype, b.data() + at * DTypeSize(dtype)),
                       std::isnan(v) ? "NaN" : (v > 0 ? "+Inf" : "-Inf"));
        }
      }
    }
  }
  // The largest finite values and the smallest subnormals are finite.
  const std::vector<uint16_t> edge16 = {0x7f7f, 0xff7f, 0x0001, 0x8001};  // bf16
  EXPECT_EQ(FindNonFinite(DType::kBF16, edge16.data(), 4), -1);
  const std::vector<uint16_t> half = {0x7bff, 0xfbff, 0x0001};  // f16 max, -max, subnormal
  EXPECT_EQ(FindNonFinite(DType::kF16, half.data(), 3), -1);
  const std::vector<uint16_t> half_inf = {0x7bff, 0x7c00};
  EXPECT_EQ(FindNonFinite(DType::kF16, half_inf.data(), 2), 1);
  // Integer tensors are never "non-finite", and misaligned data is read correctly.
  std::vector<uint8_t> shifted(1 + 4 * 200);
  const std::vector<uint8_t> f = Values(DType::kF32, 200, {{150, kNaN}});
  std::memcpy(shifted.data() + 1, f.data(), f.size());
  EXPECT_EQ(FindNonFinite(DType::kF32, shifted.data() + 1, 200), 150);
  EXPECT_EQ(FindNonFinite(DType::kI32, f.data(), 200), -1);
}

TEST(NonFiniteCheckpointTest, LastElementOfBf16TensorIsRefusedByName) {
  const int64_t rows = 8, cols = 64;
  const std::string dir = WriteModel("bf16", DType::kBF16, {rows, cols},
                                     Values(DType::kBF16, rows * cols, {{rows * cols - 1, kNaN}}));
  const absl::Status s = Open(dir);
  ASSERT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(s.message(), HasSubstr("tensor 't' (BF16 [8, 64]) holds NaN at element 511 "
                                     "(index [7, 63])"));
  EXPECT_THAT(s.message(), HasSubstr("model.safetensors"));
  EXPECT_THAT(s.message(), HasSubstr("--allow-non-finite-weights"));
}

TEST(NonFiniteCheckpointTest, EveryFloatDTypeAndBothInfinities) {
  for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16}) {
    for (float v : {kInf, -kInf, kNaN}) {
      const std::string dir = WriteModel(absl::StrCat(DTypeName(dtype), v), dtype, {100},
                                         Values(dtype, 100, {{37, v}, {90, kNaN}}));
      const absl::Status s = Open(dir);
      ASSERT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << DTypeName(dtype);
      const char* name = std::isnan(v) ? "NaN" : (v > 0 ? "+Inf" : "-Inf");
      EXPECT_THAT(s.message(), HasSubstr(absl::StrCat("holds ", name, " at element 37 ")));
    }
  }
  // Finite data of every dtype opens; integer tensors are not checked.
  for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16}) {
    EXPECT_TRUE(
        Open(WriteModel(absl::StrCat("ok", DTypeName(dtype)), dtype, {100}, Values(dtype, 100, {})))
            .ok());
  }
  std::vector<uint8_t> ints(400, 0xff);  // 0xffffffff would be a NaN as F32
  EXPECT_TRUE(Open(WriteModel("i32", DType::kI32, {100}, ints)).ok());
}

TEST(NonFiniteCheckpointTest, AllowedProcessWideOrOnThisThread) {
  const std::string dir =
      WriteModel("nan", DType::kF32, {4}, Values(DType::kF32, 4, {{0, kNaN}, {3, kInf}}));
  EXPECT_FALSE(Open(dir).ok());
  {
    ScopedNonFiniteWeightsAllowed allow;
    EXPECT_TRUE(NonFiniteWeightsAllowed());
    auto ckpt = OpenCheckpoint(dir);
    ASSERT_TRUE(ckpt.ok()) << ckpt.status();
    float v[4];
    std::memcpy(v, ckpt->Find("t")->data.data(), sizeof(v));
    EXPECT_TRUE(std::isnan(v[0]));
    EXPECT_TRUE(std::isinf(v[3]));
  }
  EXPECT_FALSE(NonFiniteWeightsAllowed());
  EXPECT_FALSE(Open(dir).ok());
  SetNonFiniteWeightsAllowed(true);
  EXPECT_TRUE(Open(dir).ok());
  SetNonFiniteWeightsAllowed(false);
  EXPECT_FALSE(Open(dir).ok());
}

// A misaligned tensor (an F32 after 3 bytes of U8, header not padded) whose elements straddle the
// read pieces, and a bad element just past the first piece boundary of an aligned tensor.
TEST(NonFiniteCheckpointTest, MisalignedTensorsAndPieceBoundaries) {
  const int64_t n = static_cast<int64_t>(kCheckPieceBytes / 4) * 3;  // three pieces of F32
  const std::vector<uint8_t> bad = Values(DType::kF32, n, {{n - 1, -kInf}});
  const std::string header = absl::StrCat(
      R"({"u":{"dtype":"U8","shape":[3],"data_offsets":[0,3]},)", R"("t":{"dtype":"F32","shape":[)",
      n, R"(],"data_offsets":[3,)", 3 + 4 * n, "]}}");
  std::vector<uint8_t> file(8);
  for (int i = 0; i < 8; ++i) file[i] = static_cast<uint8_t>(header.size() >> (8 * i));
  file.insert(file.end(), header.begin(), header.end());
  file.insert(file.end(), {1, 2, 3});
  file.insert(file.end(), bad.begin(), bad.end());
  const std::string dir = TempDir() + "/misaligned";
  std::filesystem::create_directories(dir);
  {
    std::FILE* f = std::fopen((dir + "/model.safetensors").c_str(), "wb");
    ASSERT_NE(f, nullptr);
    ASSERT_EQ(std::fwrite(file.data(), 1, file.size(), f), file.size());
    std::fclose(f);
  }
  const absl::Status s = Open(dir);
  ASSERT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(s.message(), HasSubstr(absl::StrCat("holds -Inf at element ", n - 1, " ")));

  // Aligned: the elements right before and after the first piece boundary inside "t" (the data
  // region starts after the 8-byte length and the padded header; "a" takes 64 bytes).
  const std::string probe = WriteModel("probe", DType::kF32, {n}, Values(DType::kF32, n, {}));
  std::vector<uint8_t> len(8);
  {
    std::FILE* f = std::fopen((probe + "/model.safetensors").c_str(), "rb");
    ASSERT_NE(f, nullptr);
    ASSERT_EQ(std::fread(len.data(), 1, 8, f), 8u);
    std::fclose(f);
  }
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = header_len << 8 | len[i];
  const int64_t t_begin = static_cast<int64_t>(8 + header_len + 64);
  const int64_t after = (static_cast<int64_t>(kCheckPieceBytes) - t_begin) / 4;
  for (int64_t at : {after - 1, after, after + 1}) {
    const std::string d = WriteModel(absl::StrCat("aligned", at), DType::kF32, {n},
                                     Values(DType::kF32, n, {{at, kNaN}, {n - 1, kNaN}}));
    const absl::Status a = Open(d);
    ASSERT_FALSE(a.ok());
    EXPECT_THAT(a.message(), HasSubstr(absl::StrCat("holds NaN at element ", at, " ")));
  }
}

// A file big enough to be read by several threads: the earliest bad element is reported whatever
// thread finds one first, also when a later thread's range holds one too.
TEST(NonFiniteCheckpointTest, EarliestAcrossReadingThreads) {
  const int64_t n = (int64_t{130} << 20) / 2;  // 130 MiB of BF16: two 64 MiB thread ranges
  const std::string dir =
      WriteModel("big", DType::kBF16, {n},
                 Values(DType::kBF16, n, {{n / 2 - 5, kInf}, {n - 1, kNaN}, {n - 3, kNaN}}));
  const absl::Status s = Open(dir);
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.message(), HasSubstr(absl::StrCat("holds +Inf at element ", n / 2 - 5, " ")));
  std::filesystem::remove_all(dir);
}

TEST(OwnedFileReaderTest, PiecesCoverTheRestAtPieceBoundaries) {
  const std::string path = TempDir() + "/f";
  const size_t size = 3 * kCheckPieceBytes + 12345;
  {
    std::vector<uint8_t> bytes(size);
    for (size_t i = 0; i < size; ++i) bytes[i] = static_cast<uint8_t>(i * 7);
    std::FILE* f = std::fopen(path.c_str(), "wb");
    ASSERT_NE(f, nullptr);
    ASSERT_EQ(std::fwrite(bytes.data(), 1, size, f), size);
    std::fclose(f);
  }
  auto reader = OwnedFileReader::Open(path, int64_t{1} << 30);
  ASSERT_TRUE(reader.ok()) << reader.status();
  ASSERT_TRUE(reader->ReadPrefix(1001).ok());
  EXPECT_EQ(reader->bytes()[1000], static_cast<uint8_t>(7000));
  std::mutex mu;
  std::vector<std::pair<size_t, size_t>> pieces;
  auto file = reader->ReadRest([&](size_t offset, absl::Span<const uint8_t> piece) {
    for (size_t i = 0; i < piece.size(); ++i) {
      ASSERT_EQ(piece[i], static_cast<uint8_t>((offset + i) * 7));
    }
    std::lock_guard<std::mutex> lock(mu);
    pieces.emplace_back(offset, piece.size());
  });
  ASSERT_TRUE(file.ok()) << file.status();
  ASSERT_EQ((*file)->bytes().size(), size);
  std::sort(pieces.begin(), pieces.end());
  size_t cursor = 1001;
  for (const auto& [offset, len] : pieces) {
    EXPECT_EQ(offset, cursor);
    EXPECT_LE(len, kCheckPieceBytes);
    EXPECT_TRUE((offset + len) % kCheckPieceBytes == 0 || offset + len == size) << offset;
    cursor = offset + len;
  }
  EXPECT_EQ(cursor, size);
}

}  // namespace
}  // namespace rl::model_io
