#include "services/worker/engine/kv_pool.h"

#include "common/check.h"

namespace rl::engine {

KvPool::KvPool(int64_t num_slots, int32_t page_size) : page_size_(page_size) {
  RL_CHECK(page_size > 0 && num_slots >= 0);
  is_free_.assign(num_slots / page_size, true);
  Reset();
}

bool KvPool::Alloc(int64_t n, std::vector<int32_t>* out) {
  if (n > num_free_pages()) return false;
  for (int64_t i = 0; i < n; ++i) {
    const int32_t page = free_.back();
    free_.pop_back();
    is_free_[page] = false;
    out->push_back(page);
  }
  return true;
}

void KvPool::Free(int32_t page) {
  RL_CHECK(page >= 0 && page < num_pages() && !is_free_[page]);
  is_free_[page] = true;
  free_.push_back(page);
}

void KvPool::Free(absl::Span<const int32_t> pages) {
  for (int32_t page : pages) Free(page);
}

void KvPool::Reset() {
  const int64_t n = num_pages();
  free_.clear();
  free_.reserve(n);
  // Highest id first on the stack so allocation starts at page 0.
  for (int64_t p = n - 1; p >= 0; --p) free_.push_back(static_cast<int32_t>(p));
  is_free_.assign(n, true);
}

}  // namespace rl::engine
