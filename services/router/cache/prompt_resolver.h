// PromptResolver: turns a text request into the exact prompt tokens the model sees, reusing the
// router's TextCache without ever changing the text. Checked on every request: (a) the tokens
// decode to the text byte for byte; (b) cached generated tokens, and the earlier turns they
// extend, are reused exactly; (c) every other token equals the full text's encoding (the "seam"
// rule: the rest is encoded from a pre-token boundary at or before the last cached generated
// token). A request that cannot meet (a) is served with the whole-text encoding and counted.
// docs/text-cache.md ("Prompt resolution") has the invariant and its one exception in full.
//
// Thread safety: ResolveTextPrompt may run concurrently (the cache and tokenizer are thread
// safe; counters are atomic). Cost: one cache Match, an encode of the new text plus at most
// kSeamWindowBytes before the seam (or of the whole text when no window start exists), and a
// decode of the whole prompt for check (a).
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "common/tokenizer/tokenizer.h"
#include "services/router/cache/text_cache.h"

namespace rl::router {

// How far before the seam a window start is searched for.
inline constexpr size_t kSeamWindowBytes = 512;

// Counters of ResolveTextPrompt, shared by every request.
struct SeamCounters {
  std::atomic<int64_t> requests{0};              // text prompts resolved
  std::atomic<int64_t> seam_continuations{0};    // rest encoded as a continuation (exception)
  std::atomic<int64_t> whole_text_fallbacks{0};  // (a) failed: whole text encoded, no reuse
  std::atomic<int64_t> whole_text_windows{0};    // no window start near the seam: whole text
};

struct ResolvedPrompt {
  std::vector<int32_t> ids;
  std::vector<uint32_t> ends;   // byte end of each token in the text (non-decreasing)
  std::vector<uint8_t> mask;    // 0 prompt, 1 generated
  std::vector<float> logprobs;  // NaN where unknown
  // Versions of the reused tokens (the first `cached_tokens` ids); the caller adds the rest.
  std::vector<int64_t> versions;
  int32_t cached_tokens = 0;  // reused from the cache
  // The workers that served a cached prefix of the text (CacheMatch::holders), tokens capped to
  // the prompt's: where cache-aware routing finds the prompt's KV.
  std::vector<CacheHolder> holders;
  bool seam_continuation = false;
  bool whole_text_fallback = false;
};

// Resolves `text` (non-empty, valid UTF-8, else InvalidArgument) against `cache` (one Match:
// one hit or miss counted). `counters` may be null.
absl::StatusOr<ResolvedPrompt> ResolveTextPrompt(std::string_view text, const TextCache& cache,
                                                 const tokenizer::Tokenizer& tokenizer,
                                                 SeamCounters* counters);

// A completion as the router caches it: its text in the prompt's context and, per output
// token, the byte end (within that text) of the first delta that completed the token's text:
// tokens whose text the stream decoder held back (a byte-fallback run, an incomplete UTF-8
// character) end where the delta that released it ends, together with the token that released
// it (one token group). So the text before any end is exactly the decoding of the tokens ending
// there or before. The last end is the text's size.
struct DecodedCompletion {
  std::string text;
  std::vector<uint32_t> ends;
};

// Streaming form of the above, one output token at a time: appends the token's delta (as
// returned by StreamDecoder::Step) to `text` and its end to `ends`; a token that emitted
// nothing gets kPendingEnd until a later delta releases its text (then that delta's end). After
// StreamDecoder::Flush, append the rest to `text` and set the ends from PendingFrom(ends) on
// to text's size.
inline constexpr uint32_t kPendingEnd = 0xFFFFFFFF;
void AppendCompletionDelta(std::string_view delta, std::string* text, std::vector<uint32_t>* ends);
// Index of the first trailing kPendingEnd in `ends` (ends.size() when none).
size_t PendingFrom(const std::vector<uint32_t>& ends);

// Stream-decodes `output_ids` after `prompt_ids` exactly as the router does. InvalidArgument
// for unknown ids.
absl::StatusOr<DecodedCompletion> DecodeCompletion(const tokenizer::Tokenizer& tokenizer,
                                                   absl::Span<const int32_t> prompt_ids,
                                                   absl::Span<const int32_t> output_ids);

// Whether `ids` decode to exactly `text` (the tokenizer's template prefix, when `ids` start
// with it, left out). For tests and the resolver.
bool DecodesTo(const tokenizer::Tokenizer& tokenizer, const std::vector<int32_t>& ids,
               std::string_view text);

// Largest pre-token boundary w with seam - kSeamWindowBytes <= w <= seam that the resolver
// may start a window at, or 0 when there is none (0 is always a boundary).
size_t FindWindowStart(const tokenizer::Tokenizer& tokenizer, std::string_view text, size_t seam);

}  // namespace rl::router
