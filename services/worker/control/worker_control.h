// WorkerControl: the worker's control plane as the services see it: pause / continue / flush,
// sleep / wake (ReleaseMemory / ResumeMemory), the weights checker, and the worker's state
// (asleep, serving state, what GetServerInfo and GetModelInfo report). AdminService and
// SglangService translate protos to it; WorkerController implements it over the engine, the
// sleepable runner and the weight-update unit; tests use fakes.
//
// Design: one owner per fact. The asleep state is the sleepable runner's (released()); the
// update in progress is the weight-update unit's; the serving state is derived from both here
// and nowhere else. Semantics and how later features (readiness vs liveness, drain, admin
// leases) fit: docs/worker-control.md.
// Thread-safety: every call from any thread; the state accessors never wait for the engine.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "services/worker/engine/engine.h"
#include "services/worker/weights/weight_updates.h"
#include "services/worker/weights/weights_checker.h"

namespace rl::worker {

// Whether the worker takes new work, and if not, why. Readiness, in health-check terms.
enum class ServingState {
  kServing,
  kAsleep,    // memory released (ReleaseMemory)
  kUpdating,  // a weight update holds (or is about to hold) the engine
  kDraining,  // shutting down (SIGTERM): finishes what runs, takes nothing new
};
// "serving", "asleep (memory released)", "weight update in progress", "draining (shutting
// down)".
const char* ServingStateName(ServingState state);

enum class CheckerAction { kSnapshot, kResetTensors, kCompare, kChecksum };

// What GetModelInfo reports beside the architecture (fixed for the life of the process).
struct ModelIdentity {
  std::string model_path;
  std::string backend;  // "cpu" | "cuda"
  int64_t num_parameters = 0;
  std::string config_json;  // the model folder's config.json as read at start
};

// What GetServerInfo reports beside the engine's snapshot.
struct WorkerInfo {
  bool asleep = false;
  std::string backend;
  std::string version;  // the build's version
  // The last distributed weight update failed and left the engine paused.
  bool update_failed = false;
  std::string last_error;
  std::vector<std::string> weight_update_groups;
  StagedStatus staged;  // the staged version, if any
};

class WorkerControl {
 public:
  virtual ~WorkerControl() = default;

  // ---- scheduling (engine.h has the pause modes' semantics) ----
  virtual absl::StatusOr<AdminOutcome> Pause(engine::PauseMode mode) = 0;
  // Drain pause (Engine::Drain): running and queued requests finish, new ones wait for the
  // continue; returns once drained or after `timeout` with what is still active.
  virtual absl::StatusOr<AdminOutcome> Drain(absl::Duration timeout) {
    return absl::UnimplementedError("drain pause");
  }
  // FAILED_PRECONDITION while asleep.
  virtual absl::StatusOr<AdminOutcome> Continue() = 0;
  // FAILED_PRECONDITION while requests are active (see Engine::FlushCache).
  virtual absl::StatusOr<AdminOutcome> FlushCache() = 0;

  // ---- sleep / wake ----
  // Frees weights and KV cache. FAILED_PRECONDITION while requests are active. Idempotent.
  virtual absl::StatusOr<AdminOutcome> ReleaseMemory() = 0;
  // Re-creates them with the last (or staged) weights and resumes. Idempotent.
  virtual absl::StatusOr<AdminOutcome> ResumeMemory() = 0;

  // The weights checker (weights/weights_checker.h). FAILED_PRECONDITION while asleep.
  virtual absl::StatusOr<CheckerResult> CheckWeights(CheckerAction action) = 0;

  // ---- state: never waits for the engine ----
  virtual bool asleep() const = 0;
  virtual ServingState serving_state() const = 0;
  bool serving() const { return serving_state() == ServingState::kServing; }
  // OK when new generation requests are admitted; else why (FAILED_PRECONDITION while asleep).
  virtual absl::Status CheckAdmission() const = 0;
  virtual WorkerInfo worker_info() const = 0;
  virtual const ModelIdentity& model_identity() const = 0;
};

}  // namespace rl::worker
