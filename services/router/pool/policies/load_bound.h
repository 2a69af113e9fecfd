// LoadBound: the bounded-load rule shared by affinity and cache_aware (consistent hashing with
// bounded loads, Mirrokni, Thorup and Zadimoghaddam 2018). A preferred worker takes a request of
// `units` samples only if its load stays within `factor` times the fleet's mean load counting
// the request: load + units <= factor * (total + units) / #candidates, or it is idle. So a hot
// key or a widely shared prefix never builds a hot worker: past the bound the request moves on.
// Cost: O(#candidates) to build, O(1) per test.
#pragma once

#include <cstdint>

#include "absl/types/span.h"
#include "services/router/pool/routing_policy.h"

namespace rl::router {

class LoadBound {
 public:
  LoadBound(absl::Span<const Candidate> candidates, int32_t units, double factor)
      : units_(units > 0 ? units : 1) {
    int64_t total = 0;
    for (const Candidate& c : candidates) total += c.load;
    cap_ = factor * static_cast<double>(total + units_) /
           static_cast<double>(candidates.empty() ? 1 : candidates.size());
  }
  // Whether `c` may take the request.
  bool Admits(const Candidate& c) const {
    return c.load == 0 || static_cast<double>(c.load + units_) <= cap_;
  }
  double cap() const { return cap_; }

 private:
  int32_t units_;
  double cap_ = 0;
};

}  // namespace rl::router
