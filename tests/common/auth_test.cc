#include "common/auth.h"

#include <cstdlib>

#include "gtest/gtest.h"

namespace rl {
namespace {

TEST(BearerAuth, DisabledWithoutKey) {
  BearerAuth auth("");
  EXPECT_FALSE(auth.enabled());
  EXPECT_TRUE(auth.CheckHeader(std::nullopt).ok());
}

TEST(BearerAuth, MissingWrongAndRightKeys) {
  BearerAuth auth("s3cret");
  EXPECT_EQ(auth.CheckHeader(std::nullopt).code(), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(auth.CheckHeader("").code(), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(auth.CheckHeader("Basic s3cret").code(), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(auth.CheckHeader("Bearer nope").code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(auth.CheckHeader("Bearer s3cret2").code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(auth.CheckHeader("Bearer s3cre").code(), absl::StatusCode::kPermissionDenied);
  EXPECT_TRUE(auth.CheckHeader("Bearer s3cret").ok());
  EXPECT_TRUE(auth.CheckHeader("bearer s3cret").ok());
}

TEST(BearerAuth, ErrorsNeverContainTheKey) {
  BearerAuth auth("topsecretkey");
  const absl::Status s = auth.CheckHeader("Bearer topsecretkeyX");
  EXPECT_EQ(std::string(s.message()).find("topsecret"), std::string::npos);
}

TEST(BearerAuth, FlagWinsOverEnvironment) {
  setenv("RL_TEST_AUTH_KEY", "from-env", 1);
  EXPECT_EQ(ResolveApiKey("from-flag", "RL_TEST_AUTH_KEY"), "from-flag");
  EXPECT_EQ(ResolveApiKey("", "RL_TEST_AUTH_KEY"), "from-env");
  unsetenv("RL_TEST_AUTH_KEY");
  EXPECT_EQ(ResolveApiKey("", "RL_TEST_AUTH_KEY"), "");
}

}  // namespace
}  // namespace rl
