// TextCache: the router's prefix cache from trajectory text to the exact tokens the model saw.
// A radix tree over the bytes of trajectory texts whose edges carry, per token, its id, loss
// mask, rollout logprob, span end and weight version. Edges split only at token boundaries; a
// query follows every cached path its text allows and gets the best prefix for its goal; a
// conflicting insert never replaces generated tokens; retrieval returns a trajectory's own
// versions; GC removes the oldest-version leaves once over the size limit. docs/text-cache.md
// has the boundaries, matching, conflicts, versions, invariants and GC in full.
//
// Cost: Match O(matched bytes + depth * log fan-out) per path followed; Insert O(bytes + depth
// * log fan-out) plus O(new tokens) for the new edge; GC O(log #versions) per removed node.
// Memory: 13 B per token plus the text bytes and a ~145 B node per edge (with the bit set of
// the workers that served it).
//
// Durability: created with a CacheStore, the cache is recovered from it (before the router takes
// traffic) and every mutation queues the nodes it changed as one batch, in mutation order, under
// the writer lock (text_cache_store.cc); the caller waits for the store's ticket before it
// answers. Without a store it lives in memory only.
//
// Thread safety: every method may be called concurrently. Insert and SetCurrentVersion hold the
// writer lock; Match, Retrieve, GetStats and ValidateForTesting a shared reader lock. The
// implementation is split by concern: text_cache.cc (inserts, structure, GC),
// text_cache_match.cc (lookups), text_cache_validate.cc (the invariant walk).
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"

namespace rl::router {

class CacheStore;

// Edges a Match examines at most (the paths a query follows; see the file comment).
inline constexpr size_t kMaxMatchNodes = 4096;

// Which of the cached paths a query follows Match returns (see the file comment).
enum class MatchGoal { kLongest, kMostGenerated };

struct TextCacheOptions {
  // GC runs when an insert leaves more than this many cached tokens. > 0.
  int64_t max_cache_size = 1 << 20;
  // GC removes nodes whose version is <= current_version - gc_threshold_k. >= 0.
  int64_t gc_threshold_k = 5;
  // Matches never end right before a UTF-8 continuation byte of the query.
  bool utf8_safe_match = true;

  absl::Status Validate() const;
};

// Worker addresses the cache remembers at once (one bit per node each; docs/text-cache.md,
// "Workers"). A 65th address takes the slot of the one used least recently.
inline constexpr size_t kMaxCacheWorkers = 64;

// A worker that served a trajectory through the first `tokens` tokens of a match.
struct CacheHolder {
  std::string worker;
  uint32_t tokens = 0;
};

// The cached prefix of a query. Empty (matched_bytes == 0, no tokens) on a miss.
struct CacheMatch {
  size_t matched_bytes = 0;  // query[0, matched_bytes) is covered by `tokens`
  std::vector<int32_t> tokens;
  std::vector<uint32_t> token_end_offsets;  // absolute byte offsets into the query
  std::vector<uint8_t> loss_mask;           // 0 prompt, 1 generated
  std::vector<float> logprobs;              // NaN where unknown
  // Per token, as inserted: up to the deepest trajectory end on the path, that trajectory's.
  std::vector<int64_t> token_versions;
  int64_t weight_version = 0;  // version of the deepest matched node (0 on a miss)
  // The workers that served trajectories through a prefix of the match at the cache's current
  // version, each with the tokens of the longest such prefix; longest first.
  std::vector<CacheHolder> holders;
};

// RetrieveFromText's view of a match: exactly what was inserted for query[0, matched_bytes).
struct CacheRetrieval {
  size_t matched_bytes = 0;
  std::vector<int32_t> tokens;
  std::vector<uint8_t> loss_mask;
  std::vector<float> rollout_logp;
  std::vector<int64_t> token_versions;
  int64_t weight_version = 0;  // newest version on the matched path (0 on a miss)
};

struct TextCacheStats {
  int64_t entries = 0;  // nodes, root excluded
  int64_t hits = 0;     // queries that matched at least one token
  int64_t misses = 0;
  double hit_rate = 0;  // hits / (hits + misses); 0 before the first query
  int64_t size_tokens = 0;
  int64_t size_bytes = 0;  // cached text bytes
  int64_t max_cache_size = 0;
  int64_t gc_threshold_k = 0;
  int64_t gc_runs = 0;
  int64_t gc_removed_tokens = 0;
  int64_t gc_removed_nodes = 0;
  int64_t conflicts_replaced = 0;  // prompt-only subtrees replaced by a newer tokenization
  int64_t conflicts_kept = 0;      // inserts stopped at a conflict to keep generated tokens
  int64_t current_version = 0;
};

class TextCache {
 public:
  // `store` (may be null: memory only) must outlive the cache; its contents are recovered here
  // (FailedPrecondition naming the store when they are corrupt) and every later change is
  // queued to it.
  static absl::StatusOr<std::unique_ptr<TextCache>> Create(const TextCacheOptions& options,
                                                           CacheStore* store = nullptr);
  ~TextCache();
  TextCache(const TextCache&) = delete;
  TextCache& operator=(const TextCache&) = delete;

