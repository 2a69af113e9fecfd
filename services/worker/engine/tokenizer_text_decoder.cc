#include "services/worker/engine/tokenizer_text_decoder.h"

#include <utility>

#include "common/tokenizer/stream_decoder.h"

namespace rl::engine {
namespace {

struct TokenStream final : TextDecoder::Stream {
  explicit TokenStream(const tokenizer::Tokenizer& tok)
      : decoder(tok, /*skip_special_tokens=*/false) {}
  std::string Step(int32_t id) override {
    auto text = decoder.Step(id);
    return text.ok() ? *std::move(text) : std::string();
  }
  tokenizer::StreamDecoder decoder;
};

}  // namespace

std::string TokenizerTextDecoder::Decode(absl::Span<const int32_t> ids) const {
  auto text = tok_->Decode(ids, /*skip_special_tokens=*/false);
  return text.ok() ? *std::move(text) : std::string();
}

std::unique_ptr<TextDecoder::Stream> TokenizerTextDecoder::NewStream(
    absl::Span<const int32_t> prompt) const {
  auto stream = std::make_unique<TokenStream>(*tok_);
  const size_t start = tokenizer::DecodeContextStart(*tok_, prompt);
  // An id outside the tokenizer leaves the stream unprimed (the engine validated the ids
  // against the model, whose embedding table may be padded).
  (void)stream->decoder.Prime(prompt.subspan(start));
  return stream;
}

}  // namespace rl::engine
