// The text cache's durable side (cache_store.h): the node record format, the journal of the
// nodes one mutation changed (turned into one StoreBatch under the writer lock) and recovery
// (every record read back, linked under its parent, the leaf index and counters rebuilt, then
// the whole invariant walk). docs/text-cache.md ("Durability") has the semantics.
//
// Record (little-endian, host layout): u8 format (1) | u64 parent id (0: the root) | i64 version
// | i64 token_version | u32 num_tokens | u32 num_bytes | u32 #runs | u32 #path_runs | runs as
// (u32, i64)* | path_runs as (u32, i64)* | the edge's words (ids, logprob bits, span ends, mask,
// text: Node::Allocate's layout).
#include <algorithm>
#include <cstring>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "services/router/cache/cache_store.h"
#include "services/router/cache/text_cache.h"
#include "services/router/cache/text_cache_internal.h"

namespace rl::router {
namespace {

constexpr uint8_t kRecordFormat = 1;
constexpr const char* kCurrentVersionKey = "cache.current_version";

template <typename T>
void Put(std::string* out, T v) {
  out->append(reinterpret_cast<const char*>(&v), sizeof(v));
}

// Reads fixed-size values off a record; every read is bounds-checked.
class Reader {
 public:
  explicit Reader(std::string_view data) : data_(data) {}
  template <typename T>
  bool Get(T* v) {
    if (data_.size() - pos_ < sizeof(T)) return false;
    std::memcpy(v, data_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return true;
  }
  bool Bytes(void* out, size_t n) {
    if (data_.size() - pos_ < n) return false;
    std::memcpy(out, data_.data() + pos_, n);
    pos_ += n;
    return true;
  }
  bool AtEnd() const { return pos_ == data_.size(); }

 private:
  std::string_view data_;
  size_t pos_ = 0;
};

size_t WordsSize(uint32_t tokens, uint32_t bytes) {
  return (3 * size_t{tokens} + (size_t{tokens} + bytes + 3) / 4) * sizeof(uint32_t);
}

}  // namespace

void TextCache::MarkDirty(Node* node) {
  if (store_ == nullptr || node == root_.get() || node->dirty) return;
  node->dirty = true;
  dirty_.push_back(node);
}

void TextCache::ForgetNode(Node* node) {
  if (store_ == nullptr) return;
  if (node->dirty) {
    auto it = std::find(dirty_.begin(), dirty_.end(), node);
    if (it != dirty_.end()) dirty_.erase(it);
    node->dirty = false;
  }
  deleted_.push_back(node->id);
}

std::string TextCache::EncodeNode(const Node& node) {
  std::string rec;
  rec.reserve(48 + 12 * (node.runs.size() + node.path_runs.size()) +
              WordsSize(node.num_tokens, node.num_bytes));
  Put<uint8_t>(&rec, kRecordFormat);
  Put<uint64_t>(&rec, node.parent != nullptr ? node.parent->id : 0);
  Put<int64_t>(&rec, node.version);
  Put<int64_t>(&rec, node.token_version);
  Put<uint32_t>(&rec, node.num_tokens);
  Put<uint32_t>(&rec, node.num_bytes);
  Put<uint32_t>(&rec, static_cast<uint32_t>(node.runs.size()));
  Put<uint32_t>(&rec, static_cast<uint32_t>(node.path_runs.size()));
  for (const auto& [first, v] : node.runs) {
    Put<uint32_t>(&rec, first);
    Put<int64_t>(&rec, v);
  }
  for (const auto& [first, v] : node.path_runs) {
    Put<uint32_t>(&rec, first);
    Put<int64_t>(&rec, v);
  }
  rec.append(reinterpret_cast<const char*>(node.words.get()),
             WordsSize(node.num_tokens, node.num_bytes));
  return rec;
}

void TextCache::FlushJournal() {
  if (store_ == nullptr) return;
  if (dirty_.empty() && deleted_.empty() && stored_version_ == current_version_) return;
  StoreBatch batch;
  batch.deletes = std::move(deleted_);
  deleted_.clear();
  batch.puts.reserve(dirty_.size());
  for (Node* node : dirty_) {
    node->dirty = false;
    batch.puts.emplace_back(node->id, EncodeNode(*node));
  }
  dirty_.clear();
  if (stored_version_ != current_version_) {
    std::string v;
    Put<int64_t>(&v, current_version_);
    batch.meta.emplace_back(kCurrentVersionKey, std::move(v));
    stored_version_ = current_version_;
  }
  store_->Enqueue(std::move(batch));
}

void TextCache::ResyncStore() {
  absl::MutexLock lock(&mu_);
  StoreBatch batch;
  batch.puts.reserve(static_cast<size_t>(entries_));
  // Parents before children (recovery links by id in any order; this keeps the batch readable).
  std::vector<const Node*> stack = {root_.get()};
  while (!stack.empty()) {
    const Node* n = stack.back();
    stack.pop_back();
    if (n != root_.get()) batch.puts.emplace_back(n->id, EncodeNode(*n));
    for (const auto& child : n->children) stack.push_back(child.get());
  }
  // The snapshot holds every change so far: the journal starts empty after it.
  for (Node* node : dirty_) node->dirty = false;
  dirty_.clear();
  deleted_.clear();
  std::string v;
  Put<int64_t>(&v, current_version_);
  batch.meta.emplace_back(kCurrentVersionKey, std::move(v));
  stored_version_ = current_version_;
  store_->EnqueueSnapshot(std::move(batch));
}

absl::Status TextCache::Recover() {
  absl::MutexLock lock(&mu_);
  const auto corrupt = [this](uint64_t id, const std::string& why) {
    return absl::FailedPreconditionError(
        absl::StrCat("text cache store ", store_->path(), ": node ", id, ": ", why,
                     "; move the folder away to start with an empty cache"));
  };
  std::unordered_map<uint64_t, std::pair<Node*, uint64_t>> by_id;  // id -> (node, parent id)
  std::vector<std::unique_ptr<Node>> loaded;
  absl::Status read = store_->ForEachNode([&](uint64_t id, std::string_view rec) -> absl::Status {
    Reader r(rec);
    uint8_t format = 0;
    uint64_t parent = 0;
    auto node = std::make_unique<Node>();
    uint32_t tokens = 0, bytes = 0, num_runs = 0, num_path_runs = 0;
    if (!r.Get(&format) || format != kRecordFormat) return corrupt(id, "unknown record format");
    if (!r.Get(&parent) || !r.Get(&node->version) || !r.Get(&node->token_version) ||
        !r.Get(&tokens) || !r.Get(&bytes) || !r.Get(&num_runs) || !r.Get(&num_path_runs)) {
      return corrupt(id, "truncated header");
    }
    if (id == 0 || parent == id) return corrupt(id, "bad id");
    if (tokens == 0 || bytes == 0) return corrupt(id, "empty edge");
    if (num_runs > tokens || num_path_runs > (uint32_t{1} << 30)) {
      return corrupt(id, "too many version runs");
    }
    for (uint32_t i = 0; i < num_runs + num_path_runs; ++i) {
      std::pair<uint32_t, int64_t> run;
      if (!r.Get(&run.first) || !r.Get(&run.second)) return corrupt(id, "truncated versions");
      (i < num_runs ? node->runs : node->path_runs).push_back(run);
    }
    for (size_t i = 0; i < node->runs.size(); ++i) {
      if (node->runs[i].first >= tokens || (i == 0 && node->runs[i].first != 0) ||
          (i > 0 && node->runs[i].first <= node->runs[i - 1].first)) {
        return corrupt(id, "bad token versions");
      }
    }
    node->Allocate(tokens, bytes);
    if (!r.Bytes(node->words.get(), WordsSize(tokens, bytes)) || !r.AtEnd()) {
      return corrupt(id, "record size does not match its edge");
    }
    // What FirstGroup() and the walk rely on before they may run.
    const uint32_t* e = node->ends();
    for (uint32_t i = 0; i < tokens; ++i) {
      if ((i > 0 && e[i] < e[i - 1]) || node->mask()[i] > 1) return corrupt(id, "bad tokens");
    }
    if (e[tokens - 1] != bytes) return corrupt(id, "edge does not end on its last token");
    node->id = id;
    by_id[id] = {node.get(), parent};
    loaded.push_back(std::move(node));
    return absl::OkStatus();
  });
  if (!read.ok()) return read;
  uint64_t max_id = 0;
  for (std::unique_ptr<Node>& node : loaded) {
    const auto [raw, parent_id] = by_id[node->id];
    Node* parent = root_.get();
    if (parent_id != 0) {
      auto it = by_id.find(parent_id);
      if (it == by_id.end()) return corrupt(node->id, "its parent is missing");
      parent = it->second.first;
    }
    max_id = std::max(max_id, node->id);
    node->parent = parent;
    size_tokens_ += node->num_tokens;
    size_bytes_ += node->num_bytes;
    ++entries_;
    parent->children.push_back(std::move(node));
  }
  // Children sorted by first group; leaves indexed; a cycle leaves nodes unreachable from the
  // root, which the walk below finds by its counters.
  std::vector<Node*> stack = {root_.get()};
  while (!stack.empty()) {
    Node* n = stack.back();
    stack.pop_back();
    std::sort(n->children.begin(), n->children.end(),
              [](const std::unique_ptr<Node>& a, const std::unique_ptr<Node>& b) {
                return a->FirstGroup() < b->FirstGroup();
              });
    if (n != root_.get() && n->children.empty()) LinkLeaf(n);
    for (auto& child : n->children) stack.push_back(child.get());
  }
  next_id_ = max_id + 1;
  absl::StatusOr<std::optional<std::string>> v = store_->GetMeta(kCurrentVersionKey);
  if (!v.ok()) return v.status();
  if (v->has_value() && (*v)->size() == sizeof(int64_t)) {
    std::memcpy(&current_version_, (*v)->data(), sizeof(int64_t));
  }
  stored_version_ = current_version_;
  return absl::OkStatus();
}

}  // namespace rl::router
