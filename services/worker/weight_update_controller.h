// WeightUpdateController: the weight-update lifecycle of one worker and its weight-update
// groups. WorkerServer (the composition root) builds it over the engine; AdminService calls it.
//
// Weight updates (disk, tensors, distributed) share one lifecycle, run on the engine thread
// between two steps: refuse while requests are active unless abort_all_requests or paused with
// retract → pause (retract) → abort if asked → apply → flush the prefix cache (KV computed with
// the old weights is never reused) → bump weight_version → resume unless keep_pause. A failed
// disk/tensor update leaves the old weights serving (everything is validated before anything
// changes); a failed distributed update leaves the engine paused and marks update_failed.
// CompleteWeightsUpdate and ReceiveWeights pause themselves: the decision is taken on the
// engine thread, where active requests (running, waiting, or paused in place) are retracted
// instead of refusing the update; a failure resumes the engine only if it was running.
// The prefix cache is always flushed: a request's flush_cache is not read (see UpdatePolicy).
// Updates are accepted while asleep: the runner stages them (host memory, or the folder for a
// disk update) and they become the served weights on wake; the version is bumped at the update.
// Health is NOT_SERVING while asleep or while an update holds the engine (updating()).
//
// Groups: one receive at a time per group. A call that receives on a group (per-bucket
// UpdateWeightsFromDistributed, ReceiveWeights, PrepareWeightsUpdate while it posts,
// CompleteWeightsUpdate while it waits and applies) claims it; a second call on a claimed group,
// or a receive on a group with a prepared update, gets FAILED_PRECONDITION naming the group.
// DestroyWeightsUpdateGroup never waits for a claim: it closes the group's receiver (a receive
// in flight fails promptly) and joins a posted receive.
//
// Thread-safe: gRPC handlers call in concurrently; engine state is touched only on its thread.
// Cost: a prepared receive stages every tensor it lists in host memory until Complete.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "common/model_io/model_config.h"
#include "common/request_limits.h"
#include "services/worker/engine/engine.h"
#include "services/worker/model/model_runner.h"
#include "services/worker/weight_sync/weight_sync.h"
#include "services/worker/worker_metrics.h"

namespace rl::worker {

// What an admin call did.
struct AdminOutcome {
  std::string message;
  int32_t num_aborted = 0;
  int64_t weight_version = 0;
  int64_t duration_us = 0;
  bool ready = false;  // PrepareWeightsUpdate: the receive is posted
};

// How an update treats the engine. There is no flush_cache: every update flushes the prefix
// cache (KV computed with the old weights is never reused), so the requests' flush_cache field
// is ignored, by design (README "Semantics worth knowing").
struct UpdatePolicy {
  std::optional<int64_t> weight_version;  // unset: current + 1
  bool abort_all_requests = false;
  bool keep_pause = false;
};

// One tensor of an UpdateWeightsFromTensor stream, assembled.
struct NamedTensor {
  model::TensorInfo info;
  std::vector<uint8_t> bytes;
};

struct GroupRequest {
  std::string master_address;
  int master_port = 0;
  int rank_offset = 0;
  int world_size = 0;
  std::string group_name;
  std::string backend;  // "tcp" | "nccl" | "" (auto)
  int timeout_ms = 60000;
};

// What GetServerInfo reports of the updates.
struct WeightUpdateStatus {
  // The last distributed update failed and left the engine paused (weights may be partial).
  bool update_failed = false;
  std::string last_error;
  std::vector<std::string> groups;  // names, sorted
};

class WeightUpdateController {
 public:
  struct Deps {
    engine::Engine* engine = nullptr;    // outlives the controller
    model_io::ModelConfig model_config;  // what a disk update must match
    RequestLimits limits;                // bounds on a disk update's files
    int cuda_device = 0;                 // nccl groups use it
    WorkerMetrics* metrics = nullptr;    // update durations; may be null
    // Whether the runner is released (updates are staged); null: never asleep.
    std::function<bool()> asleep;
    std::function<void()> updating_changed;  // updating() may have changed; may be null
    // Joins a group (InitWeightsUpdateGroup); null: weight_sync::ConnectReceiver. Tests pass
    // fakes.
    std::function<absl::StatusOr<std::unique_ptr<weight_sync::WeightReceiver>>(
        const weight_sync::GroupOptions&)>
        connect;
  };
  // Reads the served weights' names and shapes once (the engine must be awake): they never
  // change, so checking a request against them never waits for the engine thread.
  static absl::StatusOr<std::unique_ptr<WeightUpdateController>> Create(Deps deps);
  // Shutdown().
  ~WeightUpdateController();
  WeightUpdateController(const WeightUpdateController&) = delete;
  WeightUpdateController& operator=(const WeightUpdateController&) = delete;

  // Closes every group (a receive in flight fails promptly), joins posted receives and forgets
  // the groups. Idempotent; call before the engine goes.
  void Shutdown();

  // An update holds (or is about to hold) the engine.
  bool updating() const { return updates_in_progress_.load() > 0; }
  WeightUpdateStatus status() const;

