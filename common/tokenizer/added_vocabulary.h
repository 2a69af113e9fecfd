// AddedVocabulary: the "added_tokens" of tokenizer.json (special and not) and the matching
// that cuts them out of the input before the model sees it.
//
// Matching follows Hugging Face: leftmost-longest, non-overlapping (a byte trie stands in
// for their Aho-Corasick automaton); `single_word` discards matches touching a word
// character, `lstrip`/`rstrip` swallow adjacent whitespace; tokens with normalized=false are
// matched on the raw input, the others on the normalized text (their content normalized
// too). Thread safety: immutable after load. Cost: O(n) scan, with memchr when every token
// starts with the same byte.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "common/tokenizer/normalizer.h"
#include "common/tokenizer/string_map.h"

namespace rl::tokenizer {

struct AddedToken {
  std::string content;
  // What Decode and IdToToken show: the content, normalized when `normalized` is set (as
  // Hugging Face does). Filled by AddedVocabulary::Create.
  std::string display;
  int32_t id = -1;
  bool special = false;
  bool lstrip = false;
  bool rstrip = false;
  bool single_word = false;
  bool normalized = true;
};

// A piece of a split: an added token (id >= 0) or text (id == -1), as byte range [begin, end).
struct AddedSplit {
  int32_t id;
  size_t begin;
  size_t end;
};

class AddedVocabulary {
 public:
  // `normalizer` (may be null) normalizes the content of tokens with normalized=true.
  static absl::StatusOr<std::unique_ptr<AddedVocabulary>> Create(std::vector<AddedToken> tokens,
                                                                 const Normalizer* normalizer);

  // Splits raw input on tokens with normalized=false.
  void SplitRaw(std::string_view text, std::vector<AddedSplit>* out) const {
    Split(raw_, text, out);
  }
  // Splits normalized text on tokens with normalized=true.
  void SplitNormalized(std::string_view text, std::vector<AddedSplit>* out) const {
    Split(normalized_, text, out);
  }
  bool has_raw() const { return !raw_.patterns.empty(); }
  bool has_normalized() const { return !normalized_.patterns.empty(); }

  // The added token with this id, or nullptr.
  const AddedToken* FindById(int32_t id) const;
  std::optional<int32_t> TokenToId(std::string_view content) const;
  // Whether `content` is the content of a special added token.
  bool IsSpecialContent(std::string_view content) const;
  const std::vector<AddedToken>& tokens() const { return tokens_; }

 private:
  struct Trie {
    // Node 0 is the root. terminal[node] = index into tokens_ or -1.
    std::vector<int32_t> terminal{-1};
    absl::flat_hash_map<uint64_t, int32_t> edges;  // (node << 8 | byte) -> child
    std::array<bool, 256> first_byte{};
    int num_first_bytes = 0;
    char only_first_byte = 0;
    std::vector<int32_t> patterns;  // token indexes
    void Insert(std::string_view pattern, int32_t token_index);
    // Longest pattern starting at `pos`: its token index and length, or -1.
    int32_t LongestAt(std::string_view text, size_t pos, size_t* len) const;
  };
  void Split(const Trie& trie, std::string_view text, std::vector<AddedSplit>* out) const;

  std::vector<AddedToken> tokens_;
  absl::flat_hash_map<int32_t, int32_t> by_id_;  // id -> index into tokens_
  StringMap<int32_t> by_content_;
  StringMap<bool> special_contents_;
  Trie raw_;
  Trie normalized_;
};

}  // namespace rl::tokenizer
