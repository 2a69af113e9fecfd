#include "services/worker/control/worker_controller.h"

#include <chrono>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace rl::worker {
namespace {

int64_t MicrosSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() -
                                                               start)
      .count();
}

}  // namespace

const char* ServingStateName(ServingState state) {
  switch (state) {
    case ServingState::kServing:
      return "serving";
    case ServingState::kAsleep:
      return "asleep (memory released)";
    case ServingState::kDraining:
      return "draining (shutting down)";
    case ServingState::kUpdating:
      return "weight update in progress";
  }
  return "unknown";
}

WorkerController::WorkerController(Deps deps) : deps_(std::move(deps)) {}

void WorkerController::NotifyServing() const {
  if (deps_.serving_changed) deps_.serving_changed();
}

ServingState WorkerController::serving_state() const {
  if (draining()) return ServingState::kDraining;
  if (asleep()) return ServingState::kAsleep;
  if (deps_.weights->updating()) return ServingState::kUpdating;
  return ServingState::kServing;
}

void WorkerController::BeginDrain() {
  draining_.store(true, std::memory_order_release);
  NotifyServing();
}

absl::Status WorkerController::CheckAdmission() const {
  if (draining()) {
    return absl::UnavailableError(
        "the worker is draining (shutting down): new requests are refused; retry on another "
        "worker");
  }
  if (asleep()) {
    return absl::FailedPreconditionError("the worker is asleep (ReleaseMemory); call ResumeMemory");
  }
  return absl::OkStatus();
}

absl::StatusOr<AdminOutcome> WorkerController::Pause(engine::PauseMode mode) {
  const auto start = std::chrono::steady_clock::now();
  engine::Engine& engine = *deps_.engine;
  const engine::ServerInfo before = engine.GetServerInfo();
  RETURN_IF_ERROR(engine.Pause(mode));
  AdminOutcome out;
  out.num_aborted = static_cast<int32_t>(engine.GetServerInfo().scheduler.num_aborted -
                                         before.scheduler.num_aborted);
  out.message = absl::StrCat("paused (", engine::PauseModeName(mode), ")");
  out.weight_version = engine.weight_version();
  out.duration_us = MicrosSince(start);
  return out;
}

absl::StatusOr<AdminOutcome> WorkerController::Drain(absl::Duration timeout) {
  const auto start = std::chrono::steady_clock::now();
  ASSIGN_OR_RETURN(engine::DrainResult r, deps_.engine->Drain(timeout));
  AdminOutcome out;
  out.drained = r.drained;
  out.num_still_active = r.num_still_active;
  out.still_active_ids = std::move(r.still_active_ids);
  out.num_held = r.num_held;
  const engine::ServerInfo info = deps_.engine->GetServerInfo();
  const char* mode = engine::PauseModeName(info.pause_mode);
  out.message =
      r.drained ? absl::StrCat("paused (drain): drained; ", r.num_held,
                               " requests that arrived meanwhile wait for the continue")
                : absl::StrCat("paused (", mode, "): not drained, ", r.num_still_active,
                               " requests still active (", r.num_held, " held for the continue)");
  out.weight_version = deps_.engine->weight_version();
  out.duration_us = MicrosSince(start);
  return out;
}

absl::StatusOr<AdminOutcome> WorkerController::Continue() {
  const auto start = std::chrono::steady_clock::now();
  if (asleep()) {
    return absl::FailedPreconditionError("continue: the worker is asleep; call ResumeMemory");
  }
  RETURN_IF_ERROR(deps_.engine->Continue());
  AdminOutcome out;
  const WeightUpdateStatus updates = deps_.weights->status();
  out.message = updates.update_failed
                    ? "resumed; note: the last weight update failed: " + updates.last_error
                    : "resumed";
  out.weight_version = deps_.engine->weight_version();
  out.duration_us = MicrosSince(start);
  return out;
}

absl::StatusOr<AdminOutcome> WorkerController::FlushCache() {
  const auto start = std::chrono::steady_clock::now();
  RETURN_IF_ERROR(deps_.engine->FlushCache());
  AdminOutcome out;
  out.message = "cache flushed";
  out.weight_version = deps_.engine->weight_version();
  out.duration_us = MicrosSince(start);
  return out;
}

absl::StatusOr<CheckerResult> WorkerController::CheckWeights(CheckerAction action) {
  absl::StatusOr<CheckerResult> result = absl::InternalError("weights checker did not run");
  RETURN_IF_ERROR(deps_.engine->RunOnEngineThread([&](engine::EngineContext& ctx) -> absl::Status {
    if (asleep()) return absl::FailedPreconditionError("weights_checker: the worker is asleep");
    switch (action) {
      case CheckerAction::kSnapshot:
        result = checker_.Snapshot(ctx.runner());
        break;
      case CheckerAction::kResetTensors:
        if (ctx.has_running()) {
          return absl::FailedPreconditionError(
              "weights_checker reset_tensors: requests are running; pause first");
        }
        result =
            checker_.ResetTensors(ctx.runner(), static_cast<uint64_t>(ctx.weight_version()) + 1);
        if (result.ok()) RETURN_IF_ERROR(ctx.FlushCache());
        break;
      case CheckerAction::kCompare:
        result = checker_.Compare(ctx.runner());
        break;
      case CheckerAction::kChecksum:
        result = WeightsChecker::Checksum(ctx.runner());
        break;
    }
    return absl::OkStatus();
  }));
  return result;
}

absl::StatusOr<AdminOutcome> WorkerController::ReleaseMemory() {
  const auto start = std::chrono::steady_clock::now();
  model::SleepableRunner& runner = *deps_.runner;
  absl::Status status = deps_.engine->RunOnEngineThread([&](engine::EngineContext& ctx) {
    if (runner.released()) return absl::OkStatus();
    if (ctx.has_running() || ctx.has_waiting()) {
      return absl::FailedPreconditionError(
          "release_memory: requests are active; pause with abort (or let them finish) first");
    }
    ctx.Pause(engine::PauseMode::kInPlace);
    RETURN_IF_ERROR(ctx.FlushCache());
    return runner.Release();
  });
  RETURN_IF_ERROR(status);
  NotifyServing();
  AdminOutcome out;
  out.message = "memory released (weights and KV cache freed)";
  out.weight_version = deps_.engine->weight_version();
  out.duration_us = MicrosSince(start);
  return out;
}

absl::StatusOr<AdminOutcome> WorkerController::ResumeMemory() {
  const auto start = std::chrono::steady_clock::now();
  model::SleepableRunner& runner = *deps_.runner;
  RETURN_IF_ERROR(deps_.engine->RunOnEngineThread([&](engine::EngineContext& ctx) {
    if (!runner.released()) return absl::OkStatus();
    RETURN_IF_ERROR(runner.Resume());
    ctx.Continue();
    return absl::OkStatus();
  }));
  NotifyServing();
  AdminOutcome out;
  out.message = "memory resumed";
  out.weight_version = deps_.engine->weight_version();
  out.duration_us = MicrosSince(start);
  return out;
}

WorkerInfo WorkerController::worker_info() const {
  WorkerInfo out;
  out.asleep = asleep();
  out.backend = deps_.identity.backend;
  out.version = deps_.build_version;
  WeightUpdateStatus updates = deps_.weights->status();
  out.update_failed = updates.update_failed;
  out.last_error = std::move(updates.last_error);
  out.weight_update_groups = std::move(updates.groups);
  out.staged = std::move(updates.staged);
  return out;
}

}  // namespace rl::worker
