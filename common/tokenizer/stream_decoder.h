// StreamDecoder: turns a growing sequence of token ids (a Generate stream) into text
// deltas that never split a UTF-8 character.
//
// Invariant: the concatenation of every delta returned by Step plus the one returned by
// Flush equals tokenizer.Decode(all ids, skip_special_tokens). Each Step decodes a short
// window (the ids of the previous delta as context plus the new ones) and emits the text
// past the context's own decoding; it holds text back while the decoding ends in U+FFFD,
// i.e. while the last bytes may still be the start of a character completed by the next
// token. Context keeps decoder position effects (a stripped leading space, Metaspace's
// first token, byte-fallback groups) identical to decoding the whole sequence.
// Thread safety: one StreamDecoder per stream, not shared between threads; the Tokenizer
// must outlive it. Cost: O(window) per Step, the window being a few tokens.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/tokenizer/tokenizer.h"

namespace rl::tokenizer {

class StreamDecoder {
 public:
  StreamDecoder(const Tokenizer& tokenizer, bool skip_special_tokens)
      : tokenizer_(tokenizer), skip_special_tokens_(skip_special_tokens) {}

  // Appends ids and returns the text that became final (possibly empty). InvalidArgument for
  // an unknown id, in which case the decoder is left as it was.
  absl::StatusOr<std::string> Step(absl::Span<const int32_t> ids);
  absl::StatusOr<std::string> Step(int32_t id) { return Step(absl::MakeConstSpan(&id, 1)); }

  // Returns the text still held back (an incomplete character decodes as U+FFFD, exactly as
  // Decode would) and resets the decoder for a new stream.
  absl::StatusOr<std::string> Flush();

  // Number of ids consumed since construction or the last Flush.
  size_t num_ids() const { return num_ids_; }

 private:
  const Tokenizer& tokenizer_;
  const bool skip_special_tokens_;
  std::vector<int32_t> window_;  // context ids followed by ids not emitted yet
  size_t context_len_ = 0;       // leading ids of window_ already emitted
  std::string context_text_;     // Decode(window_[0, context_len_))
  size_t num_ids_ = 0;
};

}  // namespace rl::tokenizer
