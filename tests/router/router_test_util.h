// Test helpers for the router tests: a tiny in-process rl-worker (stories260K) and an rl-router
// over a list of workers, both on 127.0.0.1:0, with fast health checks and retries; the
// process's thread count.
#pragma once

#include <dirent.h>

#include <memory>

#include "absl/status/statusor.h"
#include "services/router/router_server.h"
#include "tests/worker/worker_test_util.h"

namespace rl::router::testing {

// Threads of this process now (/proc/self/task).
inline int CountThreads() {
  int n = 0;
  if (DIR* d = opendir("/proc/self/task")) {
    while (dirent* e = readdir(d)) n += e->d_name[0] != '.';
    closedir(d);
  }
  return n;
}

// An rl-worker on stories260K (or `model`), port 0, a small KV cache and one thread; other
// fields of `wc` are kept.
inline absl::StatusOr<std::unique_ptr<worker::WorkerServer>> StartTestWorker(
    worker::WorkerConfig wc = {}, const std::string& model = "") {
  wc.model_path = model.empty() ? worker::testing::Stories() : model;
  wc.port = 0;
  wc.kv_cache_gb = 0.01;
  wc.num_threads = 1;
  return worker::WorkerServer::Start(wc);
}

// An rl-router over `config.workers` with the stories260K tokenizer (or `model`'s), health
// checks every 100 ms and 10 ms retry backoff; other fields of `config` are kept.
inline absl::StatusOr<std::unique_ptr<RouterServer>> StartTestRouter(
    RouterConfig config, const std::string& model = "") {
  config.tokenizer_path = model.empty() ? worker::testing::Stories() : model;
  config.health_interval_ms = 100;
  config.retry_backoff_ms = 10;
  return RouterServer::Start(config);
}

}  // namespace rl::router::testing
