// StreamDecoder: for every shared tokenizer, id-by-id decoding of corpus lines, of lines
// wrapped in special tokens and of random id sequences concatenates to Decode(all ids), and
// no delta ever ends inside a UTF-8 character.
#include "common/tokenizer/stream_decoder.h"

#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "common/tokenizer/unicode.h"
#include "gtest/gtest.h"
#include "tests/testing/tokenizer_test_util.h"

namespace rl::tokenizer {
namespace {

using testing::CorpusDir;
using testing::GetTokenizer;

// Streams `ids` one at a time (or in chunks of `chunk`) and checks the invariants.
void CheckStream(const Tokenizer& tok, const std::vector<int32_t>& ids, bool skip_special,
                 size_t chunk, const std::string& what) {
  StreamDecoder stream(tok, skip_special);
  std::string streamed;
  for (size_t i = 0; i < ids.size(); i += chunk) {
    const size_t n = std::min(chunk, ids.size() - i);
    auto delta = stream.Step(absl::MakeConstSpan(ids.data() + i, n));
    ASSERT_TRUE(delta.ok()) << delta.status();
    ASSERT_EQ(FindInvalidUtf8(*delta), std::string_view::npos) << what << " at id " << i;
    streamed += *delta;
  }
  auto rest = stream.Flush();
  ASSERT_TRUE(rest.ok()) << rest.status() << " " << what;
  streamed += *rest;
  auto full = tok.Decode(ids, skip_special);
  ASSERT_TRUE(full.ok()) << full.status();
  EXPECT_EQ(streamed, *full) << what;
}

class StreamDecoderTest : public ::testing::TestWithParam<std::string> {};

TEST_P(StreamDecoderTest, CorpusLinesConcatenateToDecode) {
  const Tokenizer& tok = GetTokenizer(GetParam());
  int checked = 0;
  for (const char* file : {"mixed_utf8_demo.txt", "mixed_blns.txt", "zh_sanguo_yanyi.txt",
                           "mixed_cpython_cjk_samples.txt", "en_markdown_docs.md"}) {
    const auto lines = testing::SplitLines(testing::ReadFileOrDie(CorpusDir() + "/" + file));
    for (size_t i = 0; i < lines.size(); i += std::max<size_t>(1, lines.size() / 60)) {
      auto enc = tok.Encode(lines[i], true);
      ASSERT_TRUE(enc.ok()) << enc.status();
      std::vector<int32_t> ids = enc->ids;
      if (tok.eos_id()) ids.push_back(*tok.eos_id());
      for (bool skip : {false, true}) {
        CheckStream(tok, ids, skip, 1, std::string(file) + ":" + std::to_string(i));
        CheckStream(tok, ids, skip, 3, std::string(file) + ":" + std::to_string(i));
      }
      ++checked;
    }
  }
  EXPECT_GT(checked, 200);
}

TEST_P(StreamDecoderTest, RandomIdsConcatenateToDecode) {
  const Tokenizer& tok = GetTokenizer(GetParam());
  std::mt19937 rng(1234);
  std::uniform_int_distribution<int32_t> any(0, tok.vocab_size() - 1);
  for (int round = 0; round < 200; ++round) {
    std::vector<int32_t> ids;
    const int n = 1 + round % 17;
    while (static_cast<int>(ids.size()) < n) {
      const int32_t id = any(rng);
      if (tok.IdToToken(id)) ids.push_back(id);
    }
    CheckStream(tok, ids, round % 2 == 0, 1, "random round " + std::to_string(round));
  }
}

TEST_P(StreamDecoderTest, MultiByteCharactersAreNeverSplit) {
  const Tokenizer& tok = GetTokenizer(GetParam());
  const std::string text = "\xF0\x9F\xA6\x99 llama \xE4\xB8\x89\xE5\x9B\xBD caf\xC3\xA9";
  auto enc = tok.Encode(text, false);
  ASSERT_TRUE(enc.ok());
  StreamDecoder stream(tok, false);
  std::string out;
  for (int32_t id : enc->ids) {
    auto delta = stream.Step(id);
    ASSERT_TRUE(delta.ok());
    EXPECT_EQ(IncompleteUtf8Suffix(*delta), 0u);
    EXPECT_EQ(delta->find("\xEF\xBF\xBD"), std::string::npos);
    out += *delta;
  }
  auto rest = stream.Flush();
  ASSERT_TRUE(rest.ok());
  out += *rest;
  EXPECT_EQ(out, text);
}

TEST_P(StreamDecoderTest, UnknownIdIsAnErrorAndLeavesStateIntact) {
  const Tokenizer& tok = GetTokenizer(GetParam());
  StreamDecoder stream(tok, false);
  auto enc = tok.Encode("Hello world", false);
  ASSERT_TRUE(enc.ok());
  std::string out;
  auto d = stream.Step(enc->ids[0]);
  ASSERT_TRUE(d.ok());
  out += *d;
  EXPECT_EQ(stream.Step(tok.vocab_size() + 5).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(stream.Step(-1).status().code(), absl::StatusCode::kInvalidArgument);
  for (size_t i = 1; i < enc->ids.size(); ++i) {
    auto delta = stream.Step(enc->ids[i]);
    ASSERT_TRUE(delta.ok());
    out += *delta;
  }
  out += *stream.Flush();
  EXPECT_EQ(out, *tok.Decode(enc->ids, false));
}

// Streams `completion` id by id after priming with `prompt`; also checks DecodeContinuation
// gives the same text.
std::string Primed(const Tokenizer& tok, const std::vector<int32_t>& prompt,
                   const std::vector<int32_t>& completion) {
  StreamDecoder stream(tok, false);
  EXPECT_TRUE(stream.Prime(prompt).ok());
  std::string out;
  for (int32_t id : completion) {
    auto delta = stream.Step(id);
    EXPECT_TRUE(delta.ok()) << delta.status();
    out += delta.value_or("");
  }
  auto rest = stream.Flush();
  EXPECT_TRUE(rest.ok()) << rest.status();
  out += rest.value_or("");
  auto batch = DecodeContinuation(tok, prompt, completion, false);
  EXPECT_TRUE(batch.ok()) << batch.status();
  EXPECT_EQ(out, batch.value_or("?"));
  return out;
}

std::vector<int32_t> Bytes(const Tokenizer& tok, std::string_view bytes) {
  std::vector<int32_t> ids;
  for (unsigned char b : bytes) {
    char name[8];
    std::snprintf(name, sizeof(name), "<0x%02X>", b);
    ids.push_back(*tok.TokenToId(name));
  }
  return ids;
}

std::vector<int32_t> Cat(std::vector<int32_t> a, const std::vector<int32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// What a completion owns at the seam (stream_decoder.h), with stories260K's byte fallback.
TEST(StreamDecoderSeamTest, ByteFallbackRunAcrossTheSeam) {
  const Tokenizer& tok = GetTokenizer("stories260K");
  const std::vector<int32_t> tom = tok.Encode("Tom", true)->ids;
  const std::vector<int32_t> there = tok.EncodeContinuation(" there")->ids;
  const std::string san = "\xE4\xB8\x89";  // 三
  // The prompt ends with the first byte of 三; the completion continues it: the completion
  // owns the whole character (nothing is lost at Flush).
  std::vector<int32_t> prompt = Cat(tom, Bytes(tok, san.substr(0, 1)));
  EXPECT_EQ(Primed(tok, prompt, Bytes(tok, san.substr(1))), san);
  EXPECT_EQ(Primed(tok, prompt, Cat(Bytes(tok, san.substr(1)), there)), san + " there");
  // ... after a complete "\n" in the same run: the "\n" stays the prompt's.
  prompt = Cat(tom, Bytes(tok, "\n" + san.substr(0, 1)));
  EXPECT_EQ(Primed(tok, prompt, Cat(Bytes(tok, san.substr(1)), there)), san + " there");
  // Not completed: the character is still the completion's (U+FFFD per byte of the run).
  EXPECT_EQ(Primed(tok, prompt, there), "\xEF\xBF\xBD there");
  // Nothing generated: nothing emitted.
  EXPECT_EQ(Primed(tok, prompt, {}), "");
  // A complete prompt run ("\n") continued by bytes that are valid: joined decoding holds.
  prompt = Cat(tom, Bytes(tok, "\n"));
  const std::vector<int32_t> completion = Cat(Bytes(tok, san), there);
  EXPECT_EQ(Primed(tok, prompt, completion), san + " there");
  EXPECT_EQ(*tok.Decode(prompt) + Primed(tok, prompt, completion),
            *tok.Decode(Cat(prompt, completion)));
  // ... continued by an incomplete character: Hugging Face would turn the prompt's "\n" into
  // U+FFFD too; the run is split at the seam and the prompt keeps its "\n".
  const std::vector<int32_t> broken = Cat(Bytes(tok, san.substr(0, 2)), there);
  EXPECT_EQ(Primed(tok, prompt, broken), "\xEF\xBF\xBD\xEF\xBF\xBD there");
  EXPECT_EQ(*tok.Decode(Cat(prompt, broken)), "<s> Tom\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD there");
}

// A prompt whose text really ends with U+FFFD (a valid character) never has it re-emitted.
TEST(StreamDecoderSeamTest, PromptEndingWithAReplacementCharacterIsNotReEmitted) {
  for (const char* name : {"stories260K", "gpt2", "llama3"}) {
    const Tokenizer& tok = GetTokenizer(name);
    const std::vector<int32_t> prompt = tok.Encode("Tom \xEF\xBF\xBD", true)->ids;
    const std::vector<int32_t> completion = tok.EncodeContinuation(" went home")->ids;
    EXPECT_EQ(Primed(tok, prompt, completion), " went home") << name;
  }
}

// ByteLevel: a prompt ending inside a character (input ids) leaves the character to the
// completion; a complete prompt is a prefix of the joined decoding.
TEST(StreamDecoderSeamTest, ByteLevelIncompleteCharacterAtTheSeam) {
  const Tokenizer& tok = GetTokenizer("gpt2");
  const std::vector<int32_t> all = tok.Encode("Tom \xF0\x9F\xA6\x99 ok", false)->ids;
  // Find a cut inside the llama emoji (gpt2 splits it into byte tokens).
  size_t cut = 0;
  for (size_t i = 1; i < all.size(); ++i) {
    const std::string head = *tok.Decode(absl::MakeConstSpan(all).first(i));
    if (head.ends_with("\xEF\xBF\xBD")) cut = i;
  }
  ASSERT_GT(cut, 0u);
  const std::vector<int32_t> prompt(all.begin(), all.begin() + cut);
  const std::vector<int32_t> completion(all.begin() + cut, all.end());
  EXPECT_EQ(Primed(tok, prompt, completion), "\xF0\x9F\xA6\x99 ok");
}

INSTANTIATE_TEST_SUITE_P(All, StreamDecoderTest,
                         ::testing::Values("llama2", "gpt2", "qwen2", "llama3", "stories260K"));

}  // namespace
}  // namespace rl::tokenizer
