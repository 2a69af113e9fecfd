#include "services/worker/model/cpu_huge_pages.h"

#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <utility>

#include "absl/time/time.h"
#include "spdlog/spdlog.h"

namespace rl::model {

namespace {

constexpr uintptr_t kHugePage = uintptr_t{2} << 20;
constexpr uintptr_t kJoinGap = uintptr_t{4} << 10;
constexpr int kMadvCollapse = 25;  // MADV_COLLAPSE (Linux 6.1); older headers lack it
constexpr int kPasses = 4;
constexpr absl::Duration kRetryAfter = absl::Milliseconds(500);

}  // namespace

HugePageCollapser::~HugePageCollapser() {
  std::thread thread;
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
    thread = std::move(thread_);
  }
  if (thread.joinable()) thread.join();
}

std::vector<absl::Span<const uint8_t>> HugePageCollapser::Regions(
    const std::vector<absl::Span<const uint8_t>>& ranges) {
  std::vector<std::pair<uintptr_t, uintptr_t>> spans;
  for (absl::Span<const uint8_t> r : ranges) {
    if (r.empty()) continue;
    const auto begin = reinterpret_cast<uintptr_t>(r.data());
    spans.emplace_back(begin, begin + r.size());
  }
  std::sort(spans.begin(), spans.end());
  std::vector<std::pair<uintptr_t, uintptr_t>> joined;
  for (const auto& s : spans) {
    if (!joined.empty() && s.first <= joined.back().second + kJoinGap) {
      joined.back().second = std::max(joined.back().second, s.second);
    } else {
      joined.push_back(s);
    }
  }
  std::vector<absl::Span<const uint8_t>> regions;
  for (const auto& [begin, end] : joined) {
    for (uintptr_t a = (begin + kHugePage - 1) / kHugePage * kHugePage; a + kHugePage <= end;
         a += kHugePage) {
      regions.emplace_back(reinterpret_cast<const uint8_t*>(a), kHugePage);
    }
  }
  return regions;
}

void HugePageCollapser::Collapse(const std::vector<absl::Span<const uint8_t>>& ranges) {
  std::vector<absl::Span<const uint8_t>> regions = Regions(ranges);
  absl::MutexLock lock(&mu_);
  if (stop_) return;
  ++generation_;                                 // cancels the job in progress
  if (regions.empty() && !thread_.joinable()) {  // nothing to do: no thread for it
    stats_ = Stats{.jobs = stats_.jobs + 1};
    done_generation_ = generation_;
    return;
  }
  job_ = std::move(regions);
  if (!thread_.joinable()) thread_ = std::thread([this] { Run(); });
}

HugePageCollapser::Stats HugePageCollapser::Wait() {
  absl::MutexLock lock(&mu_);
  auto idle = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return stop_ || done_generation_ == generation_;
  };
  mu_.Await(absl::Condition(&idle));
  return stats_;
}

HugePageCollapser::Stats HugePageCollapser::stats() const {
  absl::MutexLock lock(&mu_);
  return stats_;
}

void HugePageCollapser::Run() {
  // Below the engine and the pool's threads: the collapse only uses idle time.
  (void)setpriority(PRIO_PROCESS, static_cast<id_t>(syscall(SYS_gettid)), 19);
  uint64_t seen = 0;
  for (;;) {
    std::vector<absl::Span<const uint8_t>> regions;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [&]()
                       ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_ || generation_ != seen; };
      mu_.Await(absl::Condition(&ready));
      if (stop_) return;
      seen = generation_;
      regions = std::move(job_);
      job_.clear();
    }
    const auto t0 = std::chrono::steady_clock::now();
    Stats job;
    bool cancelled = false;
    auto moved_on = [&]()
                        ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_ || generation_ != seen; };
    // The kernel refuses a region when it finds no free 2 MiB page even after compaction
    // (ENOMEM, EAGAIN: memory fragmented by the page cache or other processes); those are tried
    // again in later passes, after a pause that lets reclaim and compaction catch up.
    for (int pass = 0; pass < kPasses && !regions.empty() && !cancelled; ++pass) {
      if (pass > 0) {
        absl::MutexLock lock(&mu_);
        if (mu_.AwaitWithTimeout(absl::Condition(&moved_on), kRetryAfter)) {
          cancelled = true;
          break;
        }
      }
      std::vector<absl::Span<const uint8_t>> refused;
      for (size_t i = 0; i < regions.size(); ++i) {
        if (before_region_) before_region_();
        {
          absl::MutexLock lock(&mu_);
          if (moved_on()) {
            cancelled = true;
            break;
          }
        }
        void* p = const_cast<uint8_t*>(regions[i].data());
        if (::madvise(p, regions[i].size(), kMadvCollapse) == 0) {
          job.collapsed_bytes += static_cast<int64_t>(regions[i].size());
          continue;
        }
        job.refused_errno = errno;
        if (job.refused_errno == EINVAL || job.refused_errno == EPERM) {
          // No MADV_COLLAPSE here (Linux < 6.1, THP disabled): nothing to retry.
          refused.insert(refused.end(), regions.begin() + static_cast<int64_t>(i), regions.end());
          pass = kPasses;
          break;
        }
        refused.push_back(regions[i]);
      }
      regions = std::move(refused);
    }
    for (absl::Span<const uint8_t> r : regions) job.refused_bytes += static_cast<int64_t>(r.size());
    absl::MutexLock lock(&mu_);
    if (cancelled) continue;
    job.jobs = stats_.jobs + 1;
    job.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    stats_ = job;
    done_generation_ = seen;
    spdlog::info("cpu weights: {} MiB moved into 2 MiB pages in {:.2f} s{}",
                 job.collapsed_bytes >> 20, job.seconds,
                 job.refused_bytes == 0
                     ? ""
                     : fmt::format(" ({} MiB refused by the kernel, {}: they stay in 4 KiB pages)",
                                   job.refused_bytes >> 20, std::strerror(job.refused_errno)));
  }
}

}  // namespace rl::model
