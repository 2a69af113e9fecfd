// The durable text cache: what a cache with a CacheStore changed is recovered exactly by a new
// cache over the same folder (tokens, masks, logprob bits, per-token versions, the tree's
// counters and versions), through splits, conflicts, version bumps and GC; GC removes from the
// store; a corrupt store refuses to start; tickets and WhenDurable keep their order; a write that
// fails (the files may not grow, as on a full disk) is reported, acknowledges nothing, and the
// store recovers the whole cache once writes succeed again.
#include "services/router/cache/cache_store.h"

#include <signal.h>
#include <sqlite3.h>
#include <sys/resource.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <limits>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "services/router/cache/text_cache.h"
#include "tests/testing/test_data.h"

namespace rl::router {
namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

struct Traj {
  std::string text;
  std::vector<int32_t> tokens;
  std::vector<uint32_t> ends;
  std::vector<uint8_t> mask;
  std::vector<float> logp;
  std::vector<int64_t> versions;

  // Appends `piece` as word tokens (word + trailing spaces), generated ones with logprobs.
  Traj& Words(const std::string& piece, uint8_t m, int64_t version) {
    size_t i = 0;
    while (i < piece.size()) {
      size_t j = i;
      while (j < piece.size() && piece[j] != ' ') ++j;
      while (j < piece.size() && piece[j] == ' ') ++j;
      const std::string word = piece.substr(i, j - i);
      const auto id = static_cast<int32_t>(std::hash<std::string>()(word) % 50000);
      text += word;
      tokens.push_back(id);
      ends.push_back(static_cast<uint32_t>(text.size()));
      mask.push_back(m);
      logp.push_back(m == 1 ? -0.01f * static_cast<float>(id % 97 + 1) : kNaN);
      versions.push_back(version);
      i = j;
    }
    return *this;
  }
};

std::vector<uint32_t> Bits(const std::vector<float>& v) {
  std::vector<uint32_t> out(v.size());
  std::memcpy(out.data(), v.data(), v.size() * sizeof(float));
  return out;
}

struct Opened {
  std::unique_ptr<CacheStore> store;
  std::unique_ptr<TextCache> cache;
};

Opened Open(const std::string& dir, int64_t max_cache_size = 1 << 20, int64_t gc_k = 1,
            std::chrono::milliseconds retry = std::chrono::milliseconds(2000)) {
  CacheStoreOptions so;
  so.dir = dir;
  so.max_disk_bytes = 64 << 20;
  so.retry_interval = retry;
  Opened o;
  auto store = CacheStore::Open(so);
  EXPECT_TRUE(store.ok()) << store.status();
  if (!store.ok()) return o;
  o.store = std::move(*store);
  TextCacheOptions co;
  co.max_cache_size = max_cache_size;
  co.gc_threshold_k = gc_k;
  auto cache = TextCache::Create(co, o.store.get());
  EXPECT_TRUE(cache.ok()) << cache.status();
  if (cache.ok()) o.cache = std::move(*cache);
  return o;
}

int64_t StoredNodes(const std::string& dir) {
  sqlite3* db = nullptr;
  sqlite3_open((dir + "/router-state.sqlite3").c_str(), &db);
  sqlite3_stmt* st = nullptr;
  sqlite3_prepare_v2(db, "SELECT COUNT(*) FROM nodes", -1, &st, nullptr);
  int64_t n = -1;
  if (sqlite3_step(st) == SQLITE_ROW) n = sqlite3_column_int64(st, 0);
  sqlite3_finalize(st);
  sqlite3_close(db);
  return n;
}

// Every retrieval of `texts` and the counters are the same in both caches.
void ExpectSame(const TextCache& a, const TextCache& b, const std::vector<std::string>& texts) {
  const TextCacheStats sa = a.GetStats(), sb = b.GetStats();
  EXPECT_EQ(sa.entries, sb.entries);
  EXPECT_EQ(sa.size_tokens, sb.size_tokens);
  EXPECT_EQ(sa.size_bytes, sb.size_bytes);
  EXPECT_EQ(sa.current_version, sb.current_version);
  for (const std::string& t : texts) {
    const CacheRetrieval ra = a.Retrieve(t), rb = b.Retrieve(t);
    EXPECT_EQ(ra.matched_bytes, rb.matched_bytes) << t;
    EXPECT_EQ(ra.tokens, rb.tokens) << t;
    EXPECT_EQ(ra.loss_mask, rb.loss_mask) << t;
    EXPECT_EQ(Bits(ra.rollout_logp), Bits(rb.rollout_logp)) << t;
    EXPECT_EQ(ra.token_versions, rb.token_versions) << t;
    EXPECT_EQ(ra.weight_version, rb.weight_version) << t;
    for (MatchGoal goal : {MatchGoal::kLongest, MatchGoal::kMostGenerated}) {
      const CacheMatch ma = a.Match(t.substr(0, t.size() * 2 / 3), goal);
      const CacheMatch mb = b.Match(t.substr(0, t.size() * 2 / 3), goal);
      EXPECT_EQ(ma.tokens, mb.tokens) << t;
      EXPECT_EQ(ma.token_versions, mb.token_versions) << t;
      EXPECT_EQ(ma.weight_version, mb.weight_version) << t;
    }
  }
  EXPECT_TRUE(b.ValidateForTesting().ok());
}

TEST(CacheStoreTest, MultiTurnTrajectoriesRecoverExactly) {
  testing::TempDir dir;
  std::vector<std::string> texts;
  std::vector<Traj> trajs;
  Opened o = Open(dir.path());
  ASSERT_NE(o.cache, nullptr);
  for (int i = 0; i < 40; ++i) {
    Traj t;
    const int64_t v = 1 + i / 10;
    t.Words("system: be brief. ", 0, v).Words("user " + std::to_string(i % 7) + " asks ", 0, v);
    t.Words("answer " + std::to_string(i) + " here ", 1, v);
    ASSERT_TRUE(o.cache->Insert(t.text, t.tokens, t.ends, t.mask, t.logp, v, t.versions).ok());
    texts.push_back(t.text);
    // Turn 2 reuses turn 1's tokens and versions, at a newer version.
    t.Words("then more ", 0, v + 1).Words("second reply " + std::to_string(i) + " ", 1, v + 1);
    ASSERT_TRUE(o.cache->Insert(t.text, t.tokens, t.ends, t.mask, t.logp, v + 1, t.versions).ok());
    texts.push_back(t.text);
    trajs.push_back(t);
  }
  o.cache->SetCurrentVersion(9);
  ASSERT_TRUE(o.store->WaitDurable(o.store->last_ticket()).ok());
  // A new cache over the same folder, as after a restart (the first one closed).
  o.cache.reset();
  o.store.reset();
  Opened r = Open(dir.path());
  ASSERT_NE(r.cache, nullptr);
  EXPECT_EQ(r.cache->GetStats().current_version, 9);
  for (const Traj& t : trajs) {
    const CacheRetrieval got = r.cache->Retrieve(t.text);
    ASSERT_EQ(got.matched_bytes, t.text.size());
    EXPECT_EQ(got.tokens, t.tokens);
    EXPECT_EQ(got.loss_mask, t.mask);
    EXPECT_EQ(Bits(got.rollout_logp), Bits(t.logp));
    EXPECT_EQ(got.token_versions, t.versions);
  }
  EXPECT_TRUE(r.cache->ValidateForTesting().ok());
  EXPECT_EQ(StoredNodes(dir.path()), r.cache->GetStats().entries);
}

// A random mix of inserts (shared prefixes, splits, conflicting re-tokenizations, versions that
// go up) and GC: the recovered cache equals the live one, and the store holds exactly its nodes.
TEST(CacheStoreTest, RandomHistoryWithGcRecoversTheSameTree) {
  for (int seed = 1; seed <= 5; ++seed) {
    testing::TempDir dir;
    std::mt19937 rng(seed);
    const std::vector<std::string> words = {"a ", "bb ", "ccc ", "a b ", "dd ", "e ", "ff "};
    std::vector<std::string> texts;
    Opened live = Open(dir.path(), /*max_cache_size=*/600, /*gc_k=*/1);
    ASSERT_NE(live.cache, nullptr);
    int64_t version = 1;
    for (int i = 0; i < 300; ++i) {
      if (rng() % 40 == 0) ++version;
      Traj t;
      const int turns = 1 + static_cast<int>(rng() % 3);
      for (int k = 0; k < turns; ++k) {
        std::string prompt, reply;
        for (int w = 0; w < 1 + static_cast<int>(rng() % 3); ++w) prompt += words[rng() % 4];
        for (int w = 0; w < 1 + static_cast<int>(rng() % 3); ++w) reply += words[rng() % 7];
        t.Words(prompt, 0, version).Words(reply, static_cast<uint8_t>(rng() % 2), version);
      }
      ASSERT_TRUE(
          live.cache->Insert(t.text, t.tokens, t.ends, t.mask, t.logp, version, t.versions).ok());
      texts.push_back(t.text);
    }
    ASSERT_GT(live.cache->GetStats().gc_runs, 0) << "the test must cover GC";
    ASSERT_TRUE(live.store->WaitDurable(live.store->last_ticket()).ok());
    EXPECT_EQ(StoredNodes(dir.path()), live.cache->GetStats().entries);
    // Recover into a second folder's copy: copy the files while the live store is idle.
    testing::TempDir copy;
    for (const char* f : {"/router-state.sqlite3", "/router-state.sqlite3-wal"}) {
      std::error_code ec;
      std::filesystem::copy_file(dir.path() + f, copy.path() + f, ec);
    }
    Opened r = Open(copy.path(), 600, 1);
    ASSERT_NE(r.cache, nullptr) << "seed " << seed;
    ExpectSame(*live.cache, *r.cache, texts);
  }
}

TEST(CacheStoreTest, CorruptRecordRefusesToStartAndSaysWhere) {
  testing::TempDir dir;
  {
    Opened o = Open(dir.path());
    ASSERT_NE(o.cache, nullptr);
    Traj t;
    t.Words("hello there ", 0, 1).Words("general ", 1, 1);
    ASSERT_TRUE(o.cache->Insert(t.text, t.tokens, t.ends, t.mask, t.logp, 1, t.versions).ok());
    ASSERT_TRUE(o.store->WaitDurable(o.store->last_ticket()).ok());
  }
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open((dir.path() + "/router-state.sqlite3").c_str(), &db), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(db, "UPDATE nodes SET rec = x'01020304'", nullptr, nullptr, nullptr),
            SQLITE_OK);
  sqlite3_close(db);
  CacheStoreOptions so;
  so.dir = dir.path();
  auto store = CacheStore::Open(so);
  ASSERT_TRUE(store.ok());
  auto cache = TextCache::Create(TextCacheOptions(), store->get());
  ASSERT_FALSE(cache.ok());
  EXPECT_EQ(cache.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(cache.status().message().find("router-state.sqlite3"), std::string::npos);
  EXPECT_NE(cache.status().message().find("move the folder away"), std::string::npos);
}

TEST(CacheStoreTest, WhenDurableFiresInOrderAfterCommit) {
  testing::TempDir dir;
  CacheStoreOptions so;
  so.dir = dir.path();
  auto store = CacheStore::Open(so);
  ASSERT_TRUE(store.ok());
  std::vector<uint64_t> fired;
  absl::Mutex mu;
  std::vector<uint64_t> tickets;
  for (int i = 0; i < 50; ++i) {
    StoreBatch b;
    b.meta.emplace_back("k" + std::to_string(i), "v");
    const uint64_t t = (*store)->Enqueue(std::move(b));
    tickets.push_back(t);
    (*store)->WhenDurable(t, [&, t](absl::Status s) {
      EXPECT_TRUE(s.ok());
      absl::MutexLock lock(&mu);
      fired.push_back(t);
    });
  }
  ASSERT_TRUE((*store)->WaitDurable(tickets.back()).ok());
  {
    absl::MutexLock lock(&mu);
    auto all = [&]() { return fired.size() == tickets.size(); };
    mu.Await(absl::Condition(&all));
    EXPECT_EQ(fired, tickets);
  }
  const CacheStoreStats st = (*store)->GetStats();
  EXPECT_EQ(st.batches, 50);
  EXPECT_LE(st.commits, 50);
  auto v = (*store)->GetMeta("k49");
  ASSERT_TRUE(v.ok());
  ASSERT_TRUE(v->has_value());
  EXPECT_EQ(**v, "v");
}

// The files may not grow past `limit` bytes while it lives (RLIMIT_FSIZE, SIGXFSZ ignored: a
// write past it fails with EFBIG, as one fails on a full disk): a real failed write, no seam.
class FileSizeLimit {
 public:
  explicit FileSizeLimit(rlim_t limit) {
    old_handler_ = signal(SIGXFSZ, SIG_IGN);
    getrlimit(RLIMIT_FSIZE, &old_);
    rlimit lim = old_;
    lim.rlim_cur = limit;
    ok_ = setrlimit(RLIMIT_FSIZE, &lim) == 0;
  }
  ~FileSizeLimit() { Lift(); }
  bool ok() const { return ok_; }
  void Lift() {
    if (lifted_) return;
    lifted_ = true;
    setrlimit(RLIMIT_FSIZE, &old_);
    signal(SIGXFSZ, old_handler_);
  }

