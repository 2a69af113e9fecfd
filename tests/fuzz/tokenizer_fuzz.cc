// libFuzzer target for the tokenizer: load + encode + decode must never crash, leak or
// trip a sanitizer, whatever the bytes. Build and run: see tests/fuzz/CMakeLists.txt.
//
// The first input byte picks the mode:
//   0: the rest is a tokenizer.json; when it loads, encode and decode a fixed text with it;
//   1: the rest is text for the built-in tokenizers (byte-level and SentencePiece-style);
//      valid UTF-8 must round-trip through Decode and the StreamDecoder;
//   2: the rest is little-endian int32 ids for Decode and the StreamDecoder.
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "common/tokenizer/stream_decoder.h"
#include "common/tokenizer/tokenizer.h"
#include "common/tokenizer/unicode.h"

namespace {

using rl::tokenizer::StreamDecoder;
using rl::tokenizer::Tokenizer;

constexpr char kByteLevel[] = R"({
  "added_tokens": [{"id": 6, "content": "<eos>", "single_word": false, "lstrip": true,
                    "rstrip": true, "normalized": false, "special": true},
                   {"id": 7, "content": "wo", "single_word": true, "lstrip": false,
                    "rstrip": false, "normalized": true, "special": false}],
  "normalizer": {"type": "NFC"},
  "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
    {"type": "Split", "pattern": {"Regex": "(?i:'s|'t)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"},
     "behavior": "Isolated", "invert": false},
    {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": false}]},
  "post_processor": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true},
  "decoder": {"type": "ByteLevel"},
  "model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2, "Ġ": 3, "Ġab": 4, "Ã": 5},
            "merges": ["a b", ["Ġ", "ab"]]}
})";

constexpr char kSentencePiece[] = R"({
  "added_tokens": [{"id": 1, "content": "<s>", "single_word": false, "lstrip": false,
                    "rstrip": false, "normalized": false, "special": true}],
  "normalizer": {"type": "Sequence", "normalizers": [{"type": "Prepend", "prepend": "▁"},
                 {"type": "Replace", "pattern": {"String": " "}, "content": "▁"}]},
  "pre_tokenizer": null,
  "post_processor": {"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "<s>"}},
                     {"Sequence": {"id": "A"}}], "special_tokens": {"<s>": {"ids": [1]}}},
  "decoder": {"type": "Sequence", "decoders": [
    {"type": "Replace", "pattern": {"String": "▁"}, "content": " "}, {"type": "ByteFallback"},
    {"type": "Fuse"}, {"type": "Strip", "content": " ", "start": 1, "stop": 0}]},
  "model": {"type": "BPE", "unk_token": "<unk>", "fuse_unk": true, "byte_fallback": true,
            "vocab": {"<unk>": 0, "<s>": 1, "<0x41>": 2, "<0xC3>": 3, "<0xA9>": 4, "▁": 5,
                      "a": 6, "▁a": 7},
            "merges": ["▁ a"]}
})";

std::vector<std::unique_ptr<Tokenizer>>& Tokenizers() {
  static auto* list = [] {
    auto* v = new std::vector<std::unique_ptr<Tokenizer>>();
    for (const char* json : {kByteLevel, kSentencePiece}) {
      auto tok = Tokenizer::FromJson(json);
      if (!tok.ok()) std::abort();
      v->push_back(*std::move(tok));
    }
    if (const char* path = std::getenv("RL_FUZZ_TOKENIZER")) {
      auto tok = Tokenizer::FromFile(path);
      if (!tok.ok()) std::abort();
      v->push_back(*std::move(tok));
    }
    return v;
  }();
  return *list;
}

void Exercise(const Tokenizer& tok, std::string_view text) {
  for (bool special : {false, true}) {
    auto enc = tok.Encode(text, special);
    if (!enc.ok()) {
      if (rl::tokenizer::FindInvalidUtf8(text) == std::string_view::npos) std::abort();
      return;
    }
    if (enc->ids.size() != enc->offsets.size()) std::abort();
    for (const auto& o : enc->offsets) {
      if (o.begin > o.end || o.end > text.size()) std::abort();
    }
    auto full = tok.Decode(enc->ids, !special);
    if (!full.ok()) std::abort();
    StreamDecoder stream(tok, !special);
    std::string streamed;
    for (int32_t id : enc->ids) {
      auto delta = stream.Step(id);
      if (!delta.ok()) std::abort();
      streamed += *delta;
    }
    auto rest = stream.Flush();
    if (!rest.ok() || streamed + *rest != *full) std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string_view rest(reinterpret_cast<const char*>(data) + 1, size - 1);
  switch (data[0] % 3) {
    case 0: {
      auto tok = Tokenizer::FromJson(rest);
      if (tok.ok()) Exercise(**tok, "Hello wo world <eos> ab\xC3\xA9 123");
      break;
    }
    case 1:
      for (const auto& tok : Tokenizers()) Exercise(*tok, rest);
      break;
    case 2: {
      std::vector<int32_t> ids(rest.size() / 4);
      if (!ids.empty()) std::memcpy(ids.data(), rest.data(), ids.size() * 4);
      for (const auto& tok : Tokenizers()) {
        for (int32_t& id : ids)
          id = static_cast<int32_t>(static_cast<uint32_t>(id) % (tok->vocab_size() + 2)) - 1;
        auto full = tok->Decode(ids, false);
        StreamDecoder stream(*tok, false);
        std::string streamed;
        bool ok = true;
        for (int32_t id : ids) {
          auto delta = stream.Step(id);
          if (delta.ok()) streamed += *delta;
          ok = ok && delta.ok();
        }
        auto tail = stream.Flush();
        if (ok != full.ok()) std::abort();
        if (ok && (!tail.ok() || streamed + *tail != *full)) std::abort();
      }
      break;
    }
  }
  return 0;
}
