// Regex: a compiled PCRE2 pattern (UTF + UCP, JIT when available) used by the Split
// pre-tokenizer, the ByteLevel pre-tokenizer and the Replace normalizer/decoder.
//
// Hugging Face compiles these patterns with Oniguruma, whose `\s` is Unicode White_Space;
// PCRE2's UCP `\s` is the Z categories plus \t\n\v\f\r, which lacks U+0085, so `\s`/`\S` are
// rewritten to include it. Matching never reads outside the given subject, so lookarounds
// see exactly the slice Hugging Face would give them.
// Thread safety: the compiled code is immutable and shared; each call allocates its own match
// data (one small allocation per FindAll call, not per match).
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace rl::tokenizer {

class Regex {
 public:
  // Compiles `pattern` (Oniguruma/Rust-regex syntax as found in tokenizer.json).
  static absl::StatusOr<std::unique_ptr<Regex>> Compile(std::string_view pattern);
  // Compiles a literal string (every character matched as itself).
  static absl::StatusOr<std::unique_ptr<Regex>> Literal(std::string_view literal);
  ~Regex();

  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // Appends the non-overlapping matches [begin, end) of the pattern in `subject`, left to
  // right, to `out` (empty matches are skipped, as the callers drop empty pieces anyway).
  absl::Status FindAll(std::string_view subject, std::vector<std::pair<size_t, size_t>>* out) const;

  const std::string& pattern() const { return pattern_; }

 private:
  Regex() = default;
  std::string pattern_;
  void* code_ = nullptr;  // pcre2_code_8*
};

}  // namespace rl::tokenizer
