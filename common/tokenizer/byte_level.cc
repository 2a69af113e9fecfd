#include "common/tokenizer/byte_level.h"

#include "common/tokenizer/unicode.h"

namespace rl::tokenizer {
namespace {

struct Tables {
  std::array<std::string, 256> byte_to_str;
  std::array<int16_t, 512> cp_to_byte;  // code points < 512 cover the whole alphabet

  Tables() {
    cp_to_byte.fill(-1);
    auto printable = [](int b) {
      return (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
    };
    int n = 0;
    for (int b = 0; b < 256; ++b) {
      const char32_t cp =
          printable(b) ? static_cast<char32_t>(b) : static_cast<char32_t>(256 + n++);
      AppendUtf8(cp, &byte_to_str[b]);
      cp_to_byte[cp] = static_cast<int16_t>(b);
    }
  }
};

const Tables& GetTables() {
  static const Tables* tables = new Tables();
  return *tables;
}

}  // namespace

const std::string& ByteToUnicode(uint8_t b) { return GetTables().byte_to_str[b]; }

std::optional<uint8_t> UnicodeToByte(char32_t c) {
  if (c >= 512) return std::nullopt;
  const int16_t b = GetTables().cp_to_byte[c];
  if (b < 0) return std::nullopt;
  return static_cast<uint8_t>(b);
}

std::optional<std::string> ByteLevelToBytes(std::string_view token) {
  std::string out;
  out.reserve(token.size());
  size_t pos = 0;
  while (pos < token.size()) {
    size_t len;
    const auto b = UnicodeToByte(DecodeUtf8(token, pos, &len));
    if (!b) return std::nullopt;
    out.push_back(static_cast<char>(*b));
    pos += len;
  }
  return out;
}

}  // namespace rl::tokenizer
