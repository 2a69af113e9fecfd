#include "services/worker/weights/deferred_free.h"

#include "common/low_priority.h"

namespace rl::worker {

DeferredFree::DeferredFree(int nice) : thread_([this, nice] { Loop(nice); }) {}

DeferredFree::~DeferredFree() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  thread_.join();
}

void DeferredFree::Post(absl::AnyInvocable<void()> task) {
  absl::MutexLock lock(&mu_);
  queue_.push_back(std::move(task));
  ++queued_;
}

void DeferredFree::Drain() {
  absl::MutexLock lock(&mu_);
  const int64_t target = queued_;
  auto done = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return freed_ >= target; };
  mu_.Await(absl::Condition(&done));
}

int64_t DeferredFree::freed() const {
  absl::MutexLock lock(&mu_);
  return freed_;
}

void DeferredFree::Loop(int nice) {
  LowerThreadPriority(nice);
  while (true) {
    std::vector<absl::AnyInvocable<void()>> batch;
    bool stop = false;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [&]()
                       ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_ || !queue_.empty(); };
      mu_.Await(absl::Condition(&ready));
      batch.swap(queue_);
      stop = stopping_;
    }
    const int64_t n = static_cast<int64_t>(batch.size());
    for (absl::AnyInvocable<void()>& task : batch) task();  // outside the lock
    batch.clear();                                          // the frees, outside the lock too
    {
      absl::MutexLock lock(&mu_);
      freed_ += n;
    }
    if (stop) {
      absl::MutexLock lock(&mu_);
      if (queue_.empty()) return;
    }
  }
}

}  // namespace rl::worker
