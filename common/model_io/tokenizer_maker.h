// A small but real Hugging Face tokenizer.json for made test models: byte-level BPE (GPT-2
// byte↔unicode alphabet, all 256 byte tokens, merges learned deterministically from a built-in
// English text) plus special tokens. Loadable by the `tokenizers` Python package and by
// common/tokenizer. Cost: a few milliseconds.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace rl::model_io {

struct TokenizerSpec {
  // Upper bound on regular tokens (256 bytes + merges); fewer when the text runs out of pairs.
  int32_t max_regular_tokens = 480;
  // Special tokens, given ids right after the regular ones, in order.
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

MadeTokenizer MakeByteLevelBpeTokenizer(const TokenizerSpec& spec);

}  // namespace rl::model_io
