// HashRing: the consistent-hashing ring of the affinity policy. Every worker address it has seen
// owns kPointsPerWorker points (FNV-1a 64 of "address#i", mixed); a key hashes to a point and
// walks clockwise. A worker that joins takes only the keys whose walk now meets one of its
// points first; one that leaves (or is not a candidate for this pick) is skipped, so only its
// keys move. Hashes are stable across processes, so a restarted router places keys as before.
//
// Cost: Sync O(#candidates) per pick (a hash lookup each), plus O(R log R) when membership
// changes (R = points); Walk O(log R) plus the points walked. Not thread-safe (the pool's lock).
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/types/span.h"
#include "services/router/pool/routing_policy.h"

namespace rl::router {

// Stable 64-bit hash of a key (FNV-1a with a final avalanche).
uint64_t StableHash(std::string_view key);

class HashRing {
 public:
  static constexpr int kPointsPerWorker = 128;

  // Adds the candidates' addresses not on the ring yet; when the ring holds many addresses that
  // are no candidates any more (removed workers), rebuilds it from the candidates. Then maps
  // every ring member to its candidate index (or none) for Walk.
  void Sync(absl::Span<const Candidate> candidates);

  // Calls visit(candidate index) for each distinct candidate in ring order from `hash`, until
  // visit returns true (then returns that index) or every candidate was visited (returns -1).
  template <typename Visit>
  int64_t Walk(uint64_t hash, Visit visit) const;

  size_t num_members() const { return members_.size(); }

 private:
  void Rebuild();

  std::vector<std::string> members_;
  absl::flat_hash_map<std::string, uint32_t> index_;
  std::vector<std::pair<uint64_t, uint32_t>> points_;  // sorted (point, member)
  std::vector<int64_t> candidate_of_;                  // per member: candidate index or -1
  size_t num_candidates_ = 0;
  mutable std::vector<uint8_t> seen_;  // per member, scratch for Walk
};

template <typename Visit>
int64_t HashRing::Walk(uint64_t hash, Visit visit) const {
  if (points_.empty() || num_candidates_ == 0) return -1;
  seen_.assign(members_.size(), 0);
  size_t at = static_cast<size_t>(
      std::lower_bound(points_.begin(), points_.end(), std::make_pair(hash, uint32_t{0})) -
      points_.begin());
  size_t visited = 0;
  for (size_t step = 0; step < points_.size() && visited < num_candidates_; ++step) {
    const uint32_t member = points_[(at + step) % points_.size()].second;
    const int64_t c = candidate_of_[member];
    if (c < 0 || seen_[member]) continue;
    seen_[member] = 1;
    ++visited;
    if (visit(static_cast<size_t>(c))) return c;
  }
  return -1;
}

}  // namespace rl::router
