#include "bench/router/cache_bench.h"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "bench/router/heap_counter.h"
#include "common/status.h"
#include "nlohmann/json.hpp"
#include "services/router/cache/cache_store.h"
#include "services/router/cache/prompt_resolver.h"
#include "services/router/cache/text_cache.h"

namespace rl::bench {
namespace {

using Clock = std::chrono::steady_clock;

struct Turn {
  std::string user;
  std::string assistant;
};

struct Trajectory {
  std::string system;
  std::vector<Turn> turns;
};

// Token data in the layout TextCache::Insert takes.
struct Tokens {
  std::vector<int32_t> ids;
  std::vector<uint32_t> ends;
  std::vector<uint8_t> mask;
  std::vector<float> logprobs;
};

bool IsSpace(char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }

uint32_t Fnv1a(std::string_view s) {
  uint32_t h = 2166136261u;
  for (char c : s) {
    h ^= static_cast<uint8_t>(c);
    h *= 16777619u;
  }
  return h;
}

// Appends the word tokens of `text` (which starts at byte `base` of the trajectory): a token
// is optional leading whitespace, a run of non-whitespace and the whitespace after it.
void Tokenize(std::string_view text, size_t base, uint8_t mask, Tokens* out) {
  size_t i = 0;
  while (i < text.size()) {
    size_t j = i;
    while (j < text.size() && IsSpace(text[j])) ++j;
    while (j < text.size() && !IsSpace(text[j])) ++j;
    while (j < text.size() && IsSpace(text[j])) ++j;
    const int32_t id = static_cast<int32_t>(Fnv1a(text.substr(i, j - i)) % 151936u);
    out->ids.push_back(id);
    out->ends.push_back(static_cast<uint32_t>(base + j));
    out->mask.push_back(mask);
    // Generated tokens get a fake logprob; prompt tokens are unknown.
    out->logprobs.push_back(mask == 1 ? -0.001f * static_cast<float>(id % 1000 + 1)
                                      : std::numeric_limits<float>::quiet_NaN());
    i = j;
  }
}

absl::StatusOr<std::vector<Trajectory>> LoadWorkload(const std::string& path, int64_t limit) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open workload ", path));
  std::vector<Trajectory> out;
  std::string line;
  int64_t line_no = 0;
  while (std::getline(in, line) && (limit == 0 || static_cast<int64_t>(out.size()) < limit)) {
    ++line_no;
    if (line.empty()) continue;
    const nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_object() || !j.contains("system") || !j["system"].is_string() ||
        !j.contains("turns") || !j["turns"].is_array()) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ":", line_no, ": expected {\"system\": str, \"turns\": [...]}"));
    }
    Trajectory t;
    t.system = j["system"].get<std::string>();
    for (const auto& turn : j["turns"]) {
      if (!turn.is_object() || !turn.contains("user") || !turn["user"].is_string() ||
          !turn.contains("assistant") || !turn["assistant"].is_string()) {
        return absl::InvalidArgumentError(
            absl::StrCat(path, ":", line_no, ": a turn needs string user and assistant"));
      }
      t.turns.push_back({turn["user"].get<std::string>(), turn["assistant"].get<std::string>()});
    }
    out.push_back(std::move(t));
  }
  return out;
}

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

struct ReplayTimes {
  Clock::duration lookup{}, insert{};
  int64_t lookups = 0, inserts = 0, prompt_tokens = 0, reused_tokens = 0;
};

