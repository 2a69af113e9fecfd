// TextCache::ValidateForTesting: walks the whole tree and checks every invariant and counter
// (docs/text-cache.md). O(size); for tests.
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "services/router/cache/text_cache.h"
#include "services/router/cache/text_cache_internal.h"

namespace rl::router {

absl::Status TextCache::ValidateForTesting() const {
  absl::ReaderMutexLock lock(&mu_);
  int64_t nodes = 0, tokens = 0, bytes = 0, leaves = 0;
  // (node, tokens on the path from the root through its edge)
  std::vector<std::pair<const Node*, size_t>> stack = {{root_.get(), 0}};
  while (!stack.empty()) {
    const auto [node, path_tokens] = stack.back();
    stack.pop_back();
    const bool is_root = node == root_.get();
    if (!is_root) {
      ++nodes;
      const auto& runs = node->path_runs;
      for (size_t r = 0; r < runs.size(); ++r) {
        if ((r == 0 && runs[r].first != 0) || (r > 0 && runs[r].first <= runs[r - 1].first) ||
            runs[r].first >= path_tokens) {
          return absl::InternalError("bad trajectory-end versions");
        }
      }
      tokens += node->num_tokens;
      bytes += node->num_bytes;
      if (node->num_tokens == 0 || node->num_bytes == 0) {
        return absl::InternalError("empty edge");
      }
      const uint32_t* e = node->ends();
      for (uint32_t i = 0; i < node->num_tokens; ++i) {
        if (i > 0 && e[i] < e[i - 1]) return absl::InternalError("span ends decrease");
        if (node->mask()[i] > 1) return absl::InternalError("bad loss mask");
      }
      if (e[node->num_tokens - 1] != node->num_bytes) {
        return absl::InternalError("edge does not end on its last token");
      }
      if (e[0] == 0 && node->parent != root_.get()) {
        return absl::InternalError("zero-width leading token below the root's children");
      }
      if (node->parent != root_.get() && node->version > node->parent->version) {
        return absl::InternalError(
            absl::StrCat("child version ", node->version, " > parent ", node->parent->version));
      }
      if (node->in_leaf_index != node->children.empty()) {
        return absl::InternalError("leaf index out of sync");
      }
      if (node->in_leaf_index) ++leaves;
    }
    for (size_t i = 0; i < node->children.size(); ++i) {
      const Node* child = node->children[i].get();
      if (child->parent != node) return absl::InternalError("bad parent pointer");
      if (i > 0) {
        const std::string_view prev = node->children[i - 1]->FirstGroup();
        const std::string_view key = child->FirstGroup();
        if (!(prev < key)) {
          return absl::InternalError(absl::StrCat("sibling first groups not sorted and distinct: '",
                                                  std::string(prev), "' / '", std::string(key),
                                                  "'"));
        }
      }
      stack.emplace_back(child, path_tokens + child->num_tokens);
    }
  }
  int64_t indexed = 0;
  for (const auto& [version, head] : leaves_) {
    if (head == nullptr || head->leaf_prev != nullptr) return absl::InternalError("bad list head");
    for (const Node* leaf = head; leaf != nullptr; leaf = leaf->leaf_next) {
      if (leaf->version != version) return absl::InternalError("leaf in the wrong version list");
      ++indexed;
    }
  }
  if (nodes != entries_ || tokens != size_tokens_ || bytes != size_bytes_ || leaves != indexed) {
    return absl::InternalError(absl::StrCat("counters: nodes ", nodes, "/", entries_, " tokens ",
                                            tokens, "/", size_tokens_, " bytes ", bytes, "/",
                                            size_bytes_, " leaves ", leaves, "/", indexed));
  }
  return absl::OkStatus();
}

}  // namespace rl::router
