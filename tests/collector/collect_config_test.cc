// collect_config.h: the flags' struct is validated, the flag at fault named.
#include "services/collector/collect_config.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace rl::collector {
namespace {

using ::testing::HasSubstr;

TEST(Collector, ConfigIsValidated) {
  CollectConfig c;
  c.out = "x";
  EXPECT_THAT(ValidateConfig(c).message(), HasSubstr("--router"));
  c.router = "a:1";
  c.prompts = "p";
  c.n = 0;
  EXPECT_THAT(ValidateConfig(c).message(), HasSubstr("--n"));
  c.n = 1;
  c.top_p = 0;
  EXPECT_THAT(ValidateConfig(c).message(), HasSubstr("--top-p"));
}

}  // namespace
}  // namespace rl::collector
