// Decoder: the "decoder" section of tokenizer.json as a flat chain of steps (Sequence
// flattened at load): ByteLevel, Replace, ByteFallback, Fuse, Strip, Metaspace.
//
// Like Hugging Face's `decode_chain`, each step maps the list of token strings to a new
// list, and the final text is their concatenation. A chain that is exactly ByteLevel is
// flagged so the tokenizer can decode from precomputed token bytes without building
// strings. Thread safety: immutable after load. Cost: O(total token length) per step.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/tokenizer/regex.h"
#include "nlohmann/json_fwd.hpp"

namespace rl::tokenizer {

class Decoder {
 public:
  // `json` is the "decoder" object; null is handled by the caller.
  static absl::StatusOr<std::unique_ptr<Decoder>> FromJson(const nlohmann::json& json);

  // Decodes token strings (tokenizer.json form) into text.
  absl::StatusOr<std::string> Decode(std::vector<std::string> tokens) const;

  // True when the chain has a ByteFallback step: a run of "<0xXX>" tokens then decodes as a
  // unit (all U+FFFD if the run is not valid UTF-8).
  bool has_byte_fallback() const {
    for (const Step& s : steps_) {
      if (s.kind == Step::Kind::kByteFallback) return true;
    }
    return false;
  }

  // True when the chain is a single ByteLevel step: text = lossy UTF-8 of the bytes.
  bool is_pure_byte_level() const {
    return steps_.size() == 1 && steps_[0].kind == Step::Kind::kByteLevel;
  }

 private:
  struct Step {
    enum class Kind { kByteLevel, kReplace, kByteFallback, kFuse, kStrip, kMetaspace } kind;
    std::unique_ptr<Regex> regex;  // Replace with a Regex pattern
    std::string literal;           // Replace with a String pattern
    std::string content;           // Replace content, Strip content, Metaspace replacement
    int64_t start = 0;             // Strip
    int64_t stop = 0;              // Strip
    bool prepend = true;           // Metaspace: prepend_scheme != never
  };
  absl::Status Add(const nlohmann::json& json, const std::string& where);
  absl::Status Apply(const Step& step, std::vector<std::string>* tokens) const;

  std::vector<Step> steps_;
};

}  // namespace rl::tokenizer
