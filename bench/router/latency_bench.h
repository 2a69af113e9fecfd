// Router-vs-direct latency: an in-process "fast worker" (a Worker service that answers every
// Generate at once with a fixed completion, so only RPC and router costs remain) behind an
// in-process rl-router; measures the latency of Generate called directly on the worker and
// through the router (p50 / p99), and requests/s through the router at a given concurrency.
#pragma once

#include <ostream>
#include <string>

#include "absl/status/status.h"

namespace rl::bench {

struct LatencyBenchConfig {
  std::string tokenizer_dir;  // the router's tokenizer (text prompts)
  int requests = 2000;        // sequential requests per latency measurement
  int concurrency = 32;       // streams in flight for the throughput measurement
  int throughput_requests = 10000;
  int num_workers = 2;
  int completion_tokens = 16;
};

absl::Status RunLatencyBench(const LatencyBenchConfig& config, std::ostream& out);

}  // namespace rl::bench
