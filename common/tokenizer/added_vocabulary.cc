#include "common/tokenizer/added_vocabulary.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "common/tokenizer/unicode.h"

namespace rl::tokenizer {
namespace {

// The first / last character of `s` (which is non-empty valid UTF-8).
char32_t FirstChar(std::string_view s) {
  size_t len;
  return DecodeUtf8(s, 0, &len);
}

char32_t LastChar(std::string_view s) {
  size_t start = s.size() - 1;
  while (start > 0 && IsUtf8Continuation(static_cast<uint8_t>(s[start]))) --start;
  size_t len;
  return DecodeUtf8(s, start, &len);
}

// Start of the whitespace run that ends `s`.
size_t TrailingSpaceStart(std::string_view s) {
  size_t end = s.size();
  while (end > 0) {
    size_t start = end - 1;
    while (start > 0 && IsUtf8Continuation(static_cast<uint8_t>(s[start]))) --start;
    size_t len;
    if (!IsWhitespace(DecodeUtf8(s, start, &len))) break;
    end = start;
  }
  return end;
}

// Length of the whitespace run that starts `s`.
size_t LeadingSpaceLength(std::string_view s) {
  size_t pos = 0;
  while (pos < s.size()) {
    size_t len;
    if (!IsWhitespace(DecodeUtf8(s, pos, &len))) break;
    pos += len;
  }
  return pos;
}

}  // namespace

void AddedVocabulary::Trie::Insert(std::string_view pattern, int32_t token_index) {
  int32_t node = 0;
  for (char ch : pattern) {
    const uint64_t key = (static_cast<uint64_t>(node) << 8) | static_cast<uint8_t>(ch);
    auto it = edges.find(key);
    if (it == edges.end()) {
      const int32_t child = static_cast<int32_t>(terminal.size());
      terminal.push_back(-1);
      it = edges.emplace(key, child).first;
    }
    node = it->second;
  }
  // The first pattern registered for a given string wins, like Aho-Corasick's lowest index.
  if (terminal[node] < 0) terminal[node] = token_index;
  const uint8_t first = static_cast<uint8_t>(pattern[0]);
  if (!first_byte[first]) {
    first_byte[first] = true;
    ++num_first_bytes;
    only_first_byte = static_cast<char>(first);
  }
  patterns.push_back(token_index);
}

int32_t AddedVocabulary::Trie::LongestAt(std::string_view text, size_t pos, size_t* len) const {
  int32_t node = 0;
  int32_t best = -1;
  for (size_t i = pos; i < text.size(); ++i) {
    const uint64_t key = (static_cast<uint64_t>(node) << 8) | static_cast<uint8_t>(text[i]);
    const auto it = edges.find(key);
    if (it == edges.end()) break;
    node = it->second;
    if (terminal[node] >= 0) {
      best = terminal[node];
      *len = i + 1 - pos;
    }
  }
  return best;
}

absl::StatusOr<std::unique_ptr<AddedVocabulary>> AddedVocabulary::Create(
    std::vector<AddedToken> tokens, const Normalizer* normalizer) {
  std::unique_ptr<AddedVocabulary> v(new AddedVocabulary());
  v->tokens_ = std::move(tokens);
  // Hugging Face registers special tokens before the others.
  std::vector<int32_t> order;
  for (int32_t i = 0; i < static_cast<int32_t>(v->tokens_.size()); ++i) {
    if (v->tokens_[i].special) order.push_back(i);
  }
  for (int32_t i = 0; i < static_cast<int32_t>(v->tokens_.size()); ++i) {
    if (!v->tokens_[i].special) order.push_back(i);
  }
  for (int32_t i : order) {
    AddedToken& t = v->tokens_[i];
    t.display = t.content;
    v->by_id_[t.id] = i;
    v->by_content_.try_emplace(t.content, t.id);
    if (t.special) v->special_contents_[t.content] = true;
    if (t.content.empty()) continue;
    if (!t.normalized) {
      v->raw_.Insert(t.content, i);
      continue;
    }
    std::string pattern = t.content;
    if (normalizer != nullptr) {
      NormalizedString ns(t.content, 0);
      RETURN_IF_ERROR(normalizer->Normalize(&ns));
      pattern = std::string(ns.text());
    }
    t.display = pattern;
    if (!pattern.empty()) v->normalized_.Insert(pattern, i);
  }
  return v;
}

const AddedToken* AddedVocabulary::FindById(int32_t id) const {
  const auto it = by_id_.find(id);
  return it == by_id_.end() ? nullptr : &tokens_[it->second];
}

std::optional<int32_t> AddedVocabulary::TokenToId(std::string_view content) const {
  const auto it = by_content_.find(content);
  if (it == by_content_.end()) return std::nullopt;
  return it->second;
}

bool AddedVocabulary::IsSpecialContent(std::string_view content) const {
  return special_contents_.contains(content);
}

void AddedVocabulary::Split(const Trie& trie, std::string_view text,
                            std::vector<AddedSplit>* out) const {
  if (text.empty()) return;
  if (trie.patterns.empty()) {
    out->push_back({-1, 0, text.size()});
    return;
  }
  size_t start_offset = 0;
  size_t pos = 0;
  while (pos < text.size()) {
    // Leftmost position where some pattern matches, and the longest pattern there.
    size_t len = 0;
    int32_t index = -1;
    size_t at = pos;
    while (at < text.size()) {
      if (trie.num_first_bytes == 1) {
        at = text.find(trie.only_first_byte, at);
        if (at == std::string_view::npos) break;
      } else if (!trie.first_byte[static_cast<uint8_t>(text[at])]) {
        ++at;
        continue;
      }
      index = trie.LongestAt(text, at, &len);
      if (index >= 0) break;
      ++at;
    }
    if (index < 0) break;
    size_t start = at;
    size_t stop = at + len;
    pos = stop;
    const AddedToken& token = tokens_[index];
    if (token.single_word) {
      const bool start_space = start == 0 || !IsWordChar(LastChar(text.substr(0, start)));
      const bool stop_space = stop == text.size() || !IsWordChar(FirstChar(text.substr(stop)));
      if (!start_space || !stop_space) continue;
    }
    if (token.lstrip) start = std::max(TrailingSpaceStart(text.substr(0, start)), start_offset);
    if (token.rstrip) stop += LeadingSpaceLength(text.substr(stop));
    if (start_offset < start) out->push_back({-1, start_offset, start});
    out->push_back({token.id, start, stop});
    start_offset = stop;
  }
  if (start_offset < text.size()) out->push_back({-1, start_offset, text.size()});
}

}  // namespace rl::tokenizer
