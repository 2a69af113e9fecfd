// HugePageCollapser: which regions it works on, that collapsing never changes a byte, that a new
// job replaces the one in progress, and that destroying it mid-job returns.
#include "services/worker/model/cpu_huge_pages.h"

#include <sys/mman.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "gtest/gtest.h"

namespace rl::model {
namespace {

constexpr size_t kHuge = size_t{2} << 20;

// `size` bytes of anonymous memory at a 2 MiB boundary, in 4 KiB pages, filled with a pattern.
class Buffer {
 public:
  explicit Buffer(size_t size) : size_(size), mapped_(size + kHuge) {
    base_ = ::mmap(nullptr, mapped_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    EXPECT_NE(base_, MAP_FAILED);
    const auto a = (reinterpret_cast<uintptr_t>(base_) + kHuge - 1) / kHuge * kHuge;
    data_ = reinterpret_cast<uint8_t*>(a);
    (void)::madvise(data_, size_, MADV_NOHUGEPAGE);
    for (size_t i = 0; i < size_; ++i) data_[i] = static_cast<uint8_t>(i * 2654435761u >> 13);
    (void)::madvise(data_, size_, MADV_HUGEPAGE);  // MADV_COLLAPSE needs no more than this
  }
  ~Buffer() { ::munmap(base_, mapped_); }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  uint8_t* data() { return data_; }
  absl::Span<const uint8_t> span(size_t begin, size_t end) const {
    return absl::Span<const uint8_t>(data_ + begin, end - begin);
  }
  bool Intact() const {
    for (size_t i = 0; i < size_; ++i) {
      if (data_[i] != static_cast<uint8_t>(i * 2654435761u >> 13)) return false;
    }
    return true;
  }

 private:
  size_t size_;
  size_t mapped_;
  void* base_ = nullptr;
  uint8_t* data_ = nullptr;
};

TEST(HugePageCollapserTest, RegionsAreAlignedAndInsideTheJoinedRanges) {
  Buffer b(5 * kHuge);
  const uint8_t* base = b.data();
  // Two ranges 1 KiB apart (joined), covering [100, 10 MiB - 7): the three whole 2 MiB regions
  // from 2 MiB on.
  auto regions =
      HugePageCollapser::Regions({b.span(3 * kHuge, 5 * kHuge - 7), b.span(100, 3 * kHuge - 1024)});
  ASSERT_EQ(regions.size(), 3u);
  for (size_t i = 0; i < regions.size(); ++i) {
    EXPECT_EQ(regions[i].data(), base + (i + 1) * kHuge);
    EXPECT_EQ(regions[i].size(), kHuge);
  }
  // 8 KiB apart: not joined, and neither part holds a whole aligned region.
  EXPECT_TRUE(
      HugePageCollapser::Regions({b.span(4096, kHuge + 4096), b.span(kHuge + 12288, 2 * kHuge + 8)})
          .empty());
  // Exactly aligned, empty spans ignored.
  EXPECT_EQ(HugePageCollapser::Regions({b.span(0, 4 * kHuge), b.span(7, 7)}).size(), 4u);
  EXPECT_TRUE(HugePageCollapser::Regions({}).empty());
}

TEST(HugePageCollapserTest, CollapsesWithoutChangingAByte) {
  Buffer b(4 * kHuge);
  HugePageCollapser c;
  EXPECT_EQ(c.Wait().jobs, 0);  // no job: returns at once
  c.Collapse({b.span(0, 4 * kHuge)});
  const HugePageCollapser::Stats s = c.Wait();
  EXPECT_EQ(s.jobs, 1);
  // Every region is accounted for; the kernel may refuse (old kernel, THP off), never corrupt.
  EXPECT_EQ(s.collapsed_bytes + s.refused_bytes, static_cast<int64_t>(4 * kHuge));
  EXPECT_TRUE(b.Intact());
  // The memory stays writable and readable as before.
  b.data()[12345] ^= 0xFF;
  b.data()[12345] ^= 0xFF;
  EXPECT_TRUE(b.Intact());
}

TEST(HugePageCollapserTest, ANewJobReplacesTheOneInProgress) {
  Buffer big(32 * kHuge);
  Buffer small(2 * kHuge);
  HugePageCollapser c;
  c.Collapse({big.span(0, 32 * kHuge)});
  c.Collapse({small.span(0, 2 * kHuge)});
  const HugePageCollapser::Stats s = c.Wait();
  EXPECT_GE(s.jobs, 1);
  // The stats are the last job's: the small buffer's two regions.
  EXPECT_EQ(s.collapsed_bytes + s.refused_bytes, static_cast<int64_t>(2 * kHuge));
  EXPECT_TRUE(big.Intact());
  EXPECT_TRUE(small.Intact());
  c.Collapse({});  // nothing to do: done at once
  EXPECT_EQ(c.Wait().collapsed_bytes + c.stats().refused_bytes, 0);
}

TEST(HugePageCollapserTest, DestroyedMidJobReturns) {
  Buffer big(32 * kHuge);
  {
    HugePageCollapser c;
    c.Collapse({big.span(0, 32 * kHuge)});
  }  // joins after the region in progress
  EXPECT_TRUE(big.Intact());
}

}  // namespace
}  // namespace rl::model
