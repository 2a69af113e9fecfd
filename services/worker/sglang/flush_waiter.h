// FlushWaiter: SGLang's FlushCache{timeout_s}: a flush retried until the engine is idle, for up
// to each caller's deadline. Callers are answered once each, with the last attempt's status.
// Design: the attempts run on the worker's admin executor (never a gRPC thread, and no thread
// of its own): while any caller waits, one pump task tries the flush, answers every caller
// whose flush succeeded, failed for another reason than FAILED_PRECONDITION (not idle) or
// whose deadline passed, and polls again after `poll` (the engine publishes no idle event).
// At most `max_waiting` callers wait; more, or a full executor, answer RESOURCE_EXHAUSTED at
// once. Shutdown answers whoever still waits with UNAVAILABLE at once; the destructor waits for
// the pump to leave (the composition root destroys the executor, which runs or finishes the
// pump, before this waiter).
// Cost: one executor thread while anyone waits; one engine round trip per poll.
// Thread-safe.
#pragma once

#include <cstddef>
#include <functional>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/bounded_executor.h"

namespace rl::worker {

class FlushWaiter {
 public:
  // Answers one caller with the flush's final status.
  using Done = absl::AnyInvocable<void(const absl::Status&) &&>;

  // `try_flush` flushes or says why not (FAILED_PRECONDITION: not idle). `executor` outlives
  // this waiter's Shutdown.
  FlushWaiter(std::function<absl::Status()> try_flush, BoundedExecutor* executor,
              size_t max_waiting, absl::Duration poll);
  // Shutdown(), then waits until no pump task is queued or running.
  ~FlushWaiter();
  FlushWaiter(const FlushWaiter&) = delete;
  FlushWaiter& operator=(const FlushWaiter&) = delete;

  // Tries until `deadline` (the first try happens even when it has passed); `done` runs once,
  // on the pump (or inline when refused).
  void Add(absl::Time deadline, Done done);
  // Answers the waiting callers "worker shutting down" (UNAVAILABLE) and refuses new ones;
  // never waits for the engine. Idempotent.
  void Shutdown();

 private:
  struct Waiting {
    absl::Time deadline;
    Done done;
  };
  void Pump();

  const std::function<absl::Status()> try_flush_;
  BoundedExecutor* const executor_;
  const size_t max_waiting_;
  const absl::Duration poll_;

  absl::Mutex mu_;
  absl::CondVar cv_;  // stopping_ set, or the pump left
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool pumping_ ABSL_GUARDED_BY(mu_) = false;  // a pump task is queued or running
  std::vector<Waiting> waiting_ ABSL_GUARDED_BY(mu_);
};

}  // namespace rl::worker
