// Vocabulary coverage: a tokenizer with more ids than the model's embedding is refused, one whose
// ids stop short (or leave holes) is described as ranges of ids that decode to nothing; the made
// tokenizers cover their model's vocabulary exactly, every id decoding to text.
#include "common/tokenizer/vocab_coverage.h"

#include <string>

#include "common/model_io/tokenizer_maker.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace rl::tokenizer {
namespace {

using ::testing::HasSubstr;

std::unique_ptr<Tokenizer> Made(int32_t vocab_size, std::vector<std::string> specials = {}) {
  model_io::TokenizerSpec spec;
  spec.vocab_size = vocab_size;
  spec.special_tokens = std::move(specials);
  auto made = model_io::MakeByteLevelBpeTokenizer(spec);
  EXPECT_TRUE(made.ok()) << made.status();
  auto tok = Tokenizer::FromJson(made->json);
  EXPECT_TRUE(tok.ok()) << tok.status();
  return *std::move(tok);
}

TEST(VocabCoverageTest, ExactFitHasNothingToSay) {
  auto tok = Made(512, {"<|endoftext|>", "<|im_start|>", "<|im_end|>"});
  const VocabularyCoverage c = DescribeCoverage(*tok, 512);
  EXPECT_EQ(c.tokenizer_ids, 512);
  EXPECT_EQ(c.num_undefined, 0);
  EXPECT_EQ(UndefinedIdsNote(c), "");
  EXPECT_TRUE(CheckModelVocabulary(*tok, 512, "/m").ok());
}

TEST(VocabCoverageTest, PaddedEmbeddingIsReportedNotRefused) {
  auto tok = Made(382);
  const VocabularyCoverage c = DescribeCoverage(*tok, 512);
  EXPECT_EQ(c.num_undefined, 130);
  ASSERT_EQ(c.undefined.size(), 1u);
  EXPECT_EQ(c.undefined[0], (std::pair<int64_t, int64_t>{382, 512}));
  EXPECT_THAT(UndefinedIdsNote(c), HasSubstr("ids 382..511 (130 of the model's 512)"));
  EXPECT_THAT(UndefinedIdsNote(c), HasSubstr("decode to nothing"));
  EXPECT_TRUE(CheckModelVocabulary(*tok, 512, "/m").ok());
  EXPECT_FALSE(tok->Decode({447}).ok());  // what the note warns about
}

TEST(VocabCoverageTest, MoreTokenizerIdsThanEmbeddingRowsIsRefused) {
  auto tok = Made(512, {"<|endoftext|>"});
  const absl::Status s = CheckModelVocabulary(*tok, 400, "/models/x");
  ASSERT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("/models/x: the tokenizer has ids up to 511 but config.json "
                                     "vocab_size is 400, so 112 of its tokens have no embedding "
                                     "row (e.g. '<|endoftext|>')"));
}

TEST(VocabCoverageTest, HolesAreListedAsRanges) {
  // An added token far past the model's tokens leaves a hole, plus padding after it.
  model_io::TokenizerSpec spec;
  spec.vocab_size = 300;
  auto made = model_io::MakeByteLevelBpeTokenizer(spec);
  ASSERT_TRUE(made.ok());
  nlohmann::json j = nlohmann::json::parse(made->json);
  j["added_tokens"].push_back({{"id", 305},
                               {"content", "<x>"},
                               {"single_word", false},
                               {"lstrip", false},
                               {"rstrip", false},
                               {"normalized", false},
                               {"special", true}});
  auto tok = Tokenizer::FromJson(j.dump());
  ASSERT_TRUE(tok.ok()) << tok.status();
  const VocabularyCoverage c = DescribeCoverage(**tok, 320);
  EXPECT_EQ(c.num_undefined, 5 + 14);
  EXPECT_THAT(UndefinedIdsNote(c), HasSubstr("ids 300..304, 306..319 (19 of the model's 320)"));
}

// Every id of a made tokenizer decodes to non-empty text, at the sizes the maker writes.
TEST(VocabCoverageTest, MadeTokenizersCoverTheirVocabulary) {
  for (int32_t vocab : {512, 32768}) {
    auto tok = Made(vocab, {"<|endoftext|>", "<|im_start|>", "<|im_end|>"});
    EXPECT_EQ(DescribeCoverage(*tok, vocab).num_undefined, 0) << vocab;
    for (int32_t id = 0; id < vocab; ++id) {
      auto text = tok->Decode({id});
      ASSERT_TRUE(text.ok()) << id << ": " << text.status();
      ASSERT_FALSE(text->empty()) << id;
    }
    // English still encodes to few tokens and round-trips.
    auto enc = tok->Encode("Once upon a time, the model said hello.");
    ASSERT_TRUE(enc.ok());
    EXPECT_EQ(*tok->Decode(enc->ids), "Once upon a time, the model said hello.");
  }
  model_io::TokenizerSpec too_small;
  too_small.vocab_size = 257;
  too_small.special_tokens = {"<a>", "<b>"};
  EXPECT_EQ(model_io::MakeByteLevelBpeTokenizer(too_small).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace rl::tokenizer
