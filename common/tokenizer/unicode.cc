#include "common/tokenizer/unicode.h"

#include <unicode/uchar.h>

namespace rl::tokenizer {
namespace {

// Valid range of the second byte of a sequence led by `lead`; {0, 0} for invalid leads.
struct SecondByteRange {
  uint8_t lo;
  uint8_t hi;
  size_t len;
};

SecondByteRange RangeForLead(uint8_t lead) {
  if (lead >= 0xC2 && lead <= 0xDF) return {0x80, 0xBF, 2};
  if (lead == 0xE0) return {0xA0, 0xBF, 3};
  if ((lead >= 0xE1 && lead <= 0xEC) || lead == 0xEE || lead == 0xEF) return {0x80, 0xBF, 3};
  if (lead == 0xED) return {0x80, 0x9F, 3};
  if (lead == 0xF0) return {0x90, 0xBF, 4};
  if (lead >= 0xF1 && lead <= 0xF3) return {0x80, 0xBF, 4};
  if (lead == 0xF4) return {0x80, 0x8F, 4};
  return {0, 0, 0};
}

// Length of the valid (possibly truncated) prefix of the sequence at `pos`, and whether it
// is complete.
size_t ValidPrefix(std::string_view s, size_t pos, bool* complete) {
  const uint8_t lead = static_cast<uint8_t>(s[pos]);
  if (lead < 0x80) {
    *complete = true;
    return 1;
  }
  const SecondByteRange r = RangeForLead(lead);
  *complete = false;
  if (r.len == 0) return 0;
  size_t i = 1;
  for (; i < r.len && pos + i < s.size(); ++i) {
    const uint8_t b = static_cast<uint8_t>(s[pos + i]);
    const uint8_t lo = i == 1 ? r.lo : 0x80;
    const uint8_t hi = i == 1 ? r.hi : 0xBF;
    if (b < lo || b > hi) return i;
  }
  *complete = i == r.len;
  return i;
}

}  // namespace

char32_t DecodeUtf8(std::string_view text, size_t pos, size_t* len) {
  const uint8_t b0 = static_cast<uint8_t>(text[pos]);
  if (b0 < 0x80) {
    *len = 1;
    return b0;
  }
  const size_t n = Utf8SeqLen(b0);
  *len = n;
  char32_t c = n == 2 ? (b0 & 0x1F) : n == 3 ? (b0 & 0x0F) : (b0 & 0x07);
  for (size_t i = 1; i < n; ++i) c = (c << 6) | (static_cast<uint8_t>(text[pos + i]) & 0x3F);
  return c;
}

void AppendUtf8(char32_t c, std::string* out) {
  if (c < 0x80) {
    out->push_back(static_cast<char>(c));
  } else if (c < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (c >> 6)));
    out->push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else if (c < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (c >> 12)));
    out->push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (c >> 18)));
    out->push_back(static_cast<char>(0x80 | ((c >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (c & 0x3F)));
  }
}

size_t FindInvalidUtf8(std::string_view text) {
  size_t pos = 0;
  const size_t n = text.size();
  while (pos < n) {
    // ASCII fast path, eight bytes at a time.
    while (pos + 8 <= n) {
      uint64_t word;
      __builtin_memcpy(&word, text.data() + pos, 8);
      if (word & 0x8080808080808080ULL) break;
      pos += 8;
    }
    if (pos >= n) break;
    bool complete;
    const size_t len = ValidPrefix(text, pos, &complete);
    if (!complete) return pos;
    pos += len;
  }
  return std::string_view::npos;
}

size_t IncompleteUtf8Suffix(std::string_view text) {
  const size_t n = text.size();
  for (size_t back = 1; back <= 3 && back <= n; ++back) {
    const uint8_t b = static_cast<uint8_t>(text[n - back]);
    if (!IsUtf8Continuation(b)) {
      if (b < 0x80) return 0;
      bool complete;
      const size_t len = ValidPrefix(text, n - back, &complete);
      return (!complete && len == back) ? back : 0;
    }
  }
  return 0;
}

void AppendUtf8Lossy(std::string_view bytes, std::string* out) {
  size_t pos = 0;
  while (pos < bytes.size()) {
    bool complete;
    const size_t len = ValidPrefix(bytes, pos, &complete);
    if (complete) {
      out->append(bytes.data() + pos, len);
      pos += len;
    } else {
      out->append("\xEF\xBF\xBD");
      pos += len == 0 ? 1 : len;
    }
  }
}

bool IsWhitespace(char32_t c) {
  if (c < 0x80) return c == ' ' || (c >= 0x09 && c <= 0x0D);
  return u_hasBinaryProperty(static_cast<UChar32>(c), UCHAR_WHITE_SPACE);
}

bool IsWordChar(char32_t c) {
  if (c < 0x80) {
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
  }
  const UChar32 u = static_cast<UChar32>(c);
  if (u_hasBinaryProperty(u, UCHAR_ALPHABETIC) || u_hasBinaryProperty(u, UCHAR_JOIN_CONTROL)) {
    return true;
  }
  const int32_t mask = U_GET_GC_MASK(u);
  return (mask & (U_GC_M_MASK | U_GC_ND_MASK | U_GC_PC_MASK)) != 0;
}

}  // namespace rl::tokenizer
