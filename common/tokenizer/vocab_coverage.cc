#include "common/tokenizer/vocab_coverage.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "spdlog/spdlog.h"

namespace rl::tokenizer {

VocabularyCoverage DescribeCoverage(const Tokenizer& tok, int64_t model_vocab_size) {
  VocabularyCoverage c;
  c.model_vocab_size = model_vocab_size;
  c.tokenizer_ids = tok.vocab_size();
  for (int64_t id = 0; id < model_vocab_size; ++id) {
    if (id < c.tokenizer_ids && tok.IdToToken(static_cast<int32_t>(id)).has_value()) continue;
    ++c.num_undefined;
    if (!c.undefined.empty() && c.undefined.back().second == id) {
      ++c.undefined.back().second;
    } else {
      c.undefined.emplace_back(id, id + 1);
    }
  }
  return c;
}

std::string UndefinedIdsNote(const VocabularyCoverage& c) {
  if (c.num_undefined == 0) return "";
  constexpr size_t kMaxRanges = 4;
  std::vector<std::string> ranges;
  for (size_t i = 0; i < std::min(kMaxRanges, c.undefined.size()); ++i) {
    const auto [begin, end] = c.undefined[i];
    ranges.push_back(end - begin == 1 ? absl::StrCat(begin) : absl::StrCat(begin, "..", end - 1));
  }
  if (c.undefined.size() > kMaxRanges) ranges.push_back("...");
  return absl::StrCat(c.num_undefined == 1 ? "id " : "ids ", absl::StrJoin(ranges, ", "), " (",
                      c.num_undefined, " of the model's ", c.model_vocab_size,
                      ") have no token in the tokenizer and decode to nothing (an embedding "
                      "padded beyond the tokenizer; a sampled one gives no text)");
}

absl::Status CheckModelVocabulary(const Tokenizer& tok, int64_t model_vocab_size,
                                  const std::string& model_dir) {
  if (tok.vocab_size() > model_vocab_size) {
    const int32_t last = tok.vocab_size() - 1;
    return absl::InvalidArgumentError(absl::StrCat(
        model_dir, ": the tokenizer has ids up to ", last, " but config.json vocab_size is ",
        model_vocab_size, ", so ", tok.vocab_size() - model_vocab_size,
        " of its tokens have no embedding row (e.g. '", tok.IdToToken(last).value_or("?"),
        "'): the tokenizer and the model do not belong together"));
  }
  const std::string note = UndefinedIdsNote(DescribeCoverage(tok, model_vocab_size));
  if (!note.empty()) spdlog::warn("{}: {}", model_dir, note);
  return absl::OkStatus();
}

}  // namespace rl::tokenizer
