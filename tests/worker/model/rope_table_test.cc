// RopeTable against transformers: inverse-frequency tables for every scaling type (default,
// linear, dynamic NTK, llama3) produced by transformers on CPU float32
// (tests/golden/model/rope_inv_freq.json, written by make_rope_fixtures.py) must match bit for
// bit, and the cos/sin rows use exactly the float32 angle position * inv_freq.
#include "services/worker/model/rope_table.h"

#include <cmath>
#include <cstring>
#include <filesystem>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/worker/model/test_util.h"

namespace rl::model {
namespace {

using model_io::RopeScaling;

uint32_t Bits(float f) {
  uint32_t b;
  std::memcpy(&b, &f, sizeof(b));
  return b;
}

nlohmann::json LoadFixture() {
  const std::string path = std::string(RL_HF_FIXTURE_DIR) + "/rope_inv_freq.json";
  EXPECT_TRUE(std::filesystem::exists(path)) << path;
  return testing::ReadJson(path);
}

model_io::ModelConfig ConfigOf(const nlohmann::json& c) {
  model_io::ModelConfig config;
  config.head_dim = c["head_dim"];
  config.rope_theta = c["rope_theta"];
  config.max_position_embeddings = c["max_position_embeddings"];
  const nlohmann::json& rs = c["rope_scaling"];
  if (rs.is_object()) {
    const std::string type = rs["rope_type"];
    config.rope_scaling.factor = rs.value("factor", 1.0);
    if (type == "linear") config.rope_scaling.type = RopeScaling::Type::kLinear;
    if (type == "dynamic") config.rope_scaling.type = RopeScaling::Type::kDynamic;
    if (type == "llama3") {
      config.rope_scaling.type = RopeScaling::Type::kLlama3;
      config.rope_scaling.low_freq_factor = rs["low_freq_factor"];
      config.rope_scaling.high_freq_factor = rs["high_freq_factor"];
      config.rope_scaling.original_max_position_embeddings = rs["original_max_position_embeddings"];
    }
  }
  return config;
}

TEST(RopeTableTest, InverseFrequenciesMatchTransformersBitForBit) {
  const nlohmann::json fx = LoadFixture();
  int cases = 0;
  for (const nlohmann::json& c : fx["cases"]) {
    const model_io::ModelConfig config = ConfigOf(c);
    const RopeTable table(config);
    const int64_t seq_len = c.value("seq_len", int64_t{1});
    const std::vector<float> got = table.InvFreq(seq_len);
    const auto want = c["inv_freq_bits"].get<std::vector<uint32_t>>();
    ASSERT_EQ(got.size(), want.size()) << c["name"];
    int mismatches = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      if (Bits(got[i]) != want[i]) ++mismatches;
      EXPECT_EQ(Bits(got[i]), want[i]) << c["name"] << " frequency " << i;
    }
    EXPECT_EQ(mismatches, 0) << c["name"];
    ++cases;
  }
  EXPECT_GE(cases, 13);
}

TEST(RopeTableTest, FillUsesTheFloat32Angle) {
  const nlohmann::json fx = LoadFixture();
  const model_io::ModelConfig config = ConfigOf(fx["cases"][7]);  // llama3_31_hd128
  const RopeTable table(config);
  const std::vector<float> f = table.InvFreq(1);
  std::vector<float> cos(f.size()), sin(f.size());
  for (int64_t pos : {0, 1, 1000, 4095, 32767}) {
    table.Fill(pos, pos + 1, cos.data(), sin.data());
    for (size_t i = 0; i < f.size(); ++i) {
      const float angle = static_cast<float>(pos) * f[i];
      EXPECT_EQ(cos[i], static_cast<float>(std::cos(static_cast<double>(angle))));
      EXPECT_EQ(sin[i], static_cast<float>(std::sin(static_cast<double>(angle))));
    }
  }
}

}  // namespace
}  // namespace rl::model
