// StagedMirror (model/staged_mirror.h), the CUDA runner's second device copy of a staged
// version, checked on the CPU backend (whose "device" memory is host memory): the memory
// decision (fits with the reserve or stays host-staged, no wrapping sum), the upload in slices,
// the bookkeeping that makes only a complete copy of exactly the staged weights activatable
// (serials, not addresses; a new source restarts; one activation per upload), the copy into the
// served mirror in place (pointers unchanged, bytes equal to the staged version's, FP32 copies
// included) and the reuse of the allocation by the next stage of the same layout.
#include "services/worker/model/staged_mirror.h"

#include <cstring>
#include <filesystem>
#include <map>

#include "common/model_io/model_maker.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "services/worker/model/backend.h"
#include "tests/worker/model/test_util.h"

namespace rl::model {
namespace {

using ::testing::HasSubstr;

// name -> bytes of every tensor a Weights object holds (host or CPU-backend mirror).
std::map<std::string, std::string> Bytes(const Weights& w) {
  std::map<std::string, std::string> out;
  w.Visit([&](const TensorInfo& t, absl::Span<const uint8_t> b) {
    out[t.name] = std::string(reinterpret_cast<const char*>(b.data()), b.size());
  });
  return out;
}

class StagedMirrorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::FreshTempDir("staged_mirror");
    for (int i = 0; i < 3; ++i) {
      model_io::MakeModelOptions mo;
      mo.arch = "qwen2";
      mo.seed = 40 + static_cast<uint64_t>(i);
      mo.dtype = "bfloat16";
      mo.out_dir = dir_ + "/" + std::to_string(i);
      ASSERT_TRUE(model_io::MakeModel(mo).ok());
    }
    auto config = model_io::LoadModelConfig(dir_ + "/0");
    ASSERT_TRUE(config.ok());
    config_ = *config;
    backend_ = CreateCpuBackend(1);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::unique_ptr<Weights> Load(int i) {
    auto w = LoadWeights(dir_ + "/" + std::to_string(i), config_);
    EXPECT_TRUE(w.ok()) << w.status();
    return w.ok() ? *std::move(w) : nullptr;
  }
  // Steps until done; returns the number of steps.
  int StageAll(StagedMirror& m, const Weights& w, int64_t max_bytes) {
    int steps = 0;
    for (;;) {
      auto step = m.Step(w, max_bytes, backend_.get(), free_);
      EXPECT_TRUE(step.ok()) << step.status();
      ++steps;
      if (!step.ok() || step->done) return steps;
    }
  }

