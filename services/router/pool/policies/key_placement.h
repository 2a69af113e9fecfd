// KeyPlacement: where a routing key lives (the request's routing_key, else its GRPO group_id),
// for affinity and for cache_aware's first turns. A key seen for the first time on an idle fleet
// goes to the first worker in its hash ring order (hash_ring.h) within the load bound: routers
// agree, and a worker that joins or leaves moves only its own keys. While requests run it goes to
// a worker within the bound that took the fewest of the last 64 new keys, the first of those in
// ring order whose load is at most the fleet's mean (else the first of them): the prompt groups
// of a GRPO step, arriving together, spread evenly instead of wherever their hashes fall (with 8
// groups on 3 workers, hashing alone puts 4 or more on one worker 3 times in 4), and a worker that
// just took a group is not taken for idle while that group's samples are still arriving (by load
// alone, 6 groups' first turns in a random order put 3 on one worker in most orders). The
// placement is remembered, and
// the key's later requests go there while it is within the load bound (load_bound.h); past it they
// walk on along the ring to the next worker within the bound (a key move), and the key stays placed
// where its cache is. A worker that joins takes no placed key (their caches stay where they
// are) and, idle, the new keys first; a worker that leaves (or is no candidate any more) loses
// its keys, which are placed again, and no other key moves. A retry's excluded worker keeps its
// keys (the request walks on). At most kMaxKeys keys are remembered (the oldest forgotten
// first, then placed again as new): 32768 keys of at most 256 bytes, under 12 MiB.
//
// Cost per pick: a hash lookup, the ring's Sync (O(#candidates)) and walk (O(log R) and the
// points walked), O(#candidates) for the mean; a new key one more walk at most and
// O(#candidates) lookups of the recent keys. Not thread-safe (the pool's lock, as Choose).
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <set>
#include <string>
#include <string_view>

#include "absl/container/flat_hash_map.h"
#include "absl/types/span.h"
#include "services/router/pool/policies/hash_ring.h"
#include "services/router/pool/policies/load_bound.h"
#include "services/router/pool/routing_policy.h"

namespace rl::router {

// The index of `address` among `candidates` (sorted by address), or -1.
int64_t FindCandidate(absl::Span<const Candidate> candidates, std::string_view address);

// The key a request is placed by: "k:" + its routing key, else "g:" + its group id, else "".
std::string PlacementKey(const PickRequest& request);

class KeyPlacement {
 public:
  static constexpr size_t kMaxKeys = 32768;
  // How many of the latest new keys' workers are remembered (over all workers) to spread the
  // next ones (a step's prompt groups).
  static constexpr size_t kRecentKeys = 64;

  // Where a request of `key` (non-empty) goes among `candidates` (non-empty, sorted by
  // address): choice.keyed when a worker was found; index -1 (SIZE_MAX) when every worker on
  // the key's walk is over the bound (the caller falls back to least load). choice.moved when
  // the key's worker was over the bound.
  Choice Place(const std::string& key, const LoadBound& bound,
               absl::Span<const Candidate> candidates, const std::set<std::string>* exclude);

  size_t num_keys() const { return where_.size(); }

 private:
  void Remember(const std::string& key, const std::string& address);
  // How many of the last kRecentKeys new keys `address` took.
  int RecentKeys(const std::string& address) const;

  HashRing ring_;
  absl::flat_hash_map<std::string, std::string> where_;  // key -> worker address
  std::deque<std::string> order_;                        // keys, oldest first
  std::deque<std::string> recent_;  // the workers of the last kRecentKeys new keys, oldest first
  absl::flat_hash_map<std::string, int> recent_count_;  // worker address -> its keys in recent_
};

}  // namespace rl::router
