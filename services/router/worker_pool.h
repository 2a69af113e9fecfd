// WorkerPool: the router's view of the rl-worker fleet.
//
// Each worker has a channel and stubs, a health state (live | dead), an operator `enabled` flag
// (routing only; admin broadcasts still reach disabled live workers), a per-broadcast hold, an
// exact in-flight count, the weight version it last reported and a registry of the calls the
// router has open to it. A health thread checks every worker each interval, all at once with
// asynchronous calls (a round costs one health timeout at most, and no thread per worker): gRPC
// health + GetLoad for the version. `failure_threshold` consecutive failures mark it dead,
// `success_threshold` consecutive successes bring it back. Data-plane UNAVAILABLE errors count
// as failures too. Marking a worker dead cancels (TryCancel) every call registered on it, so
// no stream waits on a hung or vanished worker.
//
// Fleet weights: the admin fan-out records the version and source of the last successful weight
// update (SetFleetWeights). A reachable worker that reports an older version is `behind` and
// never routed: when the source is a disk folder the pool hands it to the catch-up handler
// (which replays the update, then Probe()s it), otherwise it is listed as STALE until resynced.
// With no update recorded, a dead worker is readmitted only at the newest live version.
//
// Pick() is round-robin over routable workers (live, enabled, not held by a broadcast, health
// SERVING, not behind, no failed call since the last health check), skipping excluded ones;
// the returned Lease holds one in-flight unit until destroyed. A worker whose connection is not
// READY (it dropped: the process may have restarted, at another weight version) is not picked
// until a health check, which Pick then runs at once, has seen it again. Thread-safe; Pick is
// O(#workers).
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "grpcpp/channel.h"
#include "grpcpp/client_context.h"
#include "rl/v1/admin.grpc.pb.h"
#include "rl/v1/router.pb.h"
#include "rl/v1/worker.grpc.pb.h"

namespace rl::router {

struct PoolOptions {
  std::chrono::milliseconds health_interval{1000};
  std::chrono::milliseconds health_timeout{2000};
  int failure_threshold = 2;
  int success_threshold = 1;
};

// The fleet's weights: what the last successful admin weight update installed.
struct FleetWeights {
  enum class Source { kNone, kDisk, kTensor, kDistributed };
  int64_t version = -1;  // -1: no update recorded
  Source source = Source::kNone;
  std::string path;  // kDisk: the folder
  // A worker behind this version can be brought up to date by replaying the update.
  bool replayable() const { return source == Source::kDisk && version >= 0; }
  std::string Describe() const;  // "disk:DIR", "tensor", "distributed", ""
};

class CallGuard;

// Data-plane channels per worker (Worker::data_stub).
inline constexpr int kDataChannels = 4;

class Worker {
 public:
  explicit Worker(std::string address);
  const std::string& address() const { return address_; }
  rl::v1::Worker::Stub& worker_stub() { return *worker_stub_; }
  // For Generate calls: one of kDataChannels channels in turn (the first is worker_stub's).
  // Each channel has its own HTTP/2 connection (processed by one thread at a time) and its own
  // callback completion queue, whose bookkeeping in Debian's gRPC (built without NDEBUG: a
  // linear scan of the queue's pending operations per completion) then covers a fraction of
  // the streams.
  rl::v1::Worker::Stub& data_stub() {
    return *data_stubs_[next_data_.fetch_add(1, std::memory_order_relaxed) % data_stubs_.size()];
  }
  rl::v1::Admin::Stub& admin_stub() { return *admin_stub_; }
  std::shared_ptr<grpc::Channel> channel() const { return channel_; }
  int32_t in_flight() const { return in_flight_.load(); }

 private:
  friend class WorkerPool;
  friend class Lease;
  friend class CallGuard;
  // Cancels every registered call; later registrations are cancelled at once until Revive.
  void CancelCalls(const std::string& reason);
  void Revive();

  const std::string address_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<rl::v1::Worker::Stub> worker_stub_;
  std::vector<std::unique_ptr<rl::v1::Worker::Stub>> data_stubs_;  // [0] shares channel_
  std::atomic<uint32_t> next_data_{0};
  std::unique_ptr<rl::v1::Admin::Stub> admin_stub_;
  std::atomic<int32_t> in_flight_{0};
  std::atomic<int64_t> served_{0};

