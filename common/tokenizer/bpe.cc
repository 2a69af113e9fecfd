#include "common/tokenizer/bpe.h"

#include <algorithm>
#include <atomic>
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "common/tokenizer/byte_level.h"
#include "common/tokenizer/json_util.h"
#include "common/tokenizer/unicode.h"

namespace rl::tokenizer {
namespace {

using json_util::Json;

constexpr std::string_view kMetaspace = "\xE2\x96\x81";  // U+2581
constexpr size_t kMaxCachedWordBytes = 96;
constexpr size_t kMaxCacheEntries = 1 << 16;

uint64_t PairKey(int32_t a, int32_t b) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
}

// Per-thread memo of word -> pieces, for a few models at a time (keyed by instance id so a
// destroyed model's entries are never reused).
struct WordCache {
  uint64_t owner = 0;
  StringMap<std::vector<std::pair<int32_t, uint32_t>>> map;
};

constexpr int kCachesPerThread = 4;

StringMap<std::vector<std::pair<int32_t, uint32_t>>>& CacheFor(uint64_t owner) {
  thread_local WordCache caches[kCachesPerThread];
  thread_local int next_victim = 0;
  for (auto& c : caches) {
    if (c.owner == owner) return c.map;
  }
  WordCache& c = caches[next_victim];
  next_victim = (next_victim + 1) % kCachesPerThread;
  c.owner = owner;
  c.map.clear();
  return c.map;
}

std::atomic<uint64_t> g_next_instance{1};

absl::StatusOr<std::pair<std::string, std::string>> ParseMerge(const Json& m, size_t i) {
  const std::string where = absl::StrCat("model.merges[", i, "]");
  if (m.is_string()) {
    const std::string& s = m.get_ref<const std::string&>();
    const size_t sp = s.find(' ');
    if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat("tokenizer.json: ", where, " must be two tokens separated by a space"));
    }
    return std::make_pair(s.substr(0, sp), s.substr(sp + 1));
  }
  if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
    return std::make_pair(m[0].get<std::string>(), m[1].get<std::string>());
  }
  return json_util::TypeError(where, "\"a b\" or [\"a\", \"b\"]", m);
}

}  // namespace

