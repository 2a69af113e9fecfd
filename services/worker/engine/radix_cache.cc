#include "services/worker/engine/radix_cache.h"

#include <algorithm>
#include <queue>
#include <utility>

#include "common/check.h"

namespace rl::engine {

RadixCache::RadixCache(int32_t page_size) : page_size_(page_size) { RL_CHECK(page_size > 0); }

RadixCache::~RadixCache() = default;

std::vector<int32_t> RadixCache::PageKey(absl::Span<const int32_t> tokens, int64_t pos) const {
  return std::vector<int32_t>(tokens.begin() + pos, tokens.begin() + pos + page_size_);
}

namespace {

uint64_t Mix(uint64_t h) {
  h ^= h >> 30;
  h *= 0xbf58476d1ce4e5b9ULL;
  h ^= h >> 27;
  h *= 0x94d049bb133111ebULL;
  h ^= h >> 31;
  return h;
}

}  // namespace

uint64_t RadixCache::BlockHash(uint64_t parent, absl::Span<const int32_t> tokens) {
  uint64_t h = parent ^ 0xcbf29ce484222325ULL;
  for (int32_t t : tokens) {
    h ^= static_cast<uint32_t>(t);
    h *= 0x100000001b3ULL;
  }
  return Mix(h);
}

std::vector<int64_t> RadixCache::PageHashes(const Node& node) const {
  std::vector<int64_t> out;
  out.reserve(node.pages.size());
  uint64_t h = node.parent->hash;
  for (size_t p = 0; p < node.pages.size(); ++p) {
    h = BlockHash(h, absl::MakeConstSpan(node.key).subspan(p * page_size_, page_size_));
    out.push_back(static_cast<int64_t>(h));
  }
  return out;
}

KvCacheEvent RadixCache::StoredEvent(const Node& node) const {
  KvCacheEvent e;
  e.kind = KvCacheEvent::Kind::kStored;
  e.has_parent = node.parent->parent != nullptr;
  e.parent_hash = static_cast<int64_t>(node.parent->hash);
  e.hashes = PageHashes(node);
  e.tokens = node.key;
  return e;
}

RadixCache::Node* RadixCache::Root(int64_t ns) {
  std::unique_ptr<Node>& root = roots_[ns];
  if (root == nullptr) {
    root = std::make_unique<Node>();
    root->ns = ns;
    root->hash = Mix(static_cast<uint64_t>(ns) + 0x9e3779b97f4a7c15ULL);
  }
  return root.get();
}

RadixCache::Node* RadixCache::Split(Node* node, int64_t num_pages) {
  // `node` keeps the tail; a new node takes the first `num_pages` pages and its place.
  const int64_t split_tokens = num_pages * page_size_;
  auto prefix = std::make_unique<Node>();
  prefix->key.assign(node->key.begin(), node->key.begin() + split_tokens);
  prefix->pages.assign(node->pages.begin(), node->pages.begin() + num_pages);
  prefix->parent = node->parent;
  prefix->lock_ref = node->lock_ref;
  prefix->last_access = node->last_access;
  prefix->ns = node->ns;
  node->key.erase(node->key.begin(), node->key.begin() + split_tokens);
  node->pages.erase(node->pages.begin(), node->pages.begin() + num_pages);
  uint64_t h = prefix->parent->hash;  // the prefix's last page: the same block as before
  for (int64_t p = 0; p < num_pages; ++p) {
    h = BlockHash(h, absl::MakeConstSpan(prefix->key).subspan(p * page_size_, page_size_));
  }
  prefix->hash = h;

  Node* parent = node->parent;
  auto it = parent->children.find(PageKey(prefix->key, 0));
  RL_CHECK(it != parent->children.end() && it->second.get() == node);
  std::unique_ptr<Node> tail = std::move(it->second);
  tail->parent = prefix.get();
  Node* prefix_ptr = prefix.get();
  prefix->children.emplace(PageKey(tail->key, 0), std::move(tail));
  it->second = std::move(prefix);
  ++num_nodes_;
  return prefix_ptr;
}

RadixCache::Node* RadixCache::Walk(int64_t ns, absl::Span<const int32_t> tokens, int64_t len,
                                   int64_t* matched, std::vector<const Node*>* path) {
  Node* node = Root(ns);
  int64_t pos = 0;
  while (pos < len) {
    auto it = node->children.find(PageKey(tokens, pos));
    if (it == node->children.end()) break;
    Node* child = it->second.get();
    const int64_t child_pages = static_cast<int64_t>(child->pages.size());
    int64_t k = 1;  // the first page matched through the map key
    while (k < child_pages && pos + (k + 1) * page_size_ <= len &&
           std::equal(child->key.begin() + k * page_size_,
                      child->key.begin() + (k + 1) * page_size_,
                      tokens.begin() + pos + k * page_size_)) {
      ++k;
    }
    child->last_access = ++clock_;
    if (k < child_pages) child = Split(child, k);
    if (path != nullptr) path->push_back(child);
    pos += k * page_size_;
    node = child;
    if (k < child_pages) break;
  }
  *matched = pos;
  return node;
}

RadixCache::MatchResult RadixCache::Match(int64_t ns, absl::Span<const int32_t> tokens) {
  MatchResult result;
  const int64_t len = static_cast<int64_t>(tokens.size()) / page_size_ * page_size_;
  std::vector<const Node*> path;
  Node* node = Walk(ns, tokens, len, &result.num_tokens, &path);
  for (const Node* n : path)
    result.pages.insert(result.pages.end(), n->pages.begin(), n->pages.end());
  result.last_node = node->parent == nullptr ? nullptr : node;
  return result;
}

int64_t RadixCache::Insert(int64_t ns, absl::Span<const int32_t> tokens,
                           absl::Span<const int32_t> pages, std::vector<int32_t>* duplicates) {
  const int64_t len = static_cast<int64_t>(tokens.size()) / page_size_ * page_size_;
  RL_CHECK(static_cast<int64_t>(pages.size()) >= len / page_size_);
  int64_t matched = 0;
  std::vector<const Node*> path;
  Node* node = Walk(ns, tokens, len, &matched, &path);
  int64_t page_index = 0;
  for (const Node* n : path) {
    for (int32_t tree_page : n->pages) {
      if (pages[page_index] != tree_page) duplicates->push_back(pages[page_index]);
      ++page_index;
    }
  }
  if (matched < len) {
    auto leaf = std::make_unique<Node>();
    leaf->key.assign(tokens.begin() + matched, tokens.begin() + len);
    leaf->pages.assign(pages.begin() + matched / page_size_, pages.begin() + len / page_size_);
    leaf->parent = node;
    leaf->ns = ns;
    leaf->last_access = ++clock_;
    cached_tokens_ += len - matched;
    evictable_tokens_ += len - matched;
    ++num_nodes_;
    const std::vector<int64_t> hashes = PageHashes(*leaf);
    leaf->hash = static_cast<uint64_t>(hashes.back());
    if (sink_ != nullptr) sink_->push_back(StoredEvent(*leaf));
    node->children.emplace(PageKey(leaf->key, 0), std::move(leaf));
  }
  return matched;
}

void RadixCache::Lock(Node* node) {
  for (; node != nullptr && node->parent != nullptr; node = node->parent) {
    if (node->lock_ref == 0) evictable_tokens_ -= static_cast<int64_t>(node->key.size());
    ++node->lock_ref;
  }
}

void RadixCache::Unlock(Node* node) {
  for (; node != nullptr && node->parent != nullptr; node = node->parent) {
    RL_CHECK(node->lock_ref > 0);
    --node->lock_ref;
    if (node->lock_ref == 0) evictable_tokens_ += static_cast<int64_t>(node->key.size());
  }
}

int64_t RadixCache::Evict(int64_t num_pages, std::vector<int32_t>* freed) {
  using Entry = std::pair<uint64_t, Node*>;
  std::priority_queue<Entry, std::vector<Entry>, std::greater<Entry>> leaves;
  std::vector<Node*> stack;
  for (auto& [ns, root] : roots_) stack.push_back(root.get());
  while (!stack.empty()) {
    Node* n = stack.back();
    stack.pop_back();
    if (n->children.empty()) {
      if (n->parent != nullptr && n->lock_ref == 0) leaves.emplace(n->last_access, n);
      continue;
    }
    for (auto& [key, child] : n->children) stack.push_back(child.get());
  }
  int64_t num_freed = 0;
  while (num_freed < num_pages && !leaves.empty()) {
    Node* leaf = leaves.top().second;
    leaves.pop();
    if (sink_ != nullptr) {
      KvCacheEvent removed;
      removed.kind = KvCacheEvent::Kind::kRemoved;
      removed.hashes = PageHashes(*leaf);
      sink_->push_back(std::move(removed));
    }
    freed->insert(freed->end(), leaf->pages.begin(), leaf->pages.end());
    num_freed += static_cast<int64_t>(leaf->pages.size());
    const int64_t n_tokens = static_cast<int64_t>(leaf->key.size());
    cached_tokens_ -= n_tokens;
    evictable_tokens_ -= n_tokens;
    --num_nodes_;
    Node* parent = leaf->parent;
    parent->children.erase(PageKey(leaf->key, 0));
    if (parent->children.empty()) {
      if (parent->parent != nullptr && parent->lock_ref == 0) {
        leaves.emplace(parent->last_access, parent);
      } else if (parent->parent == nullptr) {
        roots_.erase(parent->ns);
      }
    }
  }
  return num_freed;
}

void RadixCache::Reset(std::vector<int32_t>* freed) {
  RL_CHECK(locked_tokens() == 0);
  std::vector<Node*> stack;
  for (auto& [ns, root] : roots_) stack.push_back(root.get());
  while (!stack.empty()) {
    Node* n = stack.back();
    stack.pop_back();
    freed->insert(freed->end(), n->pages.begin(), n->pages.end());
    for (auto& [key, child] : n->children) stack.push_back(child.get());
  }
  roots_.clear();
  cached_tokens_ = 0;
  evictable_tokens_ = 0;
  num_nodes_ = 0;
  if (sink_ != nullptr) sink_->push_back(KvCacheEvent{KvCacheEvent::Kind::kCleared});
}

void RadixCache::Snapshot(std::vector<KvCacheEvent>* out) const {
  out->push_back(KvCacheEvent{KvCacheEvent::Kind::kCleared});
  std::vector<const Node*> stack;
  for (const auto& [ns, root] : roots_) stack.push_back(root.get());
  while (!stack.empty()) {  // preorder: a node's event comes before its children's
    const Node* n = stack.back();
    stack.pop_back();
    if (n->parent != nullptr) out->push_back(StoredEvent(*n));
    for (const auto& [key, child] : n->children) stack.push_back(child.get());
  }
}

}  // namespace rl::engine
