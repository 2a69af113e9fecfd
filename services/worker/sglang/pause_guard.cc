#include "services/worker/sglang/pause_guard.h"

#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"

namespace rl::worker {

PauseGuard::PauseGuard(PausedFn paused, AbortFn abort, absl::Duration max_wait, absl::Duration poll)
    : paused_(std::move(paused)), abort_(std::move(abort)), max_wait_(max_wait), poll_(poll) {}

PauseGuard::~PauseGuard() { Shutdown(); }

void PauseGuard::Start() {
  thread_ = std::thread([this] { Loop(); });
}

void PauseGuard::Shutdown() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

absl::Status PauseGuard::CheckAdmission() const {
  absl::MutexLock lock(&mu_);
  if (!overdue_) return absl::OkStatus();
  return absl::UnavailableError(
      absl::StrCat("the worker has been paused for more than ", absl::FormatDuration(max_wait_),
                   " (--sglang-pause-timeout-s): retry on another worker"));
}

uint64_t PauseGuard::Track(std::string id) {
  absl::MutexLock lock(&mu_);
  const uint64_t token = next_token_++;
  tracked_.emplace(token, std::move(id));
  return token;
}

void PauseGuard::Untrack(uint64_t token) {
  absl::MutexLock lock(&mu_);
  tracked_.erase(token);
}

void PauseGuard::Tick(absl::Time now) {
  const bool paused = paused_();
  std::vector<std::string> to_abort;
  {
    absl::MutexLock lock(&mu_);
    if (!paused) {
      paused_since_.reset();
      overdue_ = false;
      return;
    }
    if (!paused_since_.has_value()) paused_since_ = now;
    if (now - *paused_since_ < max_wait_) return;
    overdue_ = true;
    // Every request tracked now ends, also one admitted just before this sample.
    to_abort.reserve(tracked_.size());
    for (auto& [token, id] : tracked_) to_abort.push_back(std::move(id));
    tracked_.clear();
  }
  const std::string why =
      absl::StrCat("the worker was paused for more than ", absl::FormatDuration(max_wait_),
                   " (--sglang-pause-timeout-s)");
  for (const std::string& id : to_abort) abort_(id, why);
}

void PauseGuard::Loop() {
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      mu_.AwaitWithTimeout(absl::Condition(&stopping_), poll_);
      if (stopping_) return;
    }
    Tick(absl::Now());
  }
}

}  // namespace rl::worker
