#include "common/tokenizer/stream_decoder.h"

#include <algorithm>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/tokenizer/unicode.h"

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

absl::StatusOr<StreamDecoder::Context> StreamDecoder::ContextFor(const Tokenizer& tokenizer,
                                                                 absl::Span<const int32_t> prompt,
                                                                 bool skip_special_tokens) {
  Context ctx;
  size_t start = DecodeContextStart(tokenizer, prompt);
  if (!tokenizer.fallback_byte_ids_.empty()) {
    // ByteFallback: the prompt's trailing byte run stays out of the context; only its
    // incomplete last character (if any) goes on, pending, before the completion.
    size_t run = prompt.size();
    while (run > 0 && tokenizer.IsFallbackByte(prompt[run - 1])) --run;
    if (run < prompt.size()) {
      // Anchor the context on a token before the run that the decoding keeps.
      if (start == run) {
        while (start > 0) {
          --start;
          if (!(skip_special_tokens && tokenizer.IsSpecial(prompt[start]))) break;
        }
      }
      std::string tail;  // the run's last (up to 3) bytes
      for (size_t i = std::max(run, prompt.size() - std::min<size_t>(prompt.size(), 3));
           i < prompt.size(); ++i) {
        const std::string& t = *tokenizer.TokenText(prompt[i]);
        tail.push_back(static_cast<char>(std::stoi(t.substr(3, 2), nullptr, 16)));
      }
      const size_t incomplete = IncompleteUtf8Suffix(tail);
      ctx.ids.assign(prompt.begin() + start, prompt.begin() + run);
      ctx.context_len = ctx.ids.size();
      ctx.ids.insert(ctx.ids.end(), prompt.end() - incomplete, prompt.end());
      absl::StatusOr<std::string> text = tokenizer.Decode(
          absl::MakeConstSpan(ctx.ids).first(ctx.context_len), skip_special_tokens);
      if (!text.ok()) return text.status();
      ctx.text = *std::move(text);
      return ctx;
    }
  }
  ctx.ids.assign(prompt.begin() + start, prompt.end());
  ctx.context_len = ctx.ids.size();
  if (!tokenizer.id_bytes_.empty()) {
    // Pure ByteLevel: the decoding is the lossy UTF-8 of the bytes; an incomplete last
    // character belongs to the completion.
    std::string bytes;
    for (int32_t id : ctx.ids) {
      if (tokenizer.TokenText(id) == nullptr) {
        return absl::InvalidArgumentError(
            absl::StrCat("token id ", id, " is not in the vocabulary"));
      }
      if (!(skip_special_tokens && tokenizer.IsSpecial(id))) bytes += tokenizer.id_bytes_[id];
    }
    bytes.resize(bytes.size() - IncompleteUtf8Suffix(bytes));
    AppendUtf8Lossy(bytes, &ctx.text);
    return ctx;
  }
  absl::StatusOr<std::string> text = tokenizer.Decode(ctx.ids, skip_special_tokens);
  if (!text.ok()) return text.status();
  // Other decoders: a trailing U+FFFD may be an incomplete character completed later.
  ctx.text = std::string(WithoutTrailingReplacements(*text));
  return ctx;
}

absl::StatusOr<std::string> DecodeContinuation(const Tokenizer& tokenizer,
                                               absl::Span<const int32_t> prompt,
                                               absl::Span<const int32_t> completion,
                                               bool skip_special_tokens) {
  absl::StatusOr<StreamDecoder::Context> ctx =
      StreamDecoder::ContextFor(tokenizer, prompt, skip_special_tokens);
  if (!ctx.ok()) return ctx.status();
  if (completion.empty()) return std::string();
  std::vector<int32_t> window = std::move(ctx->ids);
  window.insert(window.end(), completion.begin(), completion.end());
  absl::StatusOr<std::string> full = tokenizer.Decode(window, skip_special_tokens);
  if (!full.ok()) return full.status();
  if (!full->starts_with(ctx->text)) {
    return absl::InternalError(absl::StrCat("decoding of ", completion.size(),
                                            " ids changed the decoding of the ", ctx->context_len,
                                            " context ids before them"));
  }
  return full->substr(ctx->text.size());
}

absl::Status StreamDecoder::Prime(absl::Span<const int32_t> prompt_ids) {
  if (!window_.empty() || num_ids_ > 0) {
    return absl::FailedPreconditionError("StreamDecoder::Prime after Step");
  }
  absl::StatusOr<Context> ctx = ContextFor(tokenizer_, prompt_ids, skip_special_tokens_);
  if (!ctx.ok()) return ctx.status();
  window_ = std::move(ctx->ids);
  context_len_ = ctx->context_len;
  context_text_ = std::move(ctx->text);
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
  if (num_ids_ == 0) {
    // Nothing generated: a primed prompt's pending incomplete character is not emitted.
    window_.clear();
    context_len_ = 0;
    context_text_.clear();
    return std::string();
  }
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
