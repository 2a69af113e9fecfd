#include "services/router/pool/policies/cache_aware.h"

#include <algorithm>
#include <string>

#include "services/router/pool/policies/least_load.h"
#include "services/router/pool/policies/load_bound.h"

namespace rl::router {

Choice CacheAwarePolicy::Choose(const PickRequest& request,
                                absl::Span<const Candidate> candidates) {
  const LoadBound bound(candidates, request.units, load_factor_, load_slack_);
  Choice choice;
  const size_t start = turn_++;
  // A first turn with a key: the key's worker, so a group's samples share their question.
  if (request.trajectory_tokens == 0) {
    if (const std::string key = PlacementKey(request); !key.empty()) {
      const Choice placed = placement_.Place(key, bound, candidates, request.exclude);
      if (placed.keyed) return placed;
      choice.moved = placed.moved;
    }
  }
  const absl::Span<const PrefixHolder> holders = request.prefix_holders;
  // Holders come longest first; take them a run of equal lengths at a time.
  for (size_t run = 0; run < holders.size();) {
    size_t end = run;
    while (end < holders.size() && holders[end].tokens == holders[run].tokens) ++end;
    int64_t best = -1;
    for (size_t h = run; h < end; ++h) {
      auto it = std::lower_bound(
          candidates.begin(), candidates.end(), holders[h].address,
          [](const Candidate& c, std::string_view a) { return std::string_view(*c.address) < a; });
      if (it == candidates.end() || *it->address != holders[h].address) continue;
      if (!bound.Admits(*it)) {
        choice.moved = true;
        continue;
      }
      const int64_t i = it - candidates.begin();
      if (best < 0) {
        best = i;
        continue;
      }
      // Equal loads go in turn (a rotating start), as least load's ties do.
      const Candidate& b = candidates[static_cast<size_t>(best)];
      const size_t n = candidates.size();
      const auto turn = [&](int64_t k) { return (static_cast<size_t>(k) + n - start % n) % n; };
      if (it->load < b.load || (it->load == b.load && turn(i) < turn(best))) best = i;
    }
    if (best >= 0) {
      choice.index = static_cast<size_t>(best);
      choice.keyed = true;
      return choice;
    }
    run = end;
  }
  choice.index = LeastLoadedIndex(candidates, start);
  return choice;
}

}  // namespace rl::router
