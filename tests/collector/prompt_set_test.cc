// prompt_set.h: every row checked with its line named; sampling overrides.
#include "services/collector/prompt_set.h"

#include <fstream>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/test_data.h"

namespace rl::collector {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(PromptSet, RowsAreValidatedWithTheLineNamed) {
  EXPECT_THAT(ParsePromptRow(R"({"text":"hi"})", 3).status().message(),
              HasSubstr("prompt line 3: missing required field `index`"));
  EXPECT_THAT(ParsePromptRow(R"({"index":1})", 1).status().message(), HasSubstr("exactly one"));
  EXPECT_THAT(ParsePromptRow(R"({"index":1,"text":"a","input_ids":[1]})", 1).status().message(),
              HasSubstr("exactly one"));
  EXPECT_THAT(ParsePromptRow(R"({"index":"1","text":"a"})", 1).status().message(),
              HasSubstr("`index` is not"));
  EXPECT_THAT(ParsePromptRow(R"({"index":1,"input_ids":[1,-2]})", 1).status().message(),
              HasSubstr("not a token id"));
  EXPECT_THAT(ParsePromptRow(R"({"index":1,"text":"a","sampling_params":{"temprature":1}})", 9)
                  .status()
                  .message(),
              HasSubstr("unknown field sampling_params.temprature"));
  EXPECT_FALSE(ParsePromptRow("{not json", 1).ok());
  auto row = ParsePromptRow(
      R"({"index":5,"input_ids":[1,2],"sampling_params":{"temperature":0.5,"stop":["x"]},"answer":"42"})",
      1);
  ASSERT_TRUE(row.ok()) << row.status();
  EXPECT_EQ(row->index, 5);
  EXPECT_THAT(row->input_ids, ElementsAre(1, 2));
  EXPECT_EQ(row->metadata_json, R"({"answer":"42"})");
  rl::v1::SamplingParams p;
  p.set_temperature(1.0f);
  ASSERT_TRUE(ApplySamplingOverrides(row->sampling_json, &p).ok());
  EXPECT_FLOAT_EQ(p.temperature(), 0.5f);
  EXPECT_EQ(p.stop(0), "x");
}

TEST(PromptSet, DuplicateIndexFailsNamingBothLines) {
  const rl::testing::TempDir tmp;
  const std::string dir = tmp.path();
  const std::string path = dir + "/p.jsonl";
  std::ofstream(path) << "{\"index\":1,\"text\":\"a\"}\n\n{\"index\":2,\"text\":\"b\"}\n"
                         "{\"index\":1,\"text\":\"c\"}\n";
  auto set = LoadPromptSet(path);
  ASSERT_FALSE(set.ok());
  EXPECT_THAT(set.status().message(),
              HasSubstr("prompt line 4: duplicate index 1 (first on line 1)"));
}

}  // namespace
}  // namespace rl::collector
