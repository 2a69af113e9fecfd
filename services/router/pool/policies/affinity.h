// Affinity: consistent hashing with bounded loads. A request goes, in this order of preference,
// to
//   1. the worker that served the cached trajectory its text prompt extends (the previous turn
//      of its episode: its prefix is in that worker's KV cache; of several holding all of it,
//      the least loaded), then
//   2. its key's worker (key_placement.h): the key is the request's routing_key (the field or
//      the rl-routing-key header), else its group_id, so the samples of a GRPO group sent as
//      separate requests meet on one worker (the n samples of one request are one worker call
//      anyway). A new key is placed on the first worker in its hash ring order at or below the
//      mean load, so the groups of a step spread by load; a placed key stays, walking on along
//      the ring past workers over the bound,
//   3. the least loaded worker (no key, no trajectory; or every worker on the ring over the
//      bound),
// each preference only while the worker stays within --load-factor times the fleet's mean load,
// or --load-slack samples above it (load_bound.h), so a hot key or a long episode never builds a
// hot worker while a group of 8 is not broken up. A pick that passes over a preferred worker for
// the bound counts as a key move. Cost: O(#candidates) plus a hash lookup and the ring walk
// (O(log R) and the points walked) per pick.
#pragma once

#include <cstddef>
#include <cstdint>

#include "services/router/pool/policies/key_placement.h"
#include "services/router/pool/routing_policy.h"

namespace rl::router {

class AffinityPolicy final : public RoutingPolicy {
 public:
  explicit AffinityPolicy(double load_factor, int32_t load_slack = 0)
      : load_factor_(load_factor), load_slack_(load_slack) {}
  const char* name() const override { return "affinity"; }
  Choice Choose(const PickRequest& request, absl::Span<const Candidate> candidates) override;
  double load_factor() const override { return load_factor_; }
  int32_t load_slack() const override { return load_slack_; }

 private:
  const double load_factor_;
  const int32_t load_slack_;
  KeyPlacement placement_;  // guarded by the pool's lock (Choose's contract)
  size_t turn_ = 0;         // least-load ties
};

}  // namespace rl::router
