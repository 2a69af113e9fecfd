// Status helpers shared by every module.
//
// Domain code returns absl::Status / absl::StatusOr<T> across module and RPC boundaries and
// propagates errors with the two macros below; there are no exceptions on the data plane.
// Exactly one function (ToGrpcStatus in common/grpc_status.h) maps absl::Status to
// grpc::Status.
#pragma once

#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

#define RL_STATUS_CONCAT_INNER_(a, b) a##b
#define RL_STATUS_CONCAT_(a, b) RL_STATUS_CONCAT_INNER_(a, b)

// Returns from the current function when `expr` (an absl::Status) is not OK.
#define RETURN_IF_ERROR(expr)                \
  do {                                       \
    ::absl::Status rl_status_ = (expr);      \
    if (!rl_status_.ok()) return rl_status_; \
  } while (0)

// `ASSIGN_OR_RETURN(auto x, MakeX());` binds the value of an absl::StatusOr or returns its
// error from the current function.
#define ASSIGN_OR_RETURN(lhs, expr) \
  RL_ASSIGN_OR_RETURN_IMPL_(RL_STATUS_CONCAT_(rl_statusor_, __LINE__), lhs, expr)

#define RL_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                              \
  if (!tmp.ok()) return std::move(tmp).status();  \
  lhs = std::move(tmp).value()

namespace rl {

// Prefixes `status`'s message with `context` ("loading model: <message>"), keeping its code.
absl::Status Annotate(const absl::Status& status, absl::string_view context);

}  // namespace rl
