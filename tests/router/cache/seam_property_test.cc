// Seam invariant property test: for every real tokenizer in ../shared/models, random
// multi-turn conversations built from the shared corpus (English, Markdown, Chinese with CRLF,
// naughty strings, UTF-8 and CJK samples, emoji, runs of spaces, newlines, contractions,
// digits) are resolved turn by turn through ResolveTextPrompt + TextCache exactly as the router
// does (completions of random vocabulary ids, byte-fallback runs across the seam included, or
// encoded corpus text, stream-decoded in the prompt's context and inserted with their ends),
// with adversarial requests caching prompt-only cuts of the text anywhere in between. Every
// turn checks, with no tolerance:
//   - the resolution equals one built independently: (b) the cache's tokens through its last
//     generated token (MatchGoal::kMostGenerated) with their masks, logprobs (bitwise) and
//     per-token versions, then (c) the full-text encoding past that seam (or, when the full
//     text has no token boundary there, the continuation encoding, flagged); served iff (a)
//     decode(tokens) == text holds for it, else the plain whole-text encoding, flagged;
//   - a conversation whose previous trajectory was fully cached (Insert's cached_tokens) gets
//     it back exactly, tokens and per-token versions;
//   - resolving the same text again gives the same tokens;
//   - the completion text is exactly what stream_decoder.h says a completion owns (checked
//     against Decode(prompt + completion) byte for byte, with the split byte-fallback run
//     computed independently), streamed and in one piece, and never contains the prompt.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "common/tokenizer/stream_decoder.h"
#include "common/tokenizer/unicode.h"
#include "gtest/gtest.h"
#include "services/router/cache/prompt_resolver.h"
#include "services/router/cache/text_cache.h"
#include "tests/testing/tokenizer_test_util.h"

namespace rl::router {
namespace {

using tokenizer::Tokenizer;
using tokenizer::testing::CorpusDir;
using tokenizer::testing::GetTokenizer;
using tokenizer::testing::ReadFileOrDie;
using tokenizer::testing::SplitLines;

uint32_t Bits(float f) {
  uint32_t b;
  std::memcpy(&b, &f, sizeof(b));
  return b;
}

// Corpus lines (without line ends; line ends are added by the generator).
const std::vector<std::string>& CorpusLines() {
  static const std::vector<std::string> lines = [] {
    std::vector<std::string> out;
    for (const char* file :
         {"en_tiny_shakespeare.txt", "en_markdown_docs.md", "zh_sanguo_yanyi.txt", "mixed_blns.txt",
          "mixed_utf8_demo.txt", "mixed_cpython_cjk_samples.txt"}) {
      const std::string text = ReadFileOrDie(CorpusDir() + "/" + file);
      // Large files: the first 200 kB are plenty.
      std::vector<std::string> lines = SplitLines(text.substr(0, 200000));
      for (std::string& l : lines) {
        while (!l.empty() && (l.back() == '\n' || l.back() == '\r')) l.pop_back();
        if (!l.empty() && l.size() < 400 &&
            tokenizer::FindInvalidUtf8(l) == std::string_view::npos) {
          out.push_back(std::move(l));
        }
      }
    }
    return out;
  }();
  return lines;
}

// Keeps `s` valid UTF-8 when cutting at `n` bytes.
std::string CutUtf8(const std::string& s, size_t n) {
  n = std::min(n, s.size());
  while (n > 0 && n < s.size() && tokenizer::IsUtf8Continuation(static_cast<uint8_t>(s[n]))) --n;
  return s.substr(0, n);
}

class Generator {
 public:
  explicit Generator(uint64_t seed) : rng_(seed) {}

  size_t Below(size_t n) { return std::uniform_int_distribution<size_t>(0, n - 1)(rng_); }

