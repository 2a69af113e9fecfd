// LoadBound: the bounded-load rule shared by affinity and cache_aware (consistent hashing with
// bounded loads, Mirrokni, Thorup and Zadimoghaddam 2018, with an absolute allowance as SMG's and
// SGLang's routers pair balance_rel_threshold with balance_abs_threshold). A preferred worker
// takes a request of `units` samples while its load, counting the request, stays within
// `factor` times the fleet's mean load counting it, OR within `slack` samples above that mean:
//   load + units <= max(factor * mean, mean + slack),  mean = (total + units) / #candidates,
// or it is idle. The relative part alone is tight while a fleet fills up: on an idle fleet of 3
// the second sample of a GRPO group is already over 1.25x the mean and the group would be broken
// up; the slack (--load-slack, default 8: a group of n = 8) keeps a group together, while a
// skewed key set still spreads once its worker holds `slack` more than the mean.
// Cost: O(#candidates) to build, O(1) per test.
#pragma once

#include <algorithm>
#include <cstdint>

#include "absl/types/span.h"
#include "services/router/pool/routing_policy.h"

namespace rl::router {

class LoadBound {
 public:
  LoadBound(absl::Span<const Candidate> candidates, int32_t units, double factor, int32_t slack = 0)
      : units_(units > 0 ? units : 1) {
    for (const Candidate& c : candidates) total_ += c.load;
    const double mean = static_cast<double>(total_ + units_) /
                        static_cast<double>(candidates.empty() ? 1 : candidates.size());
    cap_ = std::max(factor * mean, mean + static_cast<double>(std::max(slack, 0)));
  }
  // Whether `c` may take the request.
  bool Admits(const Candidate& c) const {
    return c.load == 0 || static_cast<double>(c.load + units_) <= cap_;
  }
  double cap() const { return cap_; }
  // The candidates' load before the request.
  int64_t total() const { return total_; }

 private:
  int32_t units_;
  int64_t total_ = 0;
  double cap_ = 0;
};

}  // namespace rl::router
