#include "services/router/pool/routing_policy.h"

#include <cmath>

#include "absl/strings/str_cat.h"

namespace rl::router {

absl::Status ValidatePolicyOptions(const PolicyOptions& options) {
  if (options.name != "round_robin" && options.name != "least_load" && options.name != "affinity" &&
      options.name != "cache_aware") {
    return absl::InvalidArgumentError(
        absl::StrCat("--policy: '", options.name, "' is not one of ", kPolicyNames));
  }
  if (!std::isfinite(options.load_factor) || options.load_factor < 1 || options.load_factor > 100) {
    return absl::InvalidArgumentError(
        absl::StrCat("--load-factor: must be in [1, 100], got ", options.load_factor));
  }
  if (options.load_slack < 0 || options.load_slack > 1000000) {
    return absl::InvalidArgumentError(
        absl::StrCat("--load-slack: must be in [0, 1000000], got ", options.load_slack));
  }
  return absl::OkStatus();
}

}  // namespace rl::router
