// PauseGuard: bounds how long SGLang scheduler requests wait on a worker that does not generate
// (paused by PauseGeneration, or by a weight update). The gateway (SMG 1.13) sets no deadline
// on Generate, and a plain pause leaves HealthCheck healthy, so without a bound a request
// routed to a paused worker would wait for as long as the pause lasts.
//
// Once the worker has been paused for `max_wait` without a break, every tracked request still
// in flight is aborted with a message naming the bound (its call ends UNAVAILABLE, which the
// gateway retries on another worker), and new requests are refused with UNAVAILABLE until the
// worker resumes. A shorter pause costs a request only the wait. The pause is sampled every
// `poll` by one thread (Start, joined by Shutdown), so the bound holds within one poll.
// Cost: a map insert and erase per request under a mutex; the thread wakes every poll.
// Thread-safe.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace rl::worker {

class PauseGuard {
 public:
  // Whether the engine is paused now (never waits for the engine).
  using PausedFn = std::function<bool()>;
  // Ends request `id` with `why` (must not wait for the engine: called on the poll thread).
  using AbortFn = std::function<void(const std::string& id, const std::string& why)>;

  PauseGuard(PausedFn paused, AbortFn abort, absl::Duration max_wait,
             absl::Duration poll = absl::Milliseconds(50));
  ~PauseGuard();
  PauseGuard(const PauseGuard&) = delete;
  PauseGuard& operator=(const PauseGuard&) = delete;

  // Starts the poll thread. Call once.
  void Start();
  // Stops and joins the poll thread; nothing is aborted after it returns. Idempotent.
  void Shutdown();

  // OK, or UNAVAILABLE while the worker has been paused for longer than max_wait.
  absl::Status CheckAdmission() const;
  // Tracks request `id` until Untrack(token). Call before the request reaches the engine.
  uint64_t Track(std::string id);
  void Untrack(uint64_t token);

  // One sample of the pause state at `now`: the poll thread's step (tests call it directly,
  // with a PauseGuard that was never started).
  void Tick(absl::Time now);

 private:
  void Loop();

  const PausedFn paused_;
  const AbortFn abort_;
  const absl::Duration max_wait_;
  const absl::Duration poll_;

  mutable absl::Mutex mu_;
  std::optional<absl::Time> paused_since_ ABSL_GUARDED_BY(mu_);  // first sample that saw it
  bool overdue_ ABSL_GUARDED_BY(mu_) = false;                    // paused for max_wait or longer
  uint64_t next_token_ ABSL_GUARDED_BY(mu_) = 1;
  absl::flat_hash_map<uint64_t, std::string> tracked_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace rl::worker
