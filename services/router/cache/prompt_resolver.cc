#include "services/router/cache/prompt_resolver.h"

#include <algorithm>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/tokenizer/stream_decoder.h"
#include "common/tokenizer/unicode.h"

namespace rl::router {
namespace {

constexpr float kUnknownLogprob = std::numeric_limits<float>::quiet_NaN();

bool IsAsciiLetter(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }
bool IsSpaceByte(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

// Appends the tokens of `enc` from index `first` as new prompt tokens at byte `base`.
void AppendNew(const tokenizer::Encoding& enc, size_t first, uint32_t base, ResolvedPrompt* p) {
  for (size_t i = first; i < enc.ids.size(); ++i) {
    uint32_t end = base + enc.offsets[i].end;
    if (!p->ends.empty()) end = std::max(end, p->ends.back());
    p->ids.push_back(enc.ids[i]);
    p->ends.push_back(end);
    p->mask.push_back(0);
    p->logprobs.push_back(kUnknownLogprob);
  }
}

// The whole-text encoding, nothing reused.
absl::StatusOr<ResolvedPrompt> WholeText(std::string_view text,
                                         const tokenizer::Tokenizer& tokenizer) {
  absl::StatusOr<tokenizer::Encoding> enc = tokenizer.Encode(text, /*add_special_tokens=*/true);
  if (!enc.ok()) return enc.status();
  ResolvedPrompt p;
  AppendNew(*enc, 0, 0, &p);
  return p;
}

void Count(std::atomic<int64_t>* counter) { counter->fetch_add(1, std::memory_order_relaxed); }

}  // namespace

size_t PendingFrom(const std::vector<uint32_t>& ends) {
  size_t i = ends.size();
  while (i > 0 && ends[i - 1] == kPendingEnd) --i;
  return i;
}

void AppendCompletionDelta(std::string_view delta, std::string* text, std::vector<uint32_t>* ends) {
  ends->push_back(kPendingEnd);
  if (delta.empty()) return;
  *text += delta;
  std::fill(ends->begin() + static_cast<std::ptrdiff_t>(PendingFrom(*ends)), ends->end(),
            static_cast<uint32_t>(text->size()));
}

absl::StatusOr<DecodedCompletion> DecodeCompletion(const tokenizer::Tokenizer& tokenizer,
                                                   absl::Span<const int32_t> prompt_ids,
                                                   absl::Span<const int32_t> output_ids) {
  tokenizer::StreamDecoder decoder(tokenizer, /*skip_special_tokens=*/false);
  if (absl::Status s = decoder.Prime(prompt_ids); !s.ok()) return s;
  DecodedCompletion out;
  for (int32_t id : output_ids) {
    absl::StatusOr<std::string> delta = decoder.Step(id);
    if (!delta.ok()) return delta.status();
    AppendCompletionDelta(*delta, &out.text, &out.ends);
  }
  absl::StatusOr<std::string> rest = decoder.Flush();
  if (!rest.ok()) return rest.status();
  out.text += *rest;
  std::fill(out.ends.begin() + static_cast<std::ptrdiff_t>(PendingFrom(out.ends)), out.ends.end(),
            static_cast<uint32_t>(out.text.size()));
  return out;
}

bool DecodesTo(const tokenizer::Tokenizer& tokenizer, const std::vector<int32_t>& ids,
               std::string_view text) {
  absl::Span<const int32_t> rest(ids);
  const absl::Span<const int32_t> prefix = tokenizer.template_prefix_ids();
  if (!prefix.empty() && rest.size() >= prefix.size() &&
      std::equal(prefix.begin(), prefix.end(), rest.begin())) {
    rest.remove_prefix(prefix.size());
  }
  absl::StatusOr<std::string> decoded = tokenizer.Decode(rest, /*skip_special_tokens=*/false);
  return decoded.ok() && *decoded == text;
}

size_t FindWindowStart(const tokenizer::Tokenizer& tokenizer, std::string_view text, size_t seam) {
  const bool regex = tokenizer.has_regex_pre_tokenizer();
  const size_t lowest = seam > kSeamWindowBytes ? seam - kSeamWindowBytes : 1;
  for (size_t p = std::min(seam, text.size() - 1); p >= std::max<size_t>(lowest, 1); --p) {
    // " x" after a non-space: every supported pre-tokenizer starts a pre-token at the space
    // (regex splits: ` ?\p{L}+` / `[^\r\n\p{L}\p{N}]?\p{L}+`; SentencePiece-style BPE: no
    // piece holds U+2581 after another character).
    if (text[p] == ' ' && text[p - 1] != ' ' && p + 1 < text.size() && IsAsciiLetter(text[p + 1])) {
      return p;
    }
    // Regex pre-tokenizers end every newline run at the newline (`\s*[\r\n]+`, `\s+`).
    if (regex && text[p - 1] == '\n' && !IsSpaceByte(text[p])) return p;
    if (p == 1) break;
  }
  return 0;
}

absl::StatusOr<ResolvedPrompt> ResolveTextPrompt(std::string_view text, const TextCache& cache,
                                                 const tokenizer::Tokenizer& tokenizer,
                                                 SeamCounters* counters) {
  if (text.empty()) return absl::InvalidArgumentError("text: must not be empty");
  if (const size_t bad = tokenizer::FindInvalidUtf8(text); bad != std::string_view::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("text: not valid UTF-8 (first bad byte at offset ", bad, ")"));
  }
  SeamCounters unused;
  if (counters == nullptr) counters = &unused;
  Count(&counters->requests);

