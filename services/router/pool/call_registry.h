// CallRegistry: the calls the router has open to one worker, so that marking the worker dead
// cancels every one of them at once (ClientContext::TryCancel) and no stream or admin call waits
// on a hung or vanished process. Calls registered while the worker is dead are cancelled at
// once, until the pool readmits it (Reopen). CallGuard registers one call for its lifetime.
//
// Cost: one set insert and erase per call under a per-worker mutex; CancelAll is O(#calls).
// Thread-safe.
#pragma once

#include <atomic>
#include <set>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "grpcpp/client_context.h"

namespace rl::router {

class CallGuard;

class CallRegistry {
 public:
  CallRegistry() = default;
  CallRegistry(const CallRegistry&) = delete;
  CallRegistry& operator=(const CallRegistry&) = delete;

  // Cancels every registered call, which then reports `reason`; calls registered later are
  // cancelled at once until Reopen.
  void CancelAll(const std::string& reason) ABSL_LOCKS_EXCLUDED(mu_);
  // Calls run normally again (the worker was readmitted).
  void Reopen() ABSL_LOCKS_EXCLUDED(mu_);
  // Calls registered now.
  size_t size() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  friend class CallGuard;
  mutable absl::Mutex mu_;
  std::set<CallGuard*> calls_ ABSL_GUARDED_BY(mu_);
  bool cancelling_ ABSL_GUARDED_BY(mu_) = false;  // between CancelAll and Reopen
  std::string reason_ ABSL_GUARDED_BY(mu_);
};

// Registers one call (its context) in a worker's CallRegistry while it lives; cancelled when the
// worker is marked dead, also when that happened before the guard was made. Destroy it before
// the context. Not copyable.
class CallGuard {
 public:
  CallGuard(CallRegistry* registry, grpc::ClientContext* ctx);
  ~CallGuard();
  CallGuard(const CallGuard&) = delete;
  CallGuard& operator=(const CallGuard&) = delete;
  // True when the registry cancelled the call; `reason()` then says why the worker was marked
  // dead.
  bool cancelled_by_pool() const { return cancelled_.load(); }
  std::string reason() const;

 private:
  friend class CallRegistry;
  CallRegistry* const registry_;
  grpc::ClientContext* const ctx_;
  std::atomic<bool> cancelled_{false};
  std::string reason_ ABSL_GUARDED_BY(registry_->mu_);
};

}  // namespace rl::router