absl::StatusOr<std::unique_ptr<BpeModel>> BpeModel::FromJson(const Json& model, bool byte_level) {
  std::unique_ptr<BpeModel> bpe(new BpeModel());
  bpe->instance_id_ = g_next_instance.fetch_add(1);
  bpe->byte_level_ = byte_level;
  ASSIGN_OR_RETURN(bpe->ignore_merges_,
                   json_util::GetBoolOr(model, "ignore_merges", "model", false));
  ASSIGN_OR_RETURN(bpe->byte_fallback_,
                   json_util::GetBoolOr(model, "byte_fallback", "model", false));
  ASSIGN_OR_RETURN(bpe->fuse_unk_, json_util::GetBoolOr(model, "fuse_unk", "model", false));
  if (const Json* d = json_util::Find(model, "dropout")) {
    if (!d->is_number()) return json_util::TypeError("model.dropout", "a number", *d);
    if (d->get<double>() != 0.0) {
      return absl::InvalidArgumentError("tokenizer.json: BPE dropout is not supported");
    }
  }
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    if (const Json* v = json_util::Find(model, key)) {
      if (!v->is_string()) return json_util::TypeError(absl::StrCat("model.", key), "a string", *v);
      if (!v->get_ref<const std::string&>().empty()) {
        return absl::InvalidArgumentError(
            absl::StrCat("tokenizer.json: BPE ", key, " is not supported"));
      }
    }
  }

  const Json* vocab = json_util::Find(model, "vocab");
  if (vocab == nullptr || !vocab->is_object()) {
    return absl::InvalidArgumentError("tokenizer.json: model.vocab must be an object");
  }
  int32_t max_id = -1;
  bpe->vocab_.reserve(vocab->size());
  for (const auto& [token, id_json] : vocab->items()) {
    if (!id_json.is_number_integer() || id_json.get<int64_t>() < 0 ||
        id_json.get<int64_t>() > INT32_MAX - 1) {
      return absl::InvalidArgumentError(absl::StrCat("tokenizer.json: model.vocab[\"", token,
                                                     "\"] must be a non-negative integer id"));
    }
    const int32_t id = static_cast<int32_t>(id_json.get<int64_t>());
    bpe->vocab_[token] = id;
    max_id = std::max(max_id, id);
  }
  if (max_id >= (1 << 26)) {
    return absl::InvalidArgumentError("tokenizer.json: model.vocab ids are implausibly large");
  }
  bpe->id_to_token_.resize(max_id + 1);
  bpe->id_present_.assign(max_id + 1, false);
  for (const auto& [token, id] : bpe->vocab_) {
    bpe->id_to_token_[id] = token;
    bpe->id_present_[id] = true;
  }
  if (byte_level) {
    for (const auto& [token, id] : bpe->vocab_) {
      if (auto bytes = ByteLevelToBytes(token)) bpe->byte_vocab_[*bytes] = id;
    }
  }
  bpe->single_byte_ids_.fill(-1);
  bpe->fallback_byte_ids_.fill(-1);
  for (int b = 0; b < 256; ++b) {
    const std::string key(1, static_cast<char>(b));
    if (auto id = bpe->KeyToId(key)) bpe->single_byte_ids_[b] = *id;
    char name[8];
    std::snprintf(name, sizeof(name), "<0x%02X>", b);
    if (auto it = bpe->vocab_.find(name); it != bpe->vocab_.end()) {
      bpe->fallback_byte_ids_[b] = it->second;
    }
  }

  ASSIGN_OR_RETURN(const std::string unk, json_util::GetStringOr(model, "unk_token", "model", ""));
  if (!unk.empty()) {
    const auto it = bpe->vocab_.find(unk);
    if (it == bpe->vocab_.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("tokenizer.json: model.unk_token '", unk, "' is not in the vocabulary"));
    }
    bpe->unk_id_ = it->second;
  }

  ASSIGN_OR_RETURN(const Json* merges, json_util::GetArray(model, "merges", "model"));
  bpe->merges_.reserve(merges->size());
  // A merge "x ▁y" where x ends with another character could join the two sides of a
  // U+2581 boundary; when none exists, words can be cut there.
  bool metaspace_safe =
      !byte_level && !bpe->ignore_merges_ && bpe->vocab_.contains(std::string(kMetaspace));
  for (size_t i = 0; i < merges->size(); ++i) {
    ASSIGN_OR_RETURN(auto pair, ParseMerge((*merges)[i], i));
    const auto a = bpe->vocab_.find(pair.first);
    const auto b = bpe->vocab_.find(pair.second);
    const auto merged = bpe->vocab_.find(pair.first + pair.second);
    if (a == bpe->vocab_.end() || b == bpe->vocab_.end() || merged == bpe->vocab_.end()) {
      return absl::InvalidArgumentError(absl::StrCat("tokenizer.json: model.merges[", i, "] '",
                                                     pair.first, " ", pair.second,
                                                     "' uses a token missing from the vocab"));
    }
    // A later duplicate replaces the earlier rank, as in Hugging Face's HashMap.
    bpe->merges_.insert_or_assign(PairKey(a->second, b->second),
                                  Merge{static_cast<int32_t>(i), merged->second});
    if (metaspace_safe && pair.second.starts_with(kMetaspace) &&
        !pair.first.ends_with(kMetaspace)) {
      metaspace_safe = false;
    }
  }
  bpe->split_on_metaspace_ = metaspace_safe;
  const bool all_bytes = std::all_of(bpe->single_byte_ids_.begin(), bpe->single_byte_ids_.end(),
                                     [](int32_t id) { return id >= 0; });
  if (byte_level && all_bytes) {
    bpe->byte_pair_merges_.assign(256 * 256, Merge{-1, -1});
    for (int x = 0; x < 256; ++x) {
      for (int y = 0; y < 256; ++y) {
        const int32_t a = bpe->single_byte_ids_[x];
        const int32_t b = bpe->single_byte_ids_[y];
        if (a < 0 || b < 0) continue;
        if (const auto it = bpe->merges_.find(PairKey(a, b)); it != bpe->merges_.end()) {
          bpe->byte_pair_merges_[x * 256 + y] = it->second;
        }
      }
    }
  }
  return bpe;
}

