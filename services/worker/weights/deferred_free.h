// DeferredFree: frees what a weight update replaced (the weights served before an activation,
// the staged tensors once copied in) on a thread of its own, niced like a stage, after the call
// that replaced them answered. Freeing a model is munmap of gigabytes (tens to hundreds of ms
// of kernel time, with TLB shootdowns on every core of the process): neither the engine thread
// nor the activation's answer waits for it. Memory stays bounded by the one-staged-version rule:
// a new stage or read first waits (Drain) until everything queued is freed, so a stage never
// holds its copy while the old one is still resident.
// The same thread runs other background work of an update in order (Post): the controller keeps
// a second one that hashes applied tensors after the answer (weight_update_controller.h).
// Cost: one thread for the controller's life; a queue of at most a few entries.
// Thread-safe.
#pragma once

#include <memory>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/any_invocable.h"
#include "absl/synchronization/mutex.h"

namespace rl::worker {

class DeferredFree {
 public:
  // The freeing thread runs `nice` levels nicer than the caller (0: the same priority).
  explicit DeferredFree(int nice);
  // Frees everything queued, then joins the thread.
  ~DeferredFree();
  DeferredFree(const DeferredFree&) = delete;
  DeferredFree& operator=(const DeferredFree&) = delete;

  // Queues `value` (a unique_ptr, a vector of tensors, ...) to be destroyed on the thread.
  template <typename T>
  void Free(T value) {
    Post([value = std::move(value)]() mutable { T gone = std::move(value); });
  }
  // Queues `task` to run on the thread (then destroyed there), after everything queued before.
  void Post(absl::AnyInvocable<void()> task);
  // Waits until everything queued before the call has been freed (or run).
  void Drain();
  // Objects freed and tasks run so far (tests).
  int64_t freed() const;

 private:
  void Loop(int nice);

  mutable absl::Mutex mu_;
  std::vector<absl::AnyInvocable<void()>> queue_ ABSL_GUARDED_BY(mu_);
  int64_t queued_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t freed_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace rl::worker
