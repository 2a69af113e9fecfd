// MakeRoutingPolicy: the policy --policy names (routing_policy.h has the interface and the
// options). Lives beside the policies so that the interface never includes them.
#pragma once

#include <memory>

#include "absl/status/statusor.h"
#include "services/router/pool/routing_policy.h"

namespace rl::router {

// InvalidArgument naming the bad option (ValidatePolicyOptions).
absl::StatusOr<std::unique_ptr<RoutingPolicy>> MakeRoutingPolicy(const PolicyOptions& options);

}  // namespace rl::router
