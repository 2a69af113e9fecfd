// VersionConstraint: the weight versions a generation request accepts (GenerateRequest's
// min_weight_version / exact_weight_version, issue 30). Shared by the router (which workers may
// serve it), the worker's service (refuse at the door) and the engine (finish a request whose
// engine moved to a version it does not accept, e.g. retract -> update -> continue).
// docs/weight-updates.md ("Versions a request accepts") has the contract. Header-only value type
// with no dependency beyond Abseil strings, so the engine can use it; every call is O(1).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace rl {

struct VersionConstraint {
  std::optional<int64_t> min;    // accepts versions >= min
  std::optional<int64_t> exact;  // accepts only this version

  bool any() const { return !min.has_value() && !exact.has_value(); }
  bool Accepts(int64_t version) const {
    return (!min.has_value() || version >= *min) && (!exact.has_value() || version == *exact);
  }
  // "weight version >= 3", "weight version == 4", "weight version == 4 (and >= 3)", "any".
  std::string Describe() const {
    if (exact.has_value()) {
      return absl::StrCat("weight version == ", *exact,
                          min.has_value() ? absl::StrCat(" (and >= ", *min, ")") : "");
    }
    if (min.has_value()) return absl::StrCat("weight version >= ", *min);
    return "any weight version";
  }
  // INVALID_ARGUMENT naming the field for a negative version or an exact version below the
  // minimum (which no version satisfies).
  absl::Status Validate() const {
    if (min.has_value() && *min < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("min_weight_version: ", *min, " must be >= 0"));
    }
    if (exact.has_value() && *exact < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("exact_weight_version: ", *exact, " must be >= 0"));
    }
    if (min.has_value() && exact.has_value() && *exact < *min) {
      return absl::InvalidArgumentError(absl::StrCat("exact_weight_version: ", *exact,
                                                     " is below min_weight_version (", *min,
                                                     "): no version satisfies both"));
    }
    return absl::OkStatus();
  }
};

// The constraint of a GenerateRequest-like message (rl.v1.GenerateRequest): a template so this
// header needs no protobuf.
template <typename Request>
VersionConstraint VersionConstraintOf(const Request& r) {
  VersionConstraint c;
  if (r.has_min_weight_version()) c.min = r.min_weight_version();
  if (r.has_exact_weight_version()) c.exact = r.exact_weight_version();
  return c;
}

}  // namespace rl
