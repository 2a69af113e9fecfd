// AdminLock: the router's one admin lock. It serializes the admin calls that change fleet state
// (pause, continue, flush, weight updates, group calls, sleep / wake) and the catch-up of
// rejoining workers. A caller waits at most `timeout`, then gets UNAVAILABLE instead of queueing
// forever. It is a flag under a mutex, not a mutex held across the call: the broadcast that
// takes it may release it from another thread.
//
// Cost: one mutex acquisition per Acquire / Release. Thread-safe.
#pragma once

#include <chrono>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"

namespace rl::router::admin {

class AdminLock {
 public:
  explicit AdminLock(std::chrono::milliseconds timeout) : timeout_(timeout) {}
  AdminLock(const AdminLock&) = delete;
  AdminLock& operator=(const AdminLock&) = delete;

  // Takes the lock for `what` (named in the error); UNAVAILABLE after waiting `timeout`.
  absl::Status Acquire(const char* what) ABSL_LOCKS_EXCLUDED(mu_);
  // Gives it back (the holder, from any thread).
  void Release() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  const std::chrono::milliseconds timeout_;
  absl::Mutex mu_;
  bool busy_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace rl::router::admin
