// Cache-aware: the worker holding the longest cached prefix of the prompt, as the router's own
// text cache records which workers served which trajectories (docs/text-cache.md, "Workers"),
// within the same load bound as affinity (load_bound.h): workers holding an equally long prefix
// (a system prompt every worker has served) go by least load; a holder over the bound passes the
// request to the next longest (a key move); no holder within the bound, or a token-id prompt
// (the text cache sees text only), goes to the least loaded worker. Keys are ignored. Cost:
// O(#holders x log #candidates + #candidates) per pick; the prefix lookup itself is the text
// cache's match the router makes for every text prompt anyway.
#pragma once

#include <cstddef>

#include "services/router/pool/routing_policy.h"

namespace rl::router {

class CacheAwarePolicy final : public RoutingPolicy {
 public:
  explicit CacheAwarePolicy(double load_factor) : load_factor_(load_factor) {}
  const char* name() const override { return "cache_aware"; }
  Choice Choose(const PickRequest& request, absl::Span<const Candidate> candidates) override;
  double load_factor() const override { return load_factor_; }

 private:
  const double load_factor_;
  size_t turn_ = 0;  // least-load ties; guarded by the pool's lock (Choose's contract)
};

}  // namespace rl::router
