// The single mapping between absl::Status and grpc::Status (both directions). Codes share
// their numeric values, so the mapping keeps the code and the message.
#pragma once

#include "absl/status/status.h"
#include "grpcpp/support/status.h"

namespace rl {

grpc::Status ToGrpcStatus(const absl::Status& status);
absl::Status FromGrpcStatus(const grpc::Status& status);

}  // namespace rl
