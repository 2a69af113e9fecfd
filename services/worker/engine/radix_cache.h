// RadixCache: a prefix cache over token ids whose values are KV pages, so a prompt prefix
// shared by many requests is computed once. Keys are page-aligned: every edge holds a whole
// number of pages, and a match or insert only covers floor(len / page_size) pages.
//
// Namespaces: each weight version has its own root. A prefix computed under one version never
// matches a request of another; old versions' nodes are evicted like any other.
//
// Locking: a running sequence locks the node at the end of its cached prefix; a lock pins the
// node and all its ancestors. Eviction frees least-recently-used unlocked leaves first.
// Invariant: cached_tokens() == evictable_tokens() + locked_tokens(); the tree owns every page
// it holds (the KvPool sees them as allocated).
//
// Events (kv_events.h): every page has a block hash chained from its parent's (the namespace
// seeds the root); with an event sink set, new leaves are reported stored, evicted leaves
// removed and Reset cleared (splits change no block). Snapshot lists every block.
//
// Cost: Match / Insert are O(matched pages) plus one hash lookup per edge, and O(new tokens) of
// hashing; Evict is O(nodes log nodes). Thread safety: none; used only from the engine thread.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/types/span.h"
#include "services/worker/engine/kv_events.h"

namespace rl::engine {

class RadixCache {
 public:
  struct Node {
    std::vector<int32_t> key;    // tokens of this edge, a multiple of page_size
    std::vector<int32_t> pages;  // key.size() / page_size page ids
    Node* parent = nullptr;      // nullptr for a namespace root
    // Keyed by the first page of the child's key.
    absl::flat_hash_map<std::vector<int32_t>, std::unique_ptr<Node>> children;
    int32_t lock_ref = 0;
    uint64_t last_access = 0;
    int64_t ns = 0;
    uint64_t hash = 0;  // block hash of its last page (a root: the namespace's seed)
  };

  struct MatchResult {
    int64_t num_tokens = 0;      // page-aligned length of the cached prefix
    std::vector<int32_t> pages;  // num_tokens / page_size pages, in order
    Node* last_node = nullptr;   // node ending exactly at num_tokens; nullptr when 0
  };

  explicit RadixCache(int32_t page_size);
  ~RadixCache();
  RadixCache(const RadixCache&) = delete;
  RadixCache& operator=(const RadixCache&) = delete;

  int32_t page_size() const { return page_size_; }

  // Longest cached prefix of `tokens` in namespace `ns`. Splits an edge so that last_node ends
  // exactly at the match; refreshes the LRU time of the path.
  MatchResult Match(int64_t ns, absl::Span<const int32_t> tokens);

  // Caches floor(len / page_size) pages of `tokens`, backed by `pages` (one per page). The
  // leading part that is already cached keeps the tree's pages: those of the caller's pages
  // there that differ from the tree's are appended to `duplicates` and stay the caller's to
  // free. Pages past that part now belong to the tree. Returns the already-cached length.
  int64_t Insert(int64_t ns, absl::Span<const int32_t> tokens, absl::Span<const int32_t> pages,
                 std::vector<int32_t>* duplicates);

  // Pins `node` and its ancestors (nullptr is a no-op).
  void Lock(Node* node);
  void Unlock(Node* node);

  // Frees least-recently-used unlocked leaves until `num_pages` pages came free or nothing
  // evictable is left. Appends the freed pages to `freed`; returns how many.
  int64_t Evict(int64_t num_pages, std::vector<int32_t>* freed);

  // Drops the whole tree, appending every page to `freed`. Requires no locks.
  void Reset(std::vector<int32_t>* freed);

  // Events of every later change go to `sink` (null: none are made; kv_events.h).
  void set_event_sink(std::vector<KvCacheEvent>* sink) { sink_ = sink; }
  // A clear, then every cached block as stored events, parents before children.
  void Snapshot(std::vector<KvCacheEvent>* out) const;
  // The hash of the page `tokens` (page_size of them) after a block hashed `parent`.
  static uint64_t BlockHash(uint64_t parent, absl::Span<const int32_t> tokens);

  int64_t cached_tokens() const { return cached_tokens_; }
  int64_t evictable_tokens() const { return evictable_tokens_; }
  int64_t locked_tokens() const { return cached_tokens_ - evictable_tokens_; }
  int64_t num_nodes() const { return num_nodes_; }

 private:
  // Walks from the root of `ns` along `tokens` (page-aligned length `len`), splitting the last
  // edge when the match ends inside it. Returns the deepest node reached and its depth.
  Node* Walk(int64_t ns, absl::Span<const int32_t> tokens, int64_t len, int64_t* matched,
             std::vector<const Node*>* path);
  Node* Split(Node* node, int64_t num_pages);
  Node* Root(int64_t ns);
  std::vector<int32_t> PageKey(absl::Span<const int32_t> tokens, int64_t pos) const;
  // A stored event for `node`'s pages (kStored), or the hashes of them (kRemoved).
  KvCacheEvent StoredEvent(const Node& node) const;
  std::vector<int64_t> PageHashes(const Node& node) const;

  int32_t page_size_;
  absl::flat_hash_map<int64_t, std::unique_ptr<Node>> roots_;
  uint64_t clock_ = 0;
  int64_t cached_tokens_ = 0;
  int64_t evictable_tokens_ = 0;
  int64_t num_nodes_ = 0;
  std::vector<KvCacheEvent>* sink_ = nullptr;
};

}  // namespace rl::engine
