#include "kernels/rmsnorm.h"

#include "absl/strings/str_cat.h"

namespace rl::kernels {

absl::Status RmsNormParams::Validate() const {
  if (x == nullptr || w == nullptr || y == nullptr) {
    return absl::InvalidArgumentError("rmsnorm: null x, w or y");
  }
  if (rows < 0 || dim <= 0 || !(eps >= 0)) {
    return absl::InvalidArgumentError(absl::StrCat("rmsnorm: bad rows=", rows, " dim=", dim));
  }
  if (!model_io::IsFloatWeightDType(w_dtype)) {
    return absl::InvalidArgumentError("rmsnorm: weight must be F32, BF16 or F16");
  }
  return absl::OkStatus();
}

}  // namespace rl::kernels