  // Inserts one trajectory: `text` and its tokens, with per-token span ends, loss masks,
  // logprobs (empty `logprobs`: all unknown) and weight versions (empty: all
  // `weight_version`). Versions do not stop edges from being shared; the trajectory's own
  // versions are kept where it ends (see Versions above). Raises every node on the path to
  // `weight_version` (max) and current_version to at least it; resolves conflicts as described
  // above (`cached_tokens`, when given, receives how many leading tokens of the trajectory the
  // cache holds: all of them unless a conflict kept generated tokens); then runs GC when over
  // the size limit. InvalidArgument (cache unchanged) when the text is empty or over 4 GiB,
  // lengths differ, ends decrease or do not end at the text size, or a mask is not 0/1.
  // `worker` (empty: unknown) is the address of the worker that served the trajectory: every
  // node on its cached path remembers it (Match's holders).
  absl::Status Insert(std::string_view text, absl::Span<const int32_t> tokens,
                      absl::Span<const uint32_t> token_end_offsets,
                      absl::Span<const uint8_t> loss_mask, absl::Span<const float> logprobs,
                      int64_t weight_version, absl::Span<const int64_t> token_versions = {},
                      size_t* cached_tokens = nullptr, std::string_view worker = {})
      ABSL_LOCKS_EXCLUDED(mu_);

  // Longest cached prefix of `query` ending on a token boundary (see the file comment). Counts
  // one hit (some tokens matched) or one miss.
  CacheMatch Match(std::string_view query, MatchGoal goal = MatchGoal::kLongest) const
      ABSL_LOCKS_EXCLUDED(mu_);

  // Match projected onto RetrieveFromText's fields; the trajectory is fully cached iff
  // matched_bytes == text.size(). Counts a hit or miss like Match.
  CacheRetrieval Retrieve(std::string_view text) const ABSL_LOCKS_EXCLUDED(mu_);

  // Sets current_version (the router calls it when the fleet's weight version changes, through
  // the pool's FleetObserver, before any response carries the new version); later inserts still
  // raise it to their version. Runs GC when over the size limit.
  void SetCurrentVersion(int64_t version) ABSL_LOCKS_EXCLUDED(mu_);

  TextCacheStats GetStats() const ABSL_LOCKS_EXCLUDED(mu_);

  // The durable store (null: memory only).
  CacheStore* store() const { return store_; }

  // Walks the whole tree and checks every invariant and counter. O(size); for tests.
  absl::Status ValidateForTesting() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Node;

  explicit TextCache(const TextCacheOptions& options);

