// Router text-cache benchmark: replays a multi-turn workload (bench/README.md format) through
// TextCache turn by turn, as the router does, and reports insert and lookup throughput, hit
// rate, cached tokens and heap bytes per cached token.
//
// Turn k of a trajectory: Match(system + user_1 + assistant_1 + ... + user_k); the unmatched
// rest is tokenized (mask 0, logprob NaN); assistant_k is tokenized as generated tokens (mask 1,
// a fake logprob); the whole text is inserted at the trajectory's weight version. Tokenization
// is a word splitter (a word and its trailing whitespace is one token, id = FNV-1a % 151936),
// the same as bench/router/seed_trie_bench.py, so the figures measure the cache alone. Only
// Match and Insert calls are timed. With a seam tokenizer, a second replay resolves every prompt
// through ResolveTextPrompt (cached generated tokens reused, the rest encoded as the full text,
// decode(tokens) == text checked) with the real tokenizer, and reports the resolve rate and the
// shares of seam continuations and whole-text fallbacks. Heap bytes come from heap_counter (the
// binary must link it). With persistence (the default) the replay runs again over the durable
// store (cache_store.h): Insert-call throughput, time until the last insert is durable, the
// router's pattern (threads each waiting for their commit), and recovery of the whole cache.
#pragma once

#include <cstdint>
#include <ostream>
#include <string>

#include "absl/status/status.h"

namespace rl::bench {

struct CacheBenchConfig {
  std::string workload_path;
  int64_t max_cache_size = int64_t{1} << 40;  // tokens; the default never collects
  int64_t gc_threshold_k = 5;
  int64_t trajectories_per_version = 1000;  // weight version = 1 + index / this
  int64_t limit = 0;                        // replay at most this many trajectories (0: all)
  // Non-empty: also replay through ResolveTextPrompt (the seam check) with this real
  // tokenizer folder and report the share of requests served by whole-text encoding.
  std::string seam_tokenizer_dir;
  int64_t seam_limit = 2000;  // trajectories of that replay
  // Also replay with the durable store (SQLite) and time its recovery.
  bool persistence = true;
  std::string persist_dir;       // its folder (empty: a temporary one, removed after)
  int64_t durable_threads = 16;  // concurrent replayers that wait for their commits

  absl::Status Validate() const;
};

// Replays the workload and writes a report to `out`. NotFound / InvalidArgument for an
// unreadable or malformed workload.
absl::Status RunCacheBench(const CacheBenchConfig& config, std::ostream& out);

}  // namespace rl::bench
