// RoutingPolicy: which of the routable workers a request goes to. The pool filters first
// (health, enablement, admin holds, the fleet's weight version, the versions the request
// accepts, the request's exclusions) and hands the policy what is left; the policy only chooses.
// Four implementations, one file each under policies/ (chosen by --policy, made by
// policies/make_policy.h): round_robin (the default), least_load, affinity (consistent hashing with
// bounded loads on a routing key, the GRPO group or the trajectory) and cache_aware (the worker
// holding the longest cached prefix, within the same bound). docs/routing.md ("Policies") has the
// rules and each one's cost.
//
// Contract: Choose runs under the pool's lock, so it must be quick (O(#candidates), plus a ring
// walk for affinity), must not block and must not call back into the pool; work that needs more
// (the text cache's lookup of the prompt) belongs to the caller, before Pick, with its result
// in the PickRequest. The pool may call Choose again for the same request, with the refused
// candidate removed, when the one chosen turns out unreachable.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <set>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/version_constraint.h"

namespace rl::router {

class Worker;

// A routable worker as a policy sees it.
struct Candidate {
  Worker* worker = nullptr;
  const std::string* address = nullptr;  // the worker's, for ordering and hashing
  int32_t in_flight = 0;                 // the router's requests running on it now
  int32_t load = 0;                      // their samples (a request with n samples counts n)
  double kv_usage = 0;                   // its KV usage at the last health check, in [0, 1]
  int64_t weight_version = -1;           // as it last reported
};

// A worker the router's text cache says holds a prefix of the prompt: it served a trajectory
// through those tokens (docs/text-cache.md, "Workers").
struct PrefixHolder {
  std::string_view address;
  int32_t tokens = 0;  // leading prompt tokens it holds, > 0
};

// What a policy may know of the request it places. Views into the caller's data, valid during
// Pick.
struct PickRequest {
  const std::set<std::string>* exclude = nullptr;  // addresses not to pick (tried already)
  std::string_view routing_key;  // the client's routing key (field or rl-routing-key); "": none
  std::string_view group_id;     // the client's GRPO group; "": none
  std::string_view text;         // a text prompt ("" for token prompts)
  absl::Span<const int32_t> prompt_ids;  // the prompt's tokens, when resolved
  int32_t units = 1;                     // samples the request asks for (n)
  // Workers holding a cached prefix of the prompt, longest first.
  absl::Span<const PrefixHolder> prefix_holders;
  // Leading prompt tokens that are a cached trajectory (through its last generated token); 0
  // when the prompt extends no cached trajectory.
  int32_t trajectory_tokens = 0;
  VersionConstraint versions;  // the weight versions the request accepts (the pool filters)
};

// What a policy chose, and why (for the routing metrics).
struct Choice {
  size_t index = 0;    // into the candidates
  bool keyed = false;  // placed by a preference (key, group, trajectory, cached prefix)
  bool moved = false;  // a preferred worker was over the load bound, so another one took it
};

class RoutingPolicy {
 public:
  virtual ~RoutingPolicy() = default;
  virtual const char* name() const = 0;
  // Which of `candidates` (non-empty, sorted by address) to use.
  virtual Choice Choose(const PickRequest& request, absl::Span<const Candidate> candidates) = 0;
  // The load bound's factor (--load-factor); 0 for policies without a bound.
  virtual double load_factor() const { return 0; }
  // The load bound's absolute allowance (--load-slack); 0 for policies without a bound.
  virtual int32_t load_slack() const { return 0; }
};

// --policy, --load-factor and --load-slack.
struct PolicyOptions {
  std::string name = "round_robin";
  // affinity / cache_aware: a preferred worker takes a request only while its load stays
  // within load_factor times the fleet's mean, or within load_slack samples above the mean
  // (policies/load_bound.h, docs/routing.md). load_factor >= 1; load_slack >= 0.
  double load_factor = 1.25;
  int32_t load_slack = 8;
};

// The names --policy accepts, comma-separated (for messages).
inline constexpr char kPolicyNames[] = "round_robin, least_load, affinity, cache_aware";

// InvalidArgument naming the bad option. policies/make_policy.h makes the policy.
absl::Status ValidatePolicyOptions(const PolicyOptions& options);

}  // namespace rl::router
