#include "common/bounded_executor.h"

#include <pthread.h>

#include <utility>

#include "absl/strings/str_cat.h"

namespace rl {

BoundedExecutor::BoundedExecutor(const std::string& name, int num_threads, size_t max_queued)
    : name_(name), max_queued_(max_queued) {
  threads_.reserve(static_cast<size_t>(num_threads < 1 ? 1 : num_threads));
  for (int i = 0; i < (num_threads < 1 ? 1 : num_threads); ++i) {
    threads_.emplace_back([this] { Loop(); });
    pthread_setname_np(threads_.back().native_handle(), name.substr(0, 15).c_str());
  }
}

BoundedExecutor::~BoundedExecutor() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  for (std::thread& t : threads_) t.join();
}

bool BoundedExecutor::Submit(absl::AnyInvocable<void() &&>&& task) {
  absl::MutexLock lock(&mu_);
  if (stop_ || queue_.size() >= max_queued_) return false;
  queue_.push_back(std::move(task));
  return true;
}

absl::Status BoundedExecutor::BusyError() const {
  return absl::ResourceExhaustedError(
      absl::StrCat("the ", name_, " pool has ", max_queued_, " tasks waiting; retry shortly"));
}

size_t BoundedExecutor::queued() const {
  absl::MutexLock lock(&mu_);
  return queue_.size();
}

void BoundedExecutor::Loop() {
  for (;;) {
    absl::AnyInvocable<void() &&> task;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_ || !queue_.empty(); };
      mu_.Await(absl::Condition(&ready));
      if (queue_.empty()) return;  // stopping, nothing left
      task = std::move(queue_.front());
      queue_.pop_front();
    }
    std::move(task)();
  }
}

}  // namespace rl
