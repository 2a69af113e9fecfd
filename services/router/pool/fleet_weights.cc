#include "services/router/pool/fleet_weights.h"

#include "absl/strings/str_cat.h"

namespace rl::router {

std::string FleetWeights::Describe() const {
  switch (source) {
    case Source::kNone:
      return "";
    case Source::kDisk:
      return absl::StrCat("disk:", path);
    case Source::kTensor:
      return "tensor";
    case Source::kDistributed:
      return "distributed";
    case Source::kAdopted:
      return absl::StrCat("adopted:", path);
  }
  return "";
}

}  // namespace rl::router
