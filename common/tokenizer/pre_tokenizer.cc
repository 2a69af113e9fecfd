#include "common/tokenizer/pre_tokenizer.h"

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "common/tokenizer/json_util.h"
#include "common/tokenizer/normalizer.h"

namespace rl::tokenizer {

using json_util::Json;

namespace {

constexpr std::string_view kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

absl::StatusOr<SplitBehavior> ParseBehavior(const std::string& b, const std::string& where) {
  if (b == "Removed") return SplitBehavior::kRemoved;
  if (b == "Isolated") return SplitBehavior::kIsolated;
  if (b == "MergedWithPrevious") return SplitBehavior::kMergedWithPrevious;
  if (b == "MergedWithNext") return SplitBehavior::kMergedWithNext;
  if (b == "Contiguous") return SplitBehavior::kContiguous;
  return absl::InvalidArgumentError(
      absl::StrCat("tokenizer.json: ", where, ".behavior '", b, "' is not a split behavior"));
}

}  // namespace

void SplitByMatches(const NormalizedString& s,
                    const std::vector<std::pair<size_t, size_t>>& matches, SplitBehavior behavior,
                    bool invert, std::vector<NormalizedString>* out) {
  struct Part {
    size_t begin;
    size_t end;
    bool is_match;
  };
  const size_t n = s.size();
  std::vector<Part> parts;
  parts.reserve(matches.size() * 2 + 1);
  size_t prev = 0;
  for (const auto& [b, e] : matches) {
    if (prev != b) parts.push_back({prev, b, invert});
    parts.push_back({b, e, !invert});
    prev = e;
  }
  if (prev != n) parts.push_back({prev, n, invert});

  std::vector<std::pair<size_t, size_t>> pieces;
  pieces.reserve(parts.size());
  switch (behavior) {
    case SplitBehavior::kIsolated:
      for (const Part& p : parts) pieces.emplace_back(p.begin, p.end);
      break;
    case SplitBehavior::kRemoved:
      for (const Part& p : parts) {
        if (!p.is_match) pieces.emplace_back(p.begin, p.end);
      }
      break;
    case SplitBehavior::kContiguous: {
      bool previous_match = false;
      for (const Part& p : parts) {
        if (p.is_match == previous_match && !pieces.empty()) {
          pieces.back().second = p.end;
        } else {
          pieces.emplace_back(p.begin, p.end);
        }
        previous_match = p.is_match;
      }
      break;
    }
    case SplitBehavior::kMergedWithPrevious: {
      bool previous_match = false;
      for (const Part& p : parts) {
        if (p.is_match && !previous_match && !pieces.empty()) {
          pieces.back().second = p.end;
        } else {
          pieces.emplace_back(p.begin, p.end);
        }
        previous_match = p.is_match;
      }
      break;
    }
    case SplitBehavior::kMergedWithNext: {
      bool previous_match = false;
      for (auto it = parts.rbegin(); it != parts.rend(); ++it) {
        if (it->is_match && !previous_match && !pieces.empty()) {
          pieces.back().first = it->begin;
        } else {
          pieces.emplace_back(it->begin, it->end);
        }
        previous_match = it->is_match;
      }
      std::reverse(pieces.begin(), pieces.end());
      break;
    }
  }
  for (const auto& [b, e] : pieces) {
    if (e > b) out->push_back(s.Slice(b, e));
  }
}

absl::StatusOr<std::unique_ptr<PreTokenizer>> PreTokenizer::FromJson(const Json& json) {
  std::unique_ptr<PreTokenizer> p(new PreTokenizer());
  RETURN_IF_ERROR(p->Add(json, "pre_tokenizer"));
  for (size_t i = 0; i + 1 < p->steps_.size(); ++i) {
    if (p->steps_[i].kind == Step::Kind::kByteLevel) {
      return absl::InvalidArgumentError(
          "tokenizer.json: a ByteLevel pre-tokenizer must be the last one of the sequence");
    }
  }
  p->byte_level_ = !p->steps_.empty() && p->steps_.back().kind == Step::Kind::kByteLevel;
  // A ByteLevel step with neither regex nor prefix space leaves the text as it is.
  if (p->byte_level_ && !p->steps_.back().regex && !p->steps_.back().add_prefix_space) {
    p->steps_.pop_back();
  }
  return p;
}

absl::Status PreTokenizer::Add(const Json& json, const std::string& where) {
  ASSIGN_OR_RETURN(const std::string type, json_util::GetType(json, where));
  if (type == "Sequence") {
    ASSIGN_OR_RETURN(const Json* list, json_util::GetArray(json, "pretokenizers", where));
    for (size_t i = 0; i < list->size(); ++i) {
      RETURN_IF_ERROR(Add((*list)[i], absl::StrCat(where, ".pretokenizers[", i, "]")));
    }
    return absl::OkStatus();
  }
  Step step;
  if (type == "Split") {
    step.kind = Step::Kind::kSplit;
    ASSIGN_OR_RETURN(const json_util::Pattern pattern, json_util::GetPattern(json, where));
    if (pattern.is_regex) {
      ASSIGN_OR_RETURN(step.regex, Regex::Compile(pattern.value));
    } else if (pattern.value.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("tokenizer.json: ", where, ".pattern must not be empty"));
    } else {
      step.literal = pattern.value;
    }
    ASSIGN_OR_RETURN(const std::string behavior, json_util::GetString(json, "behavior", where));
    ASSIGN_OR_RETURN(step.behavior, ParseBehavior(behavior, where));
    ASSIGN_OR_RETURN(step.invert, json_util::GetBoolOr(json, "invert", where, false));
  } else if (type == "ByteLevel") {
    step.kind = Step::Kind::kByteLevel;
    ASSIGN_OR_RETURN(step.add_prefix_space,
                     json_util::GetBoolOr(json, "add_prefix_space", where, true));
    ASSIGN_OR_RETURN(const bool use_regex, json_util::GetBoolOr(json, "use_regex", where, true));
    if (use_regex) {
      ASSIGN_OR_RETURN(step.regex, Regex::Compile(kGpt2Pattern));
    }
  } else if (type == "Metaspace") {
    step.kind = Step::Kind::kMetaspace;
    ASSIGN_OR_RETURN(step.replacement, json_util::GetString(json, "replacement", where));
    if (step.replacement.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("tokenizer.json: ", where, ".replacement must not be empty"));
    }
    ASSIGN_OR_RETURN(step.split, json_util::GetBoolOr(json, "split", where, true));
    ASSIGN_OR_RETURN(const bool add_prefix_space,
                     json_util::GetBoolOr(json, "add_prefix_space", where, true));
    ASSIGN_OR_RETURN(const std::string scheme,
                     json_util::GetStringOr(json, "prepend_scheme", where,
                                            add_prefix_space ? "always" : "never"));
    if (scheme == "always") {
      step.prepend = Step::Prepend::kAlways;
    } else if (scheme == "first") {
      step.prepend = Step::Prepend::kFirst;
    } else if (scheme == "never") {
      step.prepend = Step::Prepend::kNever;
    } else {
      return absl::InvalidArgumentError(absl::StrCat("tokenizer.json: ", where, ".prepend_scheme '",
                                                     scheme, "' is not always/first/never"));
    }
  } else {
    return json_util::UnknownType("pre_tokenizer", type);
  }
  steps_.push_back(std::move(step));
  return absl::OkStatus();
}

