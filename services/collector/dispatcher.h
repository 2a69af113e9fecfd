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
// (oversample.h) sets `drain` once its batch is complete: no call starts, AbortStartedGroups
// aborts the groups that have calls in flight (Router.Abort by group_id, once per group), and
// a call the router aborts comes back with its partial output instead of being retried.
// Thread safety: Run, CancelInFlight and AbortStartedGroups from any thread. Cost: one gRPC
// stream per attempt; while draining, one Router.Abort per group with a call in flight (plus
// bounded retries of one that failed in transport).
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
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
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
  // Draining: sends Router.Abort(group_id) to each group with a call in flight, once per group
  // for the dispatcher's life; a group none of whose calls started is never aborted (no call
  // starts once draining, so the set is final). A group whose requests are still being written
  // waits for a later call: an abort sent before a request would miss it for sure (the router
  // aborts the members it holds; one written before can still, rarely, arrive after the abort:
  // that call then runs to its end and is kept whole). An abort that failed in transport
  // (UNAVAILABLE, DEADLINE_EXCEEDED, RESOURCE_EXHAUSTED) is sent again by a later call after a
  // backoff (retry_backoff_ms doubled up to max_backoff_ms), at most max_attempts times in all;
  // any other failure is logged and not repeated. The caller calls it again and again while
  // draining (its writer loop). Returns the Router.Abort calls made.
  int AbortStartedGroups();
  // Cancels every call in flight (on stop: a long generation need not run to its end before
  // the collector can save and exit). Their samples stay pending for the next run.
  void CancelInFlight();
  // Collects task `t` on connection `slot` (modulo the number of channels), retries included.
  Result Run(const Task& t, size_t slot);

 private:
  // A group's calls in flight (an attempt counts from its start under mu_ to its end).
  struct GroupCalls {
    int running = 0;  // calls started and not ended
    int unsent = 0;   // of those, calls whose request is not yet written to the router
  };
  // Where a group's Router.Abort stands.
  struct AbortState {
    int attempts = 0;      // Router.Abort calls made
    bool settled = false;  // answered (or failed for good): never sent again
    std::chrono::steady_clock::time_point next_try{};  // after a transport failure
  };

  rl::v1::GenerateRequest BuildRequest(const Task& t, std::string* error) const;
  // One Router.Abort(group_id) call.
  grpc::Status SendAbort(int64_t index);
  // Forgets call `ctx` of group `index`, ended.
  void EndCall(grpc::ClientContext* ctx, int64_t index);

  const CollectConfig& c_;
  const std::atomic<bool>* stop_;
  const std::atomic<bool>* drain_;
  const std::string run_tag_;
  std::vector<std::unique_ptr<rl::v1::Router::Stub>> stubs_;
  absl::Mutex mu_;
  absl::flat_hash_set<grpc::ClientContext*> in_flight_ ABSL_GUARDED_BY(mu_);
  // Groups with a call in flight (an entry is erased when its last call ends).
  absl::flat_hash_map<int64_t, GroupCalls> group_calls_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<int64_t, AbortState> aborts_ ABSL_GUARDED_BY(mu_);
};

// Per-sample sampling seed derived from the base seed, the row index and the sample number.
uint64_t SampleSeed(uint64_t base, int64_t index, int32_t sample);

}  // namespace rl::collector
