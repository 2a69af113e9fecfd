// TokenizerTextDecoder: the engine's TextDecoder (text_decoder.h) over the worker's tokenizer,
// for stop strings. A completion's text is decoded as the client sees it: in the prompt's
// context (tokenizer::DecodeContextStart), with a character split across tokens held back
// until it is complete (tokenizer::StreamDecoder). Built by the worker's composition root and
// handed to Engine::Create, so the engine library itself does not link the tokenizer.
// Cost: one StreamDecoder per completion that has stop strings, O(1) work per token.
// Thread-safety: as TextDecoder (engine thread); the tokenizer must outlive it.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "absl/types/span.h"
#include "common/tokenizer/tokenizer.h"
#include "services/worker/engine/text_decoder.h"

namespace rl::engine {

class TokenizerTextDecoder final : public TextDecoder {
 public:
  explicit TokenizerTextDecoder(const tokenizer::Tokenizer* tok) : tok_(tok) {}
  // The text of `ids`; "" when the tokenizer refuses them.
  std::string Decode(absl::Span<const int32_t> ids) const override;
  std::unique_ptr<Stream> NewStream(absl::Span<const int32_t> prompt) const override;

 private:
  const tokenizer::Tokenizer* tok_;
};

}  // namespace rl::engine
