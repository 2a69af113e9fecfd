#include "services/router/cache/text_cache.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace rl::router {
namespace {

using ::testing::ElementsAre;

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

uint32_t Bits(float f) {
  uint32_t b;
  std::memcpy(&b, &f, sizeof(b));
  return b;
}

std::vector<uint32_t> AllBits(const std::vector<float>& v) {
  std::vector<uint32_t> out;
  for (float f : v) out.push_back(Bits(f));
  return out;
}

// A trajectory under construction: text plus per-token id, span end, mask and logprob.
struct Traj {
  std::string text;
  std::vector<int32_t> tokens;
  std::vector<uint32_t> ends;
  std::vector<uint8_t> mask;
  std::vector<float> logp;
  std::vector<int64_t> versions;  // empty: all the insert's version

  // Appends `piece` as one token.
  Traj& Tok(const std::string& piece, int32_t id, uint8_t m = 0, float lp = kNaN) {
    text += piece;
    tokens.push_back(id);
    ends.push_back(static_cast<uint32_t>(text.size()));
    mask.push_back(m);
    logp.push_back(lp);
    return *this;
  }
  // Appends `piece` split into words (each word plus its trailing spaces is one token, id a
  // hash of it); generated pieces (mask 1) get a logprob derived from the id.
  Traj& Words(const std::string& piece, uint8_t m = 0) {
    size_t i = 0;
    while (i < piece.size()) {
      size_t j = i;
      while (j < piece.size() && piece[j] != ' ' && piece[j] != '\n') ++j;
      while (j < piece.size() && (piece[j] == ' ' || piece[j] == '\n')) ++j;
      const std::string word = piece.substr(i, j - i);
      const int32_t id = static_cast<int32_t>(std::hash<std::string>()(word) % 50000);
      Tok(word, id, m, m == 1 ? -0.01f * static_cast<float>(id % 97 + 1) : kNaN);
      i = j;
    }
    return *this;
  }
  absl::Status InsertInto(TextCache& cache, int64_t version, size_t* cached = nullptr) const {
    return cache.Insert(text, tokens, ends, mask, logp, version, versions, cached);
  }
  // The first `k` tokens' view.
  Traj Prefix(size_t k) const {
    Traj t;
    t.tokens.assign(tokens.begin(), tokens.begin() + k);
    t.ends.assign(ends.begin(), ends.begin() + k);
    t.mask.assign(mask.begin(), mask.begin() + k);
    t.logp.assign(logp.begin(), logp.begin() + k);
    t.text = text.substr(0, k == 0 ? 0 : ends[k - 1]);
    return t;
  }
};

std::unique_ptr<TextCache> MakeCache(int64_t max_size = 1 << 30, int64_t k = 5,
                                     bool utf8_safe = true) {
  TextCacheOptions options;
  options.max_cache_size = max_size;
  options.gc_threshold_k = k;
  options.utf8_safe_match = utf8_safe;
  auto cache = TextCache::Create(options);
  EXPECT_TRUE(cache.ok()) << cache.status();
  return *std::move(cache);
}

// Expects `m` to be exactly `t`'s data (tokens, ends, masks, logprob bits).
void ExpectMatchIs(const CacheMatch& m, const Traj& t) {
  EXPECT_EQ(m.matched_bytes, t.text.size());
  EXPECT_EQ(m.tokens, t.tokens);
  EXPECT_EQ(m.token_end_offsets, t.ends);
  EXPECT_EQ(m.loss_mask, t.mask);
  EXPECT_EQ(AllBits(m.logprobs), AllBits(t.logp));
}

// Seed defect 1: the seed never split edges, so every prompt hung off the root.
TEST(TextCacheTest, PromptsSharingAPrefixShareOneNodePath) {
  auto cache = MakeCache();
  Traj a, b;
  a.Words("System: be brief\nUser: ").Words("what is two\n");
  b.Words("System: be brief\nUser: ").Words("why is sky\n");
  ASSERT_TRUE(a.InsertInto(*cache, 1).ok());
  ASSERT_TRUE(b.InsertInto(*cache, 1).ok());
  TextCacheStats stats = cache->GetStats();
  EXPECT_EQ(stats.entries, 3);  // shared prefix + two suffixes
  EXPECT_EQ(stats.size_tokens, 4 + 3 + 3);
  EXPECT_EQ(stats.size_bytes, static_cast<int64_t>(a.text.size() + b.text.size() - 23));
  ExpectMatchIs(cache->Match(a.text), a);
  ExpectMatchIs(cache->Match(b.text), b);
  ASSERT_TRUE(cache->ValidateForTesting().ok());

  // A third prompt that diverges inside the shared prompt splits it again.
  Traj c;
  c.Words("System: be verbose\n");
  ASSERT_TRUE(c.InsertInto(*cache, 1).ok());
  EXPECT_EQ(cache->GetStats().entries, 5);
  ExpectMatchIs(cache->Match(a.text), a);
  ExpectMatchIs(cache->Match(c.text), c);
  ASSERT_TRUE(cache->ValidateForTesting().ok());
}

// Seed defect 2: the seed skipped len(node.tokens) tokens without comparing them. Two
// tokenizations that cut the same text differently are two paths (siblings whose first groups
// are prefixes of one another); a match picks per MatchGoal.
TEST(TextCacheTest, DifferentCutsOfTheSameTextAreSiblingPaths) {
  auto cache = MakeCache();
  Traj old_t, new_t;
  old_t.Tok("hello", 1).Tok(" world", 2);
  new_t.Tok("hel", 10).Tok("lo", 11).Tok(" world", 2).Tok("!", 3, 1, -0.5f);
  ASSERT_TRUE(old_t.InsertInto(*cache, 1).ok());
  ASSERT_TRUE(new_t.InsertInto(*cache, 1).ok());
  ExpectMatchIs(cache->Match(new_t.text), new_t);
  // Same bytes either way: the path that ends where a trajectory ended.
  ExpectMatchIs(cache->Match("hello world"), old_t);
  // The longest path, or the one reusing generated text furthest.
  ExpectMatchIs(cache->Match("hello world! more"), new_t);
  ExpectMatchIs(cache->Match("hello world! more", MatchGoal::kMostGenerated), new_t);
  EXPECT_EQ(cache->GetStats().conflicts_replaced, 0);
  EXPECT_EQ(cache->GetStats().entries, 2);
  EXPECT_EQ(cache->GetStats().size_tokens, 6);
  ASSERT_TRUE(cache->ValidateForTesting().ok());
}

// kMostGenerated prefers the path whose generated tokens reach furthest over a longer path of
// prompt tokens: a conversation's own generated tokens are reused even where another request
// cached the same text as prompt tokens cut differently.
TEST(TextCacheTest, MostGeneratedPrefersGeneratedTokensOverLongerPromptPaths) {
  auto cache = MakeCache();
  Traj prompt_only, generated;
  prompt_only.Tok("Tom ", 1).Tok("there", 2).Tok(" is", 3).Tok(" more", 4);
  generated.Tok("Tom ", 1).Tok("the", 5, 1, -0.5f).Tok("re", 6, 1, -0.25f);
  ASSERT_TRUE(prompt_only.InsertInto(*cache, 1).ok());
  ASSERT_TRUE(generated.InsertInto(*cache, 1).ok());
  const std::string query = "Tom there is more";
  ExpectMatchIs(cache->Match(query), prompt_only);
  ExpectMatchIs(cache->Match(query, MatchGoal::kMostGenerated), generated);
  ASSERT_TRUE(cache->ValidateForTesting().ok());
}

TEST(TextCacheTest, SameSpansWithOtherIdsReplaceTheOldTokens) {
  auto cache = MakeCache();
  Traj a, b;
  a.Tok("ab", 1).Tok("cd", 2);
  b.Tok("ab", 7).Tok("cd", 2);
  ASSERT_TRUE(a.InsertInto(*cache, 1).ok());
  ASSERT_TRUE(b.InsertInto(*cache, 1).ok());
  ExpectMatchIs(cache->Match("abcd"), b);
  EXPECT_EQ(cache->GetStats().entries, 1);
  ASSERT_TRUE(cache->ValidateForTesting().ok());
}

TEST(TextCacheTest, DivergentTailsAreSiblingsAndPromptOnlyConflictsAreReplaced) {
  auto cache = MakeCache();
  Traj a, b;
  a.Tok("one ", 1).Tok("two ", 2).Tok("three", 3);
  b.Tok("one ", 1).Tok("two ", 2).Tok("thr", 30).Tok("ee", 31);
  ASSERT_TRUE(a.InsertInto(*cache, 1).ok());
  ASSERT_TRUE(b.InsertInto(*cache, 2).ok());
  // "three" and "thr" cut the same text differently: siblings; a tie goes to the longer first
  // group.
  ExpectMatchIs(cache->Match("one two three"), a);
  EXPECT_EQ(cache->GetStats().entries, 3);
  EXPECT_EQ(cache->GetStats().size_tokens, 5);
  // The same tokens with another mask or logprob are another trajectory: with prompt tokens
  // only below the conflict, the newest wins.
  Traj c;
  c.Tok("one ", 1).Tok("two ", 2, 1, -0.25f).Tok("x", 4);
  ASSERT_TRUE(c.InsertInto(*cache, 3).ok());
  ExpectMatchIs(cache->Match("one two x"), c);
  ExpectMatchIs(cache->Match("one two three"), c.Prefix(2));
  ASSERT_TRUE(cache->ValidateForTesting().ok());
}

// The conflict rule: generated tokens (and the prompt tokens before them) are never replaced
// by another tokenization of the same text; the conflicting insert is cached up to the conflict.
TEST(TextCacheTest, GeneratedTokensAreNeverReplacedByAnotherTokenization) {
  auto cache = MakeCache();
  Traj a, b;
  a.Tok("Tom ", 1).Tok("is", 2, 1, -0.5f).Tok("n't", 3, 1, -0.75f);
  b.Tok("Tom ", 1).Tok("is", 5).Tok("n't", 7, 1, -0.125f);
  size_t cached = 0;
  ASSERT_TRUE(a.InsertInto(*cache, 1, &cached).ok());
  EXPECT_EQ(cached, 3u);
  ASSERT_TRUE(b.InsertInto(*cache, 2, &cached).ok());
  EXPECT_EQ(cached, 1u);  // "Tom " shared; "is" (another id) conflicts with the generated "is"
  ExpectMatchIs(cache->Match("Tom isn't"), a);
  EXPECT_EQ(cache->GetStats().conflicts_kept, 1);
  EXPECT_EQ(cache->GetStats().conflicts_replaced, 0);
  // A prompt-only tokenization is still replaced by a newer one.
  Traj p, q;
  p.Tok("Lily ", 10).Tok("went", 11);
  q.Tok("Lily ", 10).Tok("went", 12).Tok("!", 13, 1, -1.0f);
  ASSERT_TRUE(p.InsertInto(*cache, 2).ok());
  ASSERT_TRUE(q.InsertInto(*cache, 2, &cached).ok());
  EXPECT_EQ(cached, 3u);
  ExpectMatchIs(cache->Match("Lily went!"), q);
  EXPECT_EQ(cache->GetStats().conflicts_replaced, 1);
  ASSERT_TRUE(cache->ValidateForTesting().ok());
}

// Trajectories sharing tokens inserted with other versions each get their own versions back.
TEST(TextCacheTest, RetrievalReturnsTheVersionsOfTheRetrievedTrajectory) {
  auto cache = MakeCache();
  Traj a, b;
  a.Words("System: be brief\n").Words("User: hi\n").Words("Hello there\n", 1);
  b.Words("System: be brief\n").Words("User: hi\n").Words("Hello there\n", 1);
  b.Words("User: and\n").Words("More text\n", 1);
  a.versions.assign(a.tokens.size(), 1);
  // b: its own prompt tokens at 3, the generated ones crossing an update from 3 to 4.
  b.versions.assign(b.tokens.size(), 3);
  for (size_t i = b.tokens.size() - 2; i < b.tokens.size(); ++i) b.versions[i] = 4;
  ASSERT_TRUE(a.InsertInto(*cache, 1).ok());
  ASSERT_TRUE(b.InsertInto(*cache, 4).ok());
  EXPECT_EQ(cache->GetStats().entries, 2);  // b extends a's path
  CacheMatch m = cache->Match(a.text);
  ExpectMatchIs(m, a);
  EXPECT_EQ(m.token_versions, a.versions);
  m = cache->Match(b.text);
  ExpectMatchIs(m, b);
  EXPECT_EQ(m.token_versions, b.versions);
  // A query past b's end gets b's versions; one ending inside a's path (no trajectory ends
  // there) gets the versions of the first insert that cached those tokens (a's).
  EXPECT_EQ(cache->Match(b.text + "User: ok").token_versions, b.versions);
  m = cache->Match("System: be brief\nUser: hi\n");
  EXPECT_EQ(m.token_versions, std::vector<int64_t>(m.tokens.size(), 1));
  // Inserting exactly b's tokens again with other versions: the newest versions win.
  Traj b2 = b;
  b2.versions.assign(b.tokens.size(), 7);
  ASSERT_TRUE(b2.InsertInto(*cache, 7).ok());
  EXPECT_EQ(cache->Match(b.text).token_versions, b2.versions);
  EXPECT_EQ(cache->Match(a.text).token_versions, a.versions);
  ASSERT_TRUE(cache->ValidateForTesting().ok());
}

TEST(TextCacheTest, DistinctTextsDivergingInsideAFirstTokenAreSiblings) {
  auto cache = MakeCache();
  Traj a, b;
  a.Tok("Hi", 1).Tok(" world", 2);
  b.Tok("Hi", 1).Tok(" wonder", 3);
  ASSERT_TRUE(a.InsertInto(*cache, 1).ok());
  ASSERT_TRUE(b.InsertInto(*cache, 1).ok());
  ExpectMatchIs(cache->Match(a.text), a);
  ExpectMatchIs(cache->Match(b.text), b);
  EXPECT_EQ(cache->GetStats().conflicts_replaced, 0);
  EXPECT_EQ(cache->GetStats().entries, 3);
  ASSERT_TRUE(cache->ValidateForTesting().ok());
}

// Seed defect 3: nodes created without a version were never collected.
TEST(TextCacheTest, GcCollectsEveryStaleSuffix) {
  auto cache = MakeCache(/*max_size=*/20, /*k=*/2);
  Traj turn1, turn2, turn3;
  turn1.Words("User: hi there\n").Words("Assistant: hello\n", 1);
  turn2 = turn1;
  turn2.Words("User: more\n").Words("Assistant: sure\n", 1);
  turn3 = turn2;
  turn3.Words("User: end\n");
  ASSERT_TRUE(turn1.InsertInto(*cache, 1).ok());
  ASSERT_TRUE(turn2.InsertInto(*cache, 1).ok());
  ASSERT_TRUE(turn3.InsertInto(*cache, 1).ok());
  EXPECT_EQ(cache->GetStats().size_tokens, static_cast<int64_t>(turn3.tokens.size()));
  Traj fresh;
  fresh.Words("System: new policy\n").Words("x y z w v u t s r q p o n\n", 1);
  ASSERT_TRUE(fresh.InsertInto(*cache, 5).ok());
  TextCacheStats stats = cache->GetStats();
  EXPECT_EQ(stats.gc_runs, 1);
  EXPECT_EQ(stats.gc_removed_tokens, static_cast<int64_t>(turn3.tokens.size()));
  EXPECT_EQ(stats.size_tokens, static_cast<int64_t>(fresh.tokens.size()));
  EXPECT_EQ(stats.entries, 1);
  EXPECT_TRUE(cache->Match(turn3.text).tokens.empty());
  ExpectMatchIs(cache->Match(fresh.text), fresh);
  ASSERT_TRUE(cache->ValidateForTesting().ok());
}

// Seed defect 4: GC asserted that no child is newer than its parent.
TEST(TextCacheTest, NewerExtensionOfAnOldPrefixSurvivesGc) {
  auto cache = MakeCache(/*max_size=*/1, /*k=*/3);
  Traj prefix, old_sibling, newer;
  prefix.Tok("A ", 1).Tok("B ", 2);
  old_sibling = prefix;
  old_sibling.Tok("C", 3);
  newer = prefix;
  newer.Tok("D", 4, 1, -1.0f);
  ASSERT_TRUE(prefix.InsertInto(*cache, 1).ok());
  ASSERT_TRUE(old_sibling.InsertInto(*cache, 1).ok());
  ASSERT_TRUE(newer.InsertInto(*cache, 9).ok());
  // Threshold 6: the old sibling goes; the prefix was raised to 9 by the newer insert.
  ExpectMatchIs(cache->Match(newer.text), newer);
  ExpectMatchIs(cache->Match(old_sibling.text), prefix);
  EXPECT_EQ(cache->Match(newer.text).weight_version, 9);
  EXPECT_EQ(cache->GetStats().gc_removed_tokens, 1);
  ASSERT_TRUE(cache->ValidateForTesting().ok());
  // An older-versioned insert under a newer path keeps the path's version.
  Traj late;
  late = prefix;
  late.Tok("E", 5);
  ASSERT_TRUE(late.InsertInto(*cache, 7).ok());
  ASSERT_TRUE(cache->ValidateForTesting().ok());
  ExpectMatchIs(cache->Match(late.text), late);
  EXPECT_EQ(cache->Match(late.text).weight_version, 7);
}

TEST(TextCacheTest, GcAfterVersionBumpsKeepsRecentVersions) {
  auto cache = MakeCache(/*max_size=*/1, /*k=*/2);
  std::vector<Traj> trajs(10);
  for (int v = 1; v <= 10; ++v) {
    trajs[v - 1].Words("System: s\n").Words("User: q" + std::to_string(v) + "\n");
    ASSERT_TRUE(trajs[v - 1].InsertInto(*cache, v).ok());
    ASSERT_TRUE(cache->ValidateForTesting().ok());
    for (int u = 1; u <= v; ++u) {
      const CacheMatch m = cache->Match(trajs[u - 1].text);
      if (u > v - 2) {
        ExpectMatchIs(m, trajs[u - 1]);
      } else {
        EXPECT_EQ(m.matched_bytes, 16u) << "v=" << v << " u=" << u;  // "System: s\nUser: "
      }
    }
  }
  EXPECT_EQ(cache->GetStats().current_version, 10);
  EXPECT_EQ(cache->GetStats().entries, 3);
  // An explicit version bump collects everything at or below current - k.
  cache->SetCurrentVersion(20);
  EXPECT_EQ(cache->GetStats().entries, 0);
  EXPECT_EQ(cache->GetStats().size_tokens, 0);
  EXPECT_EQ(cache->GetStats().size_bytes, 0);
  ASSERT_TRUE(cache->ValidateForTesting().ok());
}

TEST(TextCacheTest, MultiTurnTrajectoriesHitAndRetrieveExactly) {
  auto cache = MakeCache();
  const std::vector<std::pair<std::string, std::string>> turns = {
      {"User: what is two plus two\n", "Assistant: it is four\n"},
      {"User: and times three\n", "Assistant: twelve\n"},
      {"User: thanks\n", "Assistant: you are welcome\n"}};
  Traj full;
  full.Words("System: you are a calculator\n");
  for (size_t k = 0; k < turns.size(); ++k) {
    const std::string prompt = full.text + turns[k].first;
    const CacheMatch m = cache->Match(prompt);
    if (k == 0) {
      EXPECT_TRUE(m.tokens.empty());
    } else {
      // Everything cached so far is reused exactly, masks and logprobs included.
      ExpectMatchIs(m, full);
    }
    full.Words(turns[k].first, 0).Words(turns[k].second, 1);
    ASSERT_TRUE(full.InsertInto(*cache, static_cast<int64_t>(k + 1)).ok());
  }
  const CacheRetrieval r = cache->Retrieve(full.text);
  EXPECT_EQ(r.matched_bytes, full.text.size());
  EXPECT_EQ(r.tokens, full.tokens);
  EXPECT_EQ(r.loss_mask, full.mask);
  EXPECT_EQ(AllBits(r.rollout_logp), AllBits(full.logp));
  const TextCacheStats stats = cache->GetStats();
  EXPECT_EQ(stats.hits, 3);
  EXPECT_EQ(stats.misses, 1);
  EXPECT_DOUBLE_EQ(stats.hit_rate, 0.75);
  EXPECT_EQ(stats.entries, 3);  // one edge per turn
  ASSERT_TRUE(cache->ValidateForTesting().ok());
}

TEST(TextCacheTest, QueryDivergingInsideATokenBacksOffToTheBoundary) {
  auto cache = MakeCache();
  Traj t;
  t.Tok("hello", 1).Tok(" world", 2).Tok("!", 3);
  ASSERT_TRUE(t.InsertInto(*cache, 1).ok());
  EXPECT_EQ(cache->Match("hello wonderful").matched_bytes, 5u);
  EXPECT_THAT(cache->Match("hello wonderful").tokens, ElementsAre(1));
  EXPECT_EQ(cache->Match("hello worl").matched_bytes, 5u);
  EXPECT_EQ(cache->Match("hello").matched_bytes, 5u);
  EXPECT_EQ(cache->Match("hello world?").matched_bytes, 11u);
  ExpectMatchIs(cache->Match("hello world!!!"), t);
  const CacheMatch miss = cache->Match("hel");
  EXPECT_EQ(miss.matched_bytes, 0u);
  EXPECT_TRUE(miss.tokens.empty());
  EXPECT_EQ(miss.weight_version, 0);
  EXPECT_TRUE(cache->Match("").tokens.empty());
  EXPECT_TRUE(cache->Match("xyz").tokens.empty());
}

TEST(TextCacheTest, BoundariesInsideMultiByteCharacters) {
  // "aé": byte-level tokens split é (C3 A9) in two.
  const std::string e_acute = "\xC3\xA9", e_grave = "\xC3\xA8";
  {
    auto cache = MakeCache();
    Traj t;
    t.Tok("a", 1).Tok("\xC3", 2).Tok("\xA9", 3).Tok("b", 4);
    ASSERT_TRUE(t.InsertInto(*cache, 1).ok());
    // Diverging inside é: the boundary at byte 2 would leave "\xA8..." to tokenize.
    EXPECT_EQ(cache->Match("a" + e_grave).matched_bytes, 1u);
    EXPECT_EQ(cache->Match("a" + e_acute + "c").matched_bytes, 3u);
    ExpectMatchIs(cache->Match(t.text), t);
    auto raw = MakeCache(1 << 30, 5, /*utf8_safe=*/false);
    ASSERT_TRUE(t.InsertInto(*raw, 1).ok());
    EXPECT_EQ(raw->Match("a" + e_grave).matched_bytes, 2u);
    EXPECT_THAT(raw->Match("a" + e_grave).tokens, ElementsAre(1, 2));
  }
  {
    // Hugging Face offsets: both tokens of é span the whole character (equal ends).
    auto cache = MakeCache(1 << 30, 5, /*utf8_safe=*/false);
    Traj t1, t2;
    t1.Tok("a", 1).Tok(e_acute, 2);
    t1.ends.push_back(3);
    t1.tokens.push_back(3);
    t1.mask.push_back(0);
    t1.logp.push_back(kNaN);
    t2 = t1;
    t1.Tok("b", 4);
    t2.Tok("c", 5);
    ASSERT_TRUE(t1.InsertInto(*cache, 1).ok());
    ASSERT_TRUE(t2.InsertInto(*cache, 1).ok());
    EXPECT_EQ(cache->GetStats().entries, 3);  // split after the whole group, not inside it
    ExpectMatchIs(cache->Match(t1.text), t1);
    ExpectMatchIs(cache->Match(t2.text), t2);
    const CacheMatch m = cache->Match("a" + e_grave);
    EXPECT_EQ(m.matched_bytes, 1u);
    EXPECT_THAT(m.tokens, ElementsAre(1));
    const CacheMatch whole = cache->Match("a" + e_acute);
    EXPECT_THAT(whole.tokens, ElementsAre(1, 2, 3));
    EXPECT_THAT(whole.token_end_offsets, ElementsAre(1, 3, 3));
    // The same bytes grouped differently (byte-level ends) are another tokenization.
    Traj t3;
    t3.Tok("a", 1).Tok("\xC3", 2).Tok("\xA9", 3).Tok("d", 6);
    ASSERT_TRUE(t3.InsertInto(*cache, 2).ok());
    ExpectMatchIs(cache->Match(t3.text), t3);
    ExpectMatchIs(cache->Match(t1.text), t1);  // sibling paths: "\xC3" and the whole é
    ASSERT_TRUE(cache->ValidateForTesting().ok());
  }
}

TEST(TextCacheTest, LeadingZeroWidthTokensStayWithTheFirstGroup) {
  auto cache = MakeCache();
  Traj t;
  t.tokens = {100, 1, 2};  // BOS spans [0, 0)
  t.ends = {0, 2, 5};
  t.mask = {0, 0, 1};
  t.logp = {kNaN, kNaN, -0.1f};
  t.text = "hi you";
  t.ends[2] = 6;
  ASSERT_TRUE(t.InsertInto(*cache, 1).ok());
  EXPECT_THAT(cache->Match("hi there").tokens, ElementsAre(100, 1));
  EXPECT_TRUE(cache->Match("h").tokens.empty());
  ExpectMatchIs(cache->Match("hi you"), t);
  ASSERT_TRUE(cache->ValidateForTesting().ok());
}

TEST(TextCacheTest, NanLogprobsSurvive) {
  auto cache = MakeCache();
  Traj t;
  const float payload_nan = std::nanf("7");
  t.Tok("x", 1, 0, kNaN).Tok("y", 2, 1, payload_nan).Tok("z", 3, 1, -0.0f).Tok("w", 4, 1, 0.0f);
  ASSERT_TRUE(t.InsertInto(*cache, 1).ok());
  const CacheRetrieval r = cache->Retrieve(t.text);
  ASSERT_EQ(r.rollout_logp.size(), 4u);
  EXPECT_TRUE(std::isnan(r.rollout_logp[0]));
  EXPECT_EQ(Bits(r.rollout_logp[1]), Bits(payload_nan));
  EXPECT_EQ(Bits(r.rollout_logp[2]), Bits(-0.0f));
  EXPECT_EQ(Bits(r.rollout_logp[3]), Bits(0.0f));
  // No logprobs at all: every token is unknown, never 0.
  ASSERT_TRUE(cache->Insert("pq", {5, 6}, {1, 2}, {0, 0}, {}, 1).ok());
  const CacheRetrieval r2 = cache->Retrieve("pq");
  ASSERT_EQ(r2.rollout_logp.size(), 2u);
  EXPECT_TRUE(std::isnan(r2.rollout_logp[0]));
  EXPECT_TRUE(std::isnan(r2.rollout_logp[1]));
  // Re-inserting the same text with the same unknown logprobs shares the path.
  ASSERT_TRUE(cache->Insert("pqr", {5, 6, 7}, {1, 2, 3}, {0, 0, 1}, {}, 1).ok());
  EXPECT_EQ(cache->GetStats().conflicts_replaced, 0);
}

TEST(TextCacheTest, RejectsMalformedInput) {
  auto cache = MakeCache();
  EXPECT_EQ(cache->Insert("", {}, {}, {}, {}, 1).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(cache->Insert("ab", {1}, {1}, {0}, {}, 1).code(),
            absl::StatusCode::kInvalidArgument);  // does not cover the text
  EXPECT_EQ(cache->Insert("ab", {1, 2}, {2, 1}, {0, 0}, {}, 1).code(),
            absl::StatusCode::kInvalidArgument);  // decreasing ends
  EXPECT_EQ(cache->Insert("ab", {1, 2}, {1, 2}, {0}, {}, 1).code(),
            absl::StatusCode::kInvalidArgument);  // mask length
  EXPECT_EQ(cache->Insert("ab", {1, 2}, {1, 2}, {0, 0}, {0.f}, 1).code(),
            absl::StatusCode::kInvalidArgument);  // logprob length
  EXPECT_EQ(cache->Insert("ab", {1, 2}, {1, 2}, {0, 2}, {}, 1).code(),
            absl::StatusCode::kInvalidArgument);  // mask value
  EXPECT_EQ(cache->GetStats().entries, 0);
  TextCacheOptions bad;
  bad.max_cache_size = 0;
  EXPECT_EQ(TextCache::Create(bad).status().code(), absl::StatusCode::kInvalidArgument);
  bad.max_cache_size = 10;
  bad.gc_threshold_k = -1;
  EXPECT_EQ(TextCache::Create(bad).status().code(), absl::StatusCode::kInvalidArgument);
}

// Random texts over a tiny alphabet with random tokenizations (groups of equal ends, leading
// zero-width tokens), masks, logprobs and per-token versions. Checks the invariants after every
// insert, that the newest trajectory is retrievable exactly (when the insert reports it fully
// cached; else up to where it stopped), that every match is a prefix of some inserted
// trajectory: never a mix, and (without GC) that every fully cached trajectory ending with a
// generated token is still retrieved exactly, versions included, at the end.
TEST(TextCacheTest, RandomizedNeverReturnsAMix) {
  std::mt19937 rng(12345);
  for (int round = 0; round < 4; ++round) {
    // Rounds 0-1 tokenize at random (conflicts everywhere); rounds 2-3 deterministically, so
    // paths are shared and GC has old leaves to collect. Odd rounds run GC on every insert.
    const bool random_tokens = round < 2;
    const bool gc = round % 2 == 1;
    auto cache = MakeCache(/*max_size=*/gc ? 30 : (1 << 30), /*k=*/2, /*utf8_safe=*/false);
    std::vector<Traj> inserted;
    std::vector<size_t> fully_cached;  // indices into `inserted`
    int kept = 0;
    // Whether `m` is exactly a fully cached trajectory with text `text` (several tokenizations
    // of one text may be cached; a match returns one), with the versions of the newest insert
    // of exactly its tokens.
    const auto IsCachedTrajectory = [&](const CacheMatch& m, const std::string& text) {
      const Traj* newest = nullptr;
      for (size_t j : fully_cached) {
        const Traj& u = inserted[j];
        if (u.text == text && u.tokens == m.tokens && u.ends == m.token_end_offsets &&
            u.mask == m.loss_mask && AllBits(u.logp) == AllBits(m.logprobs)) {
          newest = &u;
        }
      }
      return m.matched_bytes == text.size() && newest != nullptr &&
             newest->versions == m.token_versions;
    };
    for (int step = 0; step < 1500; ++step) {
      Traj t;
      const int len = 1 + static_cast<int>(rng() % 12);
      if (!inserted.empty() && rng() % 2 == 0) {
        // Start from a previous text, keeping a prefix, to create sharing and conflicts.
        const Traj& base = inserted[rng() % inserted.size()];
        t.text = base.text.substr(0, rng() % (base.text.size() + 1));
      }
      while (static_cast<int>(t.text.size()) < len) t.text += static_cast<char>('a' + rng() % 4);
      if (random_tokens) {
        if (rng() % 8 == 0) {
          t.tokens.push_back(99);
          t.ends.push_back(0);
        }
        uint32_t p = 0;
        while (p < t.text.size()) {
          p = std::min<uint32_t>(static_cast<uint32_t>(t.text.size()), p + 1 + rng() % 3);
          const int copies = rng() % 6 == 0 ? 2 : 1;
          for (int c = 0; c < copies; ++c) {
            t.tokens.push_back(static_cast<int32_t>(rng() % 4));
            t.ends.push_back(p);
          }
        }
        for (size_t i = 0; i < t.tokens.size(); ++i) {
          t.mask.push_back(static_cast<uint8_t>(rng() % 4 == 0));
          t.logp.push_back(rng() % 3 == 0 ? kNaN : -0.5f * static_cast<float>(rng() % 2));
        }
      } else {
        const std::string text = t.text;
        t = Traj();
        for (size_t p = 0; p < text.size(); p += 2) {
          const std::string piece = text.substr(p, 2);
          const int32_t id = piece[0] * 256 + (piece.size() > 1 ? piece[1] : 0);
          t.Tok(piece, id, static_cast<uint8_t>(id % 3 == 0), -0.125f * static_cast<float>(id % 5));
        }
      }
      const int64_t version = step / 20;
      for (size_t i = 0; i < t.tokens.size(); ++i) {
        t.versions.push_back(rng() % 3 == 0 ? version - static_cast<int64_t>(rng() % 3) : version);
      }
      size_t cached = 0;
      ASSERT_TRUE(t.InsertInto(*cache, version, &cached).ok());
      ASSERT_TRUE(cache->ValidateForTesting().ok()) << cache->ValidateForTesting();
      inserted.push_back(t);
      if (cached == t.tokens.size()) {
        fully_cached.push_back(inserted.size() - 1);
        const CacheMatch m = cache->Match(t.text);
        ASSERT_EQ(m.matched_bytes, t.text.size());
        if (t.mask.back() == 1) ASSERT_TRUE(IsCachedTrajectory(m, t.text)) << "step " << step;
      } else {
        ASSERT_LT(cached, t.tokens.size());
        ++kept;
      }

      std::string query = inserted[rng() % inserted.size()].text;
      query = query.substr(0, rng() % (query.size() + 1));
      for (int extra = static_cast<int>(rng() % 3); extra > 0; --extra) {
        query += static_cast<char>('a' + rng() % 3);
      }
      const CacheMatch m = cache->Match(query);
      const size_t k = m.tokens.size();
      bool found = k == 0 && m.matched_bytes == 0;
      for (size_t j = inserted.size(); j-- > 0 && !found;) {
        const Traj& c = inserted[j];
        if (c.tokens.size() < k || k == 0) continue;
        if (c.ends[k - 1] != m.matched_bytes) continue;
        if (k < c.tokens.size() && c.ends[k] == c.ends[k - 1]) continue;
        const Traj p = c.Prefix(k);
        found = query.compare(0, m.matched_bytes, p.text) == 0 && p.tokens == m.tokens &&
                p.ends == m.token_end_offsets && p.mask == m.loss_mask &&
                AllBits(p.logp) == AllBits(m.logprobs);
      }
      ASSERT_TRUE(found) << "round " << round << " step " << step << " query " << query;
    }
    const TextCacheStats stats = cache->GetStats();
    if (random_tokens) {
      EXPECT_GT(stats.conflicts_replaced, 0);
      EXPECT_GT(stats.conflicts_kept, 0);
    }
    EXPECT_EQ(stats.conflicts_kept, kept);
    EXPECT_EQ(stats.gc_removed_tokens > 0, gc);
    if (gc) continue;
    // Generated tokens are never replaced: every fully cached trajectory that ends with one is
    // still there (its text retrieves it or another fully cached tokenization of that text,
    // never a prefix), with the versions of the newest insert of exactly its tokens.
    int checked = 0;
    for (size_t i : fully_cached) {
      const Traj& t = inserted[i];
      if (t.mask.back() != 1) continue;
      ASSERT_TRUE(IsCachedTrajectory(cache->Match(t.text), t.text))
          << "round " << round << " trajectory " << i;
      const CacheMatch m = cache->Match(t.text + "zz", MatchGoal::kMostGenerated);
      ASSERT_GE(m.tokens.size(), t.tokens.size());
      ++checked;
    }
    EXPECT_GT(checked, random_tokens ? 5 : 100)
        << "round " << round << ": " << fully_cached.size() << " fully cached, " << kept << " kept";
  }
}

TEST(TextCacheTest, ConcurrentInsertsAndMatches) {
  auto cache = MakeCache(/*max_size=*/1 << 30, /*k=*/5);
  constexpr int kThreads = 4;
  constexpr int kPerThread = 300;
  std::vector<std::thread> threads;
  for (int w = 0; w < kThreads; ++w) {
    threads.emplace_back([&cache, w] {
      for (int i = 0; i < kPerThread; ++i) {
        Traj t;
        t.Words("System: shared prompt for all\n")
            .Words("User: w" + std::to_string(w) + " q" + std::to_string(i % 50) + "\n")
            .Words("Assistant: a" + std::to_string(i) + "\n", 1);
        const CacheMatch m = cache->Match(t.text);
        EXPECT_GE(m.matched_bytes, i == 0 ? 0u : 31u);
        EXPECT_TRUE(t.InsertInto(*cache, i / 100).ok());
        ExpectMatchIs(cache->Match(t.text), t);
        if (i % 100 == 0) (void)cache->GetStats();
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_TRUE(cache->ValidateForTesting().ok());
  const TextCacheStats stats = cache->GetStats();
  EXPECT_EQ(stats.hits + stats.misses, 2 * kThreads * kPerThread);
  EXPECT_EQ(stats.conflicts_replaced, 0);
  EXPECT_EQ(stats.current_version, 2);
}

// ---- Workers (docs/text-cache.md, "Workers"): which workers served which prefixes ----

std::vector<std::pair<std::string, uint32_t>> Holders(const CacheMatch& m) {
  std::vector<std::pair<std::string, uint32_t>> out;
  for (const CacheHolder& h : m.holders) out.emplace_back(h.worker, h.tokens);
  return out;
}

absl::Status InsertBy(TextCache& cache, const Traj& t, int64_t version, const std::string& worker) {
  return cache.Insert(t.text, t.tokens, t.ends, t.mask, t.logp, version, t.versions, nullptr,
                      worker);
}

TEST(TextCacheTest, RemembersWhichWorkersServedEachPrefix) {
  auto cache = MakeCache();
  Traj sys;
  sys.Words("System: you are a careful solver of problems\n");
  Traj a = sys;
  a.Words("User: what is 2+2?\n").Words("Assistant: 4\n", 1);
  Traj b = sys;
  b.Words("User: name a prime\n").Words("Assistant: 7\n", 1);
  ASSERT_TRUE(InsertBy(*cache, a, 0, "w1:1").ok());
  ASSERT_TRUE(InsertBy(*cache, b, 0, "w2:1").ok());
  // A's next turn: w1 holds all of A, w2 the system prompt and "User: " only.
  Traj next = a;
  next.Words("User: and 3+3?\n");
  const CacheMatch m = cache->Match(next.text);
  EXPECT_THAT(Holders(m),
              ElementsAre(std::make_pair(std::string("w1:1"), uint32_t(a.tokens.size())),
                          std::make_pair(std::string("w2:1"), uint32_t(sys.tokens.size() + 1))));
  // Unknown text: no holder; a worker-less insert adds none.
  EXPECT_TRUE(cache->Match("Something else entirely").holders.empty());
  Traj c = sys;
  c.Words("User: anonymous\n");
  ASSERT_TRUE(c.InsertInto(*cache, 0).ok());
  EXPECT_EQ(cache->Match(c.text).holders.size(), 2u);  // w1 and w2 through the system prompt
  // A split keeps the workers of both halves: w3 shares A's first user words only.
  Traj d = sys;
  d.Words("User: what is 5+5?\n");
  ASSERT_TRUE(InsertBy(*cache, d, 0, "w3:1").ok());
  const CacheMatch again = cache->Match(next.text);
  ASSERT_EQ(again.holders.size(), 3u);
  EXPECT_EQ(again.holders[0].worker, "w1:1");
  EXPECT_EQ(again.holders[0].tokens, a.tokens.size());
  EXPECT_EQ(again.holders[1].worker, "w3:1");
  EXPECT_EQ(again.holders[1].tokens, sys.tokens.size() + 3);  // "User: " "what " "is "
  EXPECT_TRUE(cache->ValidateForTesting().ok());
}

TEST(TextCacheTest, AWeightUpdateForgetsWhoHeldOlderVersions) {
  auto cache = MakeCache();
  Traj t;
  t.Words("System: shared\n").Words("Assistant: x\n", 1);
  ASSERT_TRUE(InsertBy(*cache, t, 1, "w1:1").ok());
  ASSERT_TRUE(InsertBy(*cache, t, 1, "w2:1").ok());
  EXPECT_EQ(cache->Match(t.text).holders.size(), 2u);
  // The fleet moved to version 2: every worker flushed its KV.
  cache->SetCurrentVersion(2);
  EXPECT_TRUE(cache->Match(t.text).holders.empty());
  // A version-2 insert through the same nodes: only its worker holds them.
  ASSERT_TRUE(InsertBy(*cache, t, 2, "w2:1").ok());
  EXPECT_THAT(Holders(cache->Match(t.text)),
              ElementsAre(std::make_pair(std::string("w2:1"), uint32_t(t.tokens.size()))));
  // A late version-1 response adds no claim to version-2 nodes.
  ASSERT_TRUE(InsertBy(*cache, t, 1, "w1:1").ok());
  EXPECT_EQ(cache->Match(t.text).holders.size(), 1u);
}

TEST(TextCacheTest, MoreThan64WorkersRecycleTheLeastRecentlyUsedSlot) {
  auto cache = MakeCache();
  Traj first;
  first.Words("zero prompt\n");
  ASSERT_TRUE(InsertBy(*cache, first, 0, "w0:1").ok());
  for (int i = 1; i < 64; ++i) {
    Traj t;
    t.Words(std::to_string(i) + " prompt\n");
    ASSERT_TRUE(InsertBy(*cache, t, 0, "w" + std::to_string(i) + ":1").ok());
  }
  EXPECT_EQ(Holders(cache->Match(first.text)).size(), 1u);
  // The 65th takes w0's slot: w0's claim is gone, nobody inherits it.
  Traj t;
  t.Words("64 prompt\n");
  ASSERT_TRUE(InsertBy(*cache, t, 0, "w64:1").ok());
  EXPECT_TRUE(cache->Match(first.text).holders.empty());
  EXPECT_THAT(Holders(cache->Match(t.text)),
              ElementsAre(std::make_pair(std::string("w64:1"), uint32_t(t.tokens.size()))));
  EXPECT_TRUE(cache->ValidateForTesting().ok());
}

}  // namespace
}  // namespace rl::router
