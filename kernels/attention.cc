#include "kernels/attention.h"

#include "absl/strings/str_cat.h"

namespace rl::kernels {

absl::Status WriteKvParams::ValidateShapes() const {
  if (k == nullptr || v == nullptr || slots == nullptr || k_cache == nullptr ||
      v_cache == nullptr) {
    return absl::InvalidArgumentError("write_kv: null buffer");
  }
  if (num_tokens < 0 || kv_dim <= 0 || k_stride < kv_dim || v_stride < kv_dim || num_slots <= 0) {
    return absl::InvalidArgumentError("write_kv: bad sizes");
  }
  return absl::OkStatus();
}

absl::Status WriteKvParams::Validate() const {
  if (absl::Status s = ValidateShapes(); !s.ok()) return s;
  for (int64_t t = 0; t < num_tokens; ++t) {
    if (slots[t] < 0 || slots[t] >= num_slots) {
      return absl::InvalidArgumentError(
          absl::StrCat("write_kv: slot ", slots[t], " out of range [0, ", num_slots, ")"));
    }
  }
  return absl::OkStatus();
}

absl::Status AttentionParams::ValidateShapes() const {
  if (q == nullptr || k_cache == nullptr || v_cache == nullptr || out == nullptr ||
      context_len == nullptr || slot_begin == nullptr || slots == nullptr) {
    return absl::InvalidArgumentError("attention: null buffer");
  }
  if (num_tokens < 0 || num_heads <= 0 || num_kv_heads <= 0 || num_heads % num_kv_heads != 0 ||
      head_dim <= 0 || q_stride < num_heads * head_dim || num_slots <= 0 || max_context <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("attention: bad sizes heads=", num_heads,
                                                   " kv_heads=", num_kv_heads,
                                                   " head_dim=", head_dim));
  }
  return absl::OkStatus();
}

absl::Status AttentionParams::Validate() const {
  if (absl::Status s = ValidateShapes(); !s.ok()) return s;
  for (int64_t t = 0; t < num_tokens; ++t) {
    const int64_t len = context_len[t];
    const int64_t begin = slot_begin[t];
    if (len <= 0 || len > max_context || begin < 0 || begin + len > num_slot_entries) {
      return absl::InvalidArgumentError(absl::StrCat("attention: token ", t, " context ", len,
                                                     " at slot entry ", begin, " out of range"));
    }
    for (int64_t j = 0; j < len; ++j) {
      const int32_t s = slots[begin + j];
      if (s < 0 || s >= num_slots) {
        return absl::InvalidArgumentError(
            absl::StrCat("attention: slot ", s, " out of range [0, ", num_slots, ")"));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace rl::kernels