// Replays trajectories begin, begin + step, ... (< end) turn by turn into `cache`; with
// `wait_durable`, each insert waits for the store to hold it (as the router's final does).
absl::StatusOr<ReplayTimes> Replay(const CacheBenchConfig& config,
                                   const std::vector<Trajectory>& workload, size_t begin,
                                   size_t end, size_t step, router::TextCache& cache,
                                   bool wait_durable = false) {
  ReplayTimes r;
  std::string text;
  Tokens tokens;
  for (size_t index = begin; index < end; index += step) {
    const Trajectory& traj = workload[index];
    const int64_t version = 1 + static_cast<int64_t>(index) / config.trajectories_per_version;
    text = traj.system;
    for (const Turn& turn : traj.turns) {
      text += turn.user;
      Clock::time_point t0 = Clock::now();
      router::CacheMatch match = cache.Match(text);
      r.lookup += Clock::now() - t0;
      ++r.lookups;
      // The prompt: cached tokens reused as they are, the rest tokenized.
      tokens.ids = std::move(match.tokens);
      tokens.ends = std::move(match.token_end_offsets);
      tokens.mask = std::move(match.loss_mask);
      tokens.logprobs = std::move(match.logprobs);
      r.reused_tokens += static_cast<int64_t>(tokens.ids.size());
      Tokenize(std::string_view(text).substr(match.matched_bytes), match.matched_bytes, 0, &tokens);
      r.prompt_tokens += static_cast<int64_t>(tokens.ids.size());
      // The "generated" reply.
      const size_t reply_start = text.size();
      text += turn.assistant;
      Tokenize(std::string_view(text).substr(reply_start), reply_start, 1, &tokens);
      t0 = Clock::now();
      RETURN_IF_ERROR(
          cache.Insert(text, tokens.ids, tokens.ends, tokens.mask, tokens.logprobs, version));
      if (wait_durable) {
        RETURN_IF_ERROR(cache.store()->WaitDurable(cache.store()->last_ticket()));
      }
      r.insert += Clock::now() - t0;
      ++r.inserts;
    }
  }
  return r;
}

}  // namespace

// Replays the workload as the router resolves text prompts with a real tokenizer: the seam
// check on every request. Assistant replies are encoded as continuations and stream-decoded in
// the prompt's context, as the router caches a worker's output.
static absl::Status RunSeamReplay(const CacheBenchConfig& config,
                                  const std::vector<Trajectory>& workload, std::ostream& out) {
  ASSIGN_OR_RETURN(std::unique_ptr<tokenizer::Tokenizer> tok,
                   tokenizer::Tokenizer::FromDir(config.seam_tokenizer_dir));
  router::TextCacheOptions options;
  options.max_cache_size = config.max_cache_size;
  options.gc_threshold_k = config.gc_threshold_k;
  ASSIGN_OR_RETURN(std::unique_ptr<router::TextCache> cache, router::TextCache::Create(options));
  router::SeamCounters counters;
  Clock::duration resolve_time{};
  int64_t reused = 0, prompt_tokens = 0;
  const size_t n = std::min<size_t>(workload.size(), static_cast<size_t>(config.seam_limit));
  for (size_t index = 0; index < n; ++index) {
    const Trajectory& traj = workload[index];
    std::string text = traj.system;
    for (const Turn& turn : traj.turns) {
      text += turn.user;
      const Clock::time_point t0 = Clock::now();
      ASSIGN_OR_RETURN(router::ResolvedPrompt p,
                       router::ResolveTextPrompt(text, *cache, *tok, &counters));
      resolve_time += Clock::now() - t0;
      reused += p.cached_tokens;
      prompt_tokens += static_cast<int64_t>(p.ids.size());
      ASSIGN_OR_RETURN(tokenizer::Encoding reply, tok->EncodeContinuation(turn.assistant));
      if (reply.ids.empty()) break;
      ASSIGN_OR_RETURN(router::DecodedCompletion c,
                       router::DecodeCompletion(*tok, p.ids, reply.ids));
      std::vector<int32_t> ids = p.ids;
      ids.insert(ids.end(), reply.ids.begin(), reply.ids.end());
      std::vector<uint32_t> ends = p.ends;
      for (uint32_t e : c.ends) ends.push_back(static_cast<uint32_t>(text.size()) + e);
      std::vector<uint8_t> mask = p.mask;
      mask.insert(mask.end(), reply.ids.size(), 1);
      text += c.text;
      RETURN_IF_ERROR(cache->Insert(text, ids, ends, mask, {}, 1));
    }
  }
  const double requests = static_cast<double>(std::max<int64_t>(counters.requests.load(), 1));
  out << "== seam check (ResolveTextPrompt, tokenizer " << config.seam_tokenizer_dir << ") ==\n"
      << absl::StrFormat("requests              %12d  (%d trajectories)\n",
                         counters.requests.load(), n)
      << absl::StrFormat("resolve ops/s         %12.0f  (match + window encode + decode check)\n",
                         requests / Seconds(resolve_time))
      << absl::StrFormat(
             "prompt tokens reused  %12.4f  (%d of %d)\n",
             static_cast<double>(reused) / static_cast<double>(std::max<int64_t>(prompt_tokens, 1)),
             reused, prompt_tokens)
      << absl::StrFormat("seam continuations    %12.4f%% (%d)\n",
                         100.0 * static_cast<double>(counters.seam_continuations.load()) / requests,
                         counters.seam_continuations.load())
      << absl::StrFormat("whole-text windows    %12.4f%% (%d; no window start near the seam)\n",
                         100.0 * static_cast<double>(counters.whole_text_windows.load()) / requests,
                         counters.whole_text_windows.load())
      << absl::StrFormat(
             "whole-text fallbacks  %12.4f%% (%d; decode(tokens) != text)\n",
             100.0 * static_cast<double>(counters.whole_text_fallbacks.load()) / requests,
             counters.whole_text_fallbacks.load());
  return absl::OkStatus();
}

