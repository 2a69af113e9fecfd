// TextCache: the router's prefix cache from trajectory text to the exact tokens the model saw.
//
// A radix tree over the bytes of trajectory texts. Each edge carries a run of tokens with, per
// token, its id, its loss mask (0 prompt, 1 generated), its rollout logprob (NaN = unknown) and
// the byte offset where its span ends; each node carries a weight version.
//
// Boundaries. A trajectory is text plus, per token, the byte offset where the token's span ends
// (non-decreasing, the last one equal to the text size). A token spans [end of the previous
// token, its own end). Tokens that share bytes (Hugging Face offsets give every token inside one
// multi-byte character that whole character) have equal ends; leading special tokens may end at
// 0. A *boundary* is a byte offset b > 0 at which a token ends; the tokens of the prefix
// text[0, b) are exactly the tokens with end <= b. Edges are split only at boundaries, so every
// node sits on one.
//
// Match. Siblings' first token groups may be prefixes of one another ("the" and "there": two
// tokenizations cut the same text differently), so a query may follow several cached paths.
// Along each, the match extends while the cached text equals the query's, ending on a boundary:
// when the query diverges from the cached text inside a token (or inside a group of tokens
// ending at the same offset), it backs off to the previous boundary and the caller tokenizes
// the rest. The result is, among those paths' prefixes, per MatchGoal:
//   - kLongest (Retrieve): the one covering the most bytes, then the one whose last generated
//     token ends furthest, then one ending where a trajectory ended;
//   - kMostGenerated (prompt resolution): the one whose last generated token ends furthest,
//     then one ending where a trajectory ended, then the one covering the most bytes; so a
//     query extending a cached trajectory that ends in generated tokens gets that trajectory
//     whole (or a path reusing generated tokens further);
// the first found on a tie, longer first groups first. With `utf8_safe_match` the result then backs off until
// the rest does not start with a UTF-8 continuation byte, so the rest of a valid UTF-8 query is
// valid UTF-8. At most kMaxMatchNodes edges are examined per query (the best found so far is
// returned past that).
//
// Conflicts. An insert follows the child whose first group is exactly its next token group and
// shares its edge only while tokens, masks, logprobs (bitwise) and span ends agree group by
// group (versions are not compared); where no child has that first group the rest becomes a
// new child. A conflict is the same group text cached with other tokens, masks or logprobs:
//   - when the cached subtree holds a generated token (loss mask 1), it stays: generated tokens,
//     and the prompt tokens of the earlier turns they extend, are never replaced by another
//     tokenization of the same text. The insert stops there: the new trajectory is cached up to
//     the conflict only (Insert's `cached_tokens` says how far; counted in conflicts_kept). Its
//     caller already has the tokens the model saw; a later request for its text reuses the
//     cached trajectory's tokens instead.
//   - otherwise (prompt tokens only) that subtree is removed and the new remainder takes its
//     place (counted in conflicts_replaced).
// So a trajectory that ends with generated tokens, once fully cached, stays exactly as
// inserted until GC removes it.
//
// Versions. Every token has a weight version. Where an insert ends, the node keeps that
// trajectory's versions for its whole path (run-length); a match returns, for the tokens up to
// the deepest such node on its path, the versions of the trajectory that ended there (the
// newest insert of exactly that text and tokens), and for tokens below it the versions of the
// first insert that cached them. So retrieving a cached trajectory returns exactly the versions
// it was inserted with, even where it shares tokens with trajectories of other versions.
//
// Invariants (checked by ValidateForTesting):
//   - every root-to-node sequence of tokens, masks, logprobs and span ends is a prefix of one
//     inserted trajectory (the cache never returns a mix the model did not see);
//   - the first-token-group texts of a node's children are distinct (sorted as unsigned bytes);
//   - a node's version is >= its children's (inserts raise the whole path to the max);
//   - a non-root node is in the version-ordered leaf index iff it has no children.
//
// GC. After an insert leaves more than `max_cache_size` tokens, every node whose version is
// <= current_version - gc_threshold_k is removed, oldest leaves first (a parent that becomes a
// leaf joins the index), at O(log #versions) per removed node; no tree scan. The cache may stay
// above the limit when everything is recent.
//
// Cost. Match: O(matched bytes + depth * log fan-out) per path followed (one, unless cached
// tokenizations of the query's text cut it differently) plus the copy of the result. Insert:
// O(bytes + depth * log fan-out) for the shared part, O(new tokens + bytes) for the new edge, O(edge) per split, and
// O(removed) for conflicts and GC. Memory: 13 B per token (id 4, logprob 4, span end 4, mask 1)
// and the text bytes in one allocation per edge, plus a ~135 B node per edge; per-token weight
// versions are run-length encoded per edge (16 B per extra run, none for a uniform edge) and
// per trajectory end (16 B per run of that trajectory's versions).
//
// Thread safety: every method may be called concurrently. Insert and SetCurrentVersion hold the
// writer lock; Match, Retrieve, GetStats and ValidateForTesting a shared reader lock.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <string_view>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"

namespace rl::router {

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
  static absl::StatusOr<std::unique_ptr<TextCache>> Create(const TextCacheOptions& options);
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
  absl::Status Insert(std::string_view text, absl::Span<const int32_t> tokens,
                      absl::Span<const uint32_t> token_end_offsets,
                      absl::Span<const uint8_t> loss_mask, absl::Span<const float> logprobs,
                      int64_t weight_version, absl::Span<const int64_t> token_versions = {},
                      size_t* cached_tokens = nullptr) ABSL_LOCKS_EXCLUDED(mu_);

  // Longest cached prefix of `query` ending on a token boundary (see the file comment). Counts
  // one hit (some tokens matched) or one miss.
  CacheMatch Match(std::string_view query, MatchGoal goal = MatchGoal::kLongest) const
      ABSL_LOCKS_EXCLUDED(mu_);

  // Match projected onto RetrieveFromText's fields; the trajectory is fully cached iff
  // matched_bytes == text.size(). Counts a hit or miss like Match.
  CacheRetrieval Retrieve(std::string_view text) const ABSL_LOCKS_EXCLUDED(mu_);

  // Sets current_version (e.g. on a weight update announced before any response carries it);
  // later inserts still raise it to their version. Runs GC when over the size limit.
  void SetCurrentVersion(int64_t version) ABSL_LOCKS_EXCLUDED(mu_);

  TextCacheStats GetStats() const ABSL_LOCKS_EXCLUDED(mu_);

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
  void MatchLocked(std::string_view query, MatchGoal goal, CacheMatch* out) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);

  const TextCacheOptions options_;
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
  // Counted under the shared lock, hence atomic.
  mutable std::atomic<int64_t> hits_{0};
  mutable std::atomic<int64_t> misses_{0};
};

}  // namespace rl::router
