#include "services/worker/engine/req_to_token.h"

#include "common/check.h"

namespace rl::engine {

ReqToTokenPool::ReqToTokenPool(int32_t num_rows, int32_t row_len)
    : num_rows_(num_rows), row_len_(row_len), table_(static_cast<size_t>(num_rows) * row_len, -1) {
  RL_CHECK(num_rows > 0 && row_len > 0);
  Reset();
}

std::optional<int32_t> ReqToTokenPool::Alloc() {
  if (free_.empty()) return std::nullopt;
  const int32_t r = free_.back();
  free_.pop_back();
  in_use_[r] = true;
  return r;
}

void ReqToTokenPool::Free(int32_t r) {
  RL_CHECK(r >= 0 && r < num_rows_ && in_use_[r]);
  in_use_[r] = false;
  free_.push_back(r);
}

void ReqToTokenPool::Reset() {
  free_.clear();
  for (int32_t r = num_rows_ - 1; r >= 0; --r) free_.push_back(r);
  in_use_.assign(num_rows_, false);
}

}  // namespace rl::engine
