#include "services/router/pool/routing_policy.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "services/router/pool/policies/affinity.h"
#include "services/router/pool/policies/cache_aware.h"
#include "services/router/pool/policies/least_load.h"
#include "services/router/pool/policies/round_robin.h"

namespace rl::router {

absl::Status ValidatePolicyOptions(const PolicyOptions& options) {
  if (options.name != "round_robin" && options.name != "least_load" &&
      options.name != "affinity" && options.name != "cache_aware") {
    return absl::InvalidArgumentError(
        absl::StrCat("--policy: '", options.name, "' is not one of ", kPolicyNames));
  }
  if (!std::isfinite(options.load_factor) || options.load_factor < 1 ||
      options.load_factor > 100) {
    return absl::InvalidArgumentError(
        absl::StrCat("--load-factor: must be in [1, 100], got ", options.load_factor));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<RoutingPolicy>> MakeRoutingPolicy(const PolicyOptions& options) {
  if (absl::Status s = ValidatePolicyOptions(options); !s.ok()) return s;
  if (options.name == "least_load") return std::make_unique<LeastLoadPolicy>();
  if (options.name == "affinity") return std::make_unique<AffinityPolicy>(options.load_factor);
  if (options.name == "cache_aware") {
    return std::make_unique<CacheAwarePolicy>(options.load_factor);
  }
  return std::make_unique<RoundRobinPolicy>();
}

}  // namespace rl::router
