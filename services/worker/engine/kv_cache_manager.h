// KvCacheManager: the KV bookkeeping of the engine. It owns the paged KV pool, the
// req_to_token table and the radix prefix cache, and keeps every sequence's KV state (the
// fields of Sequence's KV layout, see sequence.h) consistent with them: admission with a cached
// prefix, growing by pages, caching computed pages, releasing on finish or retraction.
// No policy: the scheduler decides who runs; this class says whether the pages are there.
//
// Invariant (CheckInvariants): free pages + radix-cache pages + pages owned by the given
// running sequences == all pages, and rows in use == running sequences.
// Thread safety: none; owned by the engine thread. Cost: O(pages touched) per call, Match is
// O(prefix length).
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "services/worker/engine/kv_pool.h"
#include "services/worker/engine/radix_cache.h"
#include "services/worker/engine/req_to_token.h"
#include "services/worker/engine/sequence.h"

namespace rl::engine {

class KvCacheManager {
 public:
  // `num_rows` req_to_token rows of `row_len` slots; `num_kv_slots` / page_size pages.
  KvCacheManager(int64_t num_kv_slots, int32_t page_size, int32_t num_rows, int32_t row_len);

  int32_t page_size() const { return page_size_; }

  // The longest cached prefix of `tokens` computed with weights `version`.
  RadixCache::MatchResult Match(int64_t version, absl::Span<const int32_t> tokens);
  // Gives `seq` (holding no KV) a row that maps the matched prefix `m` (pinned in the cache),
  // with KV version `version`. False (nothing changed) when no row is free.
  bool Admit(Sequence* seq, const RadixCache::MatchResult& m, int64_t version);
  // Pages `seq` needs to hold `new_len` positions.
  int64_t PagesToGrow(const Sequence& seq, int64_t new_len) const;
  // Makes `num_pages` pages free, evicting unlocked cache pages. False when it cannot.
  bool EnsureFreePages(int64_t num_pages);
  // Allocates the pages for positions [num_allocated, new_len). False (nothing changed) when
  // the pages cannot be found even by eviction.
  bool Grow(Sequence* seq, int64_t new_len);
  // Inserts the computed whole pages of `seq` into the cache and maps its row onto the cached
  // pages (so they are shared from now on); the sequence keeps running.
  void CacheUnfinished(Sequence* seq);
  // Frees the row and pages of `seq` (with `cache`, its computed whole pages go to the cache
  // instead) and resets its KV state. No-op for a sequence holding no row.
  void Release(Sequence* seq, bool cache);
  // The slots of `seq`'s positions.
  absl::Span<const int32_t> row(const Sequence& seq) const { return req_to_token_.row(seq.row); }
  // Empties the cache, the pool and the table. No sequence may hold a row.
  void Reset();
  // Evicts every cached page no sequence pins (an in-flight update: stale KV is never reused
  // while running sequences keep theirs).
  void EvictUnlocked();

  int64_t num_free_rows() const { return req_to_token_.num_free(); }
  int32_t num_used_rows() const { return req_to_token_.num_used(); }
  int32_t num_rows() const { return req_to_token_.num_rows(); }
  int64_t total_tokens() const { return pool_.total_tokens(); }
  int64_t available_tokens() const { return pool_.available_tokens(); }
  int64_t evictable_tokens() const { return tree_.evictable_tokens(); }
  int64_t cached_tokens() const { return tree_.cached_tokens(); }
  int64_t num_cache_nodes() const { return tree_.num_nodes(); }
  // KV events of the radix cache (radix_cache.h, kv_events.h).
  void set_event_sink(std::vector<KvCacheEvent>* sink) { tree_.set_event_sink(sink); }
  void Snapshot(std::vector<KvCacheEvent>* out) const { tree_.Snapshot(out); }

  // OK when the page accounting invariant holds for `running` (every sequence holding KV);
  // INTERNAL naming the mismatch otherwise.
  absl::Status CheckInvariants(absl::Span<const Sequence* const> running) const;

 private:
  void AppendOwnPages(const Sequence& seq, std::vector<int32_t>* pages) const;
  // Inserts the first `n` (whole pages of) computed tokens of `seq` into the radix cache and
  // frees the pages the tree already held for them.
  void InsertComputed(const Sequence& seq, int64_t n);

  const int32_t page_size_;
  KvPool pool_;
  ReqToTokenPool req_to_token_;
  RadixCache tree_;
  std::vector<int32_t> scratch_pages_;
};

}  // namespace rl::engine
