// The GPT-2 byte-level alphabet: every byte 0..255 maps to one printable code point
// (printable Latin-1 bytes map to themselves, the others to U+0100 and up), so byte-level
// vocabularies are stored as text. The tokenizer works on raw bytes internally and uses
// these tables only at load time (vocabulary) and decode time.
// Tables are built once, immutable, and safe to read from any thread.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace rl::tokenizer {

// UTF-8 encoding of the code point that stands for byte `b`.
const std::string& ByteToUnicode(uint8_t b);

// The byte that code point `c` stands for, if it is part of the alphabet.
std::optional<uint8_t> UnicodeToByte(char32_t c);

// Decodes a byte-level token string into raw bytes; nullopt when some character is not in
// the alphabet.
std::optional<std::string> ByteLevelToBytes(std::string_view token);

}  // namespace rl::tokenizer
