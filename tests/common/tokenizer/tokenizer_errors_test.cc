// Malformed tokenizer.json and invalid input give clear errors, never a crash: truncated
// files, wrong JSON types, unknown component types, bad merges, invalid UTF-8 text, unknown
// ids; plus concurrent Encode/Decode/EncodeBatch agreement.
#include <string>
#include <thread>
#include <vector>

#include "common/tokenizer/tokenizer.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/tokenizer_test_util.h"

namespace rl::tokenizer {
namespace {

using testing::GetTokenizer;
using ::testing::HasSubstr;
using testing::ReadFileOrDie;

// A small valid byte-level tokenizer to mutate.
constexpr char kTiny[] = R"({
  "version": "1.0", "truncation": null, "padding": null,
  "added_tokens": [{"id": 5, "content": "<eos>", "single_word": false, "lstrip": false,
                    "rstrip": false, "normalized": false, "special": true}],
  "normalizer": null,
  "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true,
                    "use_regex": true},
  "post_processor": null,
  "decoder": {"type": "ByteLevel"},
  "model": {"type": "BPE", "dropout": null, "unk_token": null, "fuse_unk": false,
            "byte_fallback": false, "vocab": {"a": 0, "b": 1, "ab": 2, "Ġ": 3, "Ġab": 4},
            "merges": ["a b", ["Ġ", "ab"]]}
})";

absl::Status LoadStatus(const std::string& json) { return Tokenizer::FromJson(json).status(); }

std::string Replace(std::string s, const std::string& from, const std::string& to) {
  const size_t pos = s.find(from);
  EXPECT_NE(pos, std::string::npos) << from;
  if (pos != std::string::npos) s.replace(pos, from.size(), to);
  return s;
}

TEST(TokenizerErrorsTest, TinyTokenizerWorks) {
  auto tok = Tokenizer::FromJson(kTiny);
  ASSERT_TRUE(tok.ok()) << tok.status();
  auto enc = (*tok)->Encode("ab ab<eos>", true);
  ASSERT_TRUE(enc.ok()) << enc.status();
  EXPECT_EQ(enc->ids, (std::vector<int32_t>{2, 4, 5}));
  EXPECT_EQ(*(*tok)->Decode(enc->ids, true), "ab ab");
  EXPECT_EQ(*(*tok)->Decode(enc->ids, false), "ab ab<eos>");
  EXPECT_EQ((*tok)->TokenToId("Ġab"), 4);
  EXPECT_EQ((*tok)->IdToToken(5), "<eos>");
  EXPECT_TRUE((*tok)->IsSpecial(5));
  EXPECT_EQ((*tok)->vocab_size(), 6);
}

TEST(TokenizerErrorsTest, TruncatedJson) {
  const std::string full = ReadFileOrDie(testing::TokenizerPath("stories260K"));
  for (size_t len : {size_t{0}, size_t{1}, size_t{100}, full.size() / 2, full.size() - 2}) {
    const absl::Status s = LoadStatus(full.substr(0, len));
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << len;
    EXPECT_THAT(s.message(), HasSubstr("not valid JSON")) << len;
  }
}

TEST(TokenizerErrorsTest, WrongTypes) {
  struct Case {
    std::string from, to, message;
  };
  const std::vector<Case> cases = {
      {R"("vocab": {)", R"("vocab": 7, "x": {)", "model.vocab must be an object"},
      {R"("a": 0,)", R"("a": "zero",)", "model.vocab[\"a\"]"},
      {R"("merges": [)", R"("merges": 3, "y": [)", "model.merges must be an array"},
      {R"("a b")", R"("ab")", "model.merges[0]"},
      {R"(["Ġ", "ab"])", R"(["Ġ", 1])", "model.merges[1]"},
      {R"("a b")", R"("a zz")", "missing from the vocab"},
      {R"("add_prefix_space": false, "trim)", R"("add_prefix_space": "no", "trim)",
       "pre_tokenizer.add_prefix_space must be a boolean"},
      {R"("id": 5,)", R"("id": "five",)", "added_tokens[0].id"},
      {R"("added_tokens": [)", R"("added_tokens": [3, )", "added_tokens[0] must be an object"},
      {R"("dropout": null)", R"("dropout": 0.5)", "dropout is not supported"},
      {R"("unk_token": null)", R"("unk_token": "<unk>")", "not in the vocabulary"},
  };
  for (const Case& c : cases) {
    const absl::Status s = LoadStatus(Replace(kTiny, c.from, c.to));
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.to;
    EXPECT_THAT(s.message(), HasSubstr(c.message)) << c.to;
  }
  EXPECT_THAT(LoadStatus("[1, 2]").message(), HasSubstr("must be an object"));
  EXPECT_THAT(LoadStatus("{}").message(), HasSubstr("missing model"));
}

