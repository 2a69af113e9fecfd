// Broadcaster: the router's admin broadcast engine. Broadcast takes the admin lock, starts one
// asynchronous call per target worker (the live workers, or the named ones), each under its own
// deadline and registered on the worker (cancelled if the pool marks it dead), settles each
// worker's routing as soon as its own call ends, records the fleet's weights and pause state,
// and answers one result per worker. Gather is the read-only form (no lock, no holds).
// docs/router-admin.md has the semantics: deadlines, per-worker outcomes, partial weights.
//
// Cost: a broadcast over N workers holds one thread (the caller's, on the admin executor) and
// N calls in flight, never a thread per worker. Thread-safe.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/blocking_counter.h"
#include "absl/synchronization/mutex.h"
#include "grpcpp/client_context.h"
#include "grpcpp/server_context.h"
#include "rl/v1/admin.grpc.pb.h"
#include "services/router/admin/admin_lock.h"
#include "services/router/pool/worker_pool.h"

namespace rl::router::admin {

struct BroadcastOptions {
  std::chrono::milliseconds lock_timeout{30000};
  // Per-worker deadline of pause / continue / flush / destroy-group and read-only calls.
  std::chrono::milliseconds control_timeout{10000};
  // Per-worker deadline of weight updates, group init, sleep and wake.
  std::chrono::milliseconds load_timeout{600000};
  // Bearer key for calls the router makes on its own (catch-up); empty: none.
  std::string worker_admin_key;
  // Admin fencing (lease_keeper.h): every call to a worker names this router as the owner of
  // the worker's admin lease, held for `lease_ttl`; empty: no lease asked (a lone router).
  std::string lease_owner;
  std::chrono::milliseconds lease_ttl{30000};
};

// The admin client whose call is broadcast; null for the router's own calls (catch-up).
using Ctx = grpc::CallbackServerContext;
// A unary Admin method of the asynchronous (callback) client API.
using AsyncAdmin = rl::v1::Admin::StubInterface::async_interface;
template <typename Req, typename Resp>
using AsyncMethod = void (AsyncAdmin::*)(grpc::ClientContext*, const Req*, Resp*,
                                         std::function<void(grpc::Status)>);
// Called with a call's status, once (on a gRPC thread).
using Done = std::function<void(grpc::Status)>;
// Starts one asynchronous call: (worker, its index among the targets sorted by address,
// context, response, done). The request must live until `done`.
using WorkerCall =
    std::function<void(Worker&, size_t, grpc::ClientContext*, rl::v1::AdminResponse*, Done)>;

enum class Deadline { kControl, kLoad };
// Which failures may leave a worker's weights partial (it then stays out of routing). kDelta: a
// delta group receive (issue 30), built whole on a copy of the served weights and swapped in, so
// only a failure of the swap itself (INTERNAL / UNKNOWN) may.
enum class Partial { kNever, kTensor, kDistributed, kGroup, kDelta };

// How one admin call is broadcast.
struct Plan {
  const char* what = "";
  Deadline deadline = Deadline::kControl;
  // Added to each worker's deadline: the time the call may legitimately wait on the worker
  // (PauseGeneration(drain)'s drain_timeout_ms).
  std::chrono::milliseconds extra_timeout{0};
  bool hold = false;   // hold each target out of routing during its call, probe it after
  bool probe = false;  // probe each target after a successful call (wake)
  Partial partial = Partial::kNever;
  // A weight update: success records the fleet weights (source, path).
  bool bumps_version = false;
  FleetWeights::Source source = FleetWeights::Source::kNone;
  std::string path;
  // After a success on some worker the fleet is paused (true) / running (false); unset: as is.
  std::optional<bool> sets_paused;
  // Non-empty: only these workers (resync), live or not.
  std::vector<std::string> only;
  // `only` names every live worker: a success records the fleet's weights like a broadcast.
  bool whole_fleet = false;
  // Called once every target's call has started, with their number (a streaming call starts
  // feeding them then: tensor_fanout.h).
  std::function<void(size_t)> started;
};

// One worker's outcome.
struct Result {
  grpc::Status status;
  rl::v1::AdminResponse resp;
  bool left_out = false;  // out of routing afterwards (marked dead, or partial weights)
};

// One worker's call in flight (StartOne): its context, registration and outcome.
struct WorkerCallState {
  grpc::ClientContext ctx;
  std::optional<CallGuard> guard;  // destroyed before ctx
  std::chrono::system_clock::time_point deadline;
  Result result;
};

// One worker's answer to a read-only broadcast (Gather).
template <typename Resp>
struct Reply {
  std::string worker;
  grpc::Status status;
  Resp resp;
};

// Starts `method` on `w` with a request the call owns until its callback.
template <typename Req>
void CallOwning(Worker& w, AsyncMethod<Req, rl::v1::AdminResponse> method, Req req,
                grpc::ClientContext* ctx, rl::v1::AdminResponse* out, Done done) {
  auto owned = std::make_shared<Req>(std::move(req));
  (w.admin_stub().async()->*method)(
      ctx, owned.get(), out,
      [owned, done = std::move(done)](grpc::Status s) { done(std::move(s)); });
}

class Broadcaster {
 public:
  Broadcaster(WorkerPool* pool, BroadcastOptions options);
  Broadcaster(const Broadcaster&) = delete;
  Broadcaster& operator=(const Broadcaster&) = delete;

