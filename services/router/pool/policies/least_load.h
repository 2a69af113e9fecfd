// Least load: the candidate with the fewest samples in flight from this router (a request with
// n samples counts n), ties broken by the KV usage its last health check reported, remaining
// ties in turn (a rotating start), so idle workers share the first requests. Keys and the cache
// are ignored. Also the fallback of affinity and cache_aware. Cost: O(#candidates) per pick.
#pragma once

#include <cstddef>
#include <cstdint>

#include "services/router/pool/routing_policy.h"

namespace rl::router {

// The least loaded of `candidates` (non-empty), scanning from `start` (mod size) so ties go to
// the first one at or after it.
size_t LeastLoadedIndex(absl::Span<const Candidate> candidates, size_t start);

class LeastLoadPolicy final : public RoutingPolicy {
 public:
  const char* name() const override { return "least_load"; }
  Choice Choose(const PickRequest& request, absl::Span<const Candidate> candidates) override;

 private:
  size_t turn_ = 0;  // guarded by the pool's lock (Choose's contract)
};

}  // namespace rl::router
