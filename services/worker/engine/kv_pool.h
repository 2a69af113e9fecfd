// KvPool: the free-list allocator of KV pages. The runner owns `num_slots` token slots per
// layer; slot s lies in page s / page_size. The pool hands out whole pages; a page is either
// free or owned by exactly one holder (a running sequence or the radix cache).
//
// Invariant: num_free_pages() + pages held elsewhere == num_pages(); a double free is a
// broken invariant and aborts (RL_CHECK). Cost: Alloc/Free are O(pages moved).
// Thread safety: none; used only from the engine thread.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/types/span.h"

namespace rl::engine {

class KvPool {
 public:
  // `num_slots` is rounded down to whole pages.
  KvPool(int64_t num_slots, int32_t page_size);

  int32_t page_size() const { return page_size_; }
  int64_t num_pages() const { return static_cast<int64_t>(is_free_.size()); }
  int64_t num_free_pages() const { return static_cast<int64_t>(free_.size()); }
  int64_t total_tokens() const { return num_pages() * page_size_; }
  int64_t available_tokens() const { return num_free_pages() * page_size_; }

  // Appends `n` page ids to `out`. Returns false (and allocates nothing) when fewer are free.
  bool Alloc(int64_t n, std::vector<int32_t>* out);
  void Free(absl::Span<const int32_t> pages);
  void Free(int32_t page);
  // Everything free again (the caller guarantees no holder remains).
  void Reset();

 private:
  int32_t page_size_;
  std::vector<int32_t> free_;  // stack: the most recently freed page is reused first
  std::vector<bool> is_free_;
};

}  // namespace rl::engine
