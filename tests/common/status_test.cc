#include "common/status.h"

#include "common/grpc_status.h"
#include "gtest/gtest.h"

namespace rl {
namespace {

absl::StatusOr<int> Half(int x) {
  if (x % 2 != 0) return absl::InvalidArgumentError("x: odd");
  return x / 2;
}

absl::Status Quarter(int x, int* out) {
  ASSIGN_OR_RETURN(int h, Half(x));
  ASSIGN_OR_RETURN(*out, Half(h));
  RETURN_IF_ERROR(absl::OkStatus());
  return absl::OkStatus();
}

TEST(StatusMacros, PropagateErrorsAndValues) {
  int out = 0;
  EXPECT_TRUE(Quarter(8, &out).ok());
  EXPECT_EQ(out, 2);
  const absl::Status s = Quarter(6, &out);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "x: odd");
}

TEST(StatusMacros, AnnotateKeepsCode) {
  const absl::Status s = Annotate(absl::NotFoundError("no file"), "loading model");
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(s.message(), "loading model: no file");
  EXPECT_TRUE(Annotate(absl::OkStatus(), "x").ok());
}

TEST(GrpcStatus, MapsEveryCodeBothWays) {
  for (int c = 0; c <= 16; ++c) {
    const absl::Status a(static_cast<absl::StatusCode>(c), c == 0 ? "" : "msg");
    const grpc::Status g = ToGrpcStatus(a);
    EXPECT_EQ(static_cast<int>(g.error_code()), c);
    EXPECT_EQ(FromGrpcStatus(g), a);
  }
  EXPECT_EQ(ToGrpcStatus(absl::FailedPreconditionError("busy")).error_message(), "busy");
}

}  // namespace
}  // namespace rl
