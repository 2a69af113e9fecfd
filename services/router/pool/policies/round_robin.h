// Round-robin: the first candidate whose address follows the one chosen last (wrapping), so
// every routable worker takes its turn whatever joins, leaves or is excluded. Keys, groups and
// the cache are ignored. Cost: O(#candidates) per pick, one string of state.
#pragma once

#include <memory>
#include <string>

#include "services/router/pool/routing_policy.h"

namespace rl::router {

class RoundRobinPolicy final : public RoutingPolicy {
 public:
  const char* name() const override { return "round_robin"; }
  Choice Choose(const PickRequest& request, absl::Span<const Candidate> candidates) override;

 private:
  std::string last_;  // guarded by the pool's lock (Choose's contract)
};

std::unique_ptr<RoutingPolicy> MakeRoundRobinPolicy();

}  // namespace rl::router
