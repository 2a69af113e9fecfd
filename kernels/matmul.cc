#include "kernels/matmul.h"

#include "absl/strings/str_cat.h"

namespace rl::kernels {

absl::Status MatmulParams::Validate() const {
  if (x == nullptr || w == nullptr || y == nullptr) {
    return absl::InvalidArgumentError("matmul: null x, w or y");
  }
  if (m < 0 || n <= 0 || k <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("matmul: bad sizes m=", m, " n=", n, " k=", k));
  }
  if (!model_io::IsFloatWeightDType(w_dtype) ||
      (bias != nullptr && !model_io::IsFloatWeightDType(bias_dtype))) {
    return absl::InvalidArgumentError("matmul: weights must be F32, BF16 or F16");
  }
  return absl::OkStatus();
}

absl::Status ValidateMatmulGroup(absl::Span<const MatmulParams> group) {
  if (group.empty()) return absl::InvalidArgumentError("matmul group: empty");
  for (const MatmulParams& p : group) {
    if (absl::Status s = p.Validate(); !s.ok()) return s;
    if (p.m != group[0].m) {
      return absl::InvalidArgumentError(
          absl::StrCat("matmul group: m=", p.m, " differs from the first's m=", group[0].m));
    }
  }
  return absl::OkStatus();
}

}  // namespace rl::kernels
