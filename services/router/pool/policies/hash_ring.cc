#include "services/router/pool/policies/hash_ring.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace rl::router {

uint64_t StableHash(std::string_view key) {
  uint64_t h = 0xcbf29ce484222325ULL;
  for (unsigned char c : key) {
    h ^= c;
    h *= 0x100000001b3ULL;
  }
  // splitmix64's finalizer: FNV alone clusters keys that differ only in their last bytes.
  h ^= h >> 30;
  h *= 0xbf58476d1ce4e5b9ULL;
  h ^= h >> 27;
  h *= 0x94d049bb133111ebULL;
  h ^= h >> 31;
  return h;
}

void HashRing::Rebuild() {
  points_.clear();
  points_.reserve(members_.size() * kPointsPerWorker);
  for (uint32_t m = 0; m < members_.size(); ++m) {
    for (int i = 0; i < kPointsPerWorker; ++i) {
      points_.emplace_back(StableHash(absl::StrCat(members_[m], "#", i)), m);
    }
  }
  std::sort(points_.begin(), points_.end());
}

void HashRing::Sync(absl::Span<const Candidate> candidates) {
  bool changed = false;
  for (const Candidate& c : candidates) {
    if (index_.contains(*c.address)) continue;
    index_.emplace(*c.address, static_cast<uint32_t>(members_.size()));
    members_.push_back(*c.address);
    changed = true;
  }
  // Workers gone for good (removed, replaced) would make the ring grow without bound: past
  // twice the candidates (and some slack for workers briefly out of routing), keep only these.
  // Dropping a member that is no candidate moves no key of the others.
  if (members_.size() > 2 * candidates.size() + 8) {
    members_.clear();
    index_.clear();
    for (const Candidate& c : candidates) {
      index_.emplace(*c.address, static_cast<uint32_t>(members_.size()));
      members_.push_back(*c.address);
    }
    changed = true;
  }
  if (changed) Rebuild();
  candidate_of_.assign(members_.size(), -1);
  for (size_t i = 0; i < candidates.size(); ++i) {
    candidate_of_[index_.at(*candidates[i].address)] = static_cast<int64_t>(i);
  }
  num_candidates_ = candidates.size();
}

}  // namespace rl::router
