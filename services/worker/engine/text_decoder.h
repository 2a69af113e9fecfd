// TextDecoder: the engine's view of a tokenizer, injected at construction. It is used only to
// match stop strings against the decoded completion, so the engine does not depend on the
// tokenizer library. Implementations must be callable from the engine thread and be fast
// (called once per generated token of a request that has stop strings, on a short window).
#pragma once

#include <cstdint>
#include <string>

#include "absl/types/span.h"

namespace rl::engine {

class TextDecoder {
 public:
  virtual ~TextDecoder() = default;
  // The text of `ids` (no special-token cleanup beyond what the tokenizer's decoder does).
  virtual std::string Decode(absl::Span<const int32_t> ids) const = 0;
};

}  // namespace rl::engine