  // Takes the admin lock (bounded wait), starts `call` on every target at once, settles each
  // worker's routing as soon as its call ends and fills `resp` with one result per worker.
  // NotFound for an unknown worker in plan.only; UNAVAILABLE for a held lock or no target.
  absl::Status Broadcast(const Plan& plan, Ctx* caller, const WorkerCall& call,
                         rl::v1::AdminResponse* resp);
  // Broadcast for a caller that holds the admin lock already (lock()), so that several
  // broadcasts can run as one admin operation.
  absl::Status BroadcastLocked(const Plan& plan, Ctx* caller, const WorkerCall& call,
                               rl::v1::AdminResponse* resp);
  // Calls `method` on every live worker at once and waits for all (read-only calls: no admin
  // lock, control deadline).
  template <typename Req, typename Resp>
  std::vector<Reply<Resp>> Gather(Ctx* caller, const Req& req, AsyncMethod<Req, Resp> method) const;
  // Starts one call with the plan's deadline, registered on the worker; `finished` runs once the
  // outcome is in `c->result` (a missed deadline marks the worker dead, UNAVAILABLE counts as a
  // failed call). `plan`, `c` and `w` must outlive it.
  void StartOne(const Plan& plan, Ctx* caller, const std::shared_ptr<Worker>& w, size_t index,
                const WorkerCall& call, WorkerCallState* c, std::function<void()> finished);
  // Deadline and authorization for a call to a worker: the caller's header, or the router's own
  // key when `caller` is null; and the admin lease claim.
  void Prepare(Ctx* caller, grpc::ClientContext* ctx, std::chrono::milliseconds timeout) const;
  std::chrono::milliseconds Timeout(Deadline d) const;

  AdminLock& lock() { return lock_; }
  // Whether the last broadcast that set it left the fleet paused (kept by the pool, which
  // persists it: worker_pool.h SetFleetPaused).
  bool fleet_paused() const;
  WorkerPool* pool() const { return pool_; }
  const BroadcastOptions& options() const { return options_; }

 private:
  // Applies one worker's outcome to the pool (versions, death, partial weights, routing);
  // `settled` runs once the worker is routed again (after an asynchronous health probe where
  // the plan wants one).
  void Settle(const Plan& plan, const std::shared_ptr<Worker>& w, Result* r,
              std::function<void()> settled);
  // The live workers, or the ones plan.only names (NotFound for an unknown one).
  absl::StatusOr<std::vector<std::shared_ptr<Worker>>> Targets(const Plan& plan) const;
  // The broadcast itself, the admin lock held.
  absl::Status BroadcastTo(const Plan& plan, Ctx* caller, const WorkerCall& call,
                           const std::vector<std::shared_ptr<Worker>>& targets,
                           rl::v1::AdminResponse* resp);
  // Records what a successful weight update installed (fleet-wide, or a resync's folder).
  void RecordFleetWeights(const Plan& plan, int64_t version);

  WorkerPool* const pool_;
  const BroadcastOptions options_;
  AdminLock lock_;
};

template <typename Req, typename Resp>
std::vector<Reply<Resp>> Broadcaster::Gather(Ctx* caller, const Req& req,
                                             AsyncMethod<Req, Resp> method) const {
  const auto targets = pool_->LiveWorkers();
  std::vector<Reply<Resp>> out(targets.size());
  auto calls = std::make_unique<WorkerCallState[]>(targets.size());
  absl::BlockingCounter pending(static_cast<int>(targets.size()));
  for (size_t i = 0; i < targets.size(); ++i) {
    out[i].worker = targets[i]->address();
    Prepare(caller, &calls[i].ctx, options_.control_timeout);
    calls[i].guard.emplace(&targets[i]->calls(), &calls[i].ctx);
    (targets[i]->admin_stub().async()->*method)(&calls[i].ctx, &req, &out[i].resp,
                                                [r = &out[i], &pending](grpc::Status s) {
                                                  r->status = std::move(s);
                                                  pending.DecrementCount();
                                                });
  }
  pending.Wait();
  return out;
}

}  // namespace rl::router::admin
