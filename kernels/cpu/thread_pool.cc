#include "kernels/cpu/thread_pool.h"

#include <algorithm>
#include <chrono>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define RL_CPU_RELAX() _mm_pause()
#else
#define RL_CPU_RELAX() std::this_thread::yield()
#endif

namespace rl::kernels::cpu {

namespace {
constexpr int kSpinIterations = 20000;
}  // namespace

ThreadPool::ThreadPool(int num_threads)
    : num_threads_(std::max(1, num_threads)),
      claimed_(new std::atomic<int>[static_cast<size_t>(std::max(1, num_threads))]) {
  for (int i = 0; i < num_threads_; ++i) claimed_[i].store(1, std::memory_order_relaxed);
  for (int i = 1; i < num_threads_; ++i) workers_.emplace_back([this, i] { WorkerLoop(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
    generation_.fetch_add(1, std::memory_order_release);
  }
  wake_cv_.notify_all();
  for (auto& t : workers_) t.join();
}

bool ThreadPool::TryRunPart(int index) {
  int expected = 0;
  if (!claimed_[index].compare_exchange_strong(expected, 1, std::memory_order_acq_rel)) {
    return false;
  }
  const int64_t begin = n_ * index / num_threads_;
  const int64_t end = n_ * (index + 1) / num_threads_;
  if (begin < end) (*fn_)(begin, end, index);
  if (pending_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
    std::lock_guard<std::mutex> lock(mu_);
    done_cv_.notify_one();
  }
  return true;
}

void ThreadPool::ParallelFor(int64_t n, const RangeFn& fn) {
  if (n <= 0) return;
  if (num_threads_ == 1 || n == 1) {
    fn(0, n, 0);
    return;
  }
  // No part of the previous job is running: every part was claimed and finished.
  fn_ = &fn;
  n_ = n;
  pending_.store(num_threads_, std::memory_order_relaxed);
  for (int i = 0; i < num_threads_; ++i) claimed_[i].store(0, std::memory_order_release);
  {
    std::lock_guard<std::mutex> lock(mu_);
    generation_.fetch_add(1, std::memory_order_release);
  }
  wake_cv_.notify_all();
  TryRunPart(0);
  const auto own_part_done =
      collect_stats_ ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point();
  // The thread index only selects a workspace, so the caller may run a late worker's part.
  for (int i = 1; i < num_threads_; ++i) TryRunPart(i);
  for (int i = 0; i < kSpinIterations && pending_.load(std::memory_order_acquire) != 0; ++i) {
    RL_CPU_RELAX();
  }
  if (pending_.load(std::memory_order_acquire) != 0) {
    std::unique_lock<std::mutex> lock(mu_);
    done_cv_.wait(lock, [this] { return pending_.load(std::memory_order_acquire) == 0; });
  }
  fn_ = nullptr;
  if (collect_stats_) {
    ++stats_.regions;
    stats_.wait_seconds +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - own_part_done).count();
  }
}

void ThreadPool::WorkerLoop(int index) {
  // Generation 0 is the state at construction; a ParallelFor may start before this thread runs.
  uint64_t seen = 0;
  while (true) {
    for (int i = 0; i < kSpinIterations && generation_.load(std::memory_order_acquire) == seen;
         ++i) {
      RL_CPU_RELAX();
    }
    {
      std::unique_lock<std::mutex> lock(mu_);
      wake_cv_.wait(lock, [&] { return generation_.load(std::memory_order_acquire) != seen; });
      if (stop_) return;
      seen = generation_.load(std::memory_order_acquire);
    }
    TryRunPart(index);
  }
}

}  // namespace rl::kernels::cpu
