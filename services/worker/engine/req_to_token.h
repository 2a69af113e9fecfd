// ReqToTokenPool: the table mapping (request row, position) to a KV slot. Every running
// sequence owns one row for as long as it holds KV; row[p] is the slot of position p. The
// runner's `kv_slots` for a sequence are row[0 .. len).
//
// Memory: num_rows * row_len int32 (allocated once). Alloc/Free are O(1).
// Thread safety: none; used only from the engine thread.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "absl/types/span.h"

namespace rl::engine {

class ReqToTokenPool {
 public:
  ReqToTokenPool(int32_t num_rows, int32_t row_len);

  int32_t num_rows() const { return num_rows_; }
  int32_t row_len() const { return row_len_; }
  int32_t num_used() const { return num_rows_ - static_cast<int32_t>(free_.size()); }
  int32_t num_free() const { return static_cast<int32_t>(free_.size()); }

  // A free row, or nullopt when all are in use.
  std::optional<int32_t> Alloc();
  void Free(int32_t row);
  absl::Span<int32_t> row(int32_t r) {
    return absl::MakeSpan(table_.data() + static_cast<int64_t>(r) * row_len_, row_len_);
  }
  absl::Span<const int32_t> row(int32_t r) const {
    return absl::MakeConstSpan(table_.data() + static_cast<int64_t>(r) * row_len_, row_len_);
  }
  // All rows free again.
  void Reset();

 private:
  int32_t num_rows_;
  int32_t row_len_;
  std::vector<int32_t> table_;
  std::vector<int32_t> free_;
  std::vector<bool> in_use_;
};

}  // namespace rl::engine
