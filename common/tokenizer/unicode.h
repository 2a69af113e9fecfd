// UTF-8 and Unicode helpers for the tokenizer.
//
// Validation follows Rust's `str` rules (no overlongs, no surrogates, nothing above
// U+10FFFF), lossy decoding follows `String::from_utf8_lossy` (one U+FFFD per maximal
// ill-formed subpart), and the character classes follow Rust's `char::is_whitespace` and the
// `regex` crate's `\w`, because Hugging Face `tokenizers` is written in Rust and these rules
// decide where added tokens and strip operations cut. Properties come from ICU.
// Every function is pure, thread-safe and O(length of its input).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace rl::tokenizer {

// Byte length of the UTF-8 sequence that starts with `lead` (1 for continuation bytes, so
// that loops over possibly-invalid text always advance).
inline size_t Utf8SeqLen(uint8_t lead) {
  if (lead < 0x80) return 1;
  if ((lead & 0xE0) == 0xC0) return 2;
  if ((lead & 0xF0) == 0xE0) return 3;
  if ((lead & 0xF8) == 0xF0) return 4;
  return 1;
}

inline bool IsUtf8Continuation(uint8_t b) { return (b & 0xC0) == 0x80; }

// Decodes the code point at `text[pos]`; `text` must be valid UTF-8. Sets `*len` to its length.
char32_t DecodeUtf8(std::string_view text, size_t pos, size_t* len);

// Appends the UTF-8 encoding of `c` to `out`.
void AppendUtf8(char32_t c, std::string* out);

// Offset of the first invalid byte, or npos when `text` is valid UTF-8.
size_t FindInvalidUtf8(std::string_view text);

// Length of the longest prefix of `text` that is a truncated (incomplete but so far valid)
// UTF-8 sequence at its end: 0 when `text` ends on a character boundary.
size_t IncompleteUtf8Suffix(std::string_view text);

// Appends `bytes` to `out`, replacing ill-formed sequences with U+FFFD exactly like Rust's
// `String::from_utf8_lossy`.
void AppendUtf8Lossy(std::string_view bytes, std::string* out);

// Rust `char::is_whitespace` (Unicode White_Space).
bool IsWhitespace(char32_t c);

// Rust regex `\w`: Alphabetic, Mark, Decimal_Number, Connector_Punctuation, Join_Control.
bool IsWordChar(char32_t c);

}  // namespace rl::tokenizer
