#define PCRE2_CODE_UNIT_WIDTH 8
#include "common/tokenizer/regex.h"

#include <pcre2.h>

#include "absl/strings/str_cat.h"

namespace rl::tokenizer {
namespace {

// Rewrites `\s` / `\S` so they match Unicode White_Space like Oniguruma does (PCRE2 UCP
// misses U+0085). Other escapes are copied untouched.
std::string TranslatePattern(std::string_view p) {
  std::string out;
  out.reserve(p.size() + 16);
  int class_depth = 0;
  for (size_t i = 0; i < p.size(); ++i) {
    const char c = p[i];
    if (c == '\\' && i + 1 < p.size()) {
      const char e = p[i + 1];
      if (e == 's') {
        out += class_depth > 0 ? "\\s\\x{85}" : "[\\s\\x{85}]";
      } else if (e == 'S' && class_depth == 0) {
        out += "[^\\s\\x{85}]";
      } else {
        out += c;
        out += e;
      }
      ++i;
      continue;
    }
    if (c == '[') {
      ++class_depth;
      out += c;
      // A ']' right after '[' or '[^' is a literal.
      if (i + 1 < p.size() && p[i + 1] == '^') {
        out += '^';
        ++i;
      }
      if (i + 1 < p.size() && p[i + 1] == ']') {
        out += ']';
        ++i;
      }
      continue;
    }
    if (c == ']' && class_depth > 0) --class_depth;
    out += c;
  }
  return out;
}

std::string EscapeLiteral(std::string_view s) {
  std::string out;
  for (char c : s) {
    if (std::string_view("\\^$.|?*+()[]{}-#/ ").find(c) != std::string_view::npos) out += '\\';
    out += c;
  }
  return out;
}

absl::StatusOr<std::unique_ptr<Regex>> CompileRaw(std::string original, const std::string& pcre,
                                                  std::unique_ptr<Regex> re, void** code_slot) {
  int error_code = 0;
  PCRE2_SIZE error_offset = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pcre.data()), pcre.size(),
                                   PCRE2_UTF | PCRE2_UCP | PCRE2_NO_UTF_CHECK, &error_code,
                                   &error_offset, nullptr);
  if (code == nullptr) {
    PCRE2_UCHAR buf[256];
    pcre2_get_error_message(error_code, buf, sizeof(buf));
    return absl::InvalidArgumentError(absl::StrCat("bad regex '", original, "' at offset ",
                                                   error_offset, ": ",
                                                   reinterpret_cast<const char*>(buf)));
  }
  // JIT is an optimization: when the platform lacks it, the interpreter gives the same result.
  pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);
  *code_slot = code;
  return re;
}

}  // namespace

Regex::~Regex() {
  if (code_ != nullptr) pcre2_code_free(static_cast<pcre2_code*>(code_));
}

absl::StatusOr<std::unique_ptr<Regex>> Regex::Compile(std::string_view pattern) {
  std::unique_ptr<Regex> re(new Regex());
  re->pattern_ = std::string(pattern);
  void** slot = &re->code_;
  return CompileRaw(std::string(pattern), TranslatePattern(pattern), std::move(re), slot);
}

absl::StatusOr<std::unique_ptr<Regex>> Regex::Literal(std::string_view literal) {
  std::unique_ptr<Regex> re(new Regex());
  re->pattern_ = std::string(literal);
  void** slot = &re->code_;
  return CompileRaw(std::string(literal), EscapeLiteral(literal), std::move(re), slot);
}

absl::Status Regex::FindAll(std::string_view subject,
                            std::vector<std::pair<size_t, size_t>>* out) const {
  const pcre2_code* code = static_cast<const pcre2_code*>(code_);
  pcre2_match_data* md = pcre2_match_data_create(1, nullptr);
  if (md == nullptr) return absl::ResourceExhaustedError("pcre2_match_data_create failed");
  const auto* s = reinterpret_cast<PCRE2_SPTR>(subject.data());
  const size_t n = subject.size();
  size_t start = 0;
  absl::Status status;
  while (start <= n) {
    const int rc = pcre2_match(code, s, n, start, PCRE2_NO_UTF_CHECK, md, nullptr);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      PCRE2_UCHAR buf[256];
      pcre2_get_error_message(rc, buf, sizeof(buf));
      status = absl::ResourceExhaustedError(
          absl::StrCat("regex match failed: ", reinterpret_cast<const char*>(buf)));
      break;
    }
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
    const size_t b = ov[0];
    const size_t e = ov[1];
    if (e > b) {
      out->emplace_back(b, e);
      start = e;
    } else {
      // Empty match: step over one character.
      if (b >= n) break;
      start = b + 1;
      while (start < n && (static_cast<uint8_t>(subject[start]) & 0xC0) == 0x80) ++start;
    }
  }
  pcre2_match_data_free(md);
  return status;
}

}  // namespace rl::tokenizer
