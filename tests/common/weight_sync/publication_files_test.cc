// common/weight_sync/{manifest,delta_file}: manifests round-trip and are refused when edited or
// malformed; delta files round-trip, a delta publication written from two checkpoints applies to
// the parent's bytes to give the child's digests, and a delta file cut at any length or edited
// is refused.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>

#include "common/model_io/safetensors.h"
#include "common/weight_sync/delta_file.h"
#include "common/weight_sync/manifest.h"
#include "gtest/gtest.h"

namespace rl::weight_sync {
namespace {

using model_io::DType;

class PublicationFilesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("rl_pub_test_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  // Writes a checkpoint of three tensors (BF16, F16, F32); `changed` perturbs 2% of each.
  std::string WriteCheckpoint(const std::string& name, uint64_t seed, bool changed) {
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> dist(0.0f, 0.1f);
    std::uniform_real_distribution<double> u(0.0, 1.0);
    std::vector<model_io::TensorToWrite> specs;
    store_.clear();
    const std::vector<std::pair<std::string, DType>> tensors = {
        {"a.weight", DType::kBF16}, {"b.weight", DType::kF16}, {"c.weight", DType::kF32}};
    for (const auto& [tname, dtype] : tensors) {
      const int64_t numel = 4096;
      std::vector<float> f(numel);
      for (float& v : f) v = dist(rng);
      if (changed) {
        std::mt19937_64 r2(seed * 31 + tname.size());
        for (float& v : f) {
          if (u(r2) < 0.02) v += 0.05f;
        }
      }
      auto& bytes = store_.emplace_back(numel * model_io::DTypeSize(dtype));
      model_io::ConvertFromF32(f.data(), numel, dtype, bytes.data());
      specs.push_back({tname, dtype, {64, 64}, bytes});
    }
    const std::string path = (dir_ / name).string();
    std::filesystem::create_directories(path);
    EXPECT_TRUE(model_io::WriteCheckpoint(path, specs).ok());
    return path;
  }

  std::filesystem::path dir_;
  std::vector<std::vector<uint8_t>> store_;
};

TEST_F(PublicationFilesTest, ManifestRoundTripsAndMatchesTheCheckpoint) {
  const std::string ckpt = WriteCheckpoint("v1", 1, false);
  absl::StatusOr<model_io::Checkpoint> c = model_io::OpenCheckpoint(ckpt);
  ASSERT_TRUE(c.ok());
  Manifest m = ManifestOfCheckpoint(*c, 1);
  ASSERT_TRUE(WriteManifest(ckpt, m).ok());
  absl::StatusOr<std::optional<Manifest>> read = ReadManifest(ckpt);
  ASSERT_TRUE(read.ok()) << read.status();
  ASSERT_TRUE(read->has_value());
  EXPECT_EQ((*read)->sha256, m.sha256);
  EXPECT_EQ((*read)->version, 1);
  EXPECT_EQ((*read)->tensors.size(), 3u);
  for (const auto& [name, view] : c->tensors()) {
    EXPECT_TRUE(
        CheckTensorAgainstManifest(m, name, model_io::DTypeName(view.dtype), view.shape, view.data)
            .ok());
  }
  // One flipped bit is named.
  const model_io::TensorView& a = c->tensors().at("a.weight");
  std::vector<uint8_t> bad(a.data.begin(), a.data.end());
  bad[5] ^= 1;
  absl::Status s = CheckTensorAgainstManifest(m, "a.weight", "BF16", a.shape, bad);
  EXPECT_TRUE(absl::IsFailedPrecondition(s));
  EXPECT_NE(s.message().find("'a.weight'"), std::string::npos) << s;
  EXPECT_TRUE(
      absl::IsFailedPrecondition(CheckTensorAgainstManifest(m, "nope", "BF16", a.shape, a.data)));
  // No manifest: nullopt.
  absl::StatusOr<std::optional<Manifest>> none = ReadManifest((dir_ / "missing").string());
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->has_value());
}

TEST_F(PublicationFilesTest, ManifestRefusesEditsAndBadFields) {
  const std::string ckpt = WriteCheckpoint("v1", 1, false);
  Manifest m = ManifestOfCheckpoint(*model_io::OpenCheckpoint(ckpt), 3, 2);
  const std::string good = ManifestToJson(m);
  ASSERT_TRUE(ParseManifest(good, "m").ok());
  auto replaced = [&](const std::string& from, const std::string& to) {
    std::string t = good;
    const size_t at = t.find(from);
    EXPECT_NE(at, std::string::npos) << from;
    return t.replace(at, from.size(), to);
  };
  const std::string one_digest = m.tensors.at("a.weight").sha256;
  std::string flipped = one_digest;
  flipped[0] = flipped[0] == '0' ? '1' : '0';
  for (const std::string& bad : {
           replaced(one_digest, flipped),                               // edited tensor digest
           replaced("\"version\": 3", "\"version\": -3"),               // negative
           replaced("\"parent_version\": 2", "\"parent_version\": 3"),  // not below version
           replaced("rlfleet.manifest.v1", "rlfleet.manifest.v9"),
           replaced("\"BF16\"", "\"I64\""),
           good.substr(0, good.size() / 2),  // cut
           std::string("[]"),
           std::string(100, '['),
       }) {
    EXPECT_TRUE(absl::IsInvalidArgument(ParseManifest(bad, "m").status())) << bad.substr(0, 80);
  }
}

TEST_F(PublicationFilesTest, DeltaPublicationAppliesToTheChildsDigests) {
  const std::string parent = WriteCheckpoint("v1", 1, false);
  const std::string child = WriteCheckpoint("v2", 1, true);
  ASSERT_TRUE(
      WriteManifest(parent, ManifestOfCheckpoint(*model_io::OpenCheckpoint(parent), 1)).ok());
  const std::string out = (dir_ / "v2-delta").string();
  absl::StatusOr<DeltaPublicationStats> stats =
      WriteDeltaPublication(parent, child, out, 2, std::nullopt);
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_GT(stats->changed_elements, 0);
  EXPECT_LT(stats->delta_bytes, stats->dense_bytes / 5);
  absl::StatusOr<DeltaFile> delta = ReadDeltaFile(out + "/" + kDeltaFileName, int64_t{1} << 30);
  ASSERT_TRUE(delta.ok()) << delta.status();
  EXPECT_EQ(delta->manifest.version, 2);
  EXPECT_EQ(delta->manifest.parent_version, 1);
  EXPECT_EQ(delta->manifest.parent_sha256, (*ReadManifest(parent))->sha256);
  EXPECT_EQ((*ReadManifest(out))->sha256, delta->manifest.sha256);
  // Apply to the parent's bytes: every tensor then matches the child's manifest.
  model_io::Checkpoint p = *model_io::OpenCheckpoint(parent);
  std::map<std::string, std::vector<uint8_t>> copy;
  for (const auto& [name, v] : p.tensors()) copy[name].assign(v.data.begin(), v.data.end());
  for (const DeltaTensor& t : delta->tensors) {
    ASSERT_TRUE(ApplyDelta(t.dtype, t.delta, absl::MakeSpan(copy[t.name])).ok());
  }
  for (const auto& [name, v] : p.tensors()) {
    EXPECT_TRUE(CheckTensorAgainstManifest(delta->manifest, name, model_io::DTypeName(v.dtype),
                                           v.shape, copy[name])
                    .ok())
        << name;
  }
}

TEST_F(PublicationFilesTest, DeltaFileCutOrEditedIsRefused) {
  const std::string parent = WriteCheckpoint("v1", 1, false);
  const std::string child = WriteCheckpoint("v2", 1, true);
  const std::string out = (dir_ / "d").string();
  ASSERT_TRUE(WriteDeltaPublication(parent, child, out, 5, 4).ok());
  std::ifstream in(out + "/" + kDeltaFileName, std::ios::binary);
  const std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(in)),
                                   std::istreambuf_iterator<char>());
  ASSERT_TRUE(ParseDeltaFile(bytes, "d").ok());
  // Every cut is refused (step 7 keeps the test fast while covering header and data region).
  for (size_t cut = 0; cut < bytes.size(); cut += (cut < 64 ? 1 : 7)) {
    absl::Span<const uint8_t> s(bytes.data(), cut);
    EXPECT_FALSE(ParseDeltaFile(s, "d").ok()) << "cut at " << cut;
  }
  // Trailing garbage.
  std::vector<uint8_t> longer = bytes;
  longer.push_back(1);
  EXPECT_FALSE(ParseDeltaFile(longer, "d").ok());
  // Same-length edits of the header, each caught by name.
  auto edited = [&](const std::string& from, const std::string& to) {
    std::string text(bytes.begin(), bytes.end());
    const size_t at = text.find(from);
    EXPECT_NE(at, std::string::npos) << from;
    text.replace(at, from.size(), to);
    return ParseDeltaFile(std::vector<uint8_t>(text.begin(), text.end()), "d").status();
  };
  absl::Status s = edited("\"encoding\":\"", "\"encodinx\":\"");
  EXPECT_NE(s.message().find("encoding"), std::string::npos) << s;
  // One hex digit of a tensor digest inside the embedded manifest: the manifest's own digest
  // no longer matches.
  std::string text(bytes.begin(), bytes.end());
  const size_t digest = text.find("\"sha256\":\"", text.find("\"tensors\":{")) + 10;
  const std::string one(1, text[digest] == 'a' ? 'b' : 'a');
  s = edited(text.substr(digest - 10, 11), text.substr(digest - 10, 10) + one);
  EXPECT_NE(s.message().find("edited"), std::string::npos) << s;
  // A parent without a manifest and no parent version named.
  EXPECT_TRUE(
      absl::IsInvalidArgument(WriteDeltaPublication(parent, child, out, 5, std::nullopt).status()));
  // A version not above the parent's.
  EXPECT_TRUE(absl::IsInvalidArgument(WriteDeltaPublication(parent, child, out, 4, 4).status()));
}

}  // namespace
}  // namespace rl::weight_sync
