// Cache-aware: the worker holding the longest cached prefix of the prompt, as the router's own
// text cache records which workers served which trajectories (docs/text-cache.md, "Workers"),
// within the same load bound as affinity (load_bound.h). A prompt that extends no cached
// trajectory (a first turn) and carries a key (routing_key, else group_id) goes to the key's
// worker (key_placement.h: a new key on the first worker in ring order at or below the mean
// load): the samples of a GRPO group share their question, and the tree cannot see it before
// one of them has finished, so sending them together saves the question's prefill on the other
// workers. Otherwise the tree: workers holding an equally long prefix (a system prompt every
// worker has served) go by least load; a holder over the bound passes the request to the next
// longest (a key move); no holder within the bound, or a token-id prompt (the text cache sees
// text only), goes to the least loaded worker. Cost: O(#holders x log #candidates +
// #candidates) per pick, plus a hash lookup and a ring walk for a keyed first turn; the prefix
// lookup itself is the text cache's match the router makes for every text prompt anyway.
#pragma once

#include <cstddef>
#include <cstdint>

#include "services/router/pool/policies/key_placement.h"
#include "services/router/pool/routing_policy.h"

namespace rl::router {

class CacheAwarePolicy final : public RoutingPolicy {
 public:
  explicit CacheAwarePolicy(double load_factor, int32_t load_slack = 0)
      : load_factor_(load_factor), load_slack_(load_slack) {}
  const char* name() const override { return "cache_aware"; }
  Choice Choose(const PickRequest& request, absl::Span<const Candidate> candidates) override;
  double load_factor() const override { return load_factor_; }
  int32_t load_slack() const override { return load_slack_; }

 private:
  const double load_factor_;
  const int32_t load_slack_;
  // Guarded by the pool's lock (Choose's contract).
  KeyPlacement placement_;  // first turns' keys
  size_t turn_ = 0;         // least-load ties
};

}  // namespace rl::router
