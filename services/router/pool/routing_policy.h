// RoutingPolicy: which of the routable workers a request goes to. The pool filters first
// (health, enablement, admin holds, the fleet's weight version, the request's exclusions) and
// hands the policy what is left; the policy only chooses. One implementation today,
// round-robin; docs/routing.md says what a policy may rely on.
//
// Contract: Choose runs under the pool's lock, so it must be quick (O(#candidates)), must not
// block and must not call back into the pool; work that needs more (a tree lookup of the
// prompt, say) belongs to the caller, before Pick, with its result in the PickRequest. The pool
// may call Choose again for the same request, with the refused candidate removed, when the one
// chosen turns out unreachable.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <set>
#include <string>
#include <string_view>

#include "absl/types/span.h"

namespace rl::router {

class Worker;

// A routable worker as a policy sees it.
struct Candidate {
  Worker* worker = nullptr;
  const std::string* address = nullptr;  // the worker's, for ordering and hashing
  int32_t in_flight = 0;                 // the router's requests running on it now
  int64_t weight_version = -1;           // as it last reported
};

// What a policy may know of the request it places. Views into the caller's data, valid during
// Pick.
struct PickRequest {
  const std::set<std::string>* exclude = nullptr;  // addresses not to pick (tried already)
  std::string_view routing_key;                    // the client's routing key; empty: none
  std::string_view text;                           // a text prompt ("" for token prompts)
  absl::Span<const int32_t> prompt_ids;            // the prompt's tokens, when resolved
};

class RoutingPolicy {
 public:
  virtual ~RoutingPolicy() = default;
  virtual const char* name() const = 0;
  // The index in `candidates` (non-empty, sorted by address) of the worker to use.
  virtual size_t Choose(const PickRequest& request, absl::Span<const Candidate> candidates) = 0;
};

// Round-robin: the first candidate whose address follows the one chosen last (wrapping), so
// every routable worker takes its turn whatever joins, leaves or is excluded.
class RoundRobinPolicy final : public RoutingPolicy {
 public:
  const char* name() const override { return "round_robin"; }
  size_t Choose(const PickRequest& request, absl::Span<const Candidate> candidates) override;

 private:
  std::string last_;  // guarded by the pool's lock (Choose's contract)
};

std::unique_ptr<RoutingPolicy> MakeRoundRobinPolicy();

}  // namespace rl::router
