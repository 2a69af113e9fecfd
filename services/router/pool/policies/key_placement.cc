#include "services/router/pool/policies/key_placement.h"

#include <algorithm>
#include <cstdint>
#include <limits>

namespace rl::router {
namespace {

constexpr size_t kNone = std::numeric_limits<size_t>::max();

}  // namespace

int64_t FindCandidate(absl::Span<const Candidate> candidates, std::string_view address) {
  auto it = std::lower_bound(
      candidates.begin(), candidates.end(), address,
      [](const Candidate& c, std::string_view a) { return std::string_view(*c.address) < a; });
  if (it == candidates.end() || *it->address != address) return -1;
  return it - candidates.begin();
}

std::string PlacementKey(const PickRequest& request) {
  std::string key;
  if (!request.routing_key.empty()) {
    key = "k:";
    key.append(request.routing_key);
  } else if (!request.group_id.empty()) {
    key = "g:";
    key.append(request.group_id);
  }
  return key;
}

void KeyPlacement::Remember(const std::string& key, const std::string& address) {
  auto [it, inserted] = where_.try_emplace(key, address);
  if (!inserted) {
    it->second = address;
    return;
  }
  order_.emplace_back(key);
  while (order_.size() > kMaxKeys) {
    where_.erase(order_.front());
    order_.pop_front();
  }
}

Choice KeyPlacement::Place(const std::string& key, const LoadBound& bound,
                           absl::Span<const Candidate> candidates,
                           const std::set<std::string>* exclude) {
  Choice choice;
  choice.index = kNone;
  ring_.Sync(candidates);
  const uint64_t hash = StableHash(key);
  const auto walk_within_bound = [&] {
    const int64_t i = ring_.Walk(hash, [&](size_t c) {
      if (bound.Admits(candidates[c])) return true;
      choice.moved = true;
      return false;
    });
    if (i >= 0) {
      choice.index = static_cast<size_t>(i);
      choice.keyed = true;
    }
    return choice;
  };
  if (auto it = where_.find(key); it != where_.end()) {
    const int64_t i = FindCandidate(candidates, it->second);
    if (i >= 0) {
      if (bound.Admits(candidates[static_cast<size_t>(i)])) {
        choice.index = static_cast<size_t>(i);
        choice.keyed = true;
        return choice;
      }
      choice.moved = true;
      return walk_within_bound();
    }
    // Excluded by this request's retry: the key stays placed, the request walks on.
    if (exclude != nullptr && exclude->contains(it->second)) return walk_within_bound();
    // Its worker is gone (removed, dead, held, at another version): placed again below.
  }
  // A new key on an idle fleet: the first worker in ring order within the bound (consistent
  // hashing: routers agree, and a worker that joins or leaves moves only its own keys). While
  // requests run: among the workers within the bound, those that took the fewest of the last
  // kRecentKeys new keys (a group's samples arrive over a moment: a worker that just took a key
  // looks underloaded until they do), the first of them in ring order at or below the mean load,
  // else the first of them in ring order. The least loaded worker qualifies unless the request
  // is heavier than the bound allows; then none, and the caller falls back to least load without
  // placing the key.
  const int64_t n = static_cast<int64_t>(candidates.size());
  const bool idle = bound.total() == 0;
  int fewest = std::numeric_limits<int>::max();
  for (const Candidate& c : candidates) {
    if (bound.Admits(c)) fewest = std::min(fewest, idle ? 0 : RecentKeys(*c.address));
  }
  if (fewest == std::numeric_limits<int>::max()) return choice;
  const auto fewest_keys = [&](size_t c) {
    return bound.Admits(candidates[c]) && (idle || RecentKeys(*candidates[c].address) == fewest);
  };
  int64_t i = ring_.Walk(
      hash, [&](size_t c) { return fewest_keys(c) && candidates[c].load * n <= bound.total(); });
  if (i < 0) i = ring_.Walk(hash, fewest_keys);
  if (i < 0) return choice;
  choice.index = static_cast<size_t>(i);
  choice.keyed = true;
  const std::string& address = *candidates[choice.index].address;
  Remember(key, address);
  recent_.push_back(address);
  ++recent_count_[address];
  if (recent_.size() > kRecentKeys) {
    if (auto it = recent_count_.find(recent_.front());
        it != recent_count_.end() && --it->second == 0) {
      recent_count_.erase(it);
    }
    recent_.pop_front();
  }
  return choice;
}

int KeyPlacement::RecentKeys(const std::string& address) const {
  auto it = recent_count_.find(address);
  return it == recent_count_.end() ? 0 : it->second;
}

}  // namespace rl::router
