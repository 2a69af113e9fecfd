// The text cache's inserts, structure (splits, new edges, subtree removal, the version-ordered
// leaf index), GC and statistics. Lookups are text_cache_match.cc, the invariant walk
// text_cache_validate.cc.
#include "services/router/cache/text_cache.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/check.h"
#include "services/router/cache/cache_store.h"
#include "services/router/cache/text_cache_internal.h"

namespace rl::router {

using text_cache_internal::CommonPrefix;
using text_cache_internal::EncodeRuns;
using text_cache_internal::FloatBits;

bool TextCache::HoldsGenerated(const Node* node) {
  std::vector<const Node*> stack = {node};
  while (!stack.empty()) {
    const Node* n = stack.back();
    stack.pop_back();
    if (std::memchr(n->mask(), 1, n->num_tokens) != nullptr) return true;
    for (const auto& child : n->children) stack.push_back(child.get());
  }
  return false;
}

bool TextCache::KeyLess(const std::unique_ptr<Node>& child, std::string_view key) {
  return child->FirstGroup() < key;
}

absl::Status TextCacheOptions::Validate() const {
  if (max_cache_size <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_cache_size must be > 0, got ", max_cache_size));
  }
  if (gc_threshold_k < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("gc_threshold_k must be >= 0, got ", gc_threshold_k));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<TextCache>> TextCache::Create(const TextCacheOptions& options,
                                                             CacheStore* store) {
  if (absl::Status s = options.Validate(); !s.ok()) return s;
  std::unique_ptr<TextCache> cache(new TextCache(options));
  if (store != nullptr) {
    cache->store_ = store;
    if (absl::Status s = cache->Recover(); !s.ok()) return s;
    if (absl::Status s = cache->ValidateForTesting(); !s.ok()) {
      return absl::FailedPreconditionError(
          absl::StrCat("text cache store: the recovered tree is inconsistent (", s.message(),
                       "); move the folder away to start with an empty cache"));
    }
    // After a failed commit the store rewrites the whole tree from a snapshot (cache_store.h).
    store->SetResync([raw = cache.get()] { raw->ResyncStore(); });
  }
  return cache;
}

TextCache::TextCache(const TextCacheOptions& options)
    : options_(options), root_(std::make_unique<Node>()) {}

TextCache::~TextCache() {
  if (store_ != nullptr) store_->SetResync(nullptr);  // waits for a resync in progress
  // Iterative teardown: long multi-turn chains must not recurse once per node.
  std::vector<std::unique_ptr<Node>> stack;
  stack.push_back(std::move(root_));
  while (!stack.empty()) {
    std::unique_ptr<Node> node = std::move(stack.back());
    stack.pop_back();
    for (auto& child : node->children) stack.push_back(std::move(child));
  }
}

void TextCache::LinkLeaf(Node* node) {
  Node*& head = leaves_[node->version];
  node->leaf_prev = nullptr;
  node->leaf_next = head;
  if (head != nullptr) head->leaf_prev = node;
  head = node;
  node->in_leaf_index = true;
}

void TextCache::UnlinkLeaf(Node* node) {
  if (node->leaf_prev != nullptr) {
    node->leaf_prev->leaf_next = node->leaf_next;
  } else {
    auto it = leaves_.find(node->version);
    RL_CHECK(it != leaves_.end() && it->second == node);
    if (node->leaf_next != nullptr) {
      it->second = node->leaf_next;
    } else {
      leaves_.erase(it);
    }
  }
  if (node->leaf_next != nullptr) node->leaf_next->leaf_prev = node->leaf_prev;
  node->leaf_prev = node->leaf_next = nullptr;
  node->in_leaf_index = false;
}

void TextCache::SyncLeaf(Node* node) {
  if (node == root_.get()) return;
  const bool leaf = node->children.empty();
  if (leaf && !node->in_leaf_index) LinkLeaf(node);
  if (!leaf && node->in_leaf_index) UnlinkLeaf(node);
}

void TextCache::MarkWorkers(Node* node, int64_t version, uint64_t bit) {
  if (bit == 0 || node->parent == nullptr) return;  // the root holds no tokens
  if (version > node->version) {
    node->workers = bit;
  } else if (version == node->version) {
    node->workers |= bit;
  }
}

uint64_t TextCache::WorkerBit(std::string_view worker) {
  if (worker.empty()) return 0;
  ++inserts_;
  for (size_t i = 0; i < worker_slots_.size(); ++i) {
    if (worker_slots_[i] == worker) {
      worker_slot_used_[i] = inserts_;
      return uint64_t{1} << i;
    }
  }
  size_t slot = worker_slots_.size();
  if (slot < kMaxCacheWorkers) {
    worker_slots_.emplace_back(worker);
    worker_slot_used_.push_back(inserts_);
  } else {
    // Every slot is taken (more than 64 workers ever served): the one used least recently goes,
    // and no node may keep claiming that its old worker holds it. O(nodes), and rare.
    slot =
        static_cast<size_t>(std::min_element(worker_slot_used_.begin(), worker_slot_used_.end()) -
                            worker_slot_used_.begin());
    const uint64_t keep = ~(uint64_t{1} << slot);
    std::vector<Node*> stack = {root_.get()};
    while (!stack.empty()) {
      Node* n = stack.back();
      stack.pop_back();
      n->workers &= keep;
      for (auto& child : n->children) stack.push_back(child.get());
    }
    worker_slots_[slot] = std::string(worker);
    worker_slot_used_[slot] = inserts_;
  }
  return uint64_t{1} << slot;
}

void TextCache::Bump(Node* node, int64_t version) {
  if (node == root_.get() || version <= node->version) return;
  MarkDirty(node);
  if (node->in_leaf_index) {
    UnlinkLeaf(node);
    node->version = version;
    LinkLeaf(node);
  } else {
    node->version = version;
  }
}

TextCache::Node* TextCache::Split(Node* node, uint32_t num_tokens) {
  RL_CHECK(num_tokens > 0 && num_tokens < node->num_tokens);
  Node* parent = node->parent;
  const uint32_t cut = node->ends()[num_tokens - 1];
  RL_CHECK(cut > 0 && cut < node->num_bytes && node->ends()[num_tokens] > cut);
  const uint32_t n = node->num_tokens;
  const std::string_view text = node->text();
  auto it = std::lower_bound(parent->children.begin(), parent->children.end(), node->FirstGroup(),
                             KeyLess);
  RL_CHECK(it != parent->children.end() && it->get() == node);

  auto upper = std::make_unique<Node>();
  upper->id = next_id_++;
  upper->Allocate(num_tokens, cut);
  std::memcpy(upper->ids(), node->ids(), num_tokens * sizeof(int32_t));
  std::memcpy(upper->logprob_bits(), node->logprob_bits(), num_tokens * sizeof(uint32_t));
  std::memcpy(upper->ends(), node->ends(), num_tokens * sizeof(uint32_t));
  std::memcpy(upper->mask(), node->mask(), num_tokens);
  std::memcpy(upper->text_data(), text.data(), cut);
  upper->version = node->version;
  upper->workers = node->workers;
  upper->parent = parent;
  std::vector<int64_t> versions;
  versions.reserve(n);
  node->AppendVersions(0, n, &versions);
  upper->SetVersions(versions.data());

  Node lower;
  lower.Allocate(n - num_tokens, node->num_bytes - cut);
  std::memcpy(lower.ids(), node->ids() + num_tokens, lower.num_tokens * sizeof(int32_t));
  std::memcpy(lower.logprob_bits(), node->logprob_bits() + num_tokens,
              lower.num_tokens * sizeof(uint32_t));
  for (uint32_t i = 0; i < lower.num_tokens; ++i) {
    lower.ends()[i] = node->ends()[num_tokens + i] - cut;
  }
  std::memcpy(lower.mask(), node->mask() + num_tokens, lower.num_tokens);
  std::memcpy(lower.text_data(), text.data() + cut, lower.num_bytes);
  node->words = std::move(lower.words);
  node->num_tokens = lower.num_tokens;
  node->num_bytes = lower.num_bytes;
  node->SetVersions(versions.data() + num_tokens);

  // `upper` keeps node's first group, hence node's place among the parent's children.
  Node* upper_raw = upper.get();
  upper->children.push_back(std::move(*it));
  node->parent = upper_raw;
  *it = std::move(upper);
  ++entries_;
  MarkDirty(upper_raw);
  MarkDirty(node);
  return upper_raw;
}

void TextCache::RemoveSubtree(Node* parent, size_t index) {
  std::vector<std::unique_ptr<Node>> stack;
  stack.push_back(std::move(parent->children[index]));
  parent->children.erase(parent->children.begin() + static_cast<std::ptrdiff_t>(index));
  while (!stack.empty()) {
    std::unique_ptr<Node> node = std::move(stack.back());
    stack.pop_back();
    if (node->in_leaf_index) UnlinkLeaf(node.get());
    ForgetNode(node.get());
    size_tokens_ -= node->num_tokens;
    size_bytes_ -= node->num_bytes;
    --entries_;
    for (auto& child : node->children) stack.push_back(std::move(child));
  }
}

TextCache::Node* TextCache::AddChild(Node* parent, std::string_view text, size_t pos, size_t first,
                                     absl::Span<const int32_t> tokens,
                                     absl::Span<const uint32_t> ends,
                                     absl::Span<const uint8_t> loss_mask,
                                     absl::Span<const float> logprobs,
                                     absl::Span<const int64_t> token_versions, int64_t version) {
  const size_t n = tokens.size() - first;
  auto node = std::make_unique<Node>();
  node->id = next_id_++;
  node->Allocate(static_cast<uint32_t>(n), static_cast<uint32_t>(text.size() - pos));
  std::memcpy(node->ids(), tokens.data() + first, n * sizeof(int32_t));
  if (logprobs.empty()) {
    const uint32_t nan_bits = FloatBits(std::numeric_limits<float>::quiet_NaN());
    std::fill_n(node->logprob_bits(), n, nan_bits);
  } else {
    std::memcpy(node->logprob_bits(), logprobs.data() + first, n * sizeof(float));
  }
  for (size_t i = 0; i < n; ++i) node->ends()[i] = ends[first + i] - static_cast<uint32_t>(pos);
  std::memcpy(node->mask(), loss_mask.data() + first, n);
  std::memcpy(node->text_data(), text.data() + pos, node->num_bytes);
  node->version = version;
  node->parent = parent;
  if (token_versions.empty()) {
    node->token_version = version;
  } else {
    node->SetVersions(token_versions.data() + first);
  }

  Node* raw = node.get();
  auto it = std::lower_bound(parent->children.begin(), parent->children.end(), raw->FirstGroup(),
                             KeyLess);
  parent->children.insert(it, std::move(node));
  size_tokens_ += raw->num_tokens;
  size_bytes_ += raw->num_bytes;
  ++entries_;
  SyncLeaf(parent);
  LinkLeaf(raw);
  MarkDirty(raw);
  return raw;
}

absl::Status TextCache::Insert(std::string_view text, absl::Span<const int32_t> tokens,
                               absl::Span<const uint32_t> token_end_offsets,
                               absl::Span<const uint8_t> loss_mask,
                               absl::Span<const float> logprobs, int64_t weight_version,
                               absl::Span<const int64_t> token_versions, size_t* cached_tokens,
                               std::string_view worker) {
  const absl::Span<const uint32_t> ends = token_end_offsets;
  if (cached_tokens != nullptr) *cached_tokens = 0;
  if (text.empty() || tokens.empty()) {
    return absl::InvalidArgumentError("cannot insert an empty trajectory");
  }
  if (text.size() > std::numeric_limits<uint32_t>::max()) {
    return absl::InvalidArgumentError(
        absl::StrCat("text of ", text.size(), " bytes is over 4 GiB"));
  }
  const size_t n = tokens.size();
  if (ends.size() != n || loss_mask.size() != n || (!logprobs.empty() && logprobs.size() != n) ||
      (!token_versions.empty() && token_versions.size() != n)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "lengths differ: ", n, " tokens, ", ends.size(), " span ends, ", loss_mask.size(),
        " loss masks, ", logprobs.size(), " logprobs (0 = unknown), ", token_versions.size(),
        " token versions (0 = all weight_version)"));
  }
  for (size_t i = 0; i < n; ++i) {
    if (i > 0 && ends[i] < ends[i - 1]) {
      return absl::InvalidArgumentError(absl::StrCat("span end of token ", i, " (", ends[i],
                                                     ") is before the previous one (", ends[i - 1],
                                                     ")"));
    }
    if (loss_mask[i] > 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("loss mask of token ", i, " is ", loss_mask[i], ", not 0 or 1"));
    }
  }
  if (ends[n - 1] != text.size()) {
    return absl::InvalidArgumentError(absl::StrCat("the last token ends at byte ", ends[n - 1],
                                                   ", the text has ", text.size(), " bytes"));
  }

  std::vector<std::pair<uint32_t, int64_t>> path_runs =
      token_versions.empty() ? std::vector<std::pair<uint32_t, int64_t>>{{0, weight_version}}
                             : EncodeRuns(token_versions);
  absl::MutexLock lock(&mu_);
  current_version_ = std::max(current_version_, weight_version);
  const uint64_t worker_bit = WorkerBit(worker);
  Node* node = root_.get();
  size_t cached = n;  // tokens of the trajectory the cache holds afterwards
  size_t pos = 0;     // bytes of text consumed: a boundary of both the path and the trajectory
  size_t first = 0;   // tokens consumed: those ending at or before `pos`
  while (true) {
    MarkWorkers(node, weight_version, worker_bit);
    Bump(node, weight_version);
    if (pos == text.size()) {
      node->path_runs = std::move(path_runs);
      MarkDirty(node);
      break;
    }
    // The trajectory's next token group: up to the first span end after `pos`.
    size_t g = first;
    while (ends[g] <= pos) ++g;
    const std::string_view group = text.substr(pos, ends[g] - pos);
    const std::string_view rest = text.substr(pos);

    // The child whose first group is exactly `group`, if any (keys are distinct).
    auto& children = node->children;
    auto lo = std::lower_bound(children.begin(), children.end(), group, KeyLess);
    if (lo != children.end() && (*lo)->FirstGroup() == group) {
      Node* child = lo->get();
      // Share the child's edge while token groups agree exactly.
      const uint32_t* e = child->ends();
      const size_t text_common = CommonPrefix(child->text(), rest);
      uint32_t k = 0;
      uint32_t shared = 0;
      while (k < child->num_tokens && first + k < n) {
        const size_t t = first + k;
        float lp = logprobs.empty() ? std::numeric_limits<float>::quiet_NaN() : logprobs[t];
        if (e[k] != ends[t] - pos || e[k] > text_common || child->ids()[k] != tokens[t] ||
            child->mask()[k] != loss_mask[t] || child->logprob_bits()[k] != FloatBits(lp)) {
          break;
        }
        ++k;
        const bool edge_group_end = k == child->num_tokens || e[k] != e[k - 1];
        const bool new_group_end = first + k == n || ends[first + k] != ends[first + k - 1];
        if (edge_group_end != new_group_end) break;
        if (edge_group_end && e[k - 1] > 0) shared = k;  // boundaries are > 0
      }
      if (shared == child->num_tokens) {
        pos += child->num_bytes;
        first += shared;
        node = child;
        continue;
      }
      if (shared > 0) {
        pos += e[shared - 1];
        first += shared;
        node = Split(child, shared);
        continue;
      }
    }
    // A conflict: the same first-group text cached with other tokens, masks or logprobs.
    if (lo != children.end() && (*lo)->FirstGroup() == group) {
      // Generated tokens are never replaced: a conflicting subtree that holds any keeps its
      // place and the rest of this trajectory is not cached.
      if (HoldsGenerated(lo->get())) {
        ++conflicts_kept_;
        cached = first;
        break;
      }
      RemoveSubtree(node, static_cast<size_t>(lo - children.begin()));
      ++conflicts_replaced_;
    }
    Node* leaf = AddChild(node, text, pos, first, tokens, ends, loss_mask, logprobs, token_versions,
                          weight_version);
    leaf->path_runs = std::move(path_runs);
    leaf->workers = worker_bit;
    break;
  }
  if (cached_tokens != nullptr) *cached_tokens = cached;
  MaybeCollectGarbage();
  FlushJournal();
  return absl::OkStatus();
}

