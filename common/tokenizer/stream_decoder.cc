#include "common/tokenizer/stream_decoder.h"

#include "absl/strings/str_cat.h"

namespace rl::tokenizer {
namespace {

constexpr std::string_view kReplacement = "\xEF\xBF\xBD";  // U+FFFD

}  // namespace

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
