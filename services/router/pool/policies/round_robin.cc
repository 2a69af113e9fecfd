#include "services/router/pool/policies/round_robin.h"

namespace rl::router {

Choice RoundRobinPolicy::Choose(const PickRequest&, absl::Span<const Candidate> candidates) {
  size_t chosen = 0;  // wraps to the first when none follows the last one chosen
  for (size_t i = 0; i < candidates.size(); ++i) {
    if (*candidates[i].address > last_) {
      chosen = i;
      break;
    }
  }
  last_ = *candidates[chosen].address;
  return Choice{chosen};
}

std::unique_ptr<RoutingPolicy> MakeRoundRobinPolicy() {
  return std::make_unique<RoundRobinPolicy>();
}

}  // namespace rl::router
