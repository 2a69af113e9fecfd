// StreamDecoder: for every shared tokenizer, id-by-id decoding of corpus lines, of lines
// wrapped in special tokens and of random id sequences concatenates to Decode(all ids), and
// no delta ever ends inside a UTF-8 character.
#include "common/tokenizer/stream_decoder.h"

#include <random>
#include <string>
#include <vector>

#include "common/tokenizer/unicode.h"
#include "gtest/gtest.h"
#include "tests/tokenizer/test_util.h"

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

INSTANTIATE_TEST_SUITE_P(All, StreamDecoderTest,
                         ::testing::Values("llama2", "gpt2", "qwen2", "llama3", "stories260K"));

}  // namespace
}  // namespace rl::tokenizer