// The same replay with the durable store (cache_store.h) in a fresh folder: the insert calls
// (journal + queue), the time until the last insert is on disk, the router's pattern (threads
// that each wait for their insert to be durable, sharing commits), then the recovery of the
// whole cache by a new store + cache over the folder.
static absl::Status RunPersistentReplay(const CacheBenchConfig& config,
                                        const std::vector<Trajectory>& workload,
                                        const router::TextCacheStats& memory_stats,
                                        std::ostream& out) {
  std::string dir = config.persist_dir;
  std::string made;
  if (dir.empty()) {
    std::string tmpl = "/tmp/router-bench-XXXXXX";
    if (mkdtemp(tmpl.data()) == nullptr) return absl::InternalError("mkdtemp failed");
    dir = made = tmpl;
  }
  const auto cleanup = [&made] {
    if (!made.empty()) {
      std::error_code ec;
      std::filesystem::remove_all(made, ec);
    }
  };
  router::TextCacheOptions options;
  options.max_cache_size = config.max_cache_size;
  options.gc_threshold_k = config.gc_threshold_k;
  router::CacheStoreOptions store_options;
  store_options.dir = dir + "/sequential";
  store_options.max_disk_bytes = int64_t{64} << 30;
  out << "== text cache with the durable store (SQLite, " << dir << ") ==\n";
  {
    ASSIGN_OR_RETURN(std::unique_ptr<router::CacheStore> store,
                     router::CacheStore::Open(store_options));
    ASSIGN_OR_RETURN(std::unique_ptr<router::TextCache> cache,
                     router::TextCache::Create(options, store.get()));
    const Clock::time_point start = Clock::now();
    ASSIGN_OR_RETURN(ReplayTimes t, Replay(config, workload, 0, workload.size(), 1, *cache));
    RETURN_IF_ERROR(store->WaitDurable(store->last_ticket()));
    const double until_durable = Seconds(Clock::now() - start);
    const router::CacheStoreStats st = store->GetStats();
    out << absl::StrFormat("insert ops/s          %12.0f  (%d inserts, %.3f s in Insert calls)\n",
                           static_cast<double>(t.inserts) / Seconds(t.insert), t.inserts,
                           Seconds(t.insert))
        << absl::StrFormat("lookup ops/s          %12.0f  (%d lookups)\n",
                           static_cast<double>(t.lookups) / Seconds(t.lookup), t.lookups)
        << absl::StrFormat(
               "durable inserts/s     %12.0f  (replay until the last insert is on disk: %.3f s, "
               "tokenization included; %d commits, %.1f inserts each, %.1f MB written, %.1f MB "
               "on disk)\n",
               static_cast<double>(t.inserts) / until_durable, until_durable, st.commits,
               static_cast<double>(st.batches) /
                   static_cast<double>(std::max<int64_t>(1, st.commits)),
               static_cast<double>(st.bytes_written) / 1e6,
               static_cast<double>(st.disk_bytes) / 1e6);
  }
  {
    // Recovery of what the sequential replay left.
    const Clock::time_point start = Clock::now();
    ASSIGN_OR_RETURN(std::unique_ptr<router::CacheStore> store,
                     router::CacheStore::Open(store_options));
    ASSIGN_OR_RETURN(std::unique_ptr<router::TextCache> cache,
                     router::TextCache::Create(options, store.get()));
    const double recovery = Seconds(Clock::now() - start);
    const router::TextCacheStats s = cache->GetStats();
    if (s.entries != memory_stats.entries || s.size_tokens != memory_stats.size_tokens) {
      return absl::InternalError(absl::StrCat("recovered ", s.entries, " nodes / ", s.size_tokens,
                                              " tokens, the memory-only replay had ",
                                              memory_stats.entries, " / ",
                                              memory_stats.size_tokens));
    }
    out << absl::StrFormat(
        "recovery              %12.3f s (%d trajectories: %d nodes, %d tokens; open + read + "
        "link + invariant walk)\n",
        recovery, workload.size(), s.entries, s.size_tokens);
  }
  {
    // The router's pattern: concurrent requests, each final waiting for its insert on disk.
    store_options.dir = dir + "/concurrent";
    ASSIGN_OR_RETURN(std::unique_ptr<router::CacheStore> store,
                     router::CacheStore::Open(store_options));
    ASSIGN_OR_RETURN(std::unique_ptr<router::TextCache> cache,
                     router::TextCache::Create(options, store.get()));
    const size_t n = static_cast<size_t>(config.durable_threads);
    std::vector<absl::StatusOr<ReplayTimes>> results(n, absl::UnknownError("not run"));
    const Clock::time_point start = Clock::now();
    {
      std::vector<std::thread> threads;
      for (size_t i = 0; i < n; ++i) {
        threads.emplace_back(
            [&, i] { results[i] = Replay(config, workload, i, workload.size(), n, *cache, true); });
      }
      for (std::thread& th : threads) th.join();
    }
    const double wall = Seconds(Clock::now() - start);
    int64_t inserts = 0;
    for (auto& r : results) {
      RETURN_IF_ERROR(r.status());
      inserts += r->inserts;
    }
    const router::CacheStoreStats st = store->GetStats();
    out << absl::StrFormat(
        "durable inserts/s     %12.0f  (%d threads, each insert waits for its commit: %d "
        "inserts in %.3f s, %d commits, %.1f inserts each)\n",
        static_cast<double>(inserts) / wall, n, inserts, wall, st.commits,
        static_cast<double>(st.batches) / static_cast<double>(std::max<int64_t>(1, st.commits)));
  }
  cleanup();
  return absl::OkStatus();
}

