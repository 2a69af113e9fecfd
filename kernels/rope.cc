#include "kernels/rope.h"

#include "absl/strings/str_cat.h"

namespace rl::kernels {

absl::Status RopeParams::Validate() const {
  if (q == nullptr || k == nullptr || cos == nullptr || sin == nullptr) {
    return absl::InvalidArgumentError("rope: null buffer");
  }
  if (num_tokens < 0 || num_heads <= 0 || num_kv_heads <= 0 || head_dim <= 0 || head_dim % 2 != 0 ||
      q_stride < num_heads * head_dim || k_stride < num_kv_heads * head_dim) {
    return absl::InvalidArgumentError(absl::StrCat(
        "rope: bad sizes heads=", num_heads, " kv_heads=", num_kv_heads, " head_dim=", head_dim));
  }
  return absl::OkStatus();
}

}  // namespace rl::kernels
