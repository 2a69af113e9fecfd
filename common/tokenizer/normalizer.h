// Normalizer: the "normalizer" section of tokenizer.json as a flat list of steps
// (Sequence is flattened at load): NFC, NFD, NFKC, NFKD, Prepend, Replace, Strip.
//
// Each step edits a NormalizedString in place with Hugging Face's alignment rules, so
// offsets stay exact. Unknown types fail at load with the type named.
// Thread safety: immutable after load. Cost: O(length) per step; the Unicode forms cost
// nothing on text that is already in that form.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/tokenizer/normalized_string.h"
#include "common/tokenizer/regex.h"
#include "nlohmann/json_fwd.hpp"

namespace rl::tokenizer {

class Normalizer {
 public:
  // `json` is the "normalizer" value (an object); null means "no normalizer" and is handled
  // by the caller.
  static absl::StatusOr<std::unique_ptr<Normalizer>> FromJson(const nlohmann::json& json);

  // With `skip_prepend` the Prepend steps are left out (the piece continues a longer text, so
  // Hugging Face would not have prepended anything at its start).
  absl::Status Normalize(NormalizedString* s, bool skip_prepend = false) const;

 private:
  struct Step {
    enum class Kind { kUnicode, kPrepend, kReplace, kStrip } kind;
    NormalizedString::NormalForm form = NormalizedString::NormalForm::kNfc;
    std::string text;              // Prepend: prefix; Replace: content
    std::string literal;           // Replace with a String pattern
    std::unique_ptr<Regex> regex;  // Replace with a Regex pattern
    bool left = false;
    bool right = false;
  };
  absl::Status Add(const nlohmann::json& json, const std::string& where);

  std::vector<Step> steps_;
};

// Non-overlapping left-to-right occurrences of `needle` (non-empty) in `haystack`.
std::vector<std::pair<size_t, size_t>> FindLiteral(std::string_view haystack,
                                                   std::string_view needle);

}  // namespace rl::tokenizer
