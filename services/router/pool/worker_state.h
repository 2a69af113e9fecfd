// WorkerState: the pool's record of one worker as one explicit state machine. Liveness is an
// enum (dead → live ⇄ suspect → dead); beside it only the facts that vary independently of it:
// the operator's `enabled` switch (with the reason when the router disabled it for partial
// weights), the count of admin calls holding it out of routing, the last health answer
// (serving), the reported weight version, the consecutive health outcomes, and the two catch-up
// marks. Transitions are methods that return what the caller must do (cancel the worker's
// calls); the pool calls them under its lock. docs/routing.md draws the machine.
//
// Pure value code: no I/O, no locks, O(1) per transition.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace rl::router {

enum class Liveness {
  kDead,     // not checked yet, failing health checks, or marked dead: its calls are cancelled
  kLive,     // passing health checks
  kSuspect,  // live, but a call failed UNAVAILABLE or its connection dropped: not routed until
             // a health check passes (it may have restarted, at another weight version)
};
const char* LivenessName(Liveness l);

// When health checks change liveness.
struct HealthThresholds {
  int failure_threshold = 2;  // consecutive failures (checks or calls) before dead
  int success_threshold = 1;  // consecutive passed checks before a dead worker is live
};

// One health check's outcome (health_checker.h).
struct HealthReport {
  bool reachable = false;  // health and GetLoad answered (NOT_SERVING included)
  std::string error;       // !reachable: why
  bool serving = false;    // gRPC health SERVING (NOT_SERVING: asleep or updating weights)
  // GetLoad's weight version; unset when GetLoad was refused for want of a data-plane key.
  std::optional<int64_t> weight_version;
  // GetLoad's max_running_requests (0: not reported).
  int32_t max_running_requests = 0;
  // The server answered health but has no rl.v1.Worker service (GetLoad UNIMPLEMENTED): not an
  // rl-worker (e.g. an rl-router).
  bool not_a_worker = false;
  // GetLoad's paused state (issue 31); unset with the version.
  std::optional<bool> paused;
  // GetLoad's instance_id (random per worker process start) and weights_sha256 (the digest of
  // the weights it serves); "" when not reported (an older worker, unknown, GetLoad refused).
  std::string instance_id;
  std::string weights_sha256;
};

class WorkerState {
 public:
  // What a transition asks of the caller.
  // kRestarted: a live worker answered with another instance_id (a new process since the last
  // check): the caller ends the calls open to the old process and reopens its registry; a
  // rejoin is pending (its pause state and version are reconciled, as after a revival).
  enum class Change { kNone, kDied, kRevived, kRestarted };

  Liveness liveness() const { return liveness_; }
  bool live() const { return liveness_ != Liveness::kDead; }  // suspect included
  bool enabled() const { return enabled_; }
  // Why it is disabled: "" when an operator did it.
  const std::string& disabled_reason() const { return disabled_reason_; }
  int holds() const { return holds_; }
  bool serving() const { return serving_; }
  // Paused, as its last health check's GetLoad said. A paused worker is routed only while the
  // fleet is paused (the router's own pause: requests queue there until the continue).
  bool paused() const { return paused_; }
  // A fleet-wide continue reached it.
  void ClearPaused() { paused_ = false; }
  int64_t weight_version() const { return weight_version_; }  // -1: never reported
  // Requests its engine runs at once, as it reported (0: not reported).
  int32_t max_running_requests() const { return max_running_requests_; }
  int failures() const { return failures_; }
  // The last health or call failure (shown while dead).
  const std::string& last_error() const { return last_error_; }
  // The process's instance_id as last reported ("" unknown), and the restarts seen by a new one.
  const std::string& instance_id() const { return instance_id_; }
  int64_t restarts() const { return restarts_; }
  // The digest of its weights as last reported ("" unknown).
  const std::string& weights_sha256() const { return weights_sha256_; }
  bool syncing() const { return syncing_; }
  bool rejoin_pending() const { return rejoin_pending_; }

