#include "common/tokenizer/stream_decoder.h"

#include "absl/strings/str_cat.h"

namespace rl::tokenizer {
namespace {

constexpr std::string_view kReplacement = "\xEF\xBF\xBD";  // U+FFFD

// Context ids kept before the end of a primed prompt (enough for every decoder's position
// effects: Strip and Metaspace only look at the first token of the context).
constexpr size_t kContextIds = 4;

// `text` without its trailing U+FFFD characters.
std::string_view WithoutTrailingReplacements(std::string_view text) {
  while (text.ends_with(kReplacement)) text.remove_suffix(kReplacement.size());
  return text;
}

}  // namespace

size_t DecodeContextStart(const Tokenizer& tokenizer, absl::Span<const int32_t> ids) {
  size_t start = ids.size() > kContextIds ? ids.size() - kContextIds : 0;
  // Byte-fallback runs decode as a unit: start at the beginning of the run.
  while (start > 0 && tokenizer.IsFallbackByte(ids[start]) &&
         tokenizer.IsFallbackByte(ids[start - 1])) {
    --start;
  }
  return start;
}

absl::StatusOr<std::string> DecodeContinuation(const Tokenizer& tokenizer,
                                               absl::Span<const int32_t> prompt,
                                               absl::Span<const int32_t> completion,
                                               bool skip_special_tokens) {
  std::vector<int32_t> window(prompt.begin() + DecodeContextStart(tokenizer, prompt),
                              prompt.end());
  const size_t context_len = window.size();
  absl::StatusOr<std::string> context = tokenizer.Decode(window, skip_special_tokens);
  if (!context.ok()) return context.status();
  window.insert(window.end(), completion.begin(), completion.end());
  absl::StatusOr<std::string> full = tokenizer.Decode(window, skip_special_tokens);
  if (!full.ok()) return full.status();
  std::string_view prefix = *context;
  if (!full->starts_with(prefix)) prefix = WithoutTrailingReplacements(prefix);
  if (!full->starts_with(prefix)) {
    return absl::InternalError(absl::StrCat("decoding of ", completion.size(),
                                            " ids changed the decoding of the ", context_len,
                                            " context ids before them"));
  }
  return full->substr(prefix.size());
}

absl::Status StreamDecoder::Prime(absl::Span<const int32_t> prompt_ids) {
  if (!window_.empty() || num_ids_ > 0) {
    return absl::FailedPreconditionError("StreamDecoder::Prime after Step");
  }
  std::vector<int32_t> window(prompt_ids.begin() + DecodeContextStart(tokenizer_, prompt_ids),
                              prompt_ids.end());
  absl::StatusOr<std::string> context = tokenizer_.Decode(window, skip_special_tokens_);
  if (!context.ok()) return context.status();
  window_ = std::move(window);
  context_len_ = window_.size();
  context_text_ = std::string(WithoutTrailingReplacements(*context));
  return absl::OkStatus();
}

absl::StatusOr<std::string> StreamDecoder::Step(absl::Span<const int32_t> ids) {
  if (ids.empty()) return std::string();
  const size_t old_size = window_.size();
  window_.insert(window_.end(), ids.begin(), ids.end());
  absl::StatusOr<std::string> text = tokenizer_.Decode(window_, skip_special_tokens_);
  if (!text.ok()) {
    window_.resize(old_size);
    return text.status();
  }
  num_ids_ += ids.size();
  // A trailing run of byte-fallback tokens decodes as a unit: wait for its end.
  for (auto it = window_.rbegin(); it != window_.rend(); ++it) {
    if (skip_special_tokens_ && tokenizer_.IsSpecial(*it)) continue;
    if (tokenizer_.IsFallbackByte(*it)) return std::string();
    break;
  }
  if (text->size() <= context_text_.size() || text->ends_with(kReplacement) ||
      !text->starts_with(context_text_)) {
    return std::string();
  }
  std::string delta = text->substr(context_text_.size());
  // The ids just emitted become the context of the next step.
  window_.erase(window_.begin(), window_.begin() + context_len_);
  context_len_ = window_.size();
  absl::StatusOr<std::string> context = tokenizer_.Decode(window_, skip_special_tokens_);
  if (!context.ok()) return context.status();
  context_text_ = *std::move(context);
  return delta;
}

absl::StatusOr<std::string> StreamDecoder::Flush() {
  absl::StatusOr<std::string> text = tokenizer_.Decode(window_, skip_special_tokens_);
  if (!text.ok()) return text.status();
  std::string rest;
  if (text->starts_with(context_text_)) {
    rest = text->substr(context_text_.size());
  } else {
    return absl::InternalError(absl::StrCat("stream decoding diverged: context '", context_text_,
                                            "' is not a prefix of '", *text, "'"));
  }
  window_.clear();
  context_len_ = 0;
  context_text_.clear();
  num_ids_ = 0;
  return rest;
}

}  // namespace rl::tokenizer
