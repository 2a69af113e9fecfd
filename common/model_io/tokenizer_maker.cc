#include "common/model_io/tokenizer_maker.h"

#include <algorithm>
#include <map>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace rl::model_io {

namespace {

using Json = nlohmann::ordered_json;

constexpr const char kTrainingText[] =
    "Once upon a time, there was a little girl named Lily. She loved to play outside in the "
    "sun with her friends. One day, she found a big red ball in the park. The ball was shiny "
    "and round, and she wanted to share it with everyone. \"Look what I found!\" she said. Her "
    "friend Tom ran over and smiled. They played with the ball all afternoon, throwing it high "
    "into the sky and catching it again. When the sun went down, they went home happy.\n"
    "The model reads tokens and writes tokens. A trainer sends a prompt, the worker returns the "
    "generated text with the log probabilities of every token. Training steps change the "
    "weights; the workers pause, load the new weights, flush their caches and continue. "
    "Numbers like 0, 1, 2, 3, 10, 42, 100 and 2024 appear in the text too, as do symbols: "
    "+ - * / = ( ) [ ] { } < > ; : , . ! ? # @ & % $ _ ' \" and newlines.\n"
    "def forward(self, input_ids):\n    return self.model(input_ids)\n\n"
    "In the morning the birds sing, in the evening the children read their books and the "
    "parents talk about the day. Everything that happened was good, and everyone was there.";

// GPT-2's reversible byte → printable unicode code point table.
std::vector<int> ByteToCodepoint() {
  std::vector<int> table(256, -1);
  std::vector<bool> direct(256, false);
  for (int b = '!'; b <= '~'; ++b) direct[b] = true;
  for (int b = 0xA1; b <= 0xAC; ++b) direct[b] = true;
  for (int b = 0xAE; b <= 0xFF; ++b) direct[b] = true;
  int next = 256;
  for (int b = 0; b < 256; ++b) table[b] = direct[b] ? b : next++;
  return table;
}

std::string EncodeUtf8(int cp) {
  std::string s;
  if (cp < 0x80) {
    s.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    s.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    s.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    s.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    s.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    s.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
  return s;
}

enum class CharClass { kLetter, kDigit, kSpace, kOther };
CharClass Classify(unsigned char c) {
  if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) return CharClass::kLetter;
  if (c >= '0' && c <= '9') return CharClass::kDigit;
  if (c == ' ' || c == '\n' || c == '\t') return CharClass::kSpace;
  return CharClass::kOther;
}

// Approximates the GPT-2 pre-tokenizer on ASCII: an optional leading space followed by a run of
// one class. Only used to learn merges, so exactness does not matter.
std::vector<std::string> PreTokenize(const std::string& text) {
  std::vector<std::string> words;
  size_t i = 0;
  while (i < text.size()) {
    std::string w;
    if (text[i] == ' ' && i + 1 < text.size() && Classify(text[i + 1]) != CharClass::kSpace) {
      w.push_back(' ');
      ++i;
    }
    const CharClass cls = Classify(text[i]);
    while (i < text.size() && Classify(text[i]) == cls) {
      w.push_back(text[i]);
      ++i;
      if (cls == CharClass::kOther || cls == CharClass::kSpace) break;
    }
    words.push_back(std::move(w));
  }
  return words;
}

}  // namespace

