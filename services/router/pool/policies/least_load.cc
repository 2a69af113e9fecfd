#include "services/router/pool/policies/least_load.h"

namespace rl::router {

size_t LeastLoadedIndex(absl::Span<const Candidate> candidates, size_t start) {
  const size_t n = candidates.size();
  size_t best = start % n;
  for (size_t k = 1; k < n; ++k) {
    const size_t i = (start + k) % n;
    const Candidate& c = candidates[i];
    const Candidate& b = candidates[best];
    if (c.load < b.load || (c.load == b.load && c.kv_usage < b.kv_usage)) best = i;
  }
  return best;
}

Choice LeastLoadPolicy::Choose(const PickRequest&, absl::Span<const Candidate> candidates) {
  return Choice{LeastLoadedIndex(candidates, turn_++)};
}

}  // namespace rl::router
