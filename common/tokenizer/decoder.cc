#include "common/tokenizer/decoder.h"

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "common/tokenizer/byte_level.h"
#include "common/tokenizer/json_util.h"
#include "common/tokenizer/normalizer.h"
#include "common/tokenizer/unicode.h"

namespace rl::tokenizer {

using json_util::Json;

namespace {

// "<0xAB>" -> 0xAB.
std::optional<uint8_t> ParseByteToken(const std::string& t) {
  if (t.size() != 6 || !t.starts_with("<0x") || t[5] != '>') return std::nullopt;
  auto hex = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  const int hi = hex(t[3]);
  const int lo = hex(t[4]);
  if (hi < 0 || lo < 0) return std::nullopt;
  return static_cast<uint8_t>(hi * 16 + lo);
}

}  // namespace

absl::StatusOr<std::unique_ptr<Decoder>> Decoder::FromJson(const Json& json) {
  std::unique_ptr<Decoder> d(new Decoder());
  RETURN_IF_ERROR(d->Add(json, "decoder"));
  return d;
}

absl::Status Decoder::Add(const Json& json, const std::string& where) {
  ASSIGN_OR_RETURN(const std::string type, json_util::GetType(json, where));
  if (type == "Sequence") {
    ASSIGN_OR_RETURN(const Json* list, json_util::GetArray(json, "decoders", where));
    for (size_t i = 0; i < list->size(); ++i) {
      RETURN_IF_ERROR(Add((*list)[i], absl::StrCat(where, ".decoders[", i, "]")));
    }
    return absl::OkStatus();
  }
  Step step;
  if (type == "ByteLevel") {
    step.kind = Step::Kind::kByteLevel;
  } else if (type == "ByteFallback") {
    step.kind = Step::Kind::kByteFallback;
  } else if (type == "Fuse") {
    step.kind = Step::Kind::kFuse;
  } else if (type == "Replace") {
    step.kind = Step::Kind::kReplace;
    ASSIGN_OR_RETURN(const json_util::Pattern pattern, json_util::GetPattern(json, where));
    ASSIGN_OR_RETURN(step.content, json_util::GetString(json, "content", where));
    if (pattern.is_regex) {
      ASSIGN_OR_RETURN(step.regex, Regex::Compile(pattern.value));
    } else if (pattern.value.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("tokenizer.json: ", where, ".pattern must not be empty"));
    } else {
      step.literal = pattern.value;
    }
  } else if (type == "Strip") {
    step.kind = Step::Kind::kStrip;
    ASSIGN_OR_RETURN(step.content, json_util::GetString(json, "content", where));
    size_t len = 0;
    if (step.content.empty() || (DecodeUtf8(step.content, 0, &len), len) != step.content.size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("tokenizer.json: ", where, ".content must be one character"));
    }
    ASSIGN_OR_RETURN(step.start, json_util::GetIntOr(json, "start", where, 0));
    ASSIGN_OR_RETURN(step.stop, json_util::GetIntOr(json, "stop", where, 0));
    if (step.start < 0 || step.stop < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("tokenizer.json: ", where, ".start/stop must not be negative"));
    }
  } else if (type == "Metaspace") {
    step.kind = Step::Kind::kMetaspace;
    ASSIGN_OR_RETURN(step.content, json_util::GetString(json, "replacement", where));
    if (step.content.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("tokenizer.json: ", where, ".replacement must not be empty"));
    }
    ASSIGN_OR_RETURN(const bool add_prefix_space,
                     json_util::GetBoolOr(json, "add_prefix_space", where, true));
    ASSIGN_OR_RETURN(const std::string scheme,
                     json_util::GetStringOr(json, "prepend_scheme", where,
                                            add_prefix_space ? "always" : "never"));
    step.prepend = scheme != "never";
  } else {
    return json_util::UnknownType("decoder", type);
  }
  steps_.push_back(std::move(step));
  return absl::OkStatus();
}

absl::Status Decoder::Apply(const Step& step, std::vector<std::string>* tokens) const {
  switch (step.kind) {
    case Step::Kind::kByteLevel: {
      std::string bytes;
      for (const std::string& t : *tokens) {
        if (auto b = ByteLevelToBytes(t)) {
          bytes += *b;
        } else {
          bytes += t;
        }
      }
      std::string text;
      AppendUtf8Lossy(bytes, &text);
      tokens->assign(1, std::move(text));
      return absl::OkStatus();
    }
    case Step::Kind::kReplace:
      for (std::string& t : *tokens) {
        std::vector<std::pair<size_t, size_t>> matches;
        if (step.regex) {
          RETURN_IF_ERROR(step.regex->FindAll(t, &matches));
        } else {
          matches = FindLiteral(t, step.literal);
        }
        if (matches.empty()) continue;
        std::string out;
        size_t prev = 0;
        for (const auto& [b, e] : matches) {
          out.append(t, prev, b - prev);
          out += step.content;
          prev = e;
        }
        out.append(t, prev, std::string::npos);
        t = std::move(out);
      }
      return absl::OkStatus();
    case Step::Kind::kByteFallback: {
      std::vector<std::string> out;
      out.reserve(tokens->size());
      std::string pending;
      auto flush = [&] {
        if (pending.empty()) return;
        if (FindInvalidUtf8(pending) == std::string_view::npos) {
          out.push_back(pending);
        } else {
          for (size_t i = 0; i < pending.size(); ++i) out.emplace_back("\xEF\xBF\xBD");
        }
        pending.clear();
      };
      for (std::string& t : *tokens) {
        if (auto b = ParseByteToken(t)) {
          pending.push_back(static_cast<char>(*b));
        } else {
          flush();
          out.push_back(std::move(t));
        }
      }
      flush();
      *tokens = std::move(out);
      return absl::OkStatus();
    }
    case Step::Kind::kFuse: {
      std::string all;
      for (const std::string& t : *tokens) all += t;
      tokens->assign(1, std::move(all));
      return absl::OkStatus();
    }
    case Step::Kind::kStrip: {
      const std::string& c = step.content;
      for (std::string& t : *tokens) {
        size_t begin = 0;
        for (int64_t i = 0; i < step.start && t.compare(begin, c.size(), c) == 0; ++i) {
          begin += c.size();
        }
        size_t end = t.size();
        for (int64_t i = 0; i < step.stop && end >= begin + c.size() &&
                            t.compare(end - c.size(), c.size(), c) == 0;
             ++i) {
          end -= c.size();
        }
        t = t.substr(begin, end - begin);
      }
      return absl::OkStatus();
    }
    case Step::Kind::kMetaspace: {
      for (size_t i = 0; i < tokens->size(); ++i) {
        std::string& t = (*tokens)[i];
        std::vector<std::pair<size_t, size_t>> matches = FindLiteral(t, step.content);
        if (matches.empty()) continue;
        std::string out;
        size_t prev = 0;
        for (const auto& [b, e] : matches) {
          out.append(t, prev, b - prev);
          if (!(i == 0 && step.prepend)) out += ' ';
          prev = e;
        }
        out.append(t, prev, std::string::npos);
        t = std::move(out);
      }
      return absl::OkStatus();
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> Decoder::Decode(std::vector<std::string> tokens) const {
  for (const Step& step : steps_) RETURN_IF_ERROR(Apply(step, &tokens));
  std::string out;
  for (const std::string& t : tokens) out += t;
  return out;
}

}  // namespace rl::tokenizer
