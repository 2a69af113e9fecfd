// rl-collect's validated configuration: what main.cc fills from the flags (one field per flag)
// and every part of the collector reads. ValidateConfig bounds every field before any work
// starts. Cost: nothing.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/status.h"

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
  int channels = 1;    // gRPC connections to the router
  bool jsonl = false;  // also write a JSONL twin of every shard
  // Ask for the routed experts and their weights (R3, MoE models) and store them in the shards.
  bool return_routed_experts = false;
  std::string progress = "auto";  // auto | bar | log | off
  // Over-sampling (issue 34; services/collector/oversample.h): a run collects a batch of
  // batch_groups groups (0: every row, no batches), submitting ceil(over_sample x batch_groups)
  // of the pending groups, keeping the first batch_groups that complete and pass group_filter
  // (a shell command reading a group as JSON on stdin, answering keep or drop; "": keep all),
  // aborting the rest through the router and saving their partial samples for the next run.
  int64_t batch_groups = 0;
  double over_sample = 1.0;
  std::string group_filter;
};

// InvalidArgument naming the flag at fault.
absl::Status ValidateConfig(const CollectConfig& c);

}  // namespace rl::collector
