// AdminLease: admin fencing across routers. A worker takes control calls (pause, continue,
// flush, weight updates and groups, sleep / wake, the checker) from one router at a time: the
// first router that makes one, naming itself in the `rl-admin-lease-owner` header, holds a lease
// for `rl-admin-lease-ttl-ms`; every later call of the holder, read-only ones included (the
// router renews through them, services/router/admin/lease_keeper.h), extends it. Another owner's
// control call is refused FAILED_PRECONDITION naming the holder until the lease lapses. A call
// that names no owner (an operator's rlctl or grpcurl aimed at the worker, a router run without
// --admin-lease-ttl-ms) is the operator's: it runs, and neither takes nor checks the lease.
// GetServerInfo shows the lease.
//
// Cost: a mutex and a string compare per admin call. Thread-safe.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"

namespace rl::worker {

// The lease metadata of one call.
inline constexpr char kLeaseOwnerHeader[] = "rl-admin-lease-owner";
inline constexpr char kLeaseTtlHeader[] = "rl-admin-lease-ttl-ms";

struct LeaseClaim {
  std::string owner;  // "" = the caller names none
  std::chrono::milliseconds ttl{30000};
};

// The claim of a call from its header values (nullptr: absent). InvalidArgument for an owner
// over 128 bytes or not printable ASCII, a ttl that is not an integer in [100, 3600000].
absl::StatusOr<LeaseClaim> ParseLeaseClaim(const std::string* owner, const std::string* ttl_ms);

class AdminLease {
 public:
  using Clock = std::function<std::chrono::steady_clock::time_point()>;
  explicit AdminLease(Clock clock = [] { return std::chrono::steady_clock::now(); })
      : clock_(std::move(clock)) {}

  // Before a control call `method`: takes or renews the lease for `claim` when it is free,
  // lapsed or the claimant's own; FAILED_PRECONDITION naming the holder and the time left
  // otherwise. An ownerless claim always passes and takes nothing.
  absl::Status Acquire(const LeaseClaim& claim, absl::string_view method) ABSL_LOCKS_EXCLUDED(mu_);
  // Extends the lease when `claim.owner` holds it (after any call of the holder); else nothing.
  void Renew(const LeaseClaim& claim) ABSL_LOCKS_EXCLUDED(mu_);

  struct State {
    std::string owner;          // "" = none held
    int64_t expires_in_ms = 0;  // 0 when none held
  };
  State state() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  const Clock clock_;
  mutable absl::Mutex mu_;
  std::string owner_ ABSL_GUARDED_BY(mu_);
  std::chrono::steady_clock::time_point expiry_ ABSL_GUARDED_BY(mu_);
};

}  // namespace rl::worker
