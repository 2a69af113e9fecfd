#include "services/worker/weights/update_lifecycle.h"

#include <chrono>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "spdlog/spdlog.h"

namespace rl::worker {
namespace {

int64_t MicrosSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() -
                                                               start)
      .count();
}

bool Retracted(const engine::EngineContext& ctx) {
  return ctx.paused() && ctx.pause_mode() >= engine::PauseMode::kRetract;
}

// The pause an update holds the engine in: retract (the running requests give up their KV and
// are recomputed on the new weights), or in place for an in-flight update that keeps the KV.
engine::PauseMode UpdatePause(const UpdatePolicy& policy) {
  return policy.keep_kv ? engine::PauseMode::kInPlace : engine::PauseMode::kRetract;
}

}  // namespace

void UpdateLifecycle::NotifyUpdating() const {
  if (deps_.updating_changed) deps_.updating_changed();
}

void UpdateLifecycle::FillStatus(WeightUpdateStatus* out) const {
  absl::MutexLock lock(&mu_);
  out->update_failed = update_failed_;
  out->last_error = last_error_;
}

void UpdateLifecycle::RecordError(std::string message) {
  absl::MutexLock lock(&mu_);
  last_error_ = std::move(message);
}

absl::StatusOr<AdminOutcome> UpdateLifecycle::Run(const char* what, const UpdatePolicy& policy,
                                                  const Apply& apply, Options options) {
  if (policy.weight_version.has_value() && *policy.weight_version < 0) {
    return absl::InvalidArgumentError("weight_version: must be >= 0");
  }
  const auto start = std::chrono::steady_clock::now();
  in_progress_.fetch_add(1);
  NotifyUpdating();
  AdminOutcome out;
  engine::Engine& engine = *deps_.engine;
  // Whether a failure resumes the engine: it was running before this update paused it.
  bool resume_on_failure = false;
  // A self-pausing update pauses in a step of its own, so the pause is published (GetServerInfo
  // shows it) while `apply` holds the engine thread, e.g. receiving. The decision and the pause
  // are one engine-thread step: nothing starts or pauses between them.
  absl::Status status = absl::OkStatus();
  if (options.self_pause && options.pause_step) {
    status = engine.RunOnEngineThread([&](engine::EngineContext& ctx) {
      resume_on_failure = !ctx.paused();
      if (!Retracted(ctx)) ctx.Pause(UpdatePause(policy));
      return absl::OkStatus();
    });
  }
  if (status.ok()) {
    status = engine.RunOnEngineThread([&](engine::EngineContext& ctx) -> absl::Status {
      const bool active = ctx.has_running() || ctx.has_waiting();
      const bool retracted = Retracted(ctx);
      // Decided here, on the engine thread: nothing can start or pause between the check and
      // the pause below. A self-pausing update retracts whatever a Continue let run meanwhile;
      // an in-flight update (keep_kv) keeps whatever runs or is paused in place.
      if (active && !policy.abort_all_requests && !retracted && !options.self_pause &&
          !policy.keep_kv) {
        const engine::ServerInfo info = ctx.info();
        return absl::FailedPreconditionError(absl::StrCat(
            what, ": ", info.scheduler.num_running, " running and ", info.scheduler.num_waiting,
            " waiting requests; pass abort_all_requests or pause with retract first"));
      }
      if (!(options.self_pause && options.pause_step)) resume_on_failure = !ctx.paused();
      if (!retracted) ctx.Pause(UpdatePause(policy));
      if (policy.abort_all_requests) {
        out.num_aborted = ctx.AbortAll(absl::StrCat(what, " aborted it"));
      }
      applies_.fetch_add(1);
      if (absl::Status s = apply(ctx.runner()); !s.ok()) {
        if (!options.failure_keeps_pause && resume_on_failure && !asleep()) ctx.Continue();
        return s;
      }
      const int64_t version = policy.weight_version.value_or(ctx.weight_version() + 1);
      if (policy.keep_kv) {
        // The running requests keep their KV; nothing else computed by the old weights stays
        // (with nothing running this empties the prefix cache, like the flush).
        ctx.set_weight_version(version);
        out.num_kept_kv = ctx.KeepKvThroughUpdate();
      } else {
        RETURN_IF_ERROR(ctx.FlushCache());
        ctx.set_weight_version(version);
      }
      // Asleep: the runner staged the weights (model/sleepable_runner.h); they serve on wake,
      // which resumes the engine.
      if (!policy.keep_pause && !asleep()) ctx.Continue();
      out.weight_version = version;
      return absl::OkStatus();
    });
  }
  in_progress_.fetch_sub(1);
  NotifyUpdating();
  out.duration_us = MicrosSince(start);
  if (deps_.record_duration) deps_.record_duration(out.duration_us / 1e6);
  {
    absl::MutexLock lock(&mu_);
    if (status.ok()) {
      update_failed_ = false;
      last_error_.clear();
    } else if (options.failure_keeps_pause &&
               status.code() != absl::StatusCode::kFailedPrecondition) {
      update_failed_ = true;
      last_error_ = std::string(status.message());
    }
  }
  if (!status.ok()) {
    spdlog::warn("{} failed: {}", what, std::string(status.message()));
    return status;
  }
  out.message = absl::StrCat(
      what, ": weight_version ", out.weight_version,
      policy.keep_kv ? absl::StrCat(" (in flight: ", out.num_kept_kv, " requests kept their KV)")
                     : "",
      policy.keep_pause ? " (kept paused)" : "");
  spdlog::info("{} in {} ms", out.message, out.duration_us / 1000.0);
  return out;
}

}  // namespace rl::worker
