// The collector's calls to rl-router: one Dispatcher shared by the `concurrency` dispatcher
// threads, each running one Generate call at a time, and the queue that carries finished
// samples from those threads to the writer.
//
// Run() builds the request of one sample (the prompt row's text or ids, the default sampling
// parameters overridden by the row's, a per-sample seed), streams it over one of `channels`
// connections, and retries UNAVAILABLE / RESOURCE_EXHAUSTED / ABORTED / DEADLINE_EXCEEDED and
// aborted finals with jittered exponential backoff, up to max_attempts. After a stop (the
// `stop` flag) no call starts, CancelInFlight cancels those running, and their samples come
// back `cancelled` (they stay pending for the next run). Every sample of a prompt row carries
// the row's group_id (GroupId) and a routing key (the row's "routing_key" field, else the
// group id: the group's samples share a worker's prefix cache, issue 32). Over-sampling
// (oversample.h) sets `drain` once its batch is complete: no call starts, and a call the
// router aborts (AbortGroup) comes back with its partial output instead of being retried.
// Thread safety: Run and CancelInFlight from any thread. Cost: one gRPC stream per attempt.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "grpcpp/grpcpp.h"
#include "rl/v1/router.grpc.pb.h"
#include "services/collector/checkpoint.h"
#include "services/collector/collect_config.h"
#include "services/collector/prompt_set.h"
#include "services/collector/sample.h"

namespace rl::collector {

// One sample to collect: completion `sample` of prompt `row`.
struct Task {
  const PromptRow* row;
  int32_t sample;
  // An aborted sample of an earlier run: resumed within its budget (ResumeFrom by tokens).
  const PartialSample* partial = nullptr;
};

// A finished task as the writer receives it. `cancelled`: the run is stopping and the sample
// stays pending (not recorded).
struct Result {
  SampleRecord record;
  bool cancelled = false;
  bool exited = false;  // a dispatcher thread ended (wakes the writer)
  int retries = 0;
  // Draining: the router aborted the call and it had output (the record holds only its key).
  std::optional<PartialSample> partial;
};

// Mutex + condition-variable queue from the dispatcher threads to the writer.
class ResultQueue {
 public:
  void Push(Result r);
  // Waits until `deadline` for a result.
  std::optional<Result> PopUntil(std::chrono::steady_clock::time_point deadline);

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Result> q_;  // guarded by mu_
};

class Dispatcher {
 public:
  // `config`, `stop` and `drain` (may be null) must outlive the dispatcher. `run_tag` makes
  // the run's group ids its own (Router.Abort by group_id reaches this run's calls only).
  Dispatcher(const CollectConfig& config, const std::atomic<bool>* stop,
             const std::atomic<bool>* drain = nullptr, std::string run_tag = "");

  bool Stopping() const {
    return (stop_ != nullptr && stop_->load()) || (drain_ != nullptr && drain_->load());
  }
  bool Draining() const { return drain_ != nullptr && drain_->load(); }
  // The group id of prompt row `index` in this run.
  std::string GroupId(int64_t index) const;
  // Router.Abort(group_id): the group's calls in flight end with their partial output.
  absl::Status AbortGroup(int64_t index);
  // Cancels every call in flight (on stop: a long generation need not run to its end before
  // the collector can save and exit). Their samples stay pending for the next run.
  void CancelInFlight();
  // Collects task `t` on connection `slot` (modulo the number of channels), retries included.
  Result Run(const Task& t, size_t slot);

 private:
  rl::v1::GenerateRequest BuildRequest(const Task& t, std::string* error) const;

  const CollectConfig& c_;
  const std::atomic<bool>* stop_;
  const std::atomic<bool>* drain_;
  const std::string run_tag_;
  std::vector<std::unique_ptr<rl::v1::Router::Stub>> stubs_;
  std::mutex mu_;
  absl::flat_hash_set<grpc::ClientContext*> in_flight_;  // guarded by mu_
};

// Per-sample sampling seed derived from the base seed, the row index and the sample number.
uint64_t SampleSeed(uint64_t base, int64_t index, int32_t sample);

}  // namespace rl::collector
