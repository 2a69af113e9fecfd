// Golden test on a real trained model: stories260K (float32 and bfloat16 copies) against
// reference logits and greedy tokens computed in float64, on each SIMD target the CPU kernels
// can take here.
#include <cmath>
#include <fstream>
#include <sstream>
#include <tuple>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "services/worker/model/cpu_model_runner.h"
#include "tests/testing/simd_targets.h"
#include "tests/worker/model/test_util.h"

namespace rl::model {
namespace {

using testing::DataDir;
using testing::Greedy;
using testing::ReadJson;

struct Case {
  std::string model;
  std::string golden;
  bool exact_logits;
};

class StoriesGoldenTest : public ::testing::TestWithParam<std::tuple<Case, int64_t>> {};

TEST_P(StoriesGoldenTest, LogitsAndGreedyTokens) {
  const Case& c = std::get<0>(GetParam());
  ::rl::testing::ScopedSimdTarget target(std::get<1>(GetParam()));
  const nlohmann::json golden = ReadJson(DataDir() + "/stories260K/" + c.golden);
  RunnerOptions opts;
  opts.model_dir = DataDir() + "/" + c.model;
  opts.num_kv_slots = 256;
  auto runner = CreateCpuModelRunner(opts);
  ASSERT_TRUE(runner.ok()) << runner.status();
  const auto prompt = golden["prompt_ids"].get<std::vector<int32_t>>();
  const auto expected = golden["generated_ids"].get<std::vector<int32_t>>();
  auto result = Greedy(runner->get(), prompt, static_cast<int>(expected.size()));
  EXPECT_EQ(result.tokens, expected);
  if (c.exact_logits) {
    const auto ref = golden["first_step_logits"].get<std::vector<double>>();
    ASSERT_EQ(result.first_logits.size(), ref.size());
    double max_diff = 0;
    for (size_t i = 0; i < ref.size(); ++i) {
      max_diff = std::max(max_diff, std::abs(result.first_logits[i] - ref[i]));
    }
    EXPECT_LE(max_diff, 1e-4);
    RecordProperty("max_abs_diff", std::to_string(max_diff));
  }
}

INSTANTIATE_TEST_SUITE_P(
    Models, StoriesGoldenTest,
    ::testing::Combine(::testing::Values(Case{"stories260K", "golden_greedy.json", true},
                                         Case{"stories260K", "golden_greedy_bos_only.json", true},
                                         Case{"stories260K-bf16", "golden_greedy.json", false},
                                         Case{"stories260K-bf16", "golden_greedy_bos_only.json",
                                              false}),
                       ::testing::ValuesIn(::rl::testing::SimdTargets())),
    [](const auto& info) {
      const Case& c = std::get<0>(info.param);
      return std::string(c.model == "stories260K" ? "F32" : "BF16") +
             (c.golden == "golden_greedy.json" ? "_Prompt_" : "_BosOnly_") +
             ::rl::testing::SimdTargetName(std::get<1>(info.param));
    });

}  // namespace
}  // namespace rl::model