absl::Status PreTokenizer::Apply(const Step& step, const NormalizedString& s, bool continuation,
                                 std::vector<NormalizedString>* out) const {
  std::vector<std::pair<size_t, size_t>> matches;
  switch (step.kind) {
    case Step::Kind::kSplit:
      if (step.regex) {
        RETURN_IF_ERROR(step.regex->FindAll(s.text(), &matches));
      } else {
        matches = FindLiteral(s.text(), step.literal);
      }
      SplitByMatches(s, matches, step.behavior, step.invert, out);
      return absl::OkStatus();
    case Step::Kind::kByteLevel: {
      if (step.add_prefix_space && !continuation && !s.text().starts_with(' ')) {
        NormalizedString copy = s;
        copy.Prepend(" ");
        if (!step.regex) {
          out->push_back(std::move(copy));
          return absl::OkStatus();
        }
        RETURN_IF_ERROR(step.regex->FindAll(copy.text(), &matches));
        SplitByMatches(copy, matches, SplitBehavior::kIsolated, false, out);
        return absl::OkStatus();
      }
      if (!step.regex) {
        out->push_back(s);
        return absl::OkStatus();
      }
      RETURN_IF_ERROR(step.regex->FindAll(s.text(), &matches));
      SplitByMatches(s, matches, SplitBehavior::kIsolated, false, out);
      return absl::OkStatus();
    }
    case Step::Kind::kMetaspace: {
      NormalizedString copy = s;
      copy.ReplaceRanges(FindLiteral(copy.text(), " "), step.replacement);
      const bool prepend =
          !continuation && (step.prepend == Step::Prepend::kAlways ||
                            (step.prepend == Step::Prepend::kFirst && copy.original_start() == 0));
      if (prepend && !copy.text().starts_with(step.replacement)) copy.Prepend(step.replacement);
      if (!step.split) {
        out->push_back(std::move(copy));
        return absl::OkStatus();
      }
      SplitByMatches(copy, FindLiteral(copy.text(), step.replacement),
                     SplitBehavior::kMergedWithNext, false, out);
      return absl::OkStatus();
    }
  }
  return absl::OkStatus();
}

absl::Status PreTokenizer::PreTokenize(NormalizedString piece, std::vector<NormalizedString>* out,
                                       bool continuation) const {
  if (steps_.empty()) {
    out->push_back(std::move(piece));
    return absl::OkStatus();
  }
  if (steps_.size() == 1) return Apply(steps_[0], piece, continuation, out);
  std::vector<NormalizedString> current;
  current.push_back(std::move(piece));
  std::vector<NormalizedString> next;
  for (size_t i = 0; i < steps_.size(); ++i) {
    std::vector<NormalizedString>* target = i + 1 == steps_.size() ? out : &next;
    // Only the first piece of the first step starts at the continuation point.
    for (size_t j = 0; j < current.size(); ++j) {
      RETURN_IF_ERROR(Apply(steps_[i], current[j], continuation && j == 0, target));
    }
    if (target == &next) {
      current.swap(next);
      next.clear();
    }
  }
  return absl::OkStatus();
}

}  // namespace rl::tokenizer
