// rl-collect's engine: streams a prompt set through rl-router with bounded concurrency, saves
// results in shards as they complete, checkpoints atomically, resumes, merges.
//
// Threads: `concurrency` dispatcher threads each run one Generate call at a time (retrying
// UNAVAILABLE / RESOURCE_EXHAUSTED / ABORTED / DEADLINE_EXCEEDED and aborted finals with
// exponential backoff); the calling thread is the only writer: it receives finished samples
// from a queue, writes a shard every `save_batch_size` samples or after `idle_flush_ms`
// without a new result, and after each shard rewrites checkpoint.json durably. At the end (or
// with merge_only) the shards are merged into trajectories.safetensors + manifest.json.
// Invariants: a sample is in checkpoint.json's `completed` only once its shard is durable;
// resuming dispatches exactly the samples not completed (failed ones are retried); the merged
// file holds each sample once (the newest record), sorted by (index, sample).
#pragma once

#include <atomic>
#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "services/collector/checkpoint.h"

namespace rl::collector {

struct CollectConfig {
  std::string router;   // HOST:PORT of rl-router
  std::string prompts;  // JSONL prompt set
  std::string out;      // output folder
  int n = 1;            // samples per prompt (one GRPO group per prompt)
  int concurrency = 64;
  int save_batch_size = 1000;
  int max_new_tokens = 128;
  double temperature = 1.0;
  double top_p = 1.0;
  int64_t seed = -1;  // < 0: unset (random sampling seeds)
  bool merge_only = false;
  std::string api_key;
  int idle_flush_ms = 5000;
  int max_attempts = 10;  // with the default backoff, about 26 s: a router restart
  int retry_backoff_ms = 200;
  int max_backoff_ms = 5000;
  int request_timeout_s = 600;
  int channels = 1;               // gRPC connections to the router
  bool jsonl = false;             // also write a JSONL twin of every shard
  // Ask for the routed experts and their weights (R3, MoE models) and store them in the shards.
  bool return_routed_experts = false;
  std::string progress = "auto";  // auto | bar | log | off
};

absl::Status ValidateConfig(const CollectConfig& c);

struct CollectSummary {
  int64_t total = 0;
  int64_t done = 0;  // samples in the output (ok or failed)
  int64_t failed = 0;
  int64_t this_run = 0;  // samples received this run
  int64_t retries = 0;
  int64_t shards = 0;
  bool merged = false;
  bool interrupted = false;  // stopped by `stop` before everything was collected
  double seconds = 0;
  double cpu_seconds = 0;  // process CPU time during the run
  // CPU time of the calling (writer) thread: the serial part (conversion, shards, checkpoints,
  // merge) that bounds the collector's throughput whatever the concurrency.
  double writer_cpu_seconds = 0;
};

// Runs a collection (or only the merge). `stop`, when set by another thread or a signal
// handler, makes the run stop dispatching, cancel the calls in flight (their samples stay
// pending), save what finished and return (no merge).
absl::StatusOr<CollectSummary> RunCollect(const CollectConfig& config,
                                          const std::atomic<bool>* stop = nullptr);

struct MergeSummary {
  int64_t num_samples = 0;
  int64_t num_failed = 0;
  int64_t num_tokens = 0;
  std::string path;
};

// Merges the shards that `checkpoint` names in `dir` into DIR/trajectories.safetensors and
// DIR/manifest.json.
absl::StatusOr<MergeSummary> MergeShards(const std::string& dir,
                                         const CollectCheckpoint& checkpoint);

// Per-sample sampling seed derived from the base seed, the row index and the sample number.
uint64_t SampleSeed(uint64_t base, int64_t index, int32_t sample);

}  // namespace rl::collector
