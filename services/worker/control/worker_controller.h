// WorkerController: the worker's WorkerControl (worker_control.h) over the engine, the
// sleepable runner (the asleep state's owner) and the weight-update unit (the update in
// progress). The composition root builds it; it owns the weights checker's snapshot.
// Design: every call that touches the engine runs as one engine-thread step, so its checks and
// its effect are atomic with respect to scheduling; the serving-state observer is told after
// every change this unit makes (the weight-update unit tells the composition root of its own).
// Cost: a pause, continue or flush waits for the engine's current step; a release or resume is
// a model free or load (docs/worker-control.md).
// Thread-safe.
#pragma once

#include <atomic>
#include <functional>
#include <string>

#include "absl/status/statusor.h"
#include "services/worker/control/worker_control.h"
#include "services/worker/engine/engine.h"
#include "services/worker/model/sleepable_runner.h"
#include "services/worker/weights/weight_updates.h"
#include "services/worker/weights/weights_checker.h"

namespace rl::worker {

class WorkerController final : public WorkerControl {
 public:
  struct Deps {
    engine::Engine* engine = nullptr;  // outlives the controller
    // The engine's runner (owned by the engine): touched on the engine thread only, but for
    // released(), read from any thread.
    model::SleepableRunner* runner = nullptr;
    const WeightUpdates* weights = nullptr;  // outlives the controller
    ModelIdentity identity;
    std::string build_version;
    // serving_state() may have changed (sleep or wake). May be empty.
    std::function<void()> serving_changed;
  };
  // Every pointer in `deps` must be set.
  explicit WorkerController(Deps deps);

  absl::StatusOr<AdminOutcome> Pause(engine::PauseMode mode) override;
  absl::StatusOr<AdminOutcome> Drain(absl::Duration timeout) override;
  absl::StatusOr<AdminOutcome> Continue() override;
  absl::StatusOr<AdminOutcome> FlushCache() override;
  absl::StatusOr<AdminOutcome> ReleaseMemory() override;
  absl::StatusOr<AdminOutcome> ResumeMemory() override;
  absl::StatusOr<CheckerResult> CheckWeights(CheckerAction action) override;

  bool asleep() const override { return deps_.runner->released(); }
  // The graceful drain (SIGTERM) begins: serving_state() is kDraining from now on (readiness
  // off), CheckAdmission refuses new generations with UNAVAILABLE (the router retries them on
  // another worker); what runs goes on. Idempotent; never undone.
  void BeginDrain();
  bool draining() const { return draining_.load(std::memory_order_acquire); }
  ServingState serving_state() const override;
  absl::Status CheckAdmission() const override;
  WorkerInfo worker_info() const override;
  const ModelIdentity& model_identity() const override { return deps_.identity; }

 private:
  void NotifyServing() const;

  const Deps deps_;
  WeightsChecker checker_;  // engine thread only
  std::atomic<bool> draining_{false};
};

}  // namespace rl::worker
