#include "services/router/pool/policies/affinity.h"

#include <algorithm>
#include <string>

#include "services/router/pool/policies/least_load.h"
#include "services/router/pool/policies/load_bound.h"

namespace rl::router {

Choice AffinityPolicy::Choose(const PickRequest& request, absl::Span<const Candidate> candidates) {
  const LoadBound bound(candidates, request.units, load_factor_, load_slack_);
  Choice choice;
  // 1. The trajectory this prompt extends: of the workers holding all of it (usually one; two
  // when a turn was retried or replayed elsewhere), the least loaded within the bound.
  if (request.trajectory_tokens > 0) {
    int64_t best = -1;
    for (const PrefixHolder& h : request.prefix_holders) {
      if (h.tokens < request.trajectory_tokens) break;
      const int64_t i = FindCandidate(candidates, h.address);
      if (i < 0) continue;
      const Candidate& c = candidates[static_cast<size_t>(i)];
      if (!bound.Admits(c)) {
        choice.moved = true;
        continue;
      }
      if (best < 0 || c.load < candidates[static_cast<size_t>(best)].load) best = i;
    }
    if (best >= 0) {
      choice.index = static_cast<size_t>(best);
      choice.keyed = true;
      choice.moved = false;  // a holder of the whole trajectory took it
      return choice;
    }
  }
  // 2. The key's worker (key_placement.h): a new key on the first worker in ring order at or
  // below the mean load, a placed one where it was placed, within the bound.
  if (const std::string key = PlacementKey(request); !key.empty()) {
    Choice placed = placement_.Place(key, bound, candidates, request.exclude);
    placed.moved = placed.moved || choice.moved;
    if (placed.keyed) return placed;
    choice.moved = placed.moved;
  }
  // 3. No preference (or every preferred worker is over the bound).
  choice.index = LeastLoadedIndex(candidates, turn_++);
  return choice;
}

}  // namespace rl::router
