#include "services/worker/sglang/flush_waiter.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace rl::worker {

FlushWaiter::FlushWaiter(std::function<absl::Status()> try_flush, BoundedExecutor* executor,
                         size_t max_waiting, absl::Duration poll)
    : try_flush_(std::move(try_flush)),
      executor_(executor),
      max_waiting_(max_waiting),
      poll_(poll) {}

FlushWaiter::~FlushWaiter() {
  Shutdown();
  absl::MutexLock lock(&mu_);
  while (pumping_) cv_.Wait(&mu_);
}

void FlushWaiter::Add(absl::Time deadline, Done done) {
  absl::Status refused;
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) {
      refused = absl::UnavailableError("worker shutting down");
    } else if (waiting_.size() >= max_waiting_) {
      refused = absl::ResourceExhaustedError(
          absl::StrCat("FlushCache: ", max_waiting_, " flushes already wait for idle"));
    } else if (!pumping_ && !executor_->Submit([this] { Pump(); })) {
      refused = absl::ResourceExhaustedError(absl::StrCat(
          "FlushCache: the worker's admin executor is full (", executor_->num_threads(),
          " calls running and ", executor_->max_queued(), " waiting); retry later"));
    } else {
      pumping_ = true;
      waiting_.push_back(Waiting{deadline, std::move(done)});
      cv_.SignalAll();
      return;
    }
  }
  std::move(done)(refused);
}

void FlushWaiter::Pump() {
  std::vector<std::pair<Done, absl::Status>> answers;
  mu_.Lock();
  while (!stopping_ && !waiting_.empty()) {
    mu_.Unlock();
    const absl::Status s = try_flush_();
    mu_.Lock();
    const absl::Time now = absl::Now();
    std::vector<Waiting> keep;
    for (Waiting& w : waiting_) {
      if (s.code() == absl::StatusCode::kFailedPrecondition && now < w.deadline) {
        keep.push_back(std::move(w));
      } else {
        answers.emplace_back(std::move(w.done), s);
      }
    }
    waiting_.swap(keep);
    if (!answers.empty()) {
      mu_.Unlock();
      for (auto& [done, status] : answers) std::move(done)(status);
      answers.clear();
      mu_.Lock();
    }
    if (!stopping_ && !waiting_.empty()) cv_.WaitWithTimeout(&mu_, poll_);
  }
  // Stopping (Shutdown answers the rest) or nobody waits.
  pumping_ = false;
  cv_.SignalAll();
  mu_.Unlock();
}

void FlushWaiter::Shutdown() {
  std::vector<Waiting> left;
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    left.swap(waiting_);
    cv_.SignalAll();
  }
  for (Waiting& w : left) std::move(w.done)(absl::UnavailableError("worker shutting down"));
}

}  // namespace rl::worker