  // Orders children by first-group text, compared as unsigned bytes.
  // Whether `node`'s edge or any edge below it holds a generated token (loss mask 1).
  static bool HoldsGenerated(const Node* node);
  static bool KeyLess(const std::unique_ptr<Node>& child, std::string_view key);
  // Appends the children whose first-group text is a prefix of `rest`, longest first.
  // O(log fan-out) per child found or key skipped.
  static void FindChildren(const Node* parent, std::string_view rest,
                           std::vector<const Node*>* out);
  void Bump(Node* node, int64_t version) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void SyncLeaf(Node* node) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void LinkLeaf(Node* node) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void UnlinkLeaf(Node* node) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Splits `node` (a child of its parent) after its first `num_tokens` tokens; returns the new
  // upper node, which takes node's place, with `node` as its only child.
  Node* Split(Node* node, uint32_t num_tokens) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Detaches parent->children[index] and frees its subtree; the parent's leaf state is left to
  // the caller.
  void RemoveSubtree(Node* parent, size_t index) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Adds the trajectory's rest (text[pos..], tokens[first..]) as a new child of `parent`.
  Node* AddChild(Node* parent, std::string_view text, size_t pos, size_t first,
                 absl::Span<const int32_t> tokens, absl::Span<const uint32_t> ends,
                 absl::Span<const uint8_t> loss_mask, absl::Span<const float> logprobs,
                 absl::Span<const int64_t> token_versions, int64_t version)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void MaybeCollectGarbage() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The bit of `worker`'s slot, taking a slot (and clearing its old owner's bits) when new.
  uint64_t WorkerBit(std::string_view worker) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Records that the worker(s) `bit` computed `node` at `version` (before Bump raises it): a
  // newer version replaces the node's workers (older versions' KV is gone from every worker).
  static void MarkWorkers(Node* node, int64_t version, uint64_t bit);
  void HoldersLocked(const std::vector<const Node*>& path, const std::vector<size_t>& tokens,
                     CacheMatch* out) const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  void MatchLocked(std::string_view query, MatchGoal goal, CacheMatch* out) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // The store journal (text_cache_store.cc): nodes changed / removed by the current mutation,
  // queued to the store as one batch by FlushJournal. No-ops without a store.
  void MarkDirty(Node* node) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ForgetNode(Node* node) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void FlushJournal() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  static std::string EncodeNode(const Node& node);
  absl::Status Recover() ABSL_LOCKS_EXCLUDED(mu_);
  // Queues the whole tree to the store as one snapshot (CacheStore::EnqueueSnapshot), in place
  // of the batches a failed commit lost. O(cache size) under the writer lock.
  void ResyncStore() ABSL_LOCKS_EXCLUDED(mu_);

  const TextCacheOptions options_;
  CacheStore* store_ = nullptr;
  mutable absl::Mutex mu_;
  std::unique_ptr<Node> root_ ABSL_GUARDED_BY(mu_);
  // Leaves (non-root nodes without children) by version: head of an intrusive list each.
  std::map<int64_t, Node*> leaves_ ABSL_GUARDED_BY(mu_);
  int64_t entries_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t size_tokens_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t size_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t gc_runs_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t gc_removed_tokens_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t gc_removed_nodes_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t conflicts_replaced_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t conflicts_kept_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t current_version_ ABSL_GUARDED_BY(mu_) = 0;
  // Worker addresses by slot (a node's `workers` bit i is worker_slots_[i]) and, per slot, the
  // insert count at its last use.
  std::vector<std::string> worker_slots_ ABSL_GUARDED_BY(mu_);
  std::vector<uint64_t> worker_slot_used_ ABSL_GUARDED_BY(mu_);
  uint64_t inserts_ ABSL_GUARDED_BY(mu_) = 0;
  // The store journal.
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;  // node ids are never reused; the root is 0
  std::vector<Node*> dirty_ ABSL_GUARDED_BY(mu_);
  std::vector<uint64_t> deleted_ ABSL_GUARDED_BY(mu_);
  int64_t stored_version_ ABSL_GUARDED_BY(mu_) = 0;
  // Counted under the shared lock, hence atomic.
  mutable std::atomic<int64_t> hits_{0};
  mutable std::atomic<int64_t> misses_{0};
};

}  // namespace rl::router
