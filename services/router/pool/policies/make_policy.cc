#include "services/router/pool/policies/make_policy.h"

#include "common/status.h"
#include "services/router/pool/policies/affinity.h"
#include "services/router/pool/policies/cache_aware.h"
#include "services/router/pool/policies/least_load.h"
#include "services/router/pool/policies/round_robin.h"

namespace rl::router {

absl::StatusOr<std::unique_ptr<RoutingPolicy>> MakeRoutingPolicy(const PolicyOptions& options) {
  if (absl::Status s = ValidatePolicyOptions(options); !s.ok()) return s;
  if (options.name == "least_load") return std::make_unique<LeastLoadPolicy>();
  if (options.name == "affinity")
    return std::make_unique<AffinityPolicy>(options.load_factor, options.load_slack);
  if (options.name == "cache_aware") {
    return std::make_unique<CacheAwarePolicy>(options.load_factor, options.load_slack);
  }
  return std::make_unique<RoundRobinPolicy>();
}

}  // namespace rl::router
