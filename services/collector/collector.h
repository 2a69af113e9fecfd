// rl-collect's engine: streams a prompt set through rl-router with bounded concurrency, saves
// results in shards as they complete, checkpoints atomically, resumes, merges.
//
// Threads: `concurrency` dispatcher threads each run one Generate call at a time
// (dispatcher.h: retries with backoff); the calling thread is the only writer: it receives
// finished samples from a queue, writes a shard every `save_batch_size` samples or after
// `idle_flush_ms` without a new result, and after each shard rewrites checkpoint.json durably
// (shard_writer.h). At the end (or with merge_only) the shards are merged into
// trajectories.safetensors + manifest.json (merge.h).
// Invariants: a sample is in checkpoint.json's `completed` only once its shard is durable;
// resuming dispatches exactly the samples not completed (failed ones are retried); the merged
// file holds each sample once (the newest record), sorted by (index, sample).
#pragma once

#include <atomic>
#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "services/collector/collect_config.h"

namespace rl::collector {

struct CollectSummary {
  int64_t total = 0;
  int64_t done = 0;  // samples in the output (ok or failed)
  int64_t failed = 0;
  int64_t this_run = 0;  // samples received this run
  int64_t retries = 0;
  int64_t shards = 0;
  bool merged = false;
  bool interrupted = false;  // stopped by `stop` before everything was collected
  // Batch runs (--batch-groups, oversample.h): groups kept, dropped by the filter, left
  // unfinished (aborted), samples saved in `partials`, and samples resumed from them.
  int64_t kept_groups = 0;
  int64_t dropped_groups = 0;
  int64_t aborted_groups = 0;
  int64_t partials_saved = 0;
  int64_t resumed = 0;
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

}  // namespace rl::collector