absl::Status CacheBenchConfig::Validate() const {
  if (workload_path.empty()) return absl::InvalidArgumentError("--workload is required");
  if (max_cache_size <= 0) return absl::InvalidArgumentError("--max-cache-size must be > 0");
  if (gc_threshold_k < 0) return absl::InvalidArgumentError("--gc-threshold-k must be >= 0");
  if (trajectories_per_version <= 0) {
    return absl::InvalidArgumentError("--trajectories-per-version must be > 0");
  }
  if (limit < 0) return absl::InvalidArgumentError("--limit must be >= 0");
  if (durable_threads < 1 || durable_threads > 1024) {
    return absl::InvalidArgumentError("--durable-threads must be in [1, 1024]");
  }
  return absl::OkStatus();
}

absl::Status RunCacheBench(const CacheBenchConfig& config, std::ostream& out) {
  RETURN_IF_ERROR(config.Validate());
  ASSIGN_OR_RETURN(std::vector<Trajectory> workload,
                   LoadWorkload(config.workload_path, config.limit));

  router::TextCacheOptions options;
  options.max_cache_size = config.max_cache_size;
  options.gc_threshold_k = config.gc_threshold_k;
  const int64_t heap_before = LiveHeapBytes();
  ASSIGN_OR_RETURN(std::unique_ptr<router::TextCache> cache, router::TextCache::Create(options));

  const Clock::time_point start = Clock::now();
  ASSIGN_OR_RETURN(ReplayTimes times, Replay(config, workload, 0, workload.size(), 1, *cache));
  const Clock::duration lookup_time = times.lookup, insert_time = times.insert;
  const int64_t lookups = times.lookups, inserts = times.inserts, turns = times.inserts;
  const int64_t prompt_tokens = times.prompt_tokens, reused_tokens = times.reused_tokens;
  const double wall = Seconds(Clock::now() - start);
  const router::TextCacheStats stats = cache->GetStats();
  const int64_t heap = LiveHeapBytes() - heap_before;
  RETURN_IF_ERROR(cache->ValidateForTesting());

  // Token data proper: id 4 B + logprob 4 B + span end 4 B + mask 1 B.
  constexpr double kTokenDataBytes = 13;
  const double tokens_cached = static_cast<double>(std::max<int64_t>(stats.size_tokens, 1));
  out << "== router text cache (TextCache) ==\n"
      << "tokenizer: word splitter (word + trailing whitespace = 1 token, FNV-1a id), not the "
         "model tokenizer: the figures measure the cache alone\n"
      << absl::StrFormat(
             "trajectories %d, turns %d, weight versions 1..%d, max_cache_size %d, "
             "gc_threshold_k %d\n",
             workload.size(), turns, stats.current_version, config.max_cache_size,
             config.gc_threshold_k)
      << absl::StrFormat("insert ops/s          %12.0f  (%d inserts, %.3f s)\n",
                         static_cast<double>(inserts) / Seconds(insert_time), inserts,
                         Seconds(insert_time))
      << absl::StrFormat("lookup ops/s          %12.0f  (%d lookups, %.3f s)\n",
                         static_cast<double>(lookups) / Seconds(lookup_time), lookups,
                         Seconds(lookup_time))
      << absl::StrFormat("hit rate              %12.4f  (%d hits, %d misses)\n", stats.hit_rate,
                         stats.hits, stats.misses)
      << absl::StrFormat("prompt tokens reused  %12.4f  (%d of %d)\n",
                         static_cast<double>(reused_tokens) /
                             static_cast<double>(std::max<int64_t>(prompt_tokens, 1)),
                         reused_tokens, prompt_tokens)
      << absl::StrFormat("cached tokens         %12d  (%d text bytes, %d nodes)\n",
                         stats.size_tokens, stats.size_bytes, stats.entries)
      << absl::StrFormat("heap bytes/token      %12.2f  (%d bytes in all)\n",
                         static_cast<double>(heap) / tokens_cached, heap)
      << absl::StrFormat(
             "overhead bytes/token  %12.2f  (beyond 13 B of token data; text bytes "
             "%.2f of it)\n",
             static_cast<double>(heap) / tokens_cached - kTokenDataBytes,
             static_cast<double>(stats.size_bytes) / tokens_cached)
      << absl::StrFormat(
             "gc runs %d, gc removed tokens %d, conflicts replaced %d, conflicts kept %d\n",
             stats.gc_runs, stats.gc_removed_tokens, stats.conflicts_replaced, stats.conflicts_kept)
      << absl::StrFormat("replay wall time      %12.3f s (tokenization included)\n", wall);
  if (config.persistence) RETURN_IF_ERROR(RunPersistentReplay(config, workload, stats, out));
  if (!config.seam_tokenizer_dir.empty()) RETURN_IF_ERROR(RunSeamReplay(config, workload, out));
  return absl::OkStatus();
}

}  // namespace rl::bench