  // Reports a version older than the fleet's (`fleet_version` -1: none recorded).
  bool Behind(int64_t fleet_version) const {
    return fleet_version >= 0 && weight_version_ < fleet_version;
  }
  // Reports a version other than `reference`, the fleet's (the recorded fleet version, else the
  // newest live one; -1: none known, nothing differs).
  bool Differs(int64_t reference) const { return reference >= 0 && weight_version_ != reference; }
  // Live and not suspect, enabled, held by no admin call, serving, at the fleet's version
  // (`reference`, see Differs): a worker at another version is never routed.
  bool Routable(int64_t reference) const {
    return liveness_ == Liveness::kLive && enabled_ && holds_ == 0 && serving_ &&
           !Differs(reference);
  }

  // ---- operator and admin transitions ----
  // The operator's switch; either way it clears the reason (enabling also undoes DisablePartial).
  void SetEnabled(bool enabled);
  // Out of routing until enabled or ClearPartial: its weights may be partial (`reason` shown).
  void DisablePartial(std::string reason);
  // Undoes DisablePartial (a resync brought known weights); an operator's disable stays.
  void ClearPartial();
  // Admin calls holding it out of routing (nested); Release below zero is ignored.
  void Hold() { ++holds_; }
  void Release() {
    if (holds_ > 0) --holds_;
  }
  // A version reported by a response or an admin result; the digest last reported is forgotten
  // when the version moved (it was the old version's).
  void ReportVersion(int64_t version) {
    if (version != weight_version_) weights_sha256_.clear();
    weight_version_ = version;
  }

  // ---- health transitions ----
  // A call to it failed UNAVAILABLE: suspect (live) and one failure more; kDied when that makes
  // `failure_threshold` and it was live.
  Change OnCallFailed(const HealthThresholds& t);
  // Its connection was found not READY when picked: suspect until a check passes.
  void OnConnectionLost();
  // Dead now, with `reason` (a missed admin deadline, a hang); its failure count is raised to
  // the threshold. Always kDied: the caller cancels its calls (again).
  Change MarkDead(const std::string& reason, const HealthThresholds& t);
  // One health check. A failure counts toward `failure_threshold` (kDied when reached while
  // live). A live worker that reports another instance_id than before restarted: kRestarted
  // (its version, serving and paused state are the new process's, from this report). A pass clears
  // failures and suspicion, records serving and version, and readmits a dead worker after
  // `success_threshold` passes in a row when its version may serve: any version when the fleet has
  // one recorded (`fleet_version` >= 0: an older one is then caught up or listed stale, never
  // routed), else only the newest live version (`newest_live` -1: none live). kRevived then (the
  // caller reopens its calls; a rejoin is pending).
  Change OnHealthCheck(const HealthReport& report, const HealthThresholds& t, int64_t fleet_version,
                       int64_t newest_live);

  // ---- catch-up hand-off ----
  // True (and marks it syncing, the rejoin consumed) when it should go to the catch-up handler
  // now: live, not syncing already, and behind a replayable fleet version or just rejoined.
  bool TakeForCatchUp(bool behind_replayable);
  // The catch-up handler is done with it (whatever the outcome).
  void FinishSync() { syncing_ = false; }

 private:
  Change Kill(const std::string& reason);

  Liveness liveness_ = Liveness::kDead;
  bool enabled_ = true;
  std::string disabled_reason_;
  int holds_ = 0;
  bool serving_ = true;
  bool paused_ = false;
  int64_t weight_version_ = -1;
  int32_t max_running_requests_ = 0;
  std::string instance_id_;
  int64_t restarts_ = 0;
  std::string weights_sha256_;
  int failures_ = 0;
  int successes_ = 0;
  std::string last_error_ = "not checked yet";
  bool syncing_ = false;         // handed to the catch-up handler, not finished yet
  bool rejoin_pending_ = false;  // came back live: its pause state is reconciled once
};

}  // namespace rl::router