absl::StatusOr<MadeTokenizer> MakeByteLevelBpeTokenizer(const TokenizerSpec& spec) {
  const int32_t num_regular = spec.vocab_size - static_cast<int32_t>(spec.special_tokens.size());
  if (num_regular < 256) {
    return absl::InvalidArgumentError(absl::StrCat("tokenizer maker: vocab_size ", spec.vocab_size,
                                                   " cannot hold the 256 byte tokens and ",
                                                   spec.special_tokens.size(), " special tokens"));
  }
  const std::vector<int> b2u = ByteToCodepoint();
  std::vector<std::string> byte_token(256);
  for (int b = 0; b < 256; ++b) byte_token[b] = EncodeUtf8(b2u[b]);

  // vocab: the 256 byte tokens in byte order, then merges in learned order.
  std::vector<std::string> vocab = byte_token;
  std::vector<std::pair<std::string, std::string>> merges;
  std::set<std::string> known(vocab.begin(), vocab.end());

  // Word → count, each word as a sequence of token strings.
  std::map<std::string, int> word_counts;
  for (const auto& w : PreTokenize(kTrainingText)) ++word_counts[w];
  std::vector<std::pair<std::vector<std::string>, int>> words;
  for (const auto& [w, count] : word_counts) {
    std::vector<std::string> pieces;
    for (unsigned char c : w) pieces.push_back(byte_token[c]);
    words.emplace_back(std::move(pieces), count);
  }
  while (static_cast<int32_t>(vocab.size()) < num_regular) {
    std::map<std::pair<std::string, std::string>, int> pair_counts;
    for (const auto& [pieces, count] : words) {
      for (size_t i = 0; i + 1 < pieces.size(); ++i)
        pair_counts[{pieces[i], pieces[i + 1]}] += count;
    }
    // Most frequent pair; ties broken by the (ordered) map's first, so deterministic.
    const std::pair<std::string, std::string>* best = nullptr;
    int best_count = 1;
    for (const auto& [pair, count] : pair_counts) {
      if (count > best_count) {
        best = &pair;
        best_count = count;
      }
    }
    if (best == nullptr) break;
    const auto merge = *best;
    const std::string merged = merge.first + merge.second;
    merges.push_back(merge);
    if (known.insert(merged).second) vocab.push_back(merged);
    for (auto& [pieces, count] : words) {
      std::vector<std::string> out;
      for (size_t i = 0; i < pieces.size(); ++i) {
        if (i + 1 < pieces.size() && pieces[i] == merge.first && pieces[i + 1] == merge.second) {
          out.push_back(merged);
          ++i;
        } else {
          out.push_back(pieces[i]);
        }
      }
      pieces = std::move(out);
    }
  }

  // The text ran out of pairs: extend deterministically, each token from the first merged one on
  // (new ones included, so the supply never ends) followed by a lowercase letter.
  for (size_t base = vocab.size() > 256 ? 256 : 0; static_cast<int32_t>(vocab.size()) < num_regular;
       ++base) {
    for (char letter = 'a'; letter <= 'z' && static_cast<int32_t>(vocab.size()) < num_regular;
         ++letter) {
      const std::string& suffix = byte_token[static_cast<unsigned char>(letter)];
      std::string merged = vocab[base] + suffix;
      if (!known.insert(merged).second) continue;
      merges.emplace_back(vocab[base], suffix);
      vocab.push_back(std::move(merged));
    }
  }

  MadeTokenizer made;
  made.num_regular_tokens = static_cast<int32_t>(vocab.size());
  Json added = Json::array();
  for (size_t i = 0; i < spec.special_tokens.size(); ++i) {
    const int32_t id = made.num_regular_tokens + static_cast<int32_t>(i);
    made.special_ids.push_back(id);
    added.push_back({{"id", id},
                     {"content", spec.special_tokens[i]},
                     {"single_word", false},
                     {"lstrip", false},
                     {"rstrip", false},
                     {"normalized", false},
                     {"special", true}});
  }
  Json vocab_json = Json::object();
  for (size_t i = 0; i < vocab.size(); ++i) vocab_json[vocab[i]] = static_cast<int32_t>(i);
  Json merges_json = Json::array();
  for (const auto& [a, b] : merges) merges_json.push_back(a + " " + b);

  Json byte_level = {{"type", "ByteLevel"},
                     {"add_prefix_space", false},
                     {"trim_offsets", true},
                     {"use_regex", true}};
  Json post = byte_level;
  if (spec.bos_special_index >= 0 &&
      spec.bos_special_index < static_cast<int32_t>(spec.special_tokens.size())) {
    const std::string& bos = spec.special_tokens[spec.bos_special_index];
    const int32_t bos_id = made.special_ids[spec.bos_special_index];
    post = {{"type", "TemplateProcessing"},
            {"single",
             {{{"SpecialToken", {{"id", bos}, {"type_id", 0}}}},
              {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}}},
            {"pair",
             {{{"SpecialToken", {{"id", bos}, {"type_id", 0}}}},
              {{"Sequence", {{"id", "A"}, {"type_id", 0}}}},
              {{"SpecialToken", {{"id", bos}, {"type_id", 1}}}},
              {{"Sequence", {{"id", "B"}, {"type_id", 1}}}}}},
            {"special_tokens", {{bos, {{"id", bos}, {"ids", {bos_id}}, {"tokens", {bos}}}}}}};
  }
  Json tok = {{"version", "1.0"},
              {"truncation", nullptr},
              {"padding", nullptr},
              {"added_tokens", added},
              {"normalizer", nullptr},
              {"pre_tokenizer", byte_level},
              {"post_processor", post},
              {"decoder", byte_level},
              {"model",
               {{"type", "BPE"},
                {"dropout", nullptr},
                {"unk_token", nullptr},
                {"continuing_subword_prefix", nullptr},
                {"end_of_word_suffix", nullptr},
                {"fuse_unk", false},
                {"byte_fallback", false},
                {"ignore_merges", false},
                {"vocab", vocab_json},
                {"merges", merges_json}}}};
  made.json = tok.dump(2) + "\n";
  return made;
}

}  // namespace rl::model_io
