#include "services/router/cache/text_cache.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <tuple>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/check.h"

namespace rl::router {

// One edge and the node below it. The edge's data lives in one allocation of 32-bit words:
// ids[n] | logprob bits[n] | span ends[n] (relative to the edge start) | mask[n] text[bytes].
// The last token of an edge ends at its last byte; only children of the root may hold tokens
// ending at 0 (leading special tokens).
struct TextCache::Node {
  Node* parent = nullptr;
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

namespace {

bool IsUtf8Continuation(char c) { return (static_cast<uint8_t>(c) & 0xC0) == 0x80; }

size_t CommonPrefix(std::string_view a, std::string_view b) {
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
std::vector<std::pair<uint32_t, int64_t>> EncodeRuns(absl::Span<const int64_t> versions) {
  std::vector<std::pair<uint32_t, int64_t>> runs;
  for (size_t i = 0; i < versions.size(); ++i) {
    if (i == 0 || versions[i] != versions[i - 1]) {
      runs.emplace_back(static_cast<uint32_t>(i), versions[i]);
    }
  }
  return runs;
}

// Writes the first `count` versions of `runs` to out[0, count).
void ExpandRuns(const std::vector<std::pair<uint32_t, int64_t>>& runs, size_t count,
                int64_t* out) {
  for (size_t r = 0; r < runs.size() && runs[r].first < count; ++r) {
    const size_t end = r + 1 < runs.size() ? std::min<size_t>(runs[r + 1].first, count) : count;
    std::fill(out + runs[r].first, out + end, runs[r].second);
  }
}

uint32_t FloatBits(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof(bits));
  return bits;
}

}  // namespace

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

absl::StatusOr<std::unique_ptr<TextCache>> TextCache::Create(const TextCacheOptions& options) {
  if (absl::Status s = options.Validate(); !s.ok()) return s;
  return std::unique_ptr<TextCache>(new TextCache(options));
}

TextCache::TextCache(const TextCacheOptions& options)
    : options_(options), root_(std::make_unique<Node>()) {}

TextCache::~TextCache() {
  // Iterative teardown: long multi-turn chains must not recurse once per node.
  std::vector<std::unique_ptr<Node>> stack;
  stack.push_back(std::move(root_));
  while (!stack.empty()) {
    std::unique_ptr<Node> node = std::move(stack.back());
    stack.pop_back();
    for (auto& child : node->children) stack.push_back(std::move(child));
  }
}

void TextCache::FindChildren(const Node* parent, std::string_view rest,
                             std::vector<const Node*>* out) {
  const auto& children = parent->children;
  auto end = children.end();
  // The keys that are prefixes of `rest` form a chain; the longest is the last key <= rest.
  // Each step looks for the next shorter one among the keys before the last one seen.
  while (!rest.empty()) {
    auto it = std::upper_bound(children.begin(), end, rest,
                               [](std::string_view r, const std::unique_ptr<Node>& child) {
                                 return r < child->FirstGroup();
                               });
    if (it == children.begin()) return;
    --it;
    const std::string_view key = (*it)->FirstGroup();
    const size_t common = CommonPrefix(key, rest);
    if (common == key.size()) {
      out->push_back(it->get());
      rest = rest.substr(0, key.size() - 1);
    } else {
      rest = rest.substr(0, common);
    }
    end = it;
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

void TextCache::Bump(Node* node, int64_t version) {
  if (node == root_.get() || version <= node->version) return;
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
  upper->Allocate(num_tokens, cut);
  std::memcpy(upper->ids(), node->ids(), num_tokens * sizeof(int32_t));
  std::memcpy(upper->logprob_bits(), node->logprob_bits(), num_tokens * sizeof(uint32_t));
  std::memcpy(upper->ends(), node->ends(), num_tokens * sizeof(uint32_t));
  std::memcpy(upper->mask(), node->mask(), num_tokens);
  std::memcpy(upper->text_data(), text.data(), cut);
  upper->version = node->version;
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
  return raw;
}

absl::Status TextCache::Insert(std::string_view text, absl::Span<const int32_t> tokens,
                               absl::Span<const uint32_t> token_end_offsets,
                               absl::Span<const uint8_t> loss_mask,
                               absl::Span<const float> logprobs, int64_t weight_version,
                               absl::Span<const int64_t> token_versions, size_t* cached_tokens) {
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
  Node* node = root_.get();
  size_t cached = n;  // tokens of the trajectory the cache holds afterwards
  size_t pos = 0;    // bytes of text consumed: a boundary of both the path and the trajectory
  size_t first = 0;  // tokens consumed: those ending at or before `pos`
  while (true) {
    Bump(node, weight_version);
    if (pos == text.size()) {
      node->path_runs = std::move(path_runs);
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
    Node* leaf = AddChild(node, text, pos, first, tokens, ends, loss_mask, logprobs,
                          token_versions, weight_version);
    leaf->path_runs = std::move(path_runs);
    break;
  }
  if (cached_tokens != nullptr) *cached_tokens = cached;
  MaybeCollectGarbage();
  return absl::OkStatus();
}

void TextCache::MaybeCollectGarbage() {
  if (size_tokens_ <= options_.max_cache_size) return;
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

void TextCache::MatchLocked(std::string_view query, MatchGoal goal, CacheMatch* out) const {
  // Search every cached path the query follows (siblings' first groups may be prefixes of one
  // another) for the best end per `goal`; the first found (longest first groups first) on a
  // tie.
  struct State {
    const Node* node;
    size_t pos;      // bytes matched through node's edge
    size_t gen_end;  // end of the last generated token on the path (0: none)
  };
  struct Best {
    const Node* node = nullptr;
    size_t take = 0;  // tokens of node's edge in the match
    size_t pos = 0;
    size_t gen_end = 0;
    bool terminal = false;
  } best;
  const auto score = [goal](size_t gen_end, size_t pos, bool terminal) {
    return goal == MatchGoal::kLongest ? std::make_tuple(pos, gen_end, size_t{terminal})
                                       : std::make_tuple(gen_end, size_t{terminal}, pos);
  };
  std::vector<State> stack = {{root_.get(), 0, 0}};
  std::vector<const Node*> candidates;
  size_t visited = 0;
  while (!stack.empty() && visited < kMaxMatchNodes) {
    const State s = stack.back();
    stack.pop_back();
    if (s.pos == query.size()) continue;
    const std::string_view rest = query.substr(s.pos);
    candidates.clear();
    FindChildren(s.node, rest, &candidates);
    const size_t stack_size = stack.size();
    for (const Node* child : candidates) {  // longest first group first
      ++visited;
      const size_t common = CommonPrefix(child->text(), rest);
      const uint32_t* e = child->ends();
      // Tokens whose spans lie inside the common text; the first group always does.
      const size_t take =
          common == child->num_bytes
              ? child->num_tokens
              : static_cast<size_t>(std::upper_bound(e, e + child->num_tokens, common) - e);
      RL_CHECK(take > 0);
      size_t gen_end = s.gen_end;
      for (size_t i = take; i > 0; --i) {
        if (child->mask()[i - 1] == 1) {
          gen_end = s.pos + e[i - 1];
          break;
        }
      }
      const size_t end = s.pos + e[take - 1];
      const bool full = take == child->num_tokens;
      const bool terminal = full && !child->path_runs.empty();
      if (score(gen_end, end, terminal) > score(best.gen_end, best.pos, best.terminal)) {
        best = {child, take, end, gen_end, terminal};
      }
      if (full) stack.push_back({child, end, gen_end});
    }
    // Longest first group on top of the stack.
    std::reverse(stack.begin() + static_cast<std::ptrdiff_t>(stack_size), stack.end());
  }
  // The chosen path, root first.
  std::vector<const Node*> path;
  for (const Node* n = best.node; n != nullptr && n != root_.get(); n = n->parent) {
    path.push_back(n);
  }
  std::reverse(path.begin(), path.end());
  size_t pos = 0;
  // (tokens before the edge, its version) per matched edge, for weight_version after back-off.
  std::vector<std::pair<size_t, int64_t>> edges;
  // The deepest fully matched node where a trajectory ended, and the tokens up to it.
  const Node* terminal = nullptr;
  size_t terminal_tokens = 0;
  for (const Node* child : path) {
    const uint32_t* e = child->ends();
    const size_t take = child == best.node ? best.take : child->num_tokens;
    const size_t old = out->tokens.size();
    out->tokens.insert(out->tokens.end(), child->ids(), child->ids() + take);
    out->loss_mask.insert(out->loss_mask.end(), child->mask(), child->mask() + take);
    out->logprobs.resize(old + take);
    std::memcpy(out->logprobs.data() + old, child->logprob_bits(), take * sizeof(float));
    child->AppendVersions(0, static_cast<uint32_t>(take), &out->token_versions);
    out->token_end_offsets.resize(old + take);
    for (size_t i = 0; i < take; ++i) {
      out->token_end_offsets[old + i] = static_cast<uint32_t>(pos + e[i]);
    }
    edges.emplace_back(old, child->version);
    pos += e[take - 1];
    if (take == child->num_tokens && !child->path_runs.empty()) {
      terminal = child;
      terminal_tokens = out->tokens.size();
    }
  }
  if (options_.utf8_safe_match) {
    // Back off group by group while the rest would start inside a UTF-8 character.
    while (pos > 0 && pos < query.size() && IsUtf8Continuation(query[pos])) {
      while (!out->token_end_offsets.empty() && out->token_end_offsets.back() >= pos) {
        out->token_end_offsets.pop_back();
      }
      pos = out->token_end_offsets.empty() ? 0 : out->token_end_offsets.back();
    }
    if (pos == 0) out->token_end_offsets.clear();
    const size_t keep = out->token_end_offsets.size();
    out->tokens.resize(keep);
    out->loss_mask.resize(keep);
    out->logprobs.resize(keep);
    out->token_versions.resize(keep);
  }
  // Versions through the deepest trajectory end are that trajectory's own.
  if (terminal != nullptr) {
    ExpandRuns(terminal->path_runs, std::min(terminal_tokens, out->tokens.size()),
               out->token_versions.data());
  }
  out->matched_bytes = pos;
  while (!edges.empty() && edges.back().first >= out->tokens.size()) edges.pop_back();
  out->weight_version = edges.empty() ? 0 : edges.back().second;
}

CacheMatch TextCache::Match(std::string_view query, MatchGoal goal) const {
  CacheMatch out;
  {
    absl::ReaderMutexLock lock(&mu_);
    MatchLocked(query, goal, &out);
  }
  if (out.tokens.empty()) {
    misses_.fetch_add(1, std::memory_order_relaxed);
  } else {
    hits_.fetch_add(1, std::memory_order_relaxed);
  }
  return out;
}

CacheRetrieval TextCache::Retrieve(std::string_view text) const {
  CacheMatch match = Match(text);
  CacheRetrieval out;
  out.matched_bytes = match.matched_bytes;
  out.tokens = std::move(match.tokens);
  out.loss_mask = std::move(match.loss_mask);
  out.rollout_logp = std::move(match.logprobs);
  out.token_versions = std::move(match.token_versions);
  out.weight_version = match.weight_version;
  return out;
}

void TextCache::SetCurrentVersion(int64_t version) {
  absl::MutexLock lock(&mu_);
  current_version_ = version;
  MaybeCollectGarbage();
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