void TextCache::MaybeCollectGarbage() {
  // Over the token limit, or the store near its disk bound (cache_store.h).
  if (size_tokens_ <= options_.max_cache_size && (store_ == nullptr || !store_->near_full())) {
    return;
  }
  ++gc_runs_;
  const int64_t threshold = current_version_ - options_.gc_threshold_k;
  while (!leaves_.empty() && leaves_.begin()->first <= threshold) {
    Node* leaf = leaves_.begin()->second;
    Node* parent = leaf->parent;
    auto it = std::lower_bound(parent->children.begin(), parent->children.end(), leaf->FirstGroup(),
                               KeyLess);
    RL_CHECK(it != parent->children.end() && it->get() == leaf);
    gc_removed_tokens_ += leaf->num_tokens;
    ++gc_removed_nodes_;
    RemoveSubtree(parent, static_cast<size_t>(it - parent->children.begin()));
    SyncLeaf(parent);
  }
}

void TextCache::SetCurrentVersion(int64_t version) {
  absl::MutexLock lock(&mu_);
  current_version_ = version;
  MaybeCollectGarbage();
  FlushJournal();
}

TextCacheStats TextCache::GetStats() const {
  TextCacheStats stats;
  stats.hits = hits_.load(std::memory_order_relaxed);
  stats.misses = misses_.load(std::memory_order_relaxed);
  const int64_t queries = stats.hits + stats.misses;
  stats.hit_rate = queries > 0 ? static_cast<double>(stats.hits) / static_cast<double>(queries) : 0;
  stats.max_cache_size = options_.max_cache_size;
  stats.gc_threshold_k = options_.gc_threshold_k;
  absl::ReaderMutexLock lock(&mu_);
  stats.entries = entries_;
  stats.size_tokens = size_tokens_;
  stats.size_bytes = size_bytes_;
  stats.gc_runs = gc_runs_;
  stats.gc_removed_tokens = gc_removed_tokens_;
  stats.gc_removed_nodes = gc_removed_nodes_;
  stats.conflicts_replaced = conflicts_replaced_;
  stats.conflicts_kept = conflicts_kept_;
  stats.current_version = current_version_;
  return stats;
}

}  // namespace rl::router
