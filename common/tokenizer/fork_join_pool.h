// ForkJoinPool: a fixed set of threads that EncodeBatch reuses, so the per-thread BPE word
// caches stay warm from one batch to the next (fresh threads would start with empty caches).
//
// Run(helpers, fn) forks `fn` onto up to `helpers` pool threads and the caller, and joins:
// it returns when every copy has returned; `fn` itself must split the work (e.g. an atomic index).
// Thread safety: Run may be called from several threads at once (tasks queue up).
// Cost: one queue push and one wake-up per helper.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace rl::tokenizer {

class ForkJoinPool {
 public:
  explicit ForkJoinPool(int num_threads);
  ~ForkJoinPool();
  ForkJoinPool(const ForkJoinPool&) = delete;
  ForkJoinPool& operator=(const ForkJoinPool&) = delete;

  int size() const { return static_cast<int>(threads_.size()); }
  void Run(int helpers, const std::function<void()>& fn);

 private:
  void Loop();

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> tasks_;  // guarded by mu_
  bool stop_ = false;                        // guarded by mu_
  std::vector<std::thread> threads_;
};

}  // namespace rl::tokenizer
