// Admission: the router's bound on concurrent generations, with a fair queue in front of it.
//
// At most `max_in_flight` generations hold a slot (0: automatic, the bound follows SetLimit:
// the router sets it to the workers' capacity, what they run at once, so that requests wait here
// in fair queues rather than in a worker's FIFO queue); up to `max_queued` more wait in
// per-client queues (a client is the caller's `rl-client-id` metadata header when set, else its
// peer address, i.e. its connection). A freed slot goes to the clients' queues in turn (round
// robin), so a client with 5,000 waiting streams delays another client by at most one
// generation per slot. When the queue is full, a newcomer whose client has fewer waiting
// requests than the longest queue takes the place of that queue's newest request (which ends
// RESOURCE_EXHAUSTED); otherwise the newcomer is refused at once with RESOURCE_EXHAUSTED naming
// the bound. Thread-safe; Admit/Withdraw/Release are O(#queued of one client + #clients).
#pragma once

#include <cstdint>
#include <deque>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace rl::router {

struct AdmissionOptions {
  int max_in_flight = 0;  // 0: automatic (SetLimit)
  int max_queued = 16384;
};

class Admission {
 public:
  // A request waiting for a slot.
  class Waiter {
   public:
    // Once per queued waiter (never after a successful Withdraw), outside the admission's
    // lock: OK when it got a slot (Release it when done), RESOURCE_EXHAUSTED when another
    // client's request took its place in a full queue.
    virtual void Admitted(const absl::Status& status) = 0;

   protected:
    ~Waiter() = default;
  };
  enum class Result { kAdmitted, kQueued };

  explicit Admission(AdmissionOptions options)
      : options_(options), limit_(options.max_in_flight > 0 ? options.max_in_flight : 1) {}

  // kAdmitted: a slot is held now. kQueued: `waiter` is called later (or Withdraw it).
  // RESOURCE_EXHAUSTED naming the bound when no slot and no queue place is left for `client`.
  absl::StatusOr<Result> Admit(const std::string& client, Waiter* waiter);
  // A queued waiter gives up: true when it was still queued (it will not be called).
  bool Withdraw(const std::string& client, Waiter* waiter);
  // Frees one slot; the next client's oldest waiter gets it (unless a lowered bound is passed).
  void Release();
  // The in-flight bound of an automatic admission (ignored with a fixed max_in_flight); a
  // raised bound admits waiters at once, in turn.
  void SetLimit(int limit);

  int limit() const;
  int in_flight() const;
  int queued() const;
  const AdmissionOptions& options() const { return options_; }

 private:
  const AdmissionOptions options_;
  mutable absl::Mutex mu_;
  int limit_ ABSL_GUARDED_BY(mu_);
  int in_flight_ ABSL_GUARDED_BY(mu_) = 0;
  int queued_ ABSL_GUARDED_BY(mu_) = 0;
  absl::flat_hash_map<std::string, std::deque<Waiter*>> queues_ ABSL_GUARDED_BY(mu_);
  std::deque<std::string> turns_ ABSL_GUARDED_BY(mu_);  // clients with waiters, next first
};

}  // namespace rl::router
