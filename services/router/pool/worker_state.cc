#include "services/router/pool/worker_state.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"

namespace rl::router {

const char* LivenessName(Liveness l) {
  switch (l) {
    case Liveness::kDead:
      return "dead";
    case Liveness::kLive:
      return "live";
    case Liveness::kSuspect:
      return "suspect";
  }
  return "?";
}

void WorkerState::SetEnabled(bool enabled) {
  enabled_ = enabled;
  disabled_reason_.clear();
}

void WorkerState::DisablePartial(std::string reason) {
  enabled_ = false;
  disabled_reason_ = std::move(reason);
}

void WorkerState::ClearPartial() {
  if (!enabled_ && !disabled_reason_.empty()) {
    enabled_ = true;
    disabled_reason_.clear();
  }
}

WorkerState::Change WorkerState::Kill(const std::string& reason) {
  last_error_ = reason;
  successes_ = 0;
  liveness_ = Liveness::kDead;
  return Change::kDied;
}

WorkerState::Change WorkerState::OnCallFailed(const HealthThresholds& t) {
  successes_ = 0;
  if (liveness_ == Liveness::kLive) liveness_ = Liveness::kSuspect;
  if (++failures_ >= t.failure_threshold && live()) {
    return Kill(absl::StrCat("marked dead after ", failures_, " failed calls"));
  }
  return Change::kNone;
}

void WorkerState::OnConnectionLost() {
  if (liveness_ == Liveness::kLive) liveness_ = Liveness::kSuspect;
}

WorkerState::Change WorkerState::MarkDead(const std::string& reason, const HealthThresholds& t) {
  failures_ = std::max(failures_, t.failure_threshold);
  return Kill(reason);
}

WorkerState::Change WorkerState::OnHealthCheck(const HealthReport& report,
                                               const HealthThresholds& t, int64_t fleet_version,
                                               int64_t newest_live) {
  if (!report.reachable) {
    successes_ = 0;
    last_error_ = absl::StrCat("health check: ", report.error);
    if (++failures_ >= t.failure_threshold && live()) return Kill(last_error_);
    return Change::kNone;
  }
  failures_ = 0;
  if (liveness_ == Liveness::kSuspect) liveness_ = Liveness::kLive;
  // A new process behind the same address since the last check (restarted within one health
  // interval, so no check failed): what the old one reported no longer holds.
  const bool restarted =
      !report.instance_id.empty() && !instance_id_.empty() && report.instance_id != instance_id_;
  if (!report.instance_id.empty()) instance_id_ = report.instance_id;
  if (restarted) {
    ++restarts_;
    weights_sha256_.clear();
    max_running_requests_ = 0;
  }
  if (report.weight_version.has_value()) {
    weight_version_ = *report.weight_version;
    weights_sha256_ = report.weights_sha256;
  }
  if (report.max_running_requests > 0) max_running_requests_ = report.max_running_requests;
  serving_ = report.serving;
  if (report.paused.has_value()) paused_ = *report.paused;
  if (live()) {
    if (!restarted) return Change::kNone;
    // As a restart seen by failed checks would be handled once it answers again: its calls to
    // the old process end, and it is reconciled with the fleet (pause state, version).
    rejoin_pending_ = true;  // a catch-up of the old process in progress finishes first
    return Change::kRestarted;
  }
  ++successes_;
  const bool version_may_serve =
      fleet_version >= 0 || newest_live < 0 || weight_version_ >= newest_live;
  if (successes_ < t.success_threshold || !version_may_serve) return Change::kNone;
  liveness_ = Liveness::kLive;
  successes_ = 0;
  last_error_.clear();
  rejoin_pending_ = true;
  return Change::kRevived;
}

bool WorkerState::TakeForCatchUp(bool behind_replayable) {
  if (!live() || syncing_ || !(behind_replayable || rejoin_pending_)) return false;
  syncing_ = true;
  rejoin_pending_ = false;
  return true;
}

}  // namespace rl::router
