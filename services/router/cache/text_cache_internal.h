// The text cache's internals, shared by its implementation files (text_cache.cc: inserts,
// structure and GC; text_cache_match.cc: lookups; text_cache_validate.cc: the invariant walk):
// the node layout and the byte / run-length helpers. Not for use outside services/router/cache.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/types/span.h"
#include "services/router/cache/text_cache.h"

namespace rl::router {

// One edge and the node below it. The edge's data lives in one allocation of 32-bit words:
// ids[n] | logprob bits[n] | span ends[n] (relative to the edge start) | mask[n] text[bytes].
// The last token of an edge ends at its last byte; only children of the root may hold tokens
// ending at 0 (leading special tokens).
struct TextCache::Node {
  Node* parent = nullptr;
  uint64_t id = 0;     // the store's key (0: the root); never reused
  bool dirty = false;  // in the store journal of the current mutation
  std::unique_ptr<uint32_t[]> words;
  uint32_t num_tokens = 0;
  uint32_t num_bytes = 0;
  int64_t version = 0;
  // Sorted by FirstGroup(); prefix-free.
  std::vector<std::unique_ptr<Node>> children;
  Node* leaf_prev = nullptr;
  Node* leaf_next = nullptr;
  bool in_leaf_index = false;
  // Per-token weight versions, run-length: every token has `token_version` when `runs` is
  // empty; else runs[i] covers tokens [runs[i].first, runs[i + 1].first).
  int64_t token_version = 0;
  std::vector<std::pair<uint32_t, int64_t>> runs;
  // Set on a node where an inserted trajectory ends (empty elsewhere): the versions that insert
  // gave every token on the path from the root, run-length as (first token index, version).
  std::vector<std::pair<uint32_t, int64_t>> path_runs;
  // The workers (bits of TextCache::worker_slots_) that served a trajectory through this edge
  // at `version`; meaningful only while `version` is the cache's current version.
  uint64_t workers = 0;

  // Sets the versions of the tokens from `v` (num_tokens values).
  void SetVersions(const int64_t* v) {
    runs.clear();
    token_version = num_tokens > 0 ? v[0] : 0;
    for (uint32_t i = 1; i < num_tokens; ++i) {
      if (v[i] == v[i - 1]) continue;
      if (runs.empty()) runs.emplace_back(0, v[0]);
      runs.emplace_back(i, v[i]);
    }
  }
  // Appends the versions of tokens [begin, end).
  void AppendVersions(uint32_t begin, uint32_t end, std::vector<int64_t>* out) const {
    if (runs.empty()) {
      out->insert(out->end(), end - begin, token_version);
      return;
    }
    size_t r = 0;
    for (uint32_t i = begin; i < end; ++i) {
      while (r + 1 < runs.size() && runs[r + 1].first <= i) ++r;
      out->push_back(runs[r].second);
    }
  }

  void Allocate(uint32_t tokens, uint32_t bytes) {
    num_tokens = tokens;
    num_bytes = bytes;
    const size_t n = tokens;
    words.reset(new uint32_t[3 * n + (n + bytes + 3) / 4]);
  }
  int32_t* ids() { return reinterpret_cast<int32_t*>(words.get()); }
  const int32_t* ids() const { return reinterpret_cast<const int32_t*>(words.get()); }
  // Logprobs are stored as bits: read and write them with memcpy only.
  uint32_t* logprob_bits() { return words.get() + num_tokens; }
  const uint32_t* logprob_bits() const { return words.get() + num_tokens; }
  uint32_t* ends() { return words.get() + 2 * size_t{num_tokens}; }
  const uint32_t* ends() const { return words.get() + 2 * size_t{num_tokens}; }
  uint8_t* mask() { return reinterpret_cast<uint8_t*>(words.get() + 3 * size_t{num_tokens}); }
  const uint8_t* mask() const {
    return reinterpret_cast<const uint8_t*>(words.get() + 3 * size_t{num_tokens});
  }
  char* text_data() { return reinterpret_cast<char*>(mask() + num_tokens); }
  std::string_view text() const {
    return std::string_view(reinterpret_cast<const char*>(mask() + num_tokens), num_bytes);
  }
  // Text of the first token group: up to the first positive span end.
  std::string_view FirstGroup() const {
    const uint32_t* e = ends();
    uint32_t i = 0;
    while (e[i] == 0) ++i;
    return text().substr(0, e[i]);
  }
};

namespace text_cache_internal {

inline bool IsUtf8Continuation(char c) { return (static_cast<uint8_t>(c) & 0xC0) == 0x80; }

inline size_t CommonPrefix(std::string_view a, std::string_view b) {
  const size_t n = std::min(a.size(), b.size());
  size_t i = 0;
  while (i + 8 <= n) {
    uint64_t x, y;
    std::memcpy(&x, a.data() + i, 8);
    std::memcpy(&y, b.data() + i, 8);
    if (x != y) break;
    i += 8;
  }
  while (i < n && a[i] == b[i]) ++i;
  return i;
}

// Run-length encoding of `versions` (non-empty) as (first index, version) pairs.
inline std::vector<std::pair<uint32_t, int64_t>> EncodeRuns(absl::Span<const int64_t> versions) {
  std::vector<std::pair<uint32_t, int64_t>> runs;
  for (size_t i = 0; i < versions.size(); ++i) {
    if (i == 0 || versions[i] != versions[i - 1]) {
      runs.emplace_back(static_cast<uint32_t>(i), versions[i]);
    }
  }
  return runs;
}

// Writes the first `count` versions of `runs` to out[0, count).
inline void ExpandRuns(const std::vector<std::pair<uint32_t, int64_t>>& runs, size_t count,
                       int64_t* out) {
  for (size_t r = 0; r < runs.size() && runs[r].first < count; ++r) {
    const size_t end = r + 1 < runs.size() ? std::min<size_t>(runs[r + 1].first, count) : count;
    std::fill(out + runs[r].first, out + end, runs[r].second);
  }
}

inline uint32_t FloatBits(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof(bits));
  return bits;
}

}  // namespace text_cache_internal
}  // namespace rl::router
