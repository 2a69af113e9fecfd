// Golden tests against Hugging Face `tokenizers`: the shared cases.inp/cases.out files, the
// stories260K prompt, and the committed corpus fixtures (tests/golden/tokenizer/*.json.gz,
// made by make_goldens.py): ids, byte offsets, decoded text, whole-file hashes, and
// decode(encode(x)) == x for every sampled line the reference decodes losslessly.
#include <map>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testing/tokenizer_test_util.h"

namespace rl::tokenizer {
namespace {

using testing::CorpusDir;
using testing::DataDir;
using ::testing::ElementsAre;
using testing::GetTokenizer;
using testing::ReadFileOrDie;

constexpr char kSeparator[] = "\n__ggml_vocab_test__\n";

std::vector<int32_t> ParseIds(const std::string& line) {
  std::vector<int32_t> ids;
  size_t pos = 0;
  while (pos < line.size()) {
    while (pos < line.size() && line[pos] == ' ') ++pos;
    if (pos >= line.size()) break;
    size_t end = line.find(' ', pos);
    if (end == std::string::npos) end = line.size();
    ids.push_back(std::stoi(line.substr(pos, end - pos)));
    pos = end;
  }
  return ids;
}

std::vector<int32_t> EncodeIds(const Tokenizer& tok, const std::string& text, bool special) {
  auto enc = tok.Encode(text, special);
  EXPECT_TRUE(enc.ok()) << enc.status();
  return enc.ok() ? enc->ids : std::vector<int32_t>{};
}

class CasesFileTest : public ::testing::TestWithParam<std::string> {};

TEST_P(CasesFileTest, MatchesHuggingFaceIds) {
  const std::string dir = DataDir() + "/tokenizers/" + GetParam();
  const std::string inp = ReadFileOrDie(dir + "/cases.inp");
  const std::vector<std::string> out = testing::SplitLines(ReadFileOrDie(dir + "/cases.out"));
  std::vector<std::string> cases;
  size_t start = 0;
  for (size_t sep = inp.find(kSeparator); sep != std::string::npos;
       sep = inp.find(kSeparator, start)) {
    cases.push_back(inp.substr(start, sep - start));
    start = sep + sizeof(kSeparator) - 1;
  }
  ASSERT_EQ(cases.size(), 46u);
  ASSERT_GE(out.size(), cases.size());
  const Tokenizer& tok = GetTokenizer(GetParam());
  for (size_t i = 0; i < cases.size(); ++i) {
    std::string expected = out[i];
    if (!expected.empty() && expected.back() == '\n') expected.pop_back();
    EXPECT_EQ(EncodeIds(tok, cases[i], false), ParseIds(expected))
        << "case " << i << ": '" << cases[i] << "'";
  }
}

INSTANTIATE_TEST_SUITE_P(Shared, CasesFileTest, ::testing::Values("llama2", "gpt2", "qwen2"));

TEST(Stories260KTest, PromptWithBos) {
  const Tokenizer& tok = GetTokenizer("stories260K");
  EXPECT_THAT(EncodeIds(tok, "Once upon a time", true), ElementsAre(1, 403, 407, 261, 378));
  EXPECT_THAT(EncodeIds(tok, "Once upon a time", false), ElementsAre(403, 407, 261, 378));
  auto text = tok.Decode({1, 403, 407, 261, 378}, /*skip_special_tokens=*/true);
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_EQ(*text, "Once upon a time");
  EXPECT_EQ(tok.bos_id(), 1);
}

TEST(Stories260KTest, FromDirReadsBosAndEos) {
  auto tok = Tokenizer::FromDir(DataDir() + "/stories260K");
  ASSERT_TRUE(tok.ok()) << tok.status();
  EXPECT_EQ((*tok)->bos_id(), 1);
  EXPECT_EQ((*tok)->eos_id(), 2);
  EXPECT_EQ((*tok)->vocab_size(), 512);
}

class FixtureTest : public ::testing::TestWithParam<std::string> {
 protected:
  static nlohmann::json Load(const std::string& name) {
    return nlohmann::json::parse(
        ReadFileOrDie(std::string(RL_TOKENIZER_GOLDEN_DIR) + "/" + name + ".json.gz"));
  }
};

std::vector<TokenOffset> ParseOffsets(const nlohmann::json& j) {
  std::vector<TokenOffset> out;
  for (const auto& o : j) out.push_back({o[0].get<uint32_t>(), o[1].get<uint32_t>()});
  return out;
}

std::string Show(const std::vector<TokenOffset>& v) {
  std::string s;
  for (const auto& o : v) s += "(" + std::to_string(o.begin) + "," + std::to_string(o.end) + ")";
  return s;
}

TEST_P(FixtureTest, Cases) {
  const nlohmann::json golden = Load(GetParam());
  const Tokenizer& tok = GetTokenizer(GetParam());
  for (const auto& c : golden["cases"]) {
    const std::string text = c["text"];
    const bool special = c["add_special_tokens"];
    auto enc = tok.Encode(text, special);
    ASSERT_TRUE(enc.ok()) << enc.status();
    EXPECT_EQ(enc->ids, c["ids"].get<std::vector<int32_t>>()) << "'" << text << "' " << special;
    const auto offsets = ParseOffsets(c["offsets"]);
    EXPECT_EQ(enc->offsets, offsets)
        << "'" << text << "' got " << Show(enc->offsets) << " want " << Show(offsets);
    auto decoded = tok.Decode(enc->ids, false);
    ASSERT_TRUE(decoded.ok()) << decoded.status();
    EXPECT_EQ(*decoded, c["decoded"].get<std::string>()) << "'" << text << "'";
    auto skipped = tok.Decode(enc->ids, true);
    ASSERT_TRUE(skipped.ok()) << skipped.status();
    EXPECT_EQ(*skipped, c["decoded_skip_special"].get<std::string>()) << "'" << text << "'";
  }
}

TEST_P(FixtureTest, CorpusLines) {
  const nlohmann::json golden = Load(GetParam());
  const Tokenizer& tok = GetTokenizer(GetParam());
  std::map<std::string, std::vector<std::string>> files;
  int checked = 0;
  for (const auto& c : golden["lines"]) {
    const std::string file = c["file"];
    auto& lines = files[file];
    if (lines.empty()) lines = testing::SplitLines(ReadFileOrDie(CorpusDir() + "/" + file));
    const size_t index = c["line"];
    ASSERT_LT(index, lines.size()) << file;
    const std::string& line = lines[index];
    auto enc = tok.Encode(line, false);
    ASSERT_TRUE(enc.ok()) << enc.status();
    EXPECT_EQ(enc->ids, c["ids"].get<std::vector<int32_t>>()) << file << ":" << index;
    if (c.contains("offsets")) {
      EXPECT_EQ(enc->offsets, ParseOffsets(c["offsets"])) << file << ":" << index;
    }
    auto decoded = tok.Decode(enc->ids, false);
    ASSERT_TRUE(decoded.ok()) << decoded.status();
    const std::string want = c.contains("decoded") ? c["decoded"].get<std::string>() : line;
    EXPECT_EQ(*decoded, want) << file << ":" << index;
    ++checked;
  }
  EXPECT_GT(checked, 500);
}

TEST_P(FixtureTest, WholeFiles) {
  const nlohmann::json golden = Load(GetParam());
  const Tokenizer& tok = GetTokenizer(GetParam());
  for (const auto& w : golden["whole"]) {
    const std::string file = w["file"];
    const std::string text = ReadFileOrDie(CorpusDir() + "/" + file);
    auto enc = tok.Encode(text, false);
    ASSERT_TRUE(enc.ok()) << enc.status();
    EXPECT_EQ(enc->ids.size(), w["num_ids"].get<size_t>()) << file;
    EXPECT_EQ(testing::Fnv1a64(enc->ids), w["fnv1a64"].get<std::string>()) << file;
    if (w.contains("ids")) {
      EXPECT_EQ(enc->ids, w["ids"].get<std::vector<int32_t>>()) << file;
    }
  }
}

// Edited copies of the shared tokenizers (variants.json.gz), one per option.
TEST(VariantsTest, MatchHuggingFace) {
  const nlohmann::json variants = nlohmann::json::parse(
      ReadFileOrDie(std::string(RL_TOKENIZER_GOLDEN_DIR) + "/variants.json.gz"));
  ASSERT_GE(variants.size(), 10u);
  std::map<std::string, nlohmann::json> bases;
  for (const auto& v : variants) {
    const std::string base_path = DataDir() + "/" + v["base"].get<std::string>();
    auto& base = bases[base_path];
    if (base.is_null()) base = nlohmann::json::parse(ReadFileOrDie(base_path));
    nlohmann::json doc = base;
    for (const auto& [key, value] : v["patch"].items()) {
      if (key == "merges_as_pairs") {
        nlohmann::json pairs = nlohmann::json::array();
        for (const auto& m : doc["model"]["merges"]) {
          const std::string s = m;
          const size_t sp = s.find(' ');
          pairs.push_back({s.substr(0, sp), s.substr(sp + 1)});
        }
        doc["model"]["merges"] = pairs;
      } else {
        doc[key] = value;
      }
    }
    const std::string name = v["name"];
    auto tok = Tokenizer::FromJson(doc.dump());
    ASSERT_TRUE(tok.ok()) << name << ": " << tok.status();
    for (const auto& c : v["cases"]) {
      const std::string text = c["text"];
      const bool special = c["add_special_tokens"];
      auto enc = (*tok)->Encode(text, special);
      ASSERT_TRUE(enc.ok()) << enc.status();
      EXPECT_EQ(enc->ids, c["ids"].get<std::vector<int32_t>>()) << name << " '" << text << "'";
      const auto offsets = ParseOffsets(c["offsets"]);
      EXPECT_EQ(enc->offsets, offsets)
          << name << " '" << text << "' got " << Show(enc->offsets) << " want " << Show(offsets);
      auto decoded = (*tok)->Decode(enc->ids, false);
      ASSERT_TRUE(decoded.ok()) << decoded.status();
      EXPECT_EQ(*decoded, c["decoded"].get<std::string>()) << name << " '" << text << "'";
      auto skipped = (*tok)->Decode(enc->ids, true);
      ASSERT_TRUE(skipped.ok()) << skipped.status();
      EXPECT_EQ(*skipped, c["decoded_skip_special"].get<std::string>())
          << name << " '" << text << "'";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Corpus, FixtureTest,
                         ::testing::Values("llama2", "gpt2", "qwen2", "llama3", "stories260K"));

}  // namespace
}  // namespace rl::tokenizer
