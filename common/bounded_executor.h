// BoundedExecutor: a fixed pool of threads fed by one queue of bounded length, for the blocking
// work that must stay off gRPC's callback threads (tokenizing long prompts, cache inserts,
// admin fan-out calls that wait on workers). Threads are made once in the constructor, so the
// process's thread count does not grow with load; Submit refuses a task (returns false, the
// task is dropped unrun) once `max_queued` tasks are waiting, so callers answer
// RESOURCE_EXHAUSTED instead of queueing without bound. Tasks run in submission order on
// whichever thread is free. Thread-safe. The destructor runs the tasks still queued, then joins.
#pragma once

#include <cstddef>
#include <deque>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"

namespace rl {

class BoundedExecutor {
 public:
  // `num_threads` >= 1 threads named `name` (shown in /proc/PID/task/*/comm, 15 chars max).
  BoundedExecutor(const std::string& name, int num_threads, size_t max_queued);
  ~BoundedExecutor();
  BoundedExecutor(const BoundedExecutor&) = delete;
  BoundedExecutor& operator=(const BoundedExecutor&) = delete;

  // Queues `task` (moved from only then); false when `max_queued` tasks are waiting already
  // (or the executor is stopping): `task` is left to the caller, not run.
  [[nodiscard]] bool Submit(absl::AnyInvocable<void() &&>&& task);
  // RESOURCE_EXHAUSTED naming this executor and its bound (for a refused Submit).
  absl::Status BusyError() const;
  int num_threads() const { return static_cast<int>(threads_.size()); }
  size_t max_queued() const { return max_queued_; }
  size_t queued() const;

 private:
  void Loop();

  const std::string name_;
  const size_t max_queued_;
  mutable absl::Mutex mu_;
  std::deque<absl::AnyInvocable<void() &&>> queue_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_;
};

}  // namespace rl