  absl::Mutex calls_mu_;
  std::set<CallGuard*> calls_ ABSL_GUARDED_BY(calls_mu_);
  bool dead_ ABSL_GUARDED_BY(calls_mu_) = false;
  std::string dead_reason_ ABSL_GUARDED_BY(calls_mu_);

  // Guarded by the pool's mutex.
  bool live_ = false;
  bool enabled_ = true;
  std::string disabled_reason_;  // why enabled_ is false ("" = an operator did it)
  bool held_ = false;            // out of routing for an admin broadcast's call
  bool serving_ = true;          // gRPC health SERVING (NOT_SERVING: asleep or updating weights)
  bool syncing_ = false;         // handed to the catch-up handler, not finished yet
  bool rejoined_ = false;        // came back live: its pause state is reconciled once
  bool suspect_ = false;  // a call failed UNAVAILABLE: not routed until a health check passes
                          // (it may have restarted at another weight version)
  bool removed_ = false;
  int failures_ = 0;
  int successes_ = 0;
  std::string last_error_;  // last health / call failure (shown while dead)
  int64_t weight_version_ = -1;
};

// Registers one call to a worker for the call's lifetime: when the pool marks the worker dead
// the call is cancelled (ClientContext::TryCancel), also when that happened before the guard
// was made. Not copyable.
class CallGuard {
 public:
  CallGuard(Worker* worker, grpc::ClientContext* ctx);
  ~CallGuard();
  CallGuard(const CallGuard&) = delete;
  CallGuard& operator=(const CallGuard&) = delete;
  // True when the pool cancelled the call; `reason()` then says why the worker was marked dead.
  bool cancelled_by_pool() const { return cancelled_.load(); }
  std::string reason() const;

 private:
  friend class Worker;
  Worker* worker_;
  grpc::ClientContext* ctx_;
  std::atomic<bool> cancelled_{false};
  std::string reason_;  // guarded by worker_->calls_mu_
};

// One in-flight unit on a worker; movable, releases on destruction.
class Lease {
 public:
  Lease() = default;
  explicit Lease(std::shared_ptr<Worker> w);
  Lease(Lease&& other) noexcept = default;
  Lease& operator=(Lease&& other) noexcept;
  ~Lease();
  Worker* operator->() const { return worker_.get(); }
  Worker* get() const { return worker_.get(); }
  explicit operator bool() const { return worker_ != nullptr; }

 private:
  std::shared_ptr<Worker> worker_;
};

// Where a generation's attempts get their worker (generation.h): the pool in the router, a
// fake in tests.
class WorkerSource {
 public:
  virtual ~WorkerSource() = default;
  // A routable worker not in `exclude`; an empty lease when none.
  virtual Lease Pick(const std::set<std::string>& exclude) = 0;
  // True while an admin broadcast holds the pool (see WorkerPool::BeginHold).
  virtual bool held() const = 0;
  virtual void ReportFailure(Worker* w) = 0;
  virtual void ReportVersion(Worker* w, int64_t version) = 0;
};

class WorkerPool final : public WorkerSource {
 public:
  // Called (from the health thread or a reporting thread) with a live worker that is behind a
  // replayable fleet version, or that has just come back live (its pause state may differ from
  // the fleet's). The pool marks it syncing first and calls again for it only after
  // FinishSync. The handler must return quickly (queue the work).
  using CatchUpHandler = std::function<void(std::shared_ptr<Worker>)>;

  explicit WorkerPool(const PoolOptions& options);
  ~WorkerPool() override;  // stops the health thread

  // Adds (idempotent) and checks the worker once before returning; InvalidArgument for an
  // address that is not HOST:PORT.
  absl::Status Add(const std::string& address);
  // Add for many (start-up), the first checks concurrently; the first bad address's error.
  absl::Status AddAll(const std::vector<std::string>& addresses);
  absl::Status Remove(const std::string& address);  // NotFound when unknown
  // Operator switch. Enabling also clears a "weights may be partial" disable.
  absl::Status SetEnabled(const std::string& address, bool enabled);
  // Current state of every worker, sorted by address (reason filled when not routable).
  std::vector<rl::v1::WorkerStatus> List() const;
  void FillList(rl::v1::WorkerListResponse* out) const;