 private:
  rlimit old_{};
  sighandler_t old_handler_ = SIG_DFL;
  bool ok_ = false;
  bool lifted_ = false;
};

TEST(CacheStoreTest, AFailedWriteIsReportedAndTheStoreRecoversWhenSpaceReturns) {
  testing::TempDir dir;
  Opened o = Open(dir.path(), 1 << 20, 1, std::chrono::milliseconds(50));
  ASSERT_NE(o.cache, nullptr);
  std::vector<Traj> trajs(4);
  const auto insert = [&](int i) {
    Traj& t = trajs[i];
    t.Words("system: be brief. ", 0, 1).Words("user " + std::to_string(i) + " asks ", 0, 1);
    for (int k = 0; k < 200; ++k) t.Words("answer" + std::to_string(i * 1000 + k) + " ", 1, 1);
    return o.cache->Insert(t.text, t.tokens, t.ends, t.mask, t.logp, 1, t.versions);
  };
  ASSERT_TRUE(insert(0).ok());
  ASSERT_TRUE(o.store->WaitDurable(o.store->last_ticket()).ok());
  const std::string db = dir.path() + "/router-state.sqlite3";
  const auto size = [](const std::string& p) {
    std::error_code ec;
    const auto n = std::filesystem::file_size(p, ec);
    return ec ? uintmax_t{0} : n;
  };
  {
    FileSizeLimit full(std::max(size(db), size(db + "-wal")));
    ASSERT_TRUE(full.ok());
    ASSERT_TRUE(insert(1).ok());  // in memory; its batch cannot be written
    const absl::Status lost = o.store->WaitDurable(o.store->last_ticket());
    ASSERT_FALSE(lost.ok());
    EXPECT_EQ(lost.code(), absl::StatusCode::kUnavailable);
    EXPECT_NE(lost.message().find(db), std::string::npos) << lost;
    CacheStoreStats st = o.store->GetStats();
    EXPECT_TRUE(st.failed);
    EXPECT_GE(st.failures, 1);
    // While it has failed nothing is acknowledged, also after a retry interval or two (the
    // resyncs fail too while the files may not grow).
    ASSERT_TRUE(insert(2).ok());
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    EXPECT_FALSE(o.store->WaitDurable(o.store->last_ticket()).ok());
    EXPECT_TRUE(o.store->GetStats().failed);
    full.Lift();  // space returns
    for (int i = 0; i < 200 && o.store->GetStats().failed; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(25));
    }
    st = o.store->GetStats();
    EXPECT_FALSE(st.failed) << st.failure;
    EXPECT_EQ(st.recoveries, 1);
  }
  ASSERT_TRUE(insert(3).ok());
  ASSERT_TRUE(o.store->WaitDurable(o.store->last_ticket()).ok());
  o.cache.reset();
  o.store.reset();
  // Every trajectory, those whose batches were lost included, is on disk: the resync wrote the
  // whole cache.
  Opened r = Open(dir.path());
  ASSERT_NE(r.cache, nullptr);
  for (const Traj& t : trajs) {
    const CacheRetrieval got = r.cache->Retrieve(t.text);
    ASSERT_EQ(got.matched_bytes, t.text.size());
    EXPECT_EQ(got.tokens, t.tokens);
    EXPECT_EQ(got.loss_mask, t.mask);
    EXPECT_EQ(Bits(got.rollout_logp), Bits(t.logp));
    EXPECT_EQ(got.token_versions, t.versions);
  }
  EXPECT_TRUE(r.cache->ValidateForTesting().ok());
  EXPECT_EQ(StoredNodes(dir.path()), r.cache->GetStats().entries);
}

TEST(CacheStoreTest, OneRouterPerFolder) {
  testing::TempDir dir;
  CacheStoreOptions so;
  so.dir = dir.path();
  auto first = CacheStore::Open(so);
  ASSERT_TRUE(first.ok());
  auto second = CacheStore::Open(so);
  ASSERT_FALSE(second.ok());
  EXPECT_NE(second.status().message().find("another rl-router"), std::string::npos);
  first->reset();
  EXPECT_TRUE(CacheStore::Open(so).ok());
}

TEST(CacheStoreTest, BadOptionsNameTheFlag) {
  CacheStoreOptions so;
  so.dir = "";
  EXPECT_NE(so.Validate().message().find("--cache-dir"), std::string::npos);
  so.dir = "/tmp/x";
  so.max_disk_bytes = 1000;
  EXPECT_NE(so.Validate().message().find("--max-cache-disk-bytes"), std::string::npos);
}

}  // namespace
}  // namespace rl::router
