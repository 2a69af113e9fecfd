#include "kernels/embedding.h"

#include "absl/strings/str_cat.h"

namespace rl::kernels {

absl::Status EmbeddingParams::ValidateShapes() const {
  if (table == nullptr || ids == nullptr || out == nullptr) {
    return absl::InvalidArgumentError("embedding: null buffer");
  }
  if (num_tokens < 0 || num_rows <= 0 || dim <= 0 || !model_io::IsFloatWeightDType(table_dtype)) {
    return absl::InvalidArgumentError("embedding: bad sizes or dtype");
  }
  return absl::OkStatus();
}

absl::Status EmbeddingParams::Validate() const {
  if (absl::Status s = ValidateShapes(); !s.ok()) return s;
  for (int64_t t = 0; t < num_tokens; ++t) {
    if (ids[t] < 0 || ids[t] >= num_rows) {
      return absl::InvalidArgumentError(
          absl::StrCat("embedding: token id ", ids[t], " out of range [0, ", num_rows, ")"));
    }
  }
  return absl::OkStatus();
}

}  // namespace rl::kernels
