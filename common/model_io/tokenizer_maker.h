// A small but real Hugging Face tokenizer.json for made test models: byte-level BPE (GPT-2
// byte↔unicode alphabet, all 256 byte tokens, merges learned deterministically from a built-in
// English text) plus special tokens, covering exactly the model's vocabulary: when the text runs
// out of pairs, merges are extended deterministically (each token so far followed by a lowercase
// letter, in id order) until every id below `vocab_size` is a token, so any id a model samples
// decodes to text. Special tokens take the last ids. Loadable by the `tokenizers` Python package
// and by common/tokenizer. Cost: a few milliseconds (tiny) to ~0.3 s (128k ids).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace rl::model_io {

struct TokenizerSpec {
  // Every id in [0, vocab_size) is a token: vocab_size - special_tokens.size() regular tokens
  // (256 bytes + merges), at least 256 of them.
  int32_t vocab_size = 512;
  // Special tokens, given ids right after the regular ones (the last ids), in order.
  std::vector<std::string> special_tokens;
  // When >= 0, index into special_tokens of a BOS the post-processor prepends.
  int32_t bos_special_index = -1;
};

struct MadeTokenizer {
  std::string json;                  // tokenizer.json text
  int32_t num_regular_tokens = 0;    // ids [0, num_regular_tokens) are BPE tokens
  std::vector<int32_t> special_ids;  // id of each special token, in spec order
  int32_t vocab_size() const {
    return num_regular_tokens + static_cast<int32_t>(special_ids.size());
  }
};

// InvalidArgument when the vocabulary cannot hold the 256 byte tokens and the special tokens.
absl::StatusOr<MadeTokenizer> MakeByteLevelBpeTokenizer(const TokenizerSpec& spec);

}  // namespace rl::model_io
