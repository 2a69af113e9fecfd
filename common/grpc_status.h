// The single mapping between absl::Status and grpc::Status (both directions). Codes share
// their numeric values, so the mapping keeps the code and the message.
#pragma once

#include "absl/status/status.h"
#include "grpcpp/server_context.h"
#include "grpcpp/support/server_callback.h"
#include "grpcpp/support/status.h"

namespace rl {

grpc::Status ToGrpcStatus(const absl::Status& status);
absl::Status FromGrpcStatus(const grpc::Status& status);

// Finishes a unary callback call at once with `status` (OK or the error); returns its reactor.
grpc::ServerUnaryReactor* FinishUnary(grpc::CallbackServerContext* context,
                                      const absl::Status& status);

}  // namespace rl
