#include "common/tokenizer/fork_join_pool.h"

#include <latch>

namespace rl::tokenizer {

ForkJoinPool::ForkJoinPool(int num_threads) {
  threads_.reserve(num_threads);
  for (int i = 0; i < num_threads; ++i) threads_.emplace_back([this] { Loop(); });
}

ForkJoinPool::~ForkJoinPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  for (std::thread& t : threads_) t.join();
}

void ForkJoinPool::Loop() {
  for (;;) {
    std::function<void()> task;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [this] { return stop_ || !tasks_.empty(); });
      if (tasks_.empty()) return;
      task = std::move(tasks_.front());
      tasks_.pop_front();
    }
    task();
  }
}

void ForkJoinPool::Run(int helpers, const std::function<void()>& fn) {
  helpers = std::max(0, std::min(helpers, size()));
  std::latch done(helpers);
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (int i = 0; i < helpers; ++i) {
      tasks_.emplace_back([&fn, &done] {
        fn();
        done.count_down();
      });
    }
  }
  cv_.notify_all();
  fn();
  done.wait();
}

}  // namespace rl::tokenizer
