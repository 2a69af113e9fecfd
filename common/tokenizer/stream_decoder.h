// StreamDecoder: turns a growing sequence of token ids (a Generate stream) into text
// deltas that never split a UTF-8 character.
//
// Invariant: the concatenation of every delta returned by Step plus the one returned by
// Flush equals tokenizer.Decode(all ids, skip_special_tokens); after Prime(prompt) it equals
// DecodeContinuation(tokenizer, prompt, all ids): the completion's text in the prompt's
// context, never any of the prompt's own text.
//
// What a completion owns (its text in the prompt's context), with D = Decode:
//   - D(prompt + completion) past D(prompt): whenever the prompt ends on a character boundary
//     and decoding the two together leaves the prompt's text as it was, i.e.
//     D(prompt) + text == D(prompt + completion) byte for byte. This is every case except the
//     two below; for a prompt given as text (the router) only the second can occur.
//   - A prompt ending inside a UTF-8 character (input ids only; its decoding ends in U+FFFD):
//     the completion owns that whole character, completed or not. The prompt's text is its
//     decoding without those bytes (D of the prompt minus its trailing incomplete bytes), and
//     that plus the completion's text equals D(prompt + completion) when the character is
//     completed as valid UTF-8.
//   - ByteFallback only: the completion's leading byte tokens continue the prompt's trailing
//     byte-fallback run and the joined run is not valid UTF-8. Hugging Face decodes a run as a
//     unit and would turn the prompt's bytes into U+FFFD too, rewriting text the prompt already
//     had; instead the run is split at the seam (after the prompt's last complete character):
//     the prompt keeps its text and the completion owns its own bytes (plus the prompt's
//     incomplete character, if any) decoded as a run of their own, i.e. one U+FFFD per byte
//     token when they are not valid UTF-8 on their own, followed by the rest of its text.
//     Then D(prompt) + text is D(prompt + completion) with the prompt's part of the run
//     decoded as the prompt decodes it.
// Each Step decodes a short window (the ids of
// the previous delta as context plus the new ones) and emits the text past the context's own
// decoding; it holds text back while the decoding ends in U+FFFD, i.e. while the last bytes
// may still be the start of a character completed by the next token, and while the window
// ends in a byte-fallback run that may still grow. Context keeps decoder position effects (a
// stripped leading space, Metaspace's first token, byte-fallback groups) identical to
// decoding the whole sequence.
// Thread safety: one StreamDecoder per stream, not shared between threads; the Tokenizer
// must outlive it. Cost: O(window) per Step, the window being a few tokens; Prime costs
// O(the prompt's last few tokens), or the prompt's trailing byte-fallback run when longer.
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

  // Sets the prompt as context (nothing of it is ever emitted); call before the first Step.
  // A prompt that ends inside a character (input ids only) has that incomplete tail
  // dropped from the context: the completion emits the whole character (see above).
  // InvalidArgument for an unknown id, FailedPrecondition after a Step.
  absl::Status Prime(absl::Span<const int32_t> prompt_ids);

  // Appends ids and returns the text that became final (possibly empty). InvalidArgument for
  // an unknown id, in which case the decoder is left as it was.
  absl::StatusOr<std::string> Step(absl::Span<const int32_t> ids);
  absl::StatusOr<std::string> Step(int32_t id) { return Step(absl::MakeConstSpan(&id, 1)); }

  // Returns the text still held back (an incomplete character decodes as U+FFFD, exactly as
  // Decode would) and resets the decoder for a new stream (the primed context too).
  absl::StatusOr<std::string> Flush();

  // Number of ids consumed since construction or the last Flush (primed ids not counted).
  size_t num_ids() const { return num_ids_; }

  // The decoding context of a completion after `prompt` (see "What a completion owns"): a few
  // of the prompt's last ids, of which the first `context_len` are context whose decoding is
  // `text` and the rest are pending (an incomplete last character of a byte-fallback run, owned
  // by the completion). The completion's text is D(ids + completion) past `text`.
  // InvalidArgument for an unknown id.
  struct Context {
    std::vector<int32_t> ids;
    size_t context_len = 0;
    std::string text;
  };
  static absl::StatusOr<Context> ContextFor(const Tokenizer& tokenizer,
                                            absl::Span<const int32_t> prompt,
                                            bool skip_special_tokens);

 private:
  const Tokenizer& tokenizer_;
  const bool skip_special_tokens_;
  std::vector<int32_t> window_;  // context ids followed by ids not emitted yet
  size_t context_len_ = 0;       // leading ids of window_ already emitted (or primed)
  std::string context_text_;     // Decode(window_[0, context_len_))
  size_t num_ids_ = 0;
};

// Index where a decoding context for text following `ids` may start: a few ids before the
// end, never inside a run of byte-fallback ids. Decode(ids[start..] + more) minus
// Decode(ids[start..]) equals Decode(ids + more) minus Decode(ids) for the supported decoders.
size_t DecodeContextStart(const Tokenizer& tokenizer, absl::Span<const int32_t> ids);

// The text of `completion` in the context of `prompt` as defined in "What a completion owns"
// above (empty for an empty completion). What a StreamDecoder primed with `prompt` emits in
// total. O(completion + a few prompt ids). InvalidArgument for unknown ids.
absl::StatusOr<std::string> DecodeContinuation(const Tokenizer& tokenizer,
                                               absl::Span<const int32_t> prompt,
                                               absl::Span<const int32_t> completion,
                                               bool skip_special_tokens);

}  // namespace rl::tokenizer
