#include "common/tokenizer/normalizer.h"

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "common/tokenizer/json_util.h"

namespace rl::tokenizer {

using json_util::Json;

std::vector<std::pair<size_t, size_t>> FindLiteral(std::string_view haystack,
                                                   std::string_view needle) {
  std::vector<std::pair<size_t, size_t>> out;
  size_t pos = haystack.find(needle);
  while (pos != std::string_view::npos) {
    out.emplace_back(pos, pos + needle.size());
    pos = haystack.find(needle, pos + needle.size());
  }
  return out;
}

absl::StatusOr<std::unique_ptr<Normalizer>> Normalizer::FromJson(const Json& json) {
  std::unique_ptr<Normalizer> n(new Normalizer());
  RETURN_IF_ERROR(n->Add(json, "normalizer"));
  return n;
}

absl::Status Normalizer::Add(const Json& json, const std::string& where) {
  ASSIGN_OR_RETURN(const std::string type, json_util::GetType(json, where));
  if (type == "Sequence") {
    ASSIGN_OR_RETURN(const Json* list, json_util::GetArray(json, "normalizers", where));
    for (size_t i = 0; i < list->size(); ++i) {
      RETURN_IF_ERROR(Add((*list)[i], absl::StrCat(where, ".normalizers[", i, "]")));
    }
    return absl::OkStatus();
  }
  Step step;
  if (type == "NFC" || type == "NFD" || type == "NFKC" || type == "NFKD") {
    step.kind = Step::Kind::kUnicode;
    step.form = type == "NFC"    ? NormalizedString::NormalForm::kNfc
                : type == "NFD"  ? NormalizedString::NormalForm::kNfd
                : type == "NFKC" ? NormalizedString::NormalForm::kNfkc
                                 : NormalizedString::NormalForm::kNfkd;
  } else if (type == "Prepend") {
    step.kind = Step::Kind::kPrepend;
    ASSIGN_OR_RETURN(step.text, json_util::GetString(json, "prepend", where));
  } else if (type == "Replace") {
    step.kind = Step::Kind::kReplace;
    ASSIGN_OR_RETURN(const json_util::Pattern pattern, json_util::GetPattern(json, where));
    ASSIGN_OR_RETURN(step.text, json_util::GetString(json, "content", where));
    if (pattern.is_regex) {
      ASSIGN_OR_RETURN(step.regex, Regex::Compile(pattern.value));
    } else {
      if (pattern.value.empty()) {
        return absl::InvalidArgumentError(
            absl::StrCat("tokenizer.json: ", where, ".pattern must not be empty"));
      }
      step.literal = pattern.value;
    }
  } else if (type == "Strip") {
    step.kind = Step::Kind::kStrip;
    ASSIGN_OR_RETURN(step.left, json_util::GetBoolOr(json, "strip_left", where, true));
    ASSIGN_OR_RETURN(step.right, json_util::GetBoolOr(json, "strip_right", where, true));
  } else {
    return json_util::UnknownType("normalizer", type);
  }
  steps_.push_back(std::move(step));
  return absl::OkStatus();
}

absl::Status Normalizer::Normalize(NormalizedString* s, bool skip_prepend) const {
  for (const Step& step : steps_) {
    switch (step.kind) {
      case Step::Kind::kUnicode:
        RETURN_IF_ERROR(s->Normalize(step.form));
        break;
      case Step::Kind::kPrepend:
        if (!skip_prepend) s->Prepend(step.text);
        break;
      case Step::Kind::kReplace: {
        std::vector<std::pair<size_t, size_t>> matches;
        if (step.regex) {
          RETURN_IF_ERROR(step.regex->FindAll(s->text(), &matches));
        } else {
          matches = FindLiteral(s->text(), step.literal);
        }
        s->ReplaceRanges(matches, step.text);
        break;
      }
      case Step::Kind::kStrip:
        s->Strip(step.left, step.right);
        break;
    }
  }
  return absl::OkStatus();
}

}  // namespace rl::tokenizer