  // Marks a worker's health as (not) serving right away; the next health check refreshes it.
  void SetServing(const std::string& address, bool serving);
  // A routable worker not in `exclude`, round-robin; an empty lease when none.
  Lease Pick(const std::set<std::string>& exclude) override;
  Lease Pick() { return Pick({}); }

  // Holds: an admin broadcast that takes workers out of routing for its duration holds the pool
  // (BeginHold / EndHold, nested). While held, a request that finds no routable worker waits for
  // the broadcast to end instead of failing (router_service.h).
  void BeginHold() { holds_.fetch_add(1); }
  void EndHold() { holds_.fetch_sub(1); }
  bool held() const override { return holds_.load() > 0; }
  // Takes one worker out of routing for an admin call (true) or gives it back (false).
  void SetHeld(Worker* w, bool held);
  // Disables a worker whose weights may be partial; the reason shows in ListWorkers until an
  // operator enables it or a resync succeeds.
  void DisablePartial(Worker* w, const std::string& reason);
  // Clears a DisablePartial (a resync brought the worker to known weights).
  void ClearPartial(Worker* w);

  // Live workers (enabled or not, behind or not): the targets of admin broadcasts.
  std::vector<std::shared_ptr<Worker>> LiveWorkers() const;
  std::shared_ptr<Worker> Find(const std::string& address) const;
  bool IsEnabled(const std::string& address) const;

  // A call to `w` failed with UNAVAILABLE: not routed until the next health check passes (it
  // may be restarting, at another weight version); dead after `failure_threshold` of them.
  void ReportFailure(Worker* w) override;
  // `w` missed an admin deadline or hangs: dead now (its calls are cancelled); health checks
  // bring it back once it answers again.
  void MarkDead(Worker* w, const std::string& reason);
  // `w` reported weight `version` (responses, admin results).
  void ReportVersion(Worker* w, int64_t version) override;
  // Checks one worker now (health + version), as the health thread does.
  void Probe(const std::shared_ptr<Worker>& w);
  // Probe without waiting: both calls asynchronous, `done` runs (on a gRPC thread) once the
  // outcome is applied. The pool must outlive it.
  void ProbeAsync(const std::shared_ptr<Worker>& w, std::function<void()> done);
  // Runs one health round now, every worker at once (tests; the thread does this every
  // interval).
  void CheckAll();
  // The newest weight version among live workers (-1 when none is live).
  int64_t CurrentVersion() const;
  bool VersionMismatch() const;

  void SetFleetWeights(const FleetWeights& fleet);
  FleetWeights fleet_weights() const;
  // The recorded fleet version alone (-1 when none), without copying the source: per request.
  int64_t fleet_version() const;
  // True when `w` is reachable-or-not but reports a version older than the fleet's.
  bool Behind(Worker* w) const;
  void SetCatchUpHandler(CatchUpHandler handler);
  void FinishSync(Worker* w);

 private:
  // Applies one health check's outcome (status, health answer, GetLoad answer).
  void ApplyCheck(const std::shared_ptr<Worker>& w, const grpc::Status& s,
                  const grpc::health::v1::HealthCheckResponse& health,
                  const rl::v1::GetLoadResponse& load, bool version_known);
  void HealthLoop();
  int64_t CurrentVersionLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool BehindLocked(const Worker& w) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool RoutableLocked(const Worker& w) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Marks `w` dead (under mu_); returns true when it was live, so the caller cancels its calls
  // after releasing mu_.
  bool KillLocked(Worker* w, const std::string& reason) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Hands `w` to the catch-up handler when it is live, behind a replayable fleet version and
  // not syncing already. Call without mu_ held.
  void MaybeCatchUp(const std::shared_ptr<Worker>& w);

  const PoolOptions options_;
  mutable absl::Mutex mu_;
  std::atomic<int> holds_{0};
  std::vector<std::shared_ptr<Worker>> workers_ ABSL_GUARDED_BY(mu_);
  size_t next_ ABSL_GUARDED_BY(mu_) = 0;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  bool probe_now_ ABSL_GUARDED_BY(mu_) = false;  // wakes the health thread early
  FleetWeights fleet_ ABSL_GUARDED_BY(mu_);
  absl::Mutex handler_mu_;  // never held together with mu_
  CatchUpHandler catch_up_ ABSL_GUARDED_BY(handler_mu_);
  std::thread health_thread_;
};

}  // namespace rl::router