  CacheMatch m = cache.Match(text, MatchGoal::kMostGenerated);
  // Whatever the tokens end up being, the holders go with the prompt (for routing).
  const auto with_holders = [&m](ResolvedPrompt* r) {
    r->holders = std::move(m.holders);
    for (CacheHolder& h : r->holders) {
      h.tokens = std::min<uint32_t>(h.tokens, static_cast<uint32_t>(r->ids.size()));
    }
  };
  // Reuse exactly through the last generated token.
  size_t keep = 0;
  for (size_t i = m.tokens.size(); i > 0; --i) {
    if (m.loss_mask[i - 1] == 1) {
      keep = i;
      break;
    }
  }
  absl::StatusOr<ResolvedPrompt> resolved;
  if (keep == 0) {
    resolved = WholeText(text, tokenizer);
    if (!resolved.ok()) return resolved.status();
    if (!DecodesTo(tokenizer, resolved->ids, text)) {
      Count(&counters->whole_text_fallbacks);
      resolved->whole_text_fallback = true;
    }
    with_holders(&*resolved);
    return resolved;
  }

  ResolvedPrompt p;
  p.ids.assign(m.tokens.begin(), m.tokens.begin() + keep);
  p.ends.assign(m.token_end_offsets.begin(), m.token_end_offsets.begin() + keep);
  p.mask.assign(m.loss_mask.begin(), m.loss_mask.begin() + keep);
  p.logprobs.assign(m.logprobs.begin(), m.logprobs.begin() + keep);
  p.versions.assign(m.token_versions.begin(), m.token_versions.begin() + keep);
  p.cached_tokens = static_cast<int32_t>(keep);
  const size_t seam = p.ends.back();
  bool ok = true;
  if (seam < text.size()) {
    const size_t window = FindWindowStart(tokenizer, text, seam);
    absl::StatusOr<tokenizer::Encoding> enc =
        window == 0 ? tokenizer.Encode(text, /*add_special_tokens=*/true)
                    : tokenizer.EncodeContinuation(text.substr(window));
    if (!enc.ok()) return enc.status();
    if (window == 0) Count(&counters->whole_text_windows);
    // First token of the window's encoding past the seam; the seam is a boundary of the
    // full-text encoding iff that token starts at or after it.
    const uint32_t rel = static_cast<uint32_t>(seam - window);
    size_t first = 0;
    while (first < enc->ids.size() && enc->offsets[first].end <= rel) ++first;
    const size_t new_begin = p.ids.size();
    if (first == enc->ids.size() || enc->offsets[first].begin >= rel) {
      AppendNew(*enc, first, static_cast<uint32_t>(window), &p);
    } else {
      absl::StatusOr<tokenizer::Encoding> rest = tokenizer.EncodeContinuation(text.substr(seam));
      if (!rest.ok()) return rest.status();
      AppendNew(*rest, 0, static_cast<uint32_t>(seam), &p);
      p.seam_continuation = true;
      Count(&counters->seam_continuations);
    }
    if (p.ids.size() == new_begin) {
      ok = false;
    } else {
      p.ends.back() = static_cast<uint32_t>(text.size());
      ok = true;
    }
  }
  // (a) on the whole prompt: the cached part is checked too.
  if (ok) ok = DecodesTo(tokenizer, p.ids, text);
  if (ok) {
    with_holders(&p);
    return p;
  }
  Count(&counters->whole_text_fallbacks);
  resolved = WholeText(text, tokenizer);
  if (!resolved.ok()) return resolved.status();
  resolved->whole_text_fallback = true;
  with_holders(&*resolved);
  return resolved;
}

}  // namespace rl::router