  // A user message: corpus pieces and awkward bits, with varied separators.
  std::string UserText() {
    static const char* kBits[] = {"Tom isn't here.",
                                  "Lily went to the park",
                                  "  ",
                                  "    ",
                                  "\n",
                                  "\n\n",
                                  "\r\n",
                                  "user\n    x",
                                  "<a href=\"x\">",
                                  "12345",
                                  "3.14",
                                  "I'll",
                                  "we've",
                                  " \xF0\x9F\x98\x80",
                                  "\xF0\x9F\xA6\x99 llama",
                                  "\xE4\xB8\x89\xE5\x9B\xBD",
                                  "caf\xC3\xA9",
                                  ".\n\n",
                                  "\t",
                                  "don't",
                                  "x  y",
                                  "A:",
                                  "'s"};
    static const char* kSeps[] = {"", " ", "\n", "\n\n", "  ", ". ", "\r\n"};
    std::string out;
    const size_t parts = 1 + Below(3);
    for (size_t i = 0; i < parts; ++i) {
      out += kSeps[Below(std::size(kSeps))];
      if (Below(4) == 0) {
        out += kBits[Below(std::size(kBits))];
      } else {
        const auto& lines = CorpusLines();
        const std::string& line = lines[Below(lines.size())];
        out += CutUtf8(line, 1 + Below(std::min<size_t>(line.size(), 160)));
      }
    }
    if (out.empty()) out = "hi";
    return out;
  }

  // Output ids of a "model": random vocabulary ids (byte-fallback and special tokens included)
  // or an encoding of corpus text.
  std::vector<int32_t> Completion(const Tokenizer& tok) {
    std::vector<int32_t> ids;
    if (Below(2) == 0) {
      auto enc = tok.EncodeContinuation(UserText());
      EXPECT_TRUE(enc.ok());
      if (enc.ok()) ids = enc->ids;
      if (ids.size() > 40) ids.resize(40);
    } else {
      const size_t n = 1 + Below(12);
      while (ids.size() < n) {
        const int32_t id = static_cast<int32_t>(Below(static_cast<size_t>(tok.vocab_size())));
        if (tok.IdToToken(id)) ids.push_back(id);
      }
    }
    if (ids.empty()) ids.push_back(static_cast<int32_t>(Below(100) + 3));
    return ids;
  }

