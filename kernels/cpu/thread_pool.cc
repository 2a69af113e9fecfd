#include "kernels/cpu/thread_pool.h"

#include <algorithm>

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

ThreadPool::ThreadPool(int num_threads) : num_threads_(std::max(1, num_threads)) {
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

void ThreadPool::RunPart(int index) {
  const int64_t begin = n_ * index / num_threads_;
  const int64_t end = n_ * (index + 1) / num_threads_;
  if (begin < end) (*fn_)(begin, end, index);
}

void ThreadPool::ParallelFor(int64_t n, const RangeFn& fn) {
  if (n <= 0) return;
  if (num_threads_ == 1 || n == 1) {
    fn(0, n, 0);
    return;
  }
  fn_ = &fn;
  n_ = n;
  pending_.store(num_threads_ - 1, std::memory_order_relaxed);
  {
    std::lock_guard<std::mutex> lock(mu_);
    generation_.fetch_add(1, std::memory_order_release);
  }
  wake_cv_.notify_all();
  RunPart(0);
  for (int i = 0; i < kSpinIterations && pending_.load(std::memory_order_acquire) != 0; ++i) {
    RL_CPU_RELAX();
  }
  if (pending_.load(std::memory_order_acquire) != 0) {
    std::unique_lock<std::mutex> lock(mu_);
    done_cv_.wait(lock, [this] { return pending_.load(std::memory_order_acquire) == 0; });
  }
  fn_ = nullptr;
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
    RunPart(index);
    if (pending_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
      std::lock_guard<std::mutex> lock(mu_);
      done_cv_.notify_one();
    }
  }
}

}  // namespace rl::kernels::cpu
