// DrainGate: the one switch a server turns when it starts its graceful drain (SIGTERM): from
// then on the calls that would start new work are refused with UNAVAILABLE and a message naming
// the process, so a client (or the router in front of a worker) retries elsewhere, while what
// already runs is let finish. Services check it where a call starts; the composition root flips
// it once and never back.
// Cost: one atomic load per check. Thread-safe.
#pragma once

#include <atomic>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace rl {

class DrainGate {
 public:
  // `process` names the server in refusals ("rl-router").
  explicit DrainGate(std::string process) : process_(std::move(process)) {}

  // From now on Check refuses. Idempotent.
  void Begin() { draining_.store(true, std::memory_order_release); }
  bool draining() const { return draining_.load(std::memory_order_acquire); }

  // OK while not draining; else UNAVAILABLE naming `what` (the call refused).
  absl::Status Check(absl::string_view what) const {
    if (!draining()) return absl::OkStatus();
    return absl::UnavailableError(absl::StrCat(process_, " is draining (shutting down): ", what,
                                               " refused; retry on another replica"));
  }

 private:
  const std::string process_;
  std::atomic<bool> draining_{false};
};

}  // namespace rl