std::optional<int32_t> BpeModel::TokenToId(std::string_view token) const {
  const auto it = vocab_.find(token);
  if (it == vocab_.end()) return std::nullopt;
  return it->second;
}

const std::string* BpeModel::IdToToken(int32_t id) const {
  if (id < 0 || id >= id_limit() || !id_present_[id]) return nullptr;
  return &id_to_token_[id];
}

std::optional<int32_t> BpeModel::KeyToId(std::string_view key) const {
  const auto& map = byte_level_ ? byte_vocab_ : vocab_;
  const auto it = map.find(key);
  if (it == map.end()) return std::nullopt;
  return it->second;
}

std::optional<int32_t> BpeModel::CharToId(std::string_view ch) const {
  if (ch.size() == 1) {
    const int32_t id = single_byte_ids_[static_cast<uint8_t>(ch[0])];
    if (id < 0) return std::nullopt;
    return id;
  }
  return KeyToId(ch);
}

void BpeModel::Tokenize(std::string_view word, std::vector<ModelToken>* out) const {
  if (word.empty()) return;
  if (ignore_merges_) {
    if (auto id = KeyToId(word)) {
      out->push_back({*id, 0, static_cast<uint32_t>(word.size())});
      return;
    }
  }
  if (!split_on_metaspace_) {
    TokenizeChunk(word, 0, out);
    return;
  }
  // Cut before every U+2581 that follows a different character.
  size_t chunk_begin = 0;
  size_t pos = 0;
  bool prev_is_meta = false;
  while (pos < word.size()) {
    const bool is_meta = word.compare(pos, kMetaspace.size(), kMetaspace) == 0;
    if (is_meta && pos > 0 && !prev_is_meta) {
      TokenizeChunk(word.substr(chunk_begin, pos - chunk_begin), chunk_begin, out);
      chunk_begin = pos;
    }
    prev_is_meta = is_meta;
    pos += is_meta ? kMetaspace.size() : Utf8SeqLen(static_cast<uint8_t>(word[pos]));
  }
  TokenizeChunk(word.substr(chunk_begin), chunk_begin, out);
}

void BpeModel::TokenizeChunk(std::string_view word, uint32_t base,
                             std::vector<ModelToken>* out) const {
  auto emit = [&](const Pieces& pieces) {
    uint32_t pos = base;
    for (const auto& [id, len] : pieces) {
      out->push_back({id, pos, pos + len});
      pos += len;
    }
  };
  if (word.size() > kMaxCachedWordBytes) {
    thread_local Pieces pieces;
    pieces.clear();
    MergeWord(word, &pieces);
    emit(pieces);
    return;
  }
  auto& cache = CacheFor(instance_id_);
  if (const auto it = cache.find(word); it != cache.end()) {
    emit(it->second);
    return;
  }
  Pieces pieces;
  MergeWord(word, &pieces);
  emit(pieces);
  if (cache.size() >= kMaxCacheEntries) cache.clear();
  cache.emplace(std::string(word), std::move(pieces));
}

