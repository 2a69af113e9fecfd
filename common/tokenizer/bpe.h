// BpeModel: the Hugging Face "BPE" model (merges by rank, byte fallback, unk fusing,
// ignore_merges), run on one pre-token ("word") at a time.
//
// Byte-level vocabularies (GPT-2 alphabet) are decoded to raw bytes at load time and words
// are merged from single bytes, which is exactly what Hugging Face computes on the
// byte-level string. Merging reproduces Hugging Face's priority-queue algorithm (lowest rank
// first, leftmost first, stale entries detected by the merged id) so even odd vocabularies
// merge identically. Results of short words are memoized in a bounded per-thread cache.
// SentencePiece-style models (no pre-tokenizer, spaces turned into U+2581) are cut before
// each U+2581 that follows another character when the merges prove no token can span
// such a point; that keeps words short and cacheable without changing any result.
// Thread safety: immutable after load; Tokenize is safe from any number of threads.
// Cost: O(n log n) in the word length for a cache miss, one hash lookup for a hit.
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
#include "common/tokenizer/string_map.h"
#include "nlohmann/json_fwd.hpp"

namespace rl::tokenizer {

// A model token: its id and the byte range [begin, end) of the word it covers.
struct ModelToken {
  int32_t id;
  uint32_t begin;
  uint32_t end;
};

class BpeModel {
 public:
  // `model` is the "model" object of tokenizer.json; `byte_level` is true when the
  // pre-tokenizer applies the GPT-2 byte alphabet (the model then sees raw bytes).
  static absl::StatusOr<std::unique_ptr<BpeModel>> FromJson(const nlohmann::json& model,
                                                            bool byte_level);

  // Appends the tokens of `word` (non-empty normalized bytes) to `out`, with word-relative
  // byte ranges.
  void Tokenize(std::string_view word, std::vector<ModelToken>* out) const;

  // Vocabulary lookups in tokenizer.json form (byte-level strings for byte-level models).
  std::optional<int32_t> TokenToId(std::string_view token) const;
  // nullptr when `id` is not in the model vocabulary.
  const std::string* IdToToken(int32_t id) const;
  // One past the largest id of the model vocabulary.
  int32_t id_limit() const { return static_cast<int32_t>(id_to_token_.size()); }
  bool byte_level() const { return byte_level_; }

 private:
  struct Merge {
    int32_t rank;
    int32_t new_id;
  };
  using Pieces = std::vector<std::pair<int32_t, uint32_t>>;  // (id, byte length)

  BpeModel() = default;
  void TokenizeChunk(std::string_view word, uint32_t base, std::vector<ModelToken>* out) const;
  void MergeWord(std::string_view word, Pieces* pieces) const;
  std::optional<int32_t> KeyToId(std::string_view key) const;
  std::optional<int32_t> CharToId(std::string_view ch) const;

  uint64_t instance_id_ = 0;
  bool byte_level_ = false;
  bool ignore_merges_ = false;
  bool byte_fallback_ = false;
  bool fuse_unk_ = false;
  int32_t unk_id_ = -1;
  bool split_on_metaspace_ = false;
  StringMap<int32_t> vocab_;       // tokenizer.json form
  StringMap<int32_t> byte_vocab_;  // raw bytes (byte-level only)
  std::vector<std::string> id_to_token_;
  std::vector<bool> id_present_;
  std::array<int32_t, 256> single_byte_ids_{};    // ids of one-byte words, -1 when absent
  std::array<int32_t, 256> fallback_byte_ids_{};  // ids of "<0xXX>", -1 when absent
  absl::flat_hash_map<uint64_t, Merge> merges_;
  std::vector<Merge> byte_pair_merges_;  // byte-level: [b1 * 256 + b2], rank -1 when none
};

}  // namespace rl::tokenizer
