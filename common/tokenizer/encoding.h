// Encoding: the result of encoding one text: token ids and, for each token, the byte range
// [begin, end) of the original text it came from.
//
// Offsets follow Hugging Face (converted from their character offsets to bytes): tokens
// inside one multi-byte character all cover that whole character; special tokens added by
// the post-processor cover the empty range [0, 0); ranges of consecutive tokens may overlap
// when the normalizer inserted text. Plain value type, cheap to move.
#pragma once

#include <cstdint>
#include <vector>

namespace rl::tokenizer {

struct TokenOffset {
  uint32_t begin = 0;
  uint32_t end = 0;
  bool operator==(const TokenOffset&) const = default;
};

struct Encoding {
  std::vector<int32_t> ids;
  std::vector<TokenOffset> offsets;  // same length as ids
};

}  // namespace rl::tokenizer
