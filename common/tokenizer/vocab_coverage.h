// Vocabulary coverage: whether a tokenizer and a model's embedding (config.json `vocab_size`
// rows) belong together. A tokenizer id at or past vocab_size has no embedding row, so the
// tokenizer and the model cannot both be right: the worker refuses to load them. Ids below
// vocab_size that the tokenizer does not define decode to nothing (Decode refuses them): normal
// for real models, whose embeddings are padded to a round size (Qwen2.5: 151,665 tokens, 151,936
// rows), so that is one clear log line, not a refusal.
// Cost: one id lookup per embedding row (milliseconds for 150k rows). Thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "common/tokenizer/tokenizer.h"

namespace rl::tokenizer {

struct VocabularyCoverage {
  int64_t model_vocab_size = 0;
  int32_t tokenizer_ids = 0;  // one past the tokenizer's largest id
  // Ids below model_vocab_size with no token, as [begin, end) ranges in order, and their count.
  std::vector<std::pair<int64_t, int64_t>> undefined;
  int64_t num_undefined = 0;
};

VocabularyCoverage DescribeCoverage(const Tokenizer& tok, int64_t model_vocab_size);

// "ids 382..511 (130 of 512) decode to nothing: ..." for the undefined ids (at most a few ranges
// listed); empty when every id below model_vocab_size is a token.
std::string UndefinedIdsNote(const VocabularyCoverage& coverage);

// The worker's start-up check: InvalidArgument naming both sizes when the tokenizer has ids the
// embedding cannot hold; else logs UndefinedIdsNote as one warning line when there is one.
// `model_dir` names the folder in both.
absl::Status CheckModelVocabulary(const Tokenizer& tok, int64_t model_vocab_size,
                                  const std::string& model_dir);

}  // namespace rl::tokenizer
