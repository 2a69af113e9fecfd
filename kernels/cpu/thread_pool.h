// ThreadPool: a fixed set of worker threads for the CPU kernels. ParallelFor splits a range
// into one contiguous part per thread (the caller runs part 0), so the partition depends only
// on the range and the thread count — kernels never make a result depend on it anyway.
//
// Workers spin briefly before sleeping on a condition variable, which keeps the wake-up cost of
// the ~10 parallel regions per layer low. Parts are claimed atomically: when a worker has not
// started its part by the time the caller finishes its own (the core is busy elsewhere), the
// caller runs that part too instead of waiting for the worker to be scheduled.
// Not reentrant: ParallelFor must not be called from inside a task, nor concurrently from two
// threads.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace rl::kernels::cpu {

class ThreadPool {
 public:
  // `num_threads` counts the calling thread; values < 1 mean 1 (no workers).
  explicit ThreadPool(int num_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int num_threads() const { return num_threads_; }

  // Calls fn(begin, end, part) for each non-empty part of [0, n); returns when all parts are
  // done. `part` is in [0, num_threads()) and each part runs exactly once, on some thread, so
  // it may index a per-part workspace.
  using RangeFn = std::function<void(int64_t begin, int64_t end, int part)>;
  void ParallelFor(int64_t n, const RangeFn& fn);

  // Synchronisation cost, collected only after set_collect_stats(true) (runner_bench
  // --op-profile): parallel regions run, and the time the calling thread spent after its own
  // part until every part was done (waiting for workers, or running a late worker's part).
  struct Stats {
    int64_t regions = 0;
    double wait_seconds = 0;
  };
  void set_collect_stats(bool on) { collect_stats_ = on; }
  const Stats& stats() const { return stats_; }
  void ResetStats() { stats_ = Stats(); }

 private:
  void WorkerLoop(int index);
  // Claims part `index` of the current job and runs it; false when already claimed.
  bool TryRunPart(int index);

  const int num_threads_;
  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable wake_cv_;
  std::condition_variable done_cv_;
  std::atomic<uint64_t> generation_{0};
  std::atomic<int> pending_{0};
  std::unique_ptr<std::atomic<int>[]> claimed_;  // per part: 0 free, 1 claimed
  bool stop_ = false;                            // guarded by mu_
  const RangeFn* fn_ = nullptr;
  int64_t n_ = 0;
  bool collect_stats_ = false;  // the calling thread's
  Stats stats_;                 // the calling thread's
};

}  // namespace rl::kernels::cpu
