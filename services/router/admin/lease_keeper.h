// LeaseKeeper: renews this router's admin leases (worker side: services/worker/control/
// admin_lease.h). A router takes a worker's lease with its first control call; a thread then
// asks every live worker GetServerInfo with the router's lease claim every ttl / 3, which
// renews the lease where this router holds it (and takes none where it does not). So a router
// keeps its workers for as long as it lives, a second router (an HA standby, a second trainer
// job by mistake) is refused until the first has been gone for one ttl, and a refit longer than
// the ttl never loses its lease midway.
//
// Cost: one GetServerInfo per live worker per ttl / 3, all at once, no admin lock. Thread-safe.
#pragma once

#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "services/router/admin/broadcast.h"

namespace rl::router::admin {

class LeaseKeeper {
 public:
  // Starts the thread when the broadcaster asks a lease (options().lease_owner set); the
  // broadcaster must outlive this.
  explicit LeaseKeeper(const Broadcaster* broadcaster);
  ~LeaseKeeper();  // stops the thread after the round in progress
  LeaseKeeper(const LeaseKeeper&) = delete;
  LeaseKeeper& operator=(const LeaseKeeper&) = delete;

  // One renewal round now (tests; the thread runs them).
  void RenewOnce() const;

 private:
  void Loop() ABSL_LOCKS_EXCLUDED(mu_);

  const Broadcaster* const broadcaster_;
  absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace rl::router::admin
