// HugePageCollapser: moves the CPU runner's served weights into 2 MiB pages, in the background.
//
// Why: batch-1 decode streams every weight once per token. In 4 KiB pages that is a TLB miss
// (a page walk) per 4 KiB read, which cost the m = 1 matmuls 8-10% of their rate on Zen 5
// (matmul_bench --huge-pages, 1 thread). The loader maps fresh memory in 4 KiB pages on purpose
// (common/model_io/file_read.cc: a huge-page fault may compact memory synchronously and made
// the first update 10x slower), so the served copy is collapsed after the fact, off the load and
// update paths: MADV_COLLAPSE (Linux 6.1+), one 2 MiB region per call, on a thread at nice 19;
// regions the kernel refuses (no free 2 MiB page, even after compaction) are tried again in up to
// 3 more passes, 0.5 s apart.
// MADV_COLLAPSE never changes memory contents (the kernel copies the pages into a huge page and
// remaps them; readers never see a difference), so a region that another job replaced, or that
// the caller freed meanwhile, costs at most wasted work, never a wrong value. Where the kernel
// refuses (older kernels, THP disabled) the weights stay in 4 KiB pages and nothing else changes.
// Cost: a copy of the collapsed bytes plus, when free memory is fragmented, compaction (0.1-4 s
// for 1 GB, one core, measured on a loaded Zen 5 VM), once per set of served weights.
// Thread safety: every method may be called from any thread.
#pragma once

#include <cstdint>
#include <functional>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"

namespace rl::model {

class HugePageCollapser {
 public:
  // `before_region` (may be empty) runs on the collapsing thread before each region is checked
  // for cancellation and collapsed: tests hold a job in progress with it.
  explicit HugePageCollapser(std::function<void()> before_region = nullptr)
      : before_region_(std::move(before_region)) {}
  // Stops the current job after the region in progress and joins the thread.
  ~HugePageCollapser();
  HugePageCollapser(const HugePageCollapser&) = delete;
  HugePageCollapser& operator=(const HugePageCollapser&) = delete;

  struct Stats {
    int64_t jobs = 0;             // jobs finished (not cancelled)
    int64_t collapsed_bytes = 0;  // of the last finished job, in 2 MiB pages now
    int64_t refused_bytes = 0;    // of the last finished job, refused after retries
    int refused_errno = 0;        // the last refusal's errno
    double seconds = 0;           // the last finished job's wall time
  };

  // Replaces any job in progress (it stops after its current region) with collapsing the
  // 2 MiB-aligned regions that lie wholly inside the union of `ranges` (ranges closer than
  // 4 KiB are joined). Returns at once.
  void Collapse(const std::vector<absl::Span<const uint8_t>>& ranges);

  // Blocks until no job is pending (for benchmarks and tests); returns the stats.
  Stats Wait();
  Stats stats() const;

  // The aligned regions Collapse would work on, in address order (exposed for tests).
  static std::vector<absl::Span<const uint8_t>> Regions(
      const std::vector<absl::Span<const uint8_t>>& ranges);

 private:
  void Run();

  const std::function<void()> before_region_;

  mutable absl::Mutex mu_;
  std::vector<absl::Span<const uint8_t>> job_ ABSL_GUARDED_BY(mu_);
  uint64_t generation_ ABSL_GUARDED_BY(mu_) = 0;  // bumped by every Collapse
  uint64_t done_generation_ ABSL_GUARDED_BY(mu_) = 0;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  Stats stats_ ABSL_GUARDED_BY(mu_);
  std::thread thread_ ABSL_GUARDED_BY(mu_);
};

}  // namespace rl::model