  std::string dir_;
  model_io::ModelConfig config_;
  std::unique_ptr<Backend> backend_;
  int free_calls_ = 0;
  int64_t free_bytes_ = int64_t{1} << 40;
  std::function<absl::StatusOr<int64_t>()> free_ = [this]() -> absl::StatusOr<int64_t> {
    ++free_calls_;
    return free_bytes_;
  };
};

TEST(DecideDeviceStagingTest, FitsWithTheReserveOrSaysWhy) {
  EXPECT_TRUE(DecideDeviceStaging(100, 200, 100).on_device);
  const DeviceStagingDecision no = DecideDeviceStaging(101, 200, 100);
  EXPECT_FALSE(no.on_device);
  EXPECT_THAT(no.reason, HasSubstr("free"));
  EXPECT_FALSE(DecideDeviceStaging(1, 50, 100).on_device);  // free below the reserve
  // Huge values do not wrap into "fits".
  EXPECT_FALSE(DecideDeviceStaging(INT64_MAX, INT64_MAX, INT64_MAX).on_device);
  EXPECT_FALSE(DecideDeviceStaging(-1, 200, 0).on_device);
}

TEST_F(StagedMirrorTest, UploadsInSlicesThenCopiesIntoTheServedMirrorInPlace) {
  auto a = Load(0);
  auto b = Load(1);
  ASSERT_TRUE(a && b);
  auto served = MirrorWeights(*a, backend_.get(), /*fp32_lm_head=*/true);
  ASSERT_TRUE(served.ok()) << served.status();
  const void* embed_before = (*served)->embed().data;
  const void* head_before = (*served)->lm_head().data;  // the FP32 copy
  StagedMirror m({.fp32_lm_head = true, .fp32_router = false, .reserve_bytes = 0});
  EXPECT_FALSE(m.ReadyFor(*b));
  const int64_t slice = b->TotalBytes() / 8;
  auto first = m.Step(*b, slice, backend_.get(), free_);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_TRUE(first->on_device);
  EXPECT_FALSE(first->done);
  EXPECT_FALSE(m.ReadyFor(*b));  // partial: never activatable
  EXPECT_GE(StageAll(m, *b, slice), 2);
  EXPECT_TRUE(m.ReadyFor(*b));
  EXPECT_FALSE(m.ReadyFor(*a));
  EXPECT_EQ(m.bytes(), MirrorBytes(*b, true, false));
  EXPECT_GT(m.bytes(), b->TotalBytes());  // the FP32 head copy

  ASSERT_TRUE(m.CopyInto(*b, backend_.get(), served->get()).ok());
  EXPECT_EQ(Bytes(**served), Bytes(*b));
  EXPECT_EQ((*served)->embed().data, embed_before);  // in place: graphs stay valid
  EXPECT_EQ((*served)->lm_head().data, head_before);
  // The FP32 head followed: it equals a fresh mirror's of b.
  auto fresh = MirrorWeights(*b, backend_.get(), true);
  ASSERT_TRUE(fresh.ok());
  const WeightTensor& h = (*served)->lm_head();
  ASSERT_EQ(h.num_bytes, (*fresh)->lm_head().num_bytes);
  EXPECT_EQ(std::memcmp(h.data, (*fresh)->lm_head().data, static_cast<size_t>(h.num_bytes)), 0);
  // One activation per upload.
  EXPECT_FALSE(m.ReadyFor(*b));
  EXPECT_EQ(m.CopyInto(*b, backend_.get(), served->get()).code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST_F(StagedMirrorTest, StaysHostStagedWhenMemoryIsShort) {
  auto a = Load(0);
  ASSERT_TRUE(a);
  free_bytes_ = a->TotalBytes();  // fits alone, not with the reserve
  StagedMirror m({.reserve_bytes = 1 << 20});
  auto step = m.Step(*a, int64_t{1} << 30, backend_.get(), free_);
  ASSERT_TRUE(step.ok());
  EXPECT_TRUE(step->done);
  EXPECT_FALSE(step->on_device);
  EXPECT_THAT(step->note, HasSubstr("host memory"));
  EXPECT_FALSE(m.allocated());
  EXPECT_FALSE(m.ReadyFor(*a));
}

TEST_F(StagedMirrorTest, ANewSourceRestartsAndReusesTheAllocation) {
  auto a = Load(0);
  auto b = Load(1);
  auto c = Load(2);
  ASSERT_TRUE(a && b && c);
  auto served = MirrorWeights(*a, backend_.get(), false);
  ASSERT_TRUE(served.ok());
  StagedMirror m({.reserve_bytes = 0});
  // b partly uploaded, then c staged instead: b is never ready, c is, and the memory is reused
  // (free memory asked once, for the first allocation).
  auto step = m.Step(*b, 1, backend_.get(), free_);
  ASSERT_TRUE(step.ok() && !step->done);
  StageAll(m, *c, int64_t{1} << 30);
  EXPECT_EQ(free_calls_, 1);
  EXPECT_TRUE(m.ReadyFor(*c));
  EXPECT_FALSE(m.ReadyFor(*b));
  // Weights freed and another object made: a new serial, never the old copy's.
  const uint64_t c_serial = c->serial();
  c.reset();
  auto c2 = Load(2);
  ASSERT_TRUE(c2);
  EXPECT_NE(c2->serial(), c_serial);
  EXPECT_FALSE(m.ReadyFor(*c2));
  // Invalidate forgets the contents, keeps the memory.
  StageAll(m, *c2, int64_t{1} << 30);
  EXPECT_TRUE(m.ReadyFor(*c2));
  m.Invalidate();
  EXPECT_FALSE(m.ReadyFor(*c2));
  EXPECT_TRUE(m.allocated());
  EXPECT_EQ(free_calls_, 1);
  StageAll(m, *b, int64_t{1} << 30);
  ASSERT_TRUE(m.CopyInto(*b, backend_.get(), served->get()).ok());
  EXPECT_EQ(Bytes(**served), Bytes(*b));
}

TEST_F(StagedMirrorTest, CopyMirrorRefusesAnotherLayoutBeforeWriting) {
  auto a = Load(0);
  auto b = Load(1);
  ASSERT_TRUE(a && b);
  auto plain = MirrorWeights(*a, backend_.get(), false);
  auto with_head = MirrorWeights(*b, backend_.get(), true);
  ASSERT_TRUE(plain.ok() && with_head.ok());
  const auto before = Bytes(**plain);
  EXPECT_FALSE(CopyMirror(**with_head, backend_.get(), plain->get()).ok());
  EXPECT_EQ(Bytes(**plain), before);
}

}  // namespace
}  // namespace rl::model
