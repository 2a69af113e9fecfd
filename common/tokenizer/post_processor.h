// PostProcessor: the "post_processor" section of tokenizer.json for single sequences:
// TemplateProcessing (special tokens such as BOS around the sequence, only when special
// tokens are requested), ByteLevel (offset trimming when trim_offsets is set) and Sequence.
//
// Special tokens added by a template get the empty offset range [0, 0), like Hugging Face.
// Thread safety: immutable after load. Cost: O(number of tokens).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "nlohmann/json_fwd.hpp"

namespace rl::tokenizer {

struct Encoding;

class PostProcessor {
 public:
  // `json` is the "post_processor" object; null is handled by the caller.
  static absl::StatusOr<std::unique_ptr<PostProcessor>> FromJson(const nlohmann::json& json);

  // `token_text(id)` returns the tokenizer.json form of a token (for offset trimming).
  void Process(Encoding* encoding, bool add_special_tokens,
               absl::FunctionRef<std::string_view(int32_t)> token_text) const;

  // Ids the template puts before / after a single sequence (e.g. BOS).
  const std::vector<int32_t>& prefix_ids() const { return prefix_ids_; }
  const std::vector<int32_t>& suffix_ids() const { return suffix_ids_; }

 private:
  struct Step {
    enum class Kind { kTemplate, kByteLevel } kind;
    std::vector<int32_t> prefix;  // Template: ids before the sequence
    std::vector<int32_t> suffix;  // Template: ids after the sequence
    bool trim_offsets = false;    // ByteLevel
    bool add_prefix_space = false;
  };
  absl::Status Add(const nlohmann::json& json, const std::string& where);

  std::vector<Step> steps_;
  std::vector<int32_t> prefix_ids_;
  std::vector<int32_t> suffix_ids_;
};

}  // namespace rl::tokenizer