TEST(TokenizerErrorsTest, UnknownComponentTypesAreNamed) {
  struct Case {
    std::string from, to, message;
  };
  const std::vector<Case> cases = {
      {R"("normalizer": null)", R"("normalizer": {"type": "Lowercase2"})",
       "unsupported normalizer type 'Lowercase2'"},
      {R"("pre_tokenizer": {"type": "ByteLevel")", R"("pre_tokenizer": {"type": "Whitespace9")",
       "unsupported pre_tokenizer type 'Whitespace9'"},
      {R"("decoder": {"type": "ByteLevel"})", R"("decoder": {"type": "WordPiece"})",
       "unsupported decoder type 'WordPiece'"},
      {R"("post_processor": null)", R"("post_processor": {"type": "BertProcessing"})",
       "unsupported post_processor type 'BertProcessing'"},
      {R"("type": "BPE")", R"("type": "Unigram")", "unsupported model type 'Unigram'"},
      {R"("decoder": {"type": "ByteLevel"})",
       R"("decoder": {"type": "Sequence", "decoders": [{"type": "Fuse"}, {"type": "CTC"}]})",
       "unsupported decoder type 'CTC'"},
      {R"("normalizer": null)", R"("normalizer": {"kind": "NFC"})", "normalizer.type"},
  };
  for (const Case& c : cases) {
    const absl::Status s = LoadStatus(Replace(kTiny, c.from, c.to));
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.to;
    EXPECT_THAT(s.message(), HasSubstr(c.message)) << c.to;
  }
}

TEST(TokenizerErrorsTest, BadRegexIsAnError) {
  const std::string json = Replace(
      kTiny, R"("normalizer": null)",
      R"("normalizer": {"type": "Replace", "pattern": {"Regex": "(unclosed"}, "content": "x"})");
  EXPECT_THAT(LoadStatus(json).message(), HasSubstr("bad regex"));
}

TEST(TokenizerErrorsTest, MissingFileIsNotFound) {
  EXPECT_EQ(Tokenizer::FromFile("/nonexistent/tokenizer.json").status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(Tokenizer::FromDir("/nonexistent").status().code(), absl::StatusCode::kNotFound);
}

TEST(TokenizerErrorsTest, InvalidUtf8IsInvalidArgument) {
  for (const char* name : {"llama2", "qwen2", "stories260K"}) {
    const Tokenizer& tok = GetTokenizer(name);
    for (const std::string bad :
         {std::string("abc\xFF"), std::string("\xC0\xAF"), std::string("\xED\xA0\x80"),
          std::string("x\xF4\x90\x80\x80"), std::string("\xE4\xB8"), std::string("a\x80z")}) {
      const auto enc = tok.Encode(bad, true);
      EXPECT_EQ(enc.status().code(), absl::StatusCode::kInvalidArgument) << name;
      EXPECT_THAT(enc.status().message(), HasSubstr("UTF-8"));
    }
    const auto batch = tok.EncodeBatch({"ok", "bad\xFF"}, true, 2);
    EXPECT_EQ(batch.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(batch.status().message(), HasSubstr("text 1"));
  }
}

TEST(TokenizerErrorsTest, UnknownIdsAreInvalidArgument) {
  const Tokenizer& tok = GetTokenizer("qwen2");
  EXPECT_EQ(tok.Decode({1, -1}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(tok.Decode({tok.vocab_size()}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(tok.IdToToken(-3).has_value());
  EXPECT_FALSE(tok.TokenToId("definitely not a token").has_value());
}

TEST(TokenizerThreadsTest, ConcurrentEncodeDecodeAndBatchAgree) {
  const Tokenizer& tok = GetTokenizer("qwen2");
  const auto lines =
      testing::SplitLines(ReadFileOrDie(testing::CorpusDir() + "/mixed_utf8_demo.txt"));
  std::vector<std::vector<int32_t>> expected;
  std::vector<std::string> expected_text;
  for (const auto& l : lines) {
    expected.push_back(tok.Encode(l, false)->ids);
    expected_text.push_back(*tok.Decode(expected.back()));
  }
  auto batch = tok.EncodeBatch(lines, false, 4);
  ASSERT_TRUE(batch.ok());
  for (size_t i = 0; i < lines.size(); ++i) EXPECT_EQ((*batch)[i].ids, expected[i]);
  std::vector<std::thread> threads;
  std::atomic<int> mismatches{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int round = 0; round < 3; ++round) {
        for (size_t i = t; i < lines.size(); i += 2) {
          if (tok.Encode(lines[i], false)->ids != expected[i]) ++mismatches;
          if (*tok.Decode(expected[i]) != expected_text[i]) ++mismatches;
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(mismatches.load(), 0);
}

}  // namespace
}  // namespace rl::tokenizer