void BpeModel::MergeWord(std::string_view word, Pieces* pieces) const {
  struct Symbol {
    int32_t id;
    int32_t prev;
    int32_t next;
    uint32_t len;
  };
  struct QueueEntry {
    int32_t rank;
    int32_t pos;
    int32_t new_id;
    int32_t left;  // ids of the pair when the entry was pushed
    int32_t right;
    // std::push_heap builds a max-heap: "less" means lower priority (higher rank, then
    // higher position).
    bool operator<(const QueueEntry& o) const {
      return rank != o.rank ? rank > o.rank : pos > o.pos;
    }
  };
  thread_local std::vector<Symbol> symbols;
  thread_local std::vector<QueueEntry> queue;
  symbols.clear();
  queue.clear();

  auto add = [&](int32_t id, uint32_t len) {
    const int32_t index = static_cast<int32_t>(symbols.size());
    if (index > 0) symbols.back().next = index;
    symbols.push_back({id, index - 1, -1, len});
  };

  // Unknown units pending emission: (id, byte length); fused when fuse_unk is set.
  int32_t unk_pending_id = -1;
  uint32_t unk_pending_len = 0;
  size_t pos = 0;
  while (pos < word.size()) {
    const size_t len = byte_level_ ? 1 : Utf8SeqLen(static_cast<uint8_t>(word[pos]));
    const std::string_view unit = word.substr(pos, len);
    pos += len;
    if (const auto id = CharToId(unit)) {
      if (unk_pending_id >= 0) {
        add(unk_pending_id, unk_pending_len);
        unk_pending_id = -1;
      }
      add(*id, static_cast<uint32_t>(len));
      continue;
    }
    if (byte_fallback_) {
      bool all = true;
      for (char c : unit) all = all && fallback_byte_ids_[static_cast<uint8_t>(c)] >= 0;
      if (all) {
        for (char c : unit) add(fallback_byte_ids_[static_cast<uint8_t>(c)], 1);
        continue;
      }
    }
    if (unk_id_ >= 0) {
      if (unk_pending_id >= 0 && fuse_unk_) {
        unk_pending_len += static_cast<uint32_t>(len);
      } else {
        if (unk_pending_id >= 0) add(unk_pending_id, unk_pending_len);
        unk_pending_id = unk_id_;
        unk_pending_len = static_cast<uint32_t>(len);
      }
    }
  }
  if (unk_pending_id >= 0) add(unk_pending_id, unk_pending_len);

  auto lookup = [&](int32_t a, int32_t b) -> const Merge* {
    const auto it = merges_.find(PairKey(a, b));
    return it == merges_.end() ? nullptr : &it->second;
  };
  // Initial pairs; byte-level words whose symbols are still single bytes use the dense
  // byte-pair table instead of the hash map.
  const bool dense = byte_level_ && !byte_pair_merges_.empty() && symbols.size() == word.size();
  for (size_t i = 0; i + 1 < symbols.size(); ++i) {
    const Merge* m = dense ? &byte_pair_merges_[static_cast<uint8_t>(word[i]) * 256 +
                                                static_cast<uint8_t>(word[i + 1])]
                           : lookup(symbols[i].id, symbols[i + 1].id);
    if (m != nullptr && m->rank >= 0) {
      queue.push_back(
          {m->rank, static_cast<int32_t>(i), m->new_id, symbols[i].id, symbols[i + 1].id});
    }
  }
  std::make_heap(queue.begin(), queue.end());
  auto push = [&](QueueEntry e) {
    queue.push_back(e);
    std::push_heap(queue.begin(), queue.end());
  };
  while (!queue.empty()) {
    std::pop_heap(queue.begin(), queue.end());
    const QueueEntry top = queue.back();
    queue.pop_back();
    Symbol& cur = symbols[top.pos];
    if (cur.len == 0 || cur.next == -1) continue;
    const int32_t next_pos = cur.next;
    const Symbol right = symbols[next_pos];
    // Hugging Face re-looks the pair up and compares merged ids. A symbol only grows by
    // absorbing its right neighbour, so a pair at a position that changed covers a different
    // span, hence a different token: comparing the ids of the pair is the same test.
    if (cur.id != top.left || right.id != top.right) continue;
    cur.id = top.new_id;
    cur.len += right.len;
    cur.next = right.next;
    symbols[next_pos].len = 0;
    if (right.next >= 0) symbols[right.next].prev = top.pos;
    if (cur.prev >= 0) {
      if (const Merge* pm = lookup(symbols[cur.prev].id, cur.id)) {
        push({pm->rank, cur.prev, pm->new_id, symbols[cur.prev].id, cur.id});
      }
    }
    if (cur.next >= 0) {
      if (const Merge* nm = lookup(cur.id, symbols[cur.next].id)) {
        push({nm->rank, top.pos, nm->new_id, cur.id, symbols[cur.next].id});
      }
    }
  }
  for (const Symbol& s : symbols) {
    if (s.len != 0) pieces->emplace_back(s.id, s.len);
  }
}

}  // namespace rl::tokenizer
