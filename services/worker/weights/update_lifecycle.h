// UpdateLifecycle: the one lifecycle every weight update runs, whatever the source (disk,
// tensors, a group's broadcast, a staged receive), and the facts it leaves behind (an update in
// progress, the last failure).
//
// Design: one engine-thread step between two engine steps decides and acts (a self-pausing
// update whose `apply` waits for data first pauses with retract in a step of its own, so the
// pause is visible while `apply` holds the engine; an activation of data already staged does
// not: its pause is the one step): refuse while requests are active (unless abort_all_requests,
// an engine paused with retract, a self-pausing update, or keep_kv), pause (retract; in place
// with keep_kv), abort if asked, apply, flush the prefix cache (keep_kv with running requests:
// keep their KV and evict the rest), bump weight_version, resume unless keep_pause or asleep.
// Full semantics: docs/weight-updates.md.
// Cost: holds the engine thread for the whole `apply` (a swap of weights read ahead, a receive or
// a copy).
// Thread-safe: Run may be called concurrently (the engine thread serializes the updates).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "services/worker/engine/engine.h"
#include "services/worker/model/model_runner.h"
#include "services/worker/model/sleepable_runner.h"
#include "services/worker/weights/weight_updates.h"

namespace rl::worker {

class UpdateLifecycle {
 public:
  struct Deps {
    engine::Engine* engine = nullptr;  // outlives the lifecycle
    // The owner of the asleep state (updates while asleep are staged by it and served on wake,
    // which resumes the engine). Null: never asleep.
    const model::SleepableRunner* sleep = nullptr;
    // updating() may have changed (health). May be empty.
    std::function<void()> updating_changed;
    // An update took `seconds`, successful or not (metrics). May be empty.
    std::function<void(double seconds)> record_duration;
  };
  struct Options {
    // Retract active requests (running, waiting, paused in place) instead of refusing; on a
    // failure resume only an engine that was running.
    bool self_pause = false;
    // With self_pause: pause in an engine-thread step of its own before the one that applies,
    // so the pause is published while `apply` waits (a receive). An apply of data already in
    // memory (an activation) leaves it false: the whole update is then one step, so the running
    // requests lose one step's worth of time at most (plus the apply).
    bool pause_step = false;
    // A failure leaves the engine paused and marks update_failed (distributed buckets).
    bool failure_keeps_pause = false;
  };
  // Changes the served weights; runs on the engine thread with the engine paused.
  using Apply = std::function<absl::Status(model::ModelRunner&)>;

  explicit UpdateLifecycle(Deps deps) : deps_(std::move(deps)) {}

  // Runs one update (see the file comment); `what` names it in messages and logs.
  absl::StatusOr<AdminOutcome> Run(const char* what, const UpdatePolicy& policy, const Apply& apply,
                                   Options options);

  bool updating() const { return in_progress_.load() > 0; }
  // Applies started so far, every source (counted on the engine thread just before `apply`):
  // a reader of the served weights across engine steps (peer_sender.h) sees any change as a
  // new count.
  uint64_t applies() const { return applies_.load(); }
  bool asleep() const { return deps_.sleep != nullptr && deps_.sleep->released(); }
  engine::Engine& engine() const { return *deps_.engine; }
  // Fills update_failed and last_error.
  void FillStatus(WeightUpdateStatus* out) const;
  // Records `message` as the last error without marking update_failed (a failed group join).
  void RecordError(std::string message);

 private:
  void NotifyUpdating() const;

  const Deps deps_;
  std::atomic<int> in_progress_{0};
  std::atomic<uint64_t> applies_{0};
  mutable absl::Mutex mu_;
  bool update_failed_ ABSL_GUARDED_BY(mu_) = false;
  std::string last_error_ ABSL_GUARDED_BY(mu_);
};

}  // namespace rl::worker
