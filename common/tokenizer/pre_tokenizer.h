// PreTokenizer: the "pre_tokenizer" section of tokenizer.json as a flat list of steps
// (Sequence flattened at load): Split (String or Regex pattern, every delimiter behavior,
// invert), ByteLevel (optional GPT-2 regex and prefix space) and Metaspace.
//
// Splits are NormalizedString slices, so offsets stay exact; empty pieces are dropped as
// Hugging Face does. ByteLevel's byte-to-character mapping is not applied to the text: the
// BPE model works on raw bytes instead (see bpe.h), so ByteLevel must be the last step.
// Thread safety: immutable after load. Cost: one regex pass per Split step.
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

enum class SplitBehavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

// Splits `s` at `matches` (sorted, disjoint byte ranges) the way Hugging Face's
// NormalizedString::split does, appending the non-empty pieces to `out`.
void SplitByMatches(const NormalizedString& s,
                    const std::vector<std::pair<size_t, size_t>>& matches, SplitBehavior behavior,
                    bool invert, std::vector<NormalizedString>* out);

class PreTokenizer {
 public:
  // `json` is the "pre_tokenizer" object; null is handled by the caller.
  static absl::StatusOr<std::unique_ptr<PreTokenizer>> FromJson(const nlohmann::json& json);

  // True when the chain ends with ByteLevel (the model then works on raw bytes).
  bool byte_level() const { return byte_level_; }
  // True when some step splits with a regex.
  bool has_regex() const {
    for (const Step& s : steps_) {
      if (s.regex) return true;
    }
    return false;
  }

  // Splits `piece` into pre-tokens, appended to `out`.
  // With `continuation` the piece continues a longer text right after a pre-token boundary:
  // no ByteLevel prefix space and no Metaspace replacement is prepended at its start.
  absl::Status PreTokenize(NormalizedString piece, std::vector<NormalizedString>* out,
                           bool continuation = false) const;

 private:
  struct Step {
    enum class Kind { kSplit, kByteLevel, kMetaspace } kind;
    std::unique_ptr<Regex> regex;  // Split pattern, or the GPT-2 regex of ByteLevel
    std::string literal;           // Split String pattern
    SplitBehavior behavior = SplitBehavior::kIsolated;
    bool invert = false;
    bool add_prefix_space = false;  // ByteLevel
    std::string replacement;        // Metaspace
    enum class Prepend { kAlways, kFirst, kNever } prepend = Prepend::kAlways;
    bool split = true;  // Metaspace
  };
  absl::Status Add(const nlohmann::json& json, const std::string& where);
  absl::Status Apply(const Step& step, const NormalizedString& s, bool continuation,
                     std::vector<NormalizedString>* out) const;

  std::vector<Step> steps_;
  bool byte_level_ = false;
};

}  // namespace rl::tokenizer