 private:
  std::mt19937_64 rng_;
};

// Index of the first token of `enc` past byte `seam`, or -1 when `seam` is inside a token.
int FirstTokenAt(const tokenizer::Encoding& enc, size_t seam) {
  size_t j = 0;
  while (j < enc.ids.size() && enc.offsets[j].end <= seam) ++j;
  if (j < enc.ids.size() && enc.offsets[j].begin < seam) return -1;
  return static_cast<int>(j);
}

struct Stats {
  int turns = 0;
  int own_cached = 0;    // turns after a fully cached turn of the same conversation
  int reused_turns = 0;  // of those, turns that reused it (no whole-text fallback)
  int continuations = 0;
  int fallbacks = 0;
  int not_cached = 0;  // the previous insert stopped at a conflict (generated tokens kept)
  int split_runs = 0;  // byte-fallback runs split at the seam (not valid UTF-8 joined)
};

struct Conversation {
  std::string text;          // the trajectory text so far (prompt + completions)
  std::vector<int32_t> ids;  // its tokens
  std::vector<uint32_t> ends;
  std::vector<uint8_t> mask;
  std::vector<int64_t> versions;
  std::vector<int32_t> prompt_ids;  // the last turn's resolved prompt
  bool fallback = false;            // the last turn was served by whole-text encoding
  bool fully_cached = false;        // the cache holds the whole trajectory (Insert's cached_tokens)
};

// Runs one turn: resolve `prompt` (= conv.text + user text), check the invariant, generate,
// insert like the router, extend `conv`.
void RunTurn(const Tokenizer& tok, TextCache& cache, SeamCounters& counters, Generator& gen,
             Conversation& conv, const std::string& prompt, int64_t version, Stats* stats,
             const std::string& what) {
  ++stats->turns;
  absl::StatusOr<ResolvedPrompt> r = ResolveTextPrompt(prompt, cache, tok, &counters);
  ASSERT_TRUE(r.ok()) << r.status() << " " << what;
  ASSERT_EQ(r->ids.size(), r->ends.size());
  ASSERT_EQ(r->ids.size(), r->mask.size());
  ASSERT_EQ(r->versions.size(), static_cast<size_t>(r->cached_tokens));
  absl::StatusOr<tokenizer::Encoding> full = tok.Encode(prompt, true);
  ASSERT_TRUE(full.ok());
  // The expected resolution, built independently. (b): reuse the cache's tokens through its
  // last generated token, with their masks, logprobs and versions.
  const CacheMatch m = cache.Match(prompt, MatchGoal::kMostGenerated);
  size_t k = m.tokens.size();
  while (k > 0 && m.loss_mask[k - 1] != 1) --k;
  std::vector<int32_t> expected(m.tokens.begin(), m.tokens.begin() + k);
  bool continuation = false;
  if (k == 0) {
    // Nothing generated reused: the whole-text encoding, whatever the cache holds.
    expected = full->ids;
  } else if (const size_t seam = m.token_end_offsets[k - 1]; seam < prompt.size()) {
    // (c): the rest is the full text's encoding past the seam, or (no full-text token boundary
    // there) the continuation encoding, counted.
    const int j = FirstTokenAt(*full, seam);
    if (j >= 0) {
      expected.insert(expected.end(), full->ids.begin() + j, full->ids.end());
    } else {
      continuation = true;
      auto cont = tok.EncodeContinuation(std::string_view(prompt).substr(seam));
      ASSERT_TRUE(cont.ok());
      expected.insert(expected.end(), cont->ids.begin(), cont->ids.end());
    }
    if (expected.size() == k) expected.clear();  // nothing encodes the rest: cannot meet (a)
  }
  // (a) decides: met, the expected tokens; not met, the plain whole-text encoding, counted.
  const bool meets_a = !expected.empty() && DecodesTo(tok, expected, prompt);
  ASSERT_EQ(r->whole_text_fallback, !meets_a) << what << " prompt '" << prompt << "'";
  if (r->whole_text_fallback) {
    ++stats->fallbacks;
    ASSERT_EQ(r->ids, full->ids) << what;
    ASSERT_EQ(r->cached_tokens, 0) << what;
  } else {
    ASSERT_EQ(r->ids, expected) << what << " prompt '" << prompt << "'";
    ASSERT_EQ(static_cast<size_t>(r->cached_tokens), k) << what;
    ASSERT_EQ(r->seam_continuation, continuation) << what;
    if (continuation) ++stats->continuations;
    ASSERT_TRUE(std::equal(m.loss_mask.begin(), m.loss_mask.begin() + k, r->mask.begin()));
    ASSERT_EQ(std::vector<int64_t>(m.token_versions.begin(), m.token_versions.begin() + k),
              r->versions)
        << what;
    for (size_t i = 0; i < k; ++i) {
      ASSERT_EQ(Bits(m.logprobs[i]), Bits(r->logprobs[i])) << what;
    }
  }
  if (!conv.ids.empty() && conv.fully_cached) {
    // The conversation's own trajectory, which ends with generated tokens and is fully cached,
    // is what the cache gives back: tokens and per-token versions (a path reusing generated
    // tokens further would extend it).
    ++stats->own_cached;
    ASSERT_GE(k, conv.ids.size()) << what;
    ASSERT_TRUE(std::equal(conv.ids.begin(), conv.ids.end(), m.tokens.begin())) << what;
    ASSERT_TRUE(std::equal(conv.versions.begin(), conv.versions.end(), m.token_versions.begin()))
        << what;
    if (!r->whole_text_fallback) ++stats->reused_turns;
  } else if (!conv.ids.empty()) {
    ++stats->not_cached;
  }
  ASSERT_TRUE(r->ends.empty() || r->ends.back() == prompt.size());

  // Generate and stream-decode like the router (any ids: byte-fallback runs that continue the
  // prompt's trailing run included).
  std::vector<int32_t> out = gen.Completion(tok);
  absl::StatusOr<DecodedCompletion> c = DecodeCompletion(tok, r->ids, out);
  ASSERT_TRUE(c.ok()) << c.status();
  absl::StatusOr<std::string> in_context = tokenizer::DecodeContinuation(tok, r->ids, out, false);
  ASSERT_TRUE(in_context.ok());
  std::vector<int32_t> all = r->ids;
  all.insert(all.end(), out.begin(), out.end());
  auto whole = tok.Decode(all, false);
  auto prompt_only = tok.Decode(r->ids, false);
  ASSERT_TRUE(whole.ok() && prompt_only.ok());
  // The completion's text (stream_decoder.h, "What a completion owns"). The prompt's trailing
  // byte-fallback run is V + I (I: an incomplete last character, possible when reused cached
  // bytes decode to U+FFFD); the completion's leading run is R. The completion owns I + R:
  //   - V + I + R valid UTF-8 (always when I and R are empty): whole = D(prompt minus I) +
  //     text, byte for byte;
  //   - else Hugging Face turns the whole joined run into U+FFFD; the run is split before I:
  //     the completion owns I + R decoded as a run of their own, then the rest of `whole`.
  size_t rp = 0, rc = 0;
  std::string prompt_run, completion_run;
  while (rp < r->ids.size() && tok.IsFallbackByte(r->ids[r->ids.size() - 1 - rp])) ++rp;
  while (rc < out.size() && tok.IsFallbackByte(out[rc])) ++rc;
  const auto byte_of = [&tok](int32_t id) {
    return static_cast<char>(std::stoi(tok.IdToToken(id)->substr(3, 2), nullptr, 16));
  };
  for (size_t i = r->ids.size() - rp; i < r->ids.size(); ++i) prompt_run += byte_of(r->ids[i]);
  for (size_t i = 0; i < rc; ++i) completion_run += byte_of(out[i]);
  const size_t incomplete = tokenizer::IncompleteUtf8Suffix(prompt_run);
  const auto valid = [](const std::string& b) {
    return tokenizer::FindInvalidUtf8(b) == std::string_view::npos;
  };
  const std::string owned_run = prompt_run.substr(rp - incomplete) + completion_run;
  std::string expected_text;
  if (rp > 0 && !owned_run.empty() && !valid(prompt_run + completion_run)) {
    ++stats->split_runs;
    auto before = tok.Decode(absl::MakeConstSpan(r->ids).first(r->ids.size() - rp), false);
    ASSERT_TRUE(before.ok());
    std::string replaced;
    for (size_t i = 0; i < rp + rc; ++i) replaced += "\xEF\xBF\xBD";
    ASSERT_TRUE(whole->starts_with(*before + replaced)) << what;
    std::string own = owned_run;
    if (!valid(own)) {
      own.clear();
      for (size_t i = 0; i < owned_run.size(); ++i) own += "\xEF\xBF\xBD";
    }
    expected_text = own + whole->substr(before->size() + replaced.size());
  } else {
    auto kept = tok.Decode(absl::MakeConstSpan(r->ids).first(r->ids.size() - incomplete), false);
    ASSERT_TRUE(kept.ok());
    ASSERT_TRUE(whole->starts_with(*kept)) << what;
    expected_text = whole->substr(kept->size());
  }
  ASSERT_EQ(c->text, expected_text) << what;
  ASSERT_EQ(*in_context, expected_text) << what;
  if (prompt.size() >= 16) {
    EXPECT_EQ(c->text.find(prompt), std::string::npos) << "completion repeats the prompt: " << what;
  }

  // Insert the trajectory as the router does.
  Conversation next;
  next.text = prompt + c->text;
  next.ids = all;
  next.ends = r->ends;
  for (uint32_t e : c->ends) next.ends.push_back(static_cast<uint32_t>(prompt.size()) + e);
  next.mask = r->mask;
  next.mask.insert(next.mask.end(), out.size(), 1);
  next.versions = r->versions;
  next.versions.resize(r->ids.size(), version);
  next.versions.insert(next.versions.end(), out.size(), version);
  // Reused tokens keep their cached logprobs (as the router does); new ones get the "model's".
  std::vector<float> logprobs = r->logprobs;
  for (size_t i = r->ids.size(); i < next.ids.size(); ++i) {
    logprobs.push_back(-0.5f - static_cast<float>(i % 7));
  }
  size_t cached = 0;
  ASSERT_TRUE(cache
                  .Insert(next.text, next.ids, next.ends, next.mask, logprobs, version,
                          next.versions, &cached)
                  .ok())
      << what;
  next.fully_cached = cached == next.ids.size();
  next.fallback = r->whole_text_fallback;
  next.prompt_ids = r->ids;
  conv = std::move(next);
}

class SeamPropertyTest : public ::testing::TestWithParam<std::string> {};

TEST_P(SeamPropertyTest, RandomConversationsKeepTheInvariant) {
  const Tokenizer& tok = GetTokenizer(GetParam());
  TextCacheOptions options;
  options.max_cache_size = int64_t{1} << 40;
  auto cache = TextCache::Create(options);
  ASSERT_TRUE(cache.ok());
  SeamCounters counters;
  Generator gen(std::hash<std::string>()(GetParam()));
  static const char* kSystems[] = {"You are a helpful assistant.\n", "System: be brief.\n\n",
                                   "Once upon a time", "\xE4\xBD\xA0\xE5\xA5\xBD\xEF\xBC\x8C"};
  Stats stats;
  const auto start = std::chrono::steady_clock::now();
  int conversations = 0;
  // Bounded in count and time (a loaded machine runs fewer; at least 200 always).
  for (; conversations < 700; ++conversations) {
    if (conversations >= 200 &&
        std::chrono::steady_clock::now() - start > std::chrono::seconds(8)) {
      break;
    }
    Conversation conv;
    std::string prompt = std::string(kSystems[gen.Below(std::size(kSystems))]) + gen.UserText();
    const int turns = 1 + static_cast<int>(gen.Below(4));
    for (int t = 0; t < turns; ++t) {
      const std::string what = GetParam() + " conversation " + std::to_string(conversations) +
                               " turn " + std::to_string(t);
      if (gen.Below(3) == 0) {
        // Adversarial: another request cached a prompt-only cut of this text (with a
        // one-token completion that diverges from it).
        Conversation other;
        Stats ignored;
        // The cut may lie anywhere, inside a cached reply too: generated tokens are never
        // replaced, so the conversation's own trajectory stays cached.
        const std::string cut = CutUtf8(prompt, 1 + gen.Below(prompt.size()));
        if (!cut.empty()) {
          ASSERT_NO_FATAL_FAILURE(RunTurn(tok, **cache, counters, gen, other, cut, 1, &ignored,
                                          what + " (adversarial)"));
        }
      }
      ASSERT_NO_FATAL_FAILURE(
          RunTurn(tok, **cache, counters, gen, conv, prompt, 1 + t, &stats, what));
      // The same text again, after this turn's own insert: the same tokens.
      if (gen.Below(4) == 0 && !conv.ids.empty()) {
        auto again = ResolveTextPrompt(prompt, **cache, tok, nullptr);
        ASSERT_TRUE(again.ok());
        EXPECT_EQ(again->ids, conv.prompt_ids) << what << " (repeat)";
        EXPECT_EQ(again->whole_text_fallback, conv.fallback) << what << " (repeat)";
      }
      prompt = conv.text + gen.UserText();
    }
  }
  ASSERT_TRUE((*cache)->ValidateForTesting().ok());
  EXPECT_GE(counters.seam_continuations.load(), stats.continuations);
  const TextCacheStats cache_stats = (*cache)->GetStats();
  std::printf(
      "%s: %d conversations, %d turns (%d after a fully cached turn, %d of them reusing "
      "it), %d seam continuations, %d whole-text fallbacks (%.2f%%), %d turns after an "
      "insert stopped at a conflict, %d byte runs split at the seam; cache: %lld conflicts kept, "
      "%lld replaced\n",
      GetParam().c_str(), conversations, stats.turns, stats.own_cached, stats.reused_turns,
      stats.continuations, stats.fallbacks, 100.0 * stats.fallbacks / stats.turns, stats.not_cached,
      stats.split_runs, static_cast<long long>(cache_stats.conflicts_kept),
      static_cast<long long>(cache_stats.conflicts_replaced));
  EXPECT_GE(stats.turns, 400);
  EXPECT_GE(stats.reused_turns, stats.turns / 4);
}

// The examples with the real stories260K tokenizer: no double space, no split
// contraction, whatever was cached.
TEST(SeamExamples, Stories260KTwoTurnsSeeTheTextSent) {
  const Tokenizer& tok = GetTokenizer("stories260K");
  auto cache = TextCache::Create(TextCacheOptions{});
  ASSERT_TRUE(cache.ok());
  // Turn 1: "Lily went to" + generated " the".
  auto r1 = ResolveTextPrompt("Lily went to", **cache, tok, nullptr);
  ASSERT_TRUE(r1.ok());
  auto gen = tok.EncodeContinuation(" the");
  ASSERT_TRUE(gen.ok());
  auto c = DecodeCompletion(tok, r1->ids, gen->ids);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->text, " the");
  std::vector<int32_t> ids = r1->ids;
  ids.insert(ids.end(), gen->ids.begin(), gen->ids.end());
  std::vector<uint32_t> ends = r1->ends;
  for (uint32_t e : c->ends) ends.push_back(12 + e);
  std::vector<uint8_t> mask(r1->ids.size(), 0);
  mask.insert(mask.end(), gen->ids.size(), 1);
  ASSERT_TRUE((*cache)->Insert("Lily went to the", ids, ends, mask, {}, 1).ok());
  // Turn 2 continues with " park": the model sees exactly the text.
  auto r2 = ResolveTextPrompt("Lily went to the park", **cache, tok, nullptr);
  ASSERT_TRUE(r2.ok());
  EXPECT_EQ(r2->cached_tokens, static_cast<int32_t>(ids.size()));
  EXPECT_TRUE(DecodesTo(tok, r2->ids, "Lily went to the park"));
  auto plain = tok.Decode(r2->ids, /*skip_special_tokens=*/true);
  ASSERT_TRUE(plain.ok());
  EXPECT_EQ(*plain, "Lily went to the park");
  // A cached prompt-only cut inside "isn't" does not change how "Tom isn't" is tokenized.
  auto cut = ResolveTextPrompt("Tom is", **cache, tok, nullptr);
  ASSERT_TRUE(cut.ok());
  std::vector<uint32_t> cut_ends = cut->ends;
  std::vector<int32_t> cut_ids = cut->ids;
  cut_ids.push_back(*tok.TokenToId("n"));
  cut_ends.push_back(7);
  std::vector<uint8_t> cut_mask(cut->ids.size(), 0);
  cut_mask.push_back(1);
  ASSERT_TRUE((*cache)->Insert("Tom isn", cut_ids, cut_ends, cut_mask, {}, 1).ok());
  auto r3 = ResolveTextPrompt("Tom isn't", **cache, tok, nullptr);
  auto direct = tok.Encode("Tom isn't", true);
  ASSERT_TRUE(r3.ok() && direct.ok());
  // The cached generated "n" is reused (b); the rest is encoded as the full text would be or,
  // the seam being inside a full-text token, as a counted continuation.
  EXPECT_TRUE(DecodesTo(tok, r3->ids, "Tom isn't"));
  auto r4 = ResolveTextPrompt("Tom is here", **cache, tok, nullptr);
  auto direct4 = tok.Encode("Tom is here", true);
  ASSERT_TRUE(r4.ok() && direct4.ok());
  EXPECT_EQ(r4->ids, direct4->ids);  // no generated token matched: whole-text encoding
}

// A prompt ending in a byte-fallback token ("\n" is <0x0A> in stories260K) is never re-emitted.
TEST(SeamExamples, CompletionAfterNewlineDoesNotRepeatThePrompt) {
  const Tokenizer& tok = GetTokenizer("stories260K");
  auto prompt = tok.Encode("Tom had a red ball.\n", true);
  ASSERT_TRUE(prompt.ok());
  ASSERT_TRUE(tok.IsFallbackByte(prompt->ids.back()));
  auto out = tok.EncodeContinuation("\"Hello, Mr");
  ASSERT_TRUE(out.ok());
  auto c = DecodeCompletion(tok, prompt->ids, out->ids);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->text, "\"Hello, Mr");
  // Two byte tokens in a row across the seam ("\n" + "\n").
  auto nl = tok.EncodeContinuation("\nOnce");
  ASSERT_TRUE(nl.ok());
  auto c2 = DecodeCompletion(tok, prompt->ids, nl->ids);
  ASSERT_TRUE(c2.ok());
  EXPECT_EQ(c2->text, "\nOnce");
}

INSTANTIATE_TEST_SUITE_P(All, SeamPropertyTest,
                         ::testing::Values("stories260K", "llama2", "llama3", "gpt2", "qwen2"),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           return info.param;
                         });

}  // namespace
}  // namespace rl::router
