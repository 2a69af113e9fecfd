#include "common/tokenizer/post_processor.h"

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "common/tokenizer/byte_level.h"
#include "common/tokenizer/encoding.h"
#include "common/tokenizer/json_util.h"
#include "common/tokenizer/unicode.h"

namespace rl::tokenizer {

using json_util::Json;

namespace {

// Leading and trailing characters of a byte-level token that stand for whitespace.
size_t CountSpaces(std::string_view token, bool leading) {
  const std::string& space = ByteToUnicode(' ');
  size_t count = 0;
  if (leading) {
    size_t pos = 0;
    while (pos < token.size()) {
      size_t len;
      const char32_t c = DecodeUtf8(token, pos, &len);
      if (token.compare(pos, len, space) != 0 && !IsWhitespace(c)) break;
      ++count;
      pos += len;
    }
  } else {
    size_t end = token.size();
    while (end > 0) {
      size_t start = end - 1;
      while (start > 0 && IsUtf8Continuation(static_cast<uint8_t>(token[start]))) --start;
      size_t len;
      const char32_t c = DecodeUtf8(token, start, &len);
      if (token.compare(start, len, space) != 0 && !IsWhitespace(c)) break;
      ++count;
      end = start;
    }
  }
  return count;
}

absl::StatusOr<std::vector<int32_t>> TemplateIds(const Json& items, const Json& special,
                                                 const std::string& where, bool* seen_sequence,
                                                 std::vector<int32_t>* suffix) {
  std::vector<int32_t> prefix;
  if (!items.is_array()) return json_util::TypeError(where, "an array", items);
  for (size_t i = 0; i < items.size(); ++i) {
    const Json& item = items[i];
    const std::string at = absl::StrCat(where, "[", i, "]");
    if (const Json* s = json_util::Find(item, "SpecialToken")) {
      ASSIGN_OR_RETURN(const std::string name,
                       json_util::GetString(*s, "id", at + ".SpecialToken"));
      const Json* entry = json_util::Find(special, name);
      if (entry == nullptr) {
        return absl::InvalidArgumentError(absl::StrCat("tokenizer.json: ", at,
                                                       " names special token '", name,
                                                       "' missing from special_tokens"));
      }
      ASSIGN_OR_RETURN(const Json* ids,
                       json_util::GetArray(*entry, "ids", "special_tokens." + name));
      for (const Json& id : *ids) {
        if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() > INT32_MAX) {
          return json_util::TypeError(absl::StrCat("special_tokens.", name, ".ids"),
                                      "non-negative integers", id);
        }
        (*seen_sequence ? *suffix : prefix).push_back(static_cast<int32_t>(id.get<int64_t>()));
      }
    } else if (const Json* s = json_util::Find(item, "Sequence")) {
      ASSIGN_OR_RETURN(const std::string id, json_util::GetString(*s, "id", at + ".Sequence"));
      if (id != "A") {
        return absl::InvalidArgumentError(
            absl::StrCat("tokenizer.json: ", at, " of a single template must be sequence A"));
      }
      *seen_sequence = true;
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("tokenizer.json: ", at, " must be a SpecialToken or a Sequence"));
    }
  }
  return prefix;
}

}  // namespace

absl::StatusOr<std::unique_ptr<PostProcessor>> PostProcessor::FromJson(const Json& json) {
  std::unique_ptr<PostProcessor> p(new PostProcessor());
  RETURN_IF_ERROR(p->Add(json, "post_processor"));
  for (const Step& s : p->steps_) {
    if (s.kind != Step::Kind::kTemplate) continue;
    p->prefix_ids_.insert(p->prefix_ids_.end(), s.prefix.begin(), s.prefix.end());
    p->suffix_ids_.insert(p->suffix_ids_.end(), s.suffix.begin(), s.suffix.end());
  }
  return p;
}

absl::Status PostProcessor::Add(const Json& json, const std::string& where) {
  ASSIGN_OR_RETURN(const std::string type, json_util::GetType(json, where));
  if (type == "Sequence") {
    ASSIGN_OR_RETURN(const Json* list, json_util::GetArray(json, "processors", where));
    for (size_t i = 0; i < list->size(); ++i) {
      RETURN_IF_ERROR(Add((*list)[i], absl::StrCat(where, ".processors[", i, "]")));
    }
    return absl::OkStatus();
  }
  Step step;
  if (type == "ByteLevel") {
    step.kind = Step::Kind::kByteLevel;
    ASSIGN_OR_RETURN(step.trim_offsets, json_util::GetBoolOr(json, "trim_offsets", where, true));
    ASSIGN_OR_RETURN(step.add_prefix_space,
                     json_util::GetBoolOr(json, "add_prefix_space", where, true));
  } else if (type == "TemplateProcessing") {
    step.kind = Step::Kind::kTemplate;
    const Json* single = json_util::Find(json, "single");
    if (single == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("tokenizer.json: missing ", where, ".single"));
    }
    const Json* special = json_util::Find(json, "special_tokens");
    static const Json kEmpty = Json::object();
    bool seen_sequence = false;
    ASSIGN_OR_RETURN(step.prefix, TemplateIds(*single, special ? *special : kEmpty,
                                              where + ".single", &seen_sequence, &step.suffix));
  } else {
    return json_util::UnknownType("post_processor", type);
  }
  steps_.push_back(std::move(step));
  return absl::OkStatus();
}

void PostProcessor::Process(Encoding* encoding, bool add_special_tokens,
                            absl::FunctionRef<std::string_view(int32_t)> token_text) const {
  for (const Step& step : steps_) {
    if (step.kind == Step::Kind::kByteLevel) {
      if (!step.trim_offsets) continue;
      for (size_t i = 0; i < encoding->ids.size(); ++i) {
        const std::string_view token = token_text(encoding->ids[i]);
        TokenOffset& off = encoding->offsets[i];
        size_t leading = CountSpaces(token, true);
        const size_t trailing = CountSpaces(token, false);
        if (leading > 0) {
          const bool is_first = i == 0 || off.begin == 0;
          if (is_first && step.add_prefix_space && leading == 1) leading = 0;
          off.begin = std::min<uint32_t>(off.begin + static_cast<uint32_t>(leading), off.end);
        }
        if (trailing > 0 && off.end >= trailing) {
          off.end = std::max<uint32_t>(off.end - static_cast<uint32_t>(trailing), off.begin);
        }
      }
      continue;
    }
    if (!add_special_tokens || (step.prefix.empty() && step.suffix.empty())) continue;
    Encoding out;
    out.ids.reserve(encoding->ids.size() + step.prefix.size() + step.suffix.size());
    out.offsets.reserve(out.ids.capacity());
    for (int32_t id : step.prefix) {
      out.ids.push_back(id);
      out.offsets.push_back({0, 0});
    }
    out.ids.insert(out.ids.end(), encoding->ids.begin(), encoding->ids.end());
    out.offsets.insert(out.offsets.end(), encoding->offsets.begin(), encoding->offsets.end());
    for (int32_t id : step.suffix) {
      out.ids.push_back(id);
      out.offsets.push_back({0, 0});
    }
    *encoding = std::move(out);
  }
}

}  // namespace rl::tokenizer
