// Router latency and concurrency: in-process fake workers (tests/router/fake_worker.h: every
// Generate answered at once with a fixed completion, so only RPC and router costs remain).
//
// 1. In-process: an rl-router of this build in the same process; latency of Generate called
//    directly on the worker and through the router (p50 / p99, sequential requests), and
//    requests/s through the router at `concurrency` blocking client threads.
// 2. Side by side (when `router_binaries` is set): each rl-router binary (e.g. the previous
//    build's, blocking thread-per-stream data plane, and this build's) runs as its own process
//    in front of the same fake workers; for low load (sequential) and for each count in
//    `streams` (that many streams kept in flight by asynchronous clients, closed loop):
//    the router process's peak thread count, RSS growth per stream, p50 / p99 latency added over
//    calling the worker directly at the same concurrency, requests/s, the router's CPU time per
//    request, how busy it kept its cores (CPU time / wall time, 100% = one core) and the
//    requests/s one router core sustains at that CPU cost (1e6 / CPU us per request).
//    `router_cpus` pins the router processes to those CPUs (run the bench itself pinned to the
//    others, `bench_cpus`, so the two do not compete for cores).
#pragma once

#include <ostream>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace rl::bench {

struct LatencyBenchConfig {
  std::string tokenizer_dir;  // the router's tokenizer (text prompts)
  int requests = 2000;        // sequential requests per latency measurement
  int concurrency = 32;       // streams in flight for the in-process throughput measurement
  int throughput_requests = 10000;
  int num_workers = 2;
  int completion_tokens = 16;
  // Side by side: "label=PATH" rl-router binaries, and the stream counts to run each at.
  std::vector<std::string> router_binaries;
  std::vector<int> streams = {1000, 10000};
  int rounds = 3;                // requests per stream in the concurrency runs
  std::vector<int> router_cpus;  // empty: not pinned
};

// Pins the calling thread, and so every thread it starts later, to `cpus`.
absl::Status PinToCpus(const std::vector<int>& cpus);

absl::Status RunLatencyBench(const LatencyBenchConfig& config, std::ostream& out);

}  // namespace rl::bench
