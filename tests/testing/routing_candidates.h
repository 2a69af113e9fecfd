// Candidates for routing-policy tests: a fleet of named workers with loads, handed to a policy
// as the pool does (sorted by address), and the address a policy chose.
#pragma once

#include <algorithm>
#include <string>
#include <vector>

#include "services/router/pool/routing_policy.h"

namespace rl::router::testing {

class FakeFleet {
 public:
  explicit FakeFleet(std::vector<std::string> addresses) : addresses_(std::move(addresses)) {
    std::sort(addresses_.begin(), addresses_.end());
    loads_.assign(addresses_.size(), 0);
  }
  const std::vector<std::string>& addresses() const { return addresses_; }
  int32_t& load(const std::string& address) { return loads_[IndexOf(address)]; }
  // The candidates now (every worker, or those not in `without`).
  std::vector<Candidate> Candidates(const std::vector<std::string>& without = {}) const {
    std::vector<Candidate> out;
    for (size_t i = 0; i < addresses_.size(); ++i) {
      if (std::find(without.begin(), without.end(), addresses_[i]) != without.end()) continue;
      out.push_back({nullptr, &addresses_[i], loads_[i], loads_[i], 0.0, 0});
    }
    return out;
  }
  // What `policy` picks for `request`, and (with `take`) the request's load added to it.
  std::string Pick(RoutingPolicy& policy, const PickRequest& request, bool take = false,
                   Choice* choice = nullptr, const std::vector<std::string>& without = {}) {
    const std::vector<Candidate> c = Candidates(without);
    const Choice ch = policy.Choose(request, c);
    if (choice != nullptr) *choice = ch;
    if (ch.index >= c.size()) return "";
    const std::string address = *c[ch.index].address;
    if (take) load(address) += std::max(request.units, 1);
    return address;
  }

 private:
  size_t IndexOf(const std::string& a) const {
    return static_cast<size_t>(std::find(addresses_.begin(), addresses_.end(), a) -
                               addresses_.begin());
  }
  std::vector<std::string> addresses_;
  std::vector<int32_t> loads_;
};

}  // namespace rl::router::testing
