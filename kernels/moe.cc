#include "kernels/moe.h"

#include "absl/strings/str_cat.h"

namespace rl::kernels {

absl::Status MoeRouteParams::Validate() const {
  if (logits == nullptr || ids == nullptr || weights == nullptr) {
    return absl::InvalidArgumentError("moe_route: null buffer");
  }
  if (num_tokens < 0 || num_experts <= 0 || top_k <= 0 || top_k > num_experts) {
    return absl::InvalidArgumentError(absl::StrCat("moe_route: bad sizes tokens=", num_tokens,
                                                   " experts=", num_experts, " top_k=", top_k));
  }
  return absl::OkStatus();
}

absl::Status MoeExpertsParams::Validate() const {
  if (x == nullptr || ids == nullptr || weights == nullptr || gate == nullptr || up == nullptr ||
      down == nullptr || y == nullptr) {
    return absl::InvalidArgumentError("moe_experts: null buffer");
  }
  if (x == y) return absl::InvalidArgumentError("moe_experts: y must not alias x");
  if (num_tokens < 0 || hidden <= 0 || intermediate <= 0 || num_experts <= 0 || top_k <= 0 ||
      top_k > num_experts) {
    return absl::InvalidArgumentError(
        absl::StrCat("moe_experts: bad sizes tokens=", num_tokens, " hidden=", hidden,
                     " intermediate=", intermediate, " experts=", num_experts, " top_k=", top_k));
  }
  if (!model_io::IsFloatWeightDType(w_dtype)) {
    return absl::InvalidArgumentError("moe_experts: weights must be F32, BF16 or F16");
  }
  for (int64_t i = 0; i < num_experts; ++i) {
    if (gate[i] == nullptr || up[i] == nullptr || down[i] == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("moe_experts: expert ", i, " has no weights"));
    }
  }
  return absl::OkStatus();
}

}  // namespace rl::kernels
