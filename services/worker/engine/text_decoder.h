// TextDecoder: the engine's view of a tokenizer, injected at construction. It is used only to
// match stop strings against the decoded completion, so the engine does not depend on the
// tokenizer library. Implementations must be callable from the engine thread and be fast.
//
// Stop strings are matched on incremental text: the output processor keeps one Stream per
// completion that has stop strings and feeds it each new token once (O(1) per token), instead
// of decoding a window of recent tokens on every step.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "absl/types/span.h"

namespace rl::engine {

class TextDecoder {
 public:
  // The text of one completion, a token at a time.
  class Stream {
   public:
    virtual ~Stream() = default;
    // The text that token `id` made final (possibly empty: e.g. the first bytes of a character
    // split across tokens are held back until it is complete).
    virtual std::string Step(int32_t id) = 0;
  };

  virtual ~TextDecoder() = default;
  // The text of `ids` (no special-token cleanup beyond what the tokenizer's decoder does).
  virtual std::string Decode(absl::Span<const int32_t> ids) const = 0;
  // A stream for the completion of `prompt` (its context). The default decodes each token on
  // its own with Decode, which is exact for decoders without cross-token state.
  virtual std::unique_ptr<Stream> NewStream(absl::Span<const int32_t> prompt) const;
};

}  // namespace rl::engine