  absl::StatusOr<AdminOutcome> UpdateWeightsFromDisk(const std::string& model_path,
                                                     const UpdatePolicy& policy);
  // Validates every tensor (name, dtype, shape, byte count) before changing any.
  absl::StatusOr<AdminOutcome> UpdateWeightsFromTensors(std::vector<NamedTensor> tensors,
                                                        const UpdatePolicy& policy);
  absl::StatusOr<AdminOutcome> InitWeightsUpdateGroup(const GroupRequest& request);
  absl::StatusOr<AdminOutcome> UpdateWeightsFromDistributed(const std::string& group_name,
                                                            std::vector<model::TensorInfo> specs,
                                                            const UpdatePolicy& policy);
  absl::StatusOr<AdminOutcome> DestroyWeightsUpdateGroup(const std::string& group_name);
  // Two-phase receive (admin.proto): Prepare validates `buckets` against the served weights and
  // starts receiving them on a background thread (host staging); it answers ready once the
  // first bucket's receive is posted (the receive's error when the group cannot receive). Complete
  // waits for it, then applies everything atomically (self-pausing update). One prepared receive
  // per group at a time. A Complete that fails before applying (e.g. a bad weight_version) keeps
  // the prepared receive for a retry; one whose receive failed, or whose tensors were refused,
  // drops it (the error says which).
  absl::StatusOr<AdminOutcome> PrepareWeightsUpdate(
      const std::string& group_name, std::vector<std::vector<model::TensorInfo>> buckets);
  absl::StatusOr<AdminOutcome> CompleteWeightsUpdate(const std::string& group_name,
                                                     const UpdatePolicy& policy);
  // Single call: pause (retract) → receive `buckets` → apply atomically → resume.
  absl::StatusOr<AdminOutcome> ReceiveWeights(const std::string& group_name,
                                              std::vector<std::vector<model::TensorInfo>> buckets,
                                              const UpdatePolicy& policy);
  // The served weights' names, dtypes and shapes (FAILED_PRECONDITION while asleep).
  absl::StatusOr<std::vector<model::TensorInfo>> ListWeights();
  // The served weights as read at Create (fixed for the life of the process).
  const std::vector<model::TensorInfo>& served_weights() const { return served_; }

 private:
  // A receive PrepareWeightsUpdate posted. The thread writes `posted` before notifying
  // `settled` (once: posted, or ended before posting), and `status` and `tensors`, read after
  // join.
  struct PendingReceive {
    std::thread thread;
    absl::Notification settled;
    bool posted = false;
    absl::Status status;
    std::vector<NamedTensor> tensors;
  };
  // A joined group. Its fields are guarded by mu_; the receiver is shared so a call that
  // receives holds its own reference (DestroyWeightsUpdateGroup closes it, never frees it
  // under that call).
  struct Group {
    std::shared_ptr<weight_sync::WeightReceiver> receiver;
    bool busy = false;  // claimed by a call (see the file comment)
    std::unique_ptr<PendingReceive> pending;
  };
  class Claim;
  // What a call claims a group for: a receive needs no prepared receive on the group, nor
  // does a Prepare; a Complete takes the prepared receive into its claim.
  enum class ClaimFor { kReceive, kPrepare, kComplete };

  struct RunOptions {
    // Retract active requests (running, waiting, paused in place) instead of refusing; on a
    // failure resume only an engine that was running.
    bool self_pause = false;
    // A failure leaves the engine paused and marks update_failed (distributed buckets).
    bool failure_keeps_pause = false;
  };
  // The shared weight-update lifecycle (see the file comment). `apply` runs on the engine
  // thread with the engine paused.
  absl::StatusOr<AdminOutcome> RunWeightUpdate(
      const char* what, const UpdatePolicy& policy,
      const std::function<absl::Status(model::ModelRunner&)>& apply, RunOptions options);
  // Claims `group_name` for the caller: FAILED_PRECONDITION naming the group when it does not
  // exist, is claimed, or has (lacks, for kComplete) a prepared receive.
  absl::StatusOr<Claim> ClaimGroup(const std::string& group_name, ClaimFor what);
  // Checks every bucket against the served weights, then claims the group.
  absl::StatusOr<Claim> CheckAndClaim(const std::string& group_name,
                                      const std::vector<std::vector<model::TensorInfo>>& buckets,
                                      ClaimFor what);
  // Whether `group` is still joined under `name` (not destroyed or shut down meanwhile).
  bool Joined(const std::string& name, const std::shared_ptr<Group>& group) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void NotifyUpdating();

  explicit WeightUpdateController(Deps deps);

  Deps deps_;  // not changed after construction
  std::vector<model::TensorInfo> served_;
  std::atomic<int> updates_in_progress_{0};

  mutable absl::Mutex mu_;
  bool update_failed_ ABSL_GUARDED_BY(mu_) = false;
  std::string last_error_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::shared_ptr<Group>> groups_ ABSL_GUARDED_BY(mu_);
};

}  // namespace rl::worker
