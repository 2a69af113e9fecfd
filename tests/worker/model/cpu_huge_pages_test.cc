// HugePageCollapser: which regions it works on, that collapsing never changes a byte, that a new
// job replaces the one in progress, and that destroying it mid-job returns; CpuModelRunner starts
// a job at creation and at every weight swap, and none with cpu_huge_pages off; its KV cache is
// advised into 2 MiB pages with cpu_huge_pages.
#include "services/worker/model/cpu_huge_pages.h"

#include <sys/mman.h>

#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/model_io/model_config.h"
#include "common/model_io/model_maker.h"
#include "gtest/gtest.h"
#include "services/worker/model/cpu_model_runner.h"
#include "services/worker/model/weights.h"
#include "tests/worker/model/test_util.h"

namespace rl::model {
namespace {

constexpr size_t kHuge = size_t{2} << 20;

// `size` bytes of anonymous memory at a 2 MiB boundary, in 4 KiB pages, filled with a pattern;
// ok() is false (nothing mapped) when the mapping failed.
class Buffer {
 public:
  explicit Buffer(size_t size) : size_(size), mapped_(size + kHuge) {
    base_ = ::mmap(nullptr, mapped_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (base_ == MAP_FAILED) return;
    const auto a = (reinterpret_cast<uintptr_t>(base_) + kHuge - 1) / kHuge * kHuge;
    data_ = reinterpret_cast<uint8_t*>(a);
    (void)::madvise(data_, size_, MADV_NOHUGEPAGE);
    for (size_t i = 0; i < size_; ++i) data_[i] = static_cast<uint8_t>(i * 2654435761u >> 13);
    (void)::madvise(data_, size_, MADV_HUGEPAGE);  // MADV_COLLAPSE needs no more than this
  }
  ~Buffer() {
    if (base_ != MAP_FAILED) ::munmap(base_, mapped_);
  }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  bool ok() const { return data_ != nullptr; }
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
  void* base_ = MAP_FAILED;
  uint8_t* data_ = nullptr;
};

// A Buffer named `name` of `size` bytes; the test is skipped when the memory cannot be mapped
// (an environment limit, not a defect of the collapser).
#define BUFFER_OR_SKIP(name, size) \
  Buffer name(size);               \
  if (!name.ok()) GTEST_SKIP() << "cannot map " << (size) << " bytes for " #name

TEST(HugePageCollapserTest, RegionsAreAlignedAndInsideTheJoinedRanges) {
  BUFFER_OR_SKIP(b, 5 * kHuge);
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
  BUFFER_OR_SKIP(b, 4 * kHuge);
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

// The job in progress is held at its first region (before its cancellation check) while a new
// one is given: released, it must stop there. Without the cancellation it would go on through
// all 32 regions and finish, and two jobs would be counted.
TEST(HugePageCollapserTest, ANewJobReplacesTheOneInProgress) {
  BUFFER_OR_SKIP(big, 32 * kHuge);
  BUFFER_OR_SKIP(small, 2 * kHuge);
  absl::Mutex mu;
  int regions_seen = 0;
  bool released = false;
  HugePageCollapser c([&] {
    absl::MutexLock lock(&mu);
    ++regions_seen;
    auto go = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) { return released; };
    mu.Await(absl::Condition(&go));
  });
  c.Collapse({big.span(0, 32 * kHuge)});
  {
    absl::MutexLock lock(&mu);
    auto entered = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) { return regions_seen >= 1; };
    ASSERT_TRUE(mu.AwaitWithTimeout(absl::Condition(&entered), absl::Seconds(60)));
  }
  c.Collapse({small.span(0, 2 * kHuge)});  // replaces the big job, held at its first region
  {
    absl::MutexLock lock(&mu);
    released = true;
  }
  const HugePageCollapser::Stats s = c.Wait();
  EXPECT_EQ(s.jobs, 1);  // the big job never finished
  // The stats are the last job's: the small buffer's two regions.
  EXPECT_EQ(s.collapsed_bytes + s.refused_bytes, static_cast<int64_t>(2 * kHuge));
  {
    absl::MutexLock lock(&mu);
    EXPECT_LE(regions_seen, 1 + 2 * 4);  // the big job's first, then the small one's (retries)
  }
  EXPECT_TRUE(big.Intact());
  EXPECT_TRUE(small.Intact());
  c.Collapse({});  // nothing to do: done at once
  EXPECT_EQ(c.Wait().collapsed_bytes + c.stats().refused_bytes, 0);
}

TEST(HugePageCollapserTest, DestroyedMidJobReturns) {
  BUFFER_OR_SKIP(big, 32 * kHuge);
  {
    HugePageCollapser c;
    c.Collapse({big.span(0, 32 * kHuge)});
  }  // joins after the region in progress
  EXPECT_TRUE(big.Intact());
}

// A forward pass's logits of a short prompt.
std::vector<float> Logits(CpuModelRunner& r) {
  ForwardInput in;
  SequenceInput s;
  s.token_ids = {1, 5, 9};
  s.kv_slots = {0, 1, 2};
  in.seqs = {s};
  ForwardOutput out;
  EXPECT_TRUE(r.Forward(in, &out).ok());
  return out.logits;
}

TEST(CpuModelRunnerHugePagesTest, AJobPerLoadAndSwapAndNoneWhenOff) {
  const std::string dir = testing::FreshTempDir("huge_pages");
  model_io::MakeModelOptions mo;
  mo.arch = "qwen2";
  mo.seed = 11;
  mo.out_dir = dir + "/a";
  ASSERT_TRUE(model_io::MakeModel(mo).ok());
  for (bool on : {true, false}) {
    SCOPED_TRACE(on ? "cpu_huge_pages on" : "off");
    RunnerOptions ro;
    ro.model_dir = dir + "/a";
    ro.num_kv_slots = 64;
    ro.cpu_huge_pages = on;
    auto r = CpuModelRunner::Create(ro);
    ASSERT_TRUE(r.ok()) << r.status();
    const std::vector<float> before = Logits(**r);
    EXPECT_EQ((*r)->WaitForHugePages().jobs, on ? 1 : 0);
    ASSERT_TRUE((*r)->LoadWeightsFromDisk(dir + "/a").ok());
    EXPECT_EQ((*r)->WaitForHugePages().jobs, on ? 2 : 0);
    auto fresh = LoadWeights(dir + "/a", (*r)->config());
    ASSERT_TRUE(fresh.ok()) << fresh.status();
    ASSERT_TRUE((*r)->ActivateWeights(&*fresh, "test", "").ok());
    EXPECT_EQ((*r)->WaitForHugePages().jobs, on ? 3 : 0);
    const std::vector<float> after = Logits(**r);
    ASSERT_EQ(before.size(), after.size());
    EXPECT_EQ(std::memcmp(before.data(), after.data(), before.size() * sizeof(float)), 0);
  }
  std::filesystem::remove_all(dir);
}

// The VmFlags of the mapping in /proc/self/smaps that holds `address` ("" if none does).
std::string VmFlagsAt(const void* address) {
  std::ifstream smaps("/proc/self/smaps");
  const auto a = reinterpret_cast<uintptr_t>(address);
  bool inside = false;
  for (std::string line; std::getline(smaps, line);) {
    uintptr_t begin = 0, end = 0;
    // A mapping's first line is "begin-end perms ..."; its fields ("Size:", ...) follow.
    if (std::sscanf(line.c_str(), "%" SCNxPTR "-%" SCNxPTR " ", &begin, &end) == 2) {
      inside = begin <= a && a < end;
    } else if (inside && line.rfind("VmFlags:", 0) == 0) {
      return line;
    }
  }
  return "";
}

// cpu_huge_pages also puts the KV cache in 2 MiB pages: every layer's K and V buffer is a
// MADV_HUGEPAGE mapping ("hg" in its VmFlags), and none is without it. Off first: memory freed
// back to the heap keeps its advice, so an "off" buffer could inherit an "on" one's.
TEST(CpuModelRunnerHugePagesTest, TheKvCacheIsAdvisedIntoHugePages) {
  if (!std::filesystem::exists("/sys/kernel/mm/transparent_hugepage")) {
    GTEST_SKIP() << "this kernel has no transparent huge pages (MADV_HUGEPAGE is refused)";
  }
  const std::string dir = testing::FreshTempDir("huge_pages_kv");
  model_io::MakeModelOptions mo;
  mo.arch = "qwen2";
  mo.seed = 12;
  mo.out_dir = dir;
  ASSERT_TRUE(model_io::MakeModel(mo).ok());
  auto config = model_io::LoadModelConfig(dir);
  ASSERT_TRUE(config.ok()) << config.status();
  for (bool on : {false, true}) {
    SCOPED_TRACE(on ? "cpu_huge_pages on" : "off");
    RunnerOptions ro;
    ro.model_dir = dir;
    // 4 MiB per layer's K and per layer's V.
    ro.num_kv_slots = (int64_t{4} << 20) / (int64_t{config->num_key_value_heads} *
                                            config->head_dim * static_cast<int64_t>(sizeof(float)));
    ro.cpu_huge_pages = on;
    auto r = CpuModelRunner::Create(ro);
    ASSERT_TRUE(r.ok()) << r.status();
    const std::vector<absl::Span<const uint8_t>> kv = (*r)->KvCacheBytes();
    ASSERT_FALSE(kv.empty());
    for (absl::Span<const uint8_t> buffer : kv) {
      ASSERT_GE(buffer.size(), 2 * kHuge);
      if (on) EXPECT_EQ(reinterpret_cast<uintptr_t>(buffer.data()) % kHuge, 0u);
      const std::string flags = VmFlagsAt(buffer.data() + buffer.size() / 2);
      ASSERT_NE(flags, "") << "no mapping holds the KV cache";
      EXPECT_EQ(flags.find(" hg") != std::string::npos, on) << flags;
    }
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace rl::model
