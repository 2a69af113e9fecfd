// common/sglang: the tokenizer archive (GetTokenizer) and what a request id and a request's
// fields carry (seed=, episode=, refused fields, sampling defaults).
#include <zip.h>

#include <filesystem>
#include <set>
#include <string>

#include "common/sglang/sglang_request.h"
#include "common/sglang/tokenizer_bundle.h"
#include "common/sha256.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/test_data.h"

namespace rl::sglang {
namespace {

using ::testing::HasSubstr;

TEST(TokenizerBundleTest, ZipsTheTokenizerFiles) {
  auto archive = BuildTokenizerArchive(rl::testing::Stories());
  ASSERT_TRUE(archive.ok()) << archive.status();
  EXPECT_EQ(archive->sha256, Sha256Hex(archive->zip));
  zip_error_t error;
  zip_error_init(&error);
  zip_source_t* src = zip_source_buffer_create(archive->zip.data(), archive->zip.size(), 0, &error);
  ASSERT_NE(src, nullptr);
  zip_t* z = zip_open_from_source(src, ZIP_RDONLY, &error);
  ASSERT_NE(z, nullptr) << zip_error_strerror(&error);
  std::set<std::string> names;
  for (zip_int64_t i = 0; i < zip_get_num_entries(z, 0); ++i) names.insert(zip_get_name(z, i, 0));
  EXPECT_TRUE(names.count("tokenizer.json"));
  EXPECT_TRUE(names.count("tokenizer_config.json"));
  EXPECT_TRUE(names.count("config.json"));
  EXPECT_FALSE(names.count("model.safetensors"));
  zip_stat_t st;
  ASSERT_EQ(zip_stat(z, "tokenizer.json", 0, &st), 0);
  EXPECT_EQ(st.size, std::filesystem::file_size(rl::testing::Stories() + "/tokenizer.json"));
  zip_close(z);

  rl::testing::TempDir empty;
  EXPECT_EQ(BuildTokenizerArchive(empty.path()).status().code(), absl::StatusCode::kNotFound);
}

TEST(EpisodeFromRequestIdTest, ReadsTheTokenAndStopsAtTheGatewaysSuffix) {
  auto episode = [](absl::string_view id) { return EpisodeFromRequestId(id); };
  EXPECT_FALSE(episode("chatcmpl-123")->has_value());
  EXPECT_EQ(**episode("episode=ep_7"), "ep_7");
  // The gateway appends "-<uuid>" to an x-request-id header.
  EXPECT_EQ(**episode("episode=ep_7-0b9e3f1c-8a2d-4f5e-9c1b-2d3e4f5a6b7c"), "ep_7");
  EXPECT_EQ(**episode("run.3/episode=a.b_c/seed=4"), "a.b_c");
  EXPECT_EQ(**episode("seed=4;episode=x"), "x");
  // Not a token: part of a longer word.
  EXPECT_FALSE(episode("myepisode=x")->has_value());
  // Malformed: empty, a character outside the id alphabet, too long, two tokens.
  EXPECT_THAT(episode("episode=").status().message(), HasSubstr("episode= must be followed"));
  EXPECT_EQ(episode("episode=a b").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(episode("episode=" + std::string(kMaxEpisodeIdBytes + 1, 'a')).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(episode("episode=" + std::string(kMaxEpisodeIdBytes, 'a')).ok());
  EXPECT_THAT(episode("episode=a/episode=b").status().message(), HasSubstr("more than one"));
}

TEST(SglangRequestTest, SamplingZerosAreDefaultsAndSeedsMustAgree) {
  sgl::GenerateRequest in;
  auto s = ReadSampling(in.sampling_params(), 64);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->top_p, 1.0);
  EXPECT_EQ(s->top_k, -1);
  EXPECT_EQ(s->repetition_penalty, 1.0);
  EXPECT_EQ(s->n, 1);
  in.mutable_sampling_params()->set_n(65);
  EXPECT_THAT(ReadSampling(in.sampling_params(), 64).status().message(),
              HasSubstr("sampling_params.n: must be in [1, 64]"));
  in.set_request_id("episode=e/seed=5");
  EXPECT_EQ(**ReadSeed(in), 5u);
  (*in.mutable_sampling_params()->mutable_custom_params()->mutable_fields())["seed"]
      .set_number_value(6);
  EXPECT_THAT(ReadSeed(in).status().message(), HasSubstr("differs from custom_params.seed 6"));
}

TEST(SglangRequestTest, InputIdsAndRefusedFields) {
  sgl::GenerateRequest in;
  EXPECT_THAT(ReadInputIds(in).status().message(), HasSubstr("tokenized: required"));
  in.mutable_tokenized()->add_input_ids(3);
  in.mutable_tokenized()->add_input_ids(0x80000000u);
  EXPECT_THAT(ReadInputIds(in).status().message(), HasSubstr("out of range"));
  in.set_lora_id("x");
  EXPECT_THAT(CheckSupported(in).message(), HasSubstr("lora_id: LoRA"));
}

}  // namespace
}  // namespace rl::sglang
