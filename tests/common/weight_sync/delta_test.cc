// common/weight_sync/delta: a property test of random delta updates against dense updates
// (both encodings and the size-chosen one, sparse, clustered and dense changes, BF16 / F16 /
// F32: the applied copy equals the child bytewise and the checksums are equal every time), and
// the decoder's refusals of malformed input (nothing written on error); MaxDeltaPayloadBytes
// bounds every encoding EncodeDelta writes (the bound transports allocate by).
#include "common/weight_sync/delta.h"

#include <cstring>
#include <random>

#include "common/model_io/dtype.h"
#include "common/weight_sync/manifest.h"
#include "gtest/gtest.h"

namespace rl::weight_sync {
namespace {

using model_io::DType;

std::vector<uint8_t> RandomTensor(DType dtype, int64_t numel, std::mt19937_64& rng) {
  std::normal_distribution<float> dist(0.0f, 0.05f);
  std::vector<float> f(static_cast<size_t>(numel));
  for (float& v : f) v = dist(rng);
  std::vector<uint8_t> out(static_cast<size_t>(numel * model_io::DTypeSize(dtype)));
  model_io::ConvertFromF32(f.data(), numel, dtype, out.data());
  return out;
}

// A trainer step: `density` of the elements get a small update (a few ulps to a few %), either
// scattered or in runs (rows of an embedding).
std::vector<uint8_t> Step(DType dtype, const std::vector<uint8_t>& parent, double density,
                          bool clustered, std::mt19937_64& rng) {
  const int64_t width = model_io::DTypeSize(dtype);
  const int64_t numel = static_cast<int64_t>(parent.size()) / width;
  std::vector<float> f(static_cast<size_t>(numel));
  model_io::ConvertToF32(dtype, parent.data(), numel, f.data());
  std::uniform_real_distribution<double> u(0.0, 1.0);
  std::normal_distribution<float> step(0.0f, 0.02f);
  int64_t run_left = 0;
  for (int64_t i = 0; i < numel; ++i) {
    bool change;
    if (clustered) {
      if (run_left == 0 && u(rng) < density / 16) run_left = 16;
      change = run_left > 0;
      if (run_left > 0) --run_left;
    } else {
      change = u(rng) < density;
    }
    if (change) f[static_cast<size_t>(i)] += step(rng) + 1e-3f;
  }
  std::vector<uint8_t> out(parent.size());
  model_io::ConvertFromF32(f.data(), numel, dtype, out.data());
  return out;
}

std::string Digest(DType dtype, int64_t numel, const std::vector<uint8_t>& bytes) {
  return TensorSha256("t", model_io::DTypeName(dtype), {numel}, bytes);
}

TEST(DeltaTest, RandomUpdatesApplyToTheDenseResultEveryTime) {
  std::mt19937_64 rng(20260530);
  int checked = 0;
  int chose[2] = {0, 0};
  for (DType dtype : {DType::kBF16, DType::kF16, DType::kF32}) {
    for (double density : {0.0, 0.001, 0.02, 0.045, 0.3, 1.0}) {
      for (bool clustered : {false, true}) {
        for (int trial = 0; trial < 4; ++trial) {
          const int64_t numel = 1 + static_cast<int64_t>(rng() % 5000);
          const std::vector<uint8_t> parent = RandomTensor(dtype, numel, rng);
          const std::vector<uint8_t> child = Step(dtype, parent, density, clustered, rng);
          const std::string want = Digest(dtype, numel, child);
          absl::StatusOr<TensorDelta> best = EncodeDelta(dtype, parent, child);
          ASSERT_TRUE(best.ok()) << best.status();
          for (int e = 0; e < 3; ++e) {
            absl::StatusOr<TensorDelta> d =
                e == 0 ? best
                       : EncodeDeltaAs(e == 1 ? DeltaEncoding::kOverwrite : DeltaEncoding::kXor,
                                       dtype, parent, child);
            ASSERT_TRUE(d.ok()) << d.status();
            if (e > 0) {
              EXPECT_LE(best->payload.size(), d->payload.size());
            }
            std::vector<uint8_t> copy = parent;
            absl::Status s = ApplyDelta(dtype, d->view(), absl::MakeSpan(copy));
            ASSERT_TRUE(s.ok()) << s << " dtype " << model_io::DTypeName(dtype) << " density "
                                << density << " encoding " << e;
            ASSERT_EQ(copy, child) << model_io::DTypeName(dtype) << " density " << density;
            ASSERT_EQ(Digest(dtype, numel, copy), want);
            ++checked;
          }
          ++chose[best->encoding == DeltaEncoding::kOverwrite ? 0 : 1];
          absl::StatusOr<int64_t> changed = CountChangedWords(dtype, parent, child);
          ASSERT_TRUE(changed.ok());
          if (best->encoding == DeltaEncoding::kOverwrite) {
            EXPECT_EQ(best->count, *changed);
          }
        }
      }
    }
  }
  EXPECT_EQ(checked, 3 * 6 * 2 * 4 * 3);
  // Sparse scattered changes pick overwrite, dense ones xor: both are exercised.
  EXPECT_GT(chose[0], 0);
  EXPECT_GT(chose[1], 0);
}

TEST(DeltaTest, SparseBf16DeltaIsAFewPercentOfDense) {
  std::mt19937_64 rng(7);
  const int64_t numel = 1 << 20;
  const std::vector<uint8_t> parent = RandomTensor(DType::kBF16, numel, rng);
  const std::vector<uint8_t> child = Step(DType::kBF16, parent, 0.02, false, rng);
  absl::StatusOr<TensorDelta> d = EncodeDelta(DType::kBF16, parent, child);
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->encoding, DeltaEncoding::kOverwrite);
  EXPECT_LE(d->payload.size(), parent.size() * 5 / 100);
}

TEST(DeltaTest, UnchangedTensorEncodesEmpty) {
  std::mt19937_64 rng(1);
  const std::vector<uint8_t> t = RandomTensor(DType::kF32, 100, rng);
  absl::StatusOr<TensorDelta> d = EncodeDelta(DType::kF32, t, t);
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->count, 0);
  EXPECT_TRUE(d->payload.empty());
  std::vector<uint8_t> copy = t;
  EXPECT_TRUE(ApplyDelta(DType::kF32, d->view(), absl::MakeSpan(copy)).ok());
  EXPECT_EQ(copy, t);
}

TEST(DeltaTest, RefusesBadPairs) {
  std::vector<uint8_t> a(8), b(6), c(7);
  EXPECT_TRUE(absl::IsInvalidArgument(EncodeDelta(DType::kF32, a, b).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(EncodeDelta(DType::kBF16, c, c).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(EncodeDelta(DType::kI64, a, a).status()));
}

// Every cut of every payload, random corruptions and hand-made malformed payloads: refused with
// the target unchanged, or (a corruption that still parses) applied within bounds; never a
// crash or a write outside the tensor.
TEST(DeltaTest, MalformedPayloadsAreRefusedAndWriteNothing) {
  std::mt19937_64 rng(3);
  for (DType dtype : {DType::kBF16, DType::kF32}) {
    for (DeltaEncoding enc : {DeltaEncoding::kOverwrite, DeltaEncoding::kXor}) {
      const int64_t numel = 300;
      const std::vector<uint8_t> parent = RandomTensor(dtype, numel, rng);
      const std::vector<uint8_t> child = Step(dtype, parent, 0.1, false, rng);
      absl::StatusOr<TensorDelta> d = EncodeDeltaAs(enc, dtype, parent, child);
      ASSERT_TRUE(d.ok());
      ASSERT_GT(d->payload.size(), 4u);
      for (size_t cut = 0; cut < d->payload.size(); ++cut) {
        DeltaView v = d->view();
        v.payload = v.payload.subspan(0, cut);
        std::vector<uint8_t> copy = parent;
        absl::Status s = ApplyDelta(dtype, v, absl::MakeSpan(copy));
        EXPECT_TRUE(absl::IsInvalidArgument(s)) << "cut at " << cut;
        EXPECT_EQ(copy, parent) << "cut at " << cut;
      }
      for (int trial = 0; trial < 2000; ++trial) {
        std::vector<uint8_t> bad = d->payload;
        bad[rng() % bad.size()] ^= static_cast<uint8_t>(1 + rng() % 255);
        TensorDelta t{enc, d->count, bad};
        std::vector<uint8_t> copy = parent;
        absl::Status s =
            ApplyDelta(dtype, t.view(), absl::MakeSpan(copy), {.allow_non_finite = true});
        if (!s.ok()) {
          EXPECT_EQ(copy, parent);
        }
      }
      // A count that disagrees with the payload.
      for (int64_t count : {d->count - 1, d->count + 1, int64_t{-1}, numel + 1}) {
        TensorDelta t{enc, count, d->payload};
        std::vector<uint8_t> copy = parent;
        EXPECT_TRUE(absl::IsInvalidArgument(ApplyDelta(dtype, t.view(), absl::MakeSpan(copy))));
        EXPECT_EQ(copy, parent);
      }
      // Trailing bytes.
      TensorDelta longer = *d;
      longer.payload.push_back(0);
      std::vector<uint8_t> copy = parent;
      EXPECT_TRUE(absl::IsInvalidArgument(ApplyDelta(dtype, longer.view(), absl::MakeSpan(copy))));
      EXPECT_EQ(copy, parent);
      // The wrong tensor size.
      std::vector<uint8_t> small(parent.begin(), parent.begin() + parent.size() / 2);
      const std::vector<uint8_t> small_before = small;
      EXPECT_FALSE(ApplyDelta(dtype, d->view(), absl::MakeSpan(small)).ok());
      EXPECT_EQ(small, small_before);
    }
  }
}

TEST(DeltaTest, HandMadeOutOfRangeInputs) {
  std::vector<uint8_t> target(8 * 2, 0);  // 8 BF16 words
  const std::vector<uint8_t> before = target;
  // overwrite: index 8 of 8.
  TensorDelta past{DeltaEncoding::kOverwrite, 1, {8, 0x80, 0x3f}};
  absl::Status s = ApplyDelta(DType::kBF16, past.view(), absl::MakeSpan(target));
  EXPECT_TRUE(absl::IsInvalidArgument(s));
  EXPECT_NE(s.message().find("index past"), std::string::npos) << s;
  // overwrite: a huge gap (10-byte varint) must not wrap around.
  TensorDelta wrap{DeltaEncoding::kOverwrite,
                   1,
                   {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01, 0x80, 0x3f}};
  EXPECT_TRUE(
      absl::IsInvalidArgument(ApplyDelta(DType::kBF16, wrap.view(), absl::MakeSpan(target))));
  // varint longer than 64 bits.
  TensorDelta over{DeltaEncoding::kOverwrite,
                   1,
                   {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f, 0x80, 0x3f}};
  EXPECT_TRUE(
      absl::IsInvalidArgument(ApplyDelta(DType::kBF16, over.view(), absl::MakeSpan(target))));
  // xor: a run past the end, a run with no progress, runs short of the tensor.
  TensorDelta run_past{DeltaEncoding::kXor, 2, {7, 2, 1, 0, 1, 0}};
  EXPECT_TRUE(
      absl::IsInvalidArgument(ApplyDelta(DType::kBF16, run_past.view(), absl::MakeSpan(target))));
  TensorDelta stuck{DeltaEncoding::kXor, 0, {0, 0, 8, 0}};
  EXPECT_TRUE(
      absl::IsInvalidArgument(ApplyDelta(DType::kBF16, stuck.view(), absl::MakeSpan(target))));
  TensorDelta short_runs{DeltaEncoding::kXor, 0, {4, 0}};
  EXPECT_TRUE(
      absl::IsInvalidArgument(ApplyDelta(DType::kBF16, short_runs.view(), absl::MakeSpan(target))));
  EXPECT_EQ(target, before);
  // A well-formed xor: 7 unchanged, 1 changed.
  TensorDelta ok{DeltaEncoding::kXor, 1, {7, 1, 0x80, 0x3f}};
  EXPECT_TRUE(ApplyDelta(DType::kBF16, ok.view(), absl::MakeSpan(target)).ok());
  EXPECT_EQ(target[14], 0x80);
  EXPECT_EQ(target[15], 0x3f);
}

TEST(DeltaTest, NonFiniteValuesAreRefusedUnlessAllowed) {
  for (DType dtype : {DType::kBF16, DType::kF16, DType::kF32}) {
    std::mt19937_64 rng(5);
    const std::vector<uint8_t> parent = RandomTensor(dtype, 64, rng);
    std::vector<uint8_t> child = parent;
    const float nan = std::numeric_limits<float>::quiet_NaN();
    model_io::ConvertFromF32(&nan, 1, dtype, child.data() + 10 * model_io::DTypeSize(dtype));
    for (DeltaEncoding enc : {DeltaEncoding::kOverwrite, DeltaEncoding::kXor}) {
      absl::StatusOr<TensorDelta> d = EncodeDeltaAs(enc, dtype, parent, child);
      ASSERT_TRUE(d.ok());
      std::vector<uint8_t> copy = parent;
      absl::Status s = ApplyDelta(dtype, d->view(), absl::MakeSpan(copy));
      EXPECT_TRUE(absl::IsInvalidArgument(s));
      EXPECT_NE(s.message().find("element 10"), std::string::npos) << s;
      EXPECT_EQ(copy, parent);
      EXPECT_TRUE(
          ApplyDelta(dtype, d->view(), absl::MakeSpan(copy), {.allow_non_finite = true}).ok());
      EXPECT_EQ(copy, child);
    }
  }
}

TEST(DeltaTest, MaxPayloadBytesBoundsEveryEncoding) {
  std::mt19937_64 rng(7);
  for (DType dtype : {DType::kBF16, DType::kF16, DType::kF32}) {
    const int width = *DeltaWordBytes(dtype);
    for (double density : {0.0, 0.001, 0.02, 0.3, 1.0}) {
      for (bool clustered : {false, true}) {
        const int64_t numel = 4096;
        const std::vector<uint8_t> parent = RandomTensor(dtype, numel, rng);
        const std::vector<uint8_t> child = Step(dtype, parent, density, clustered, rng);
        for (DeltaEncoding e : {DeltaEncoding::kOverwrite, DeltaEncoding::kXor}) {
          absl::StatusOr<TensorDelta> d = EncodeDeltaAs(e, dtype, parent, child);
          ASSERT_TRUE(d.ok()) << d.status();
          absl::StatusOr<int64_t> most = MaxDeltaPayloadBytes(e, d->count, numel, width);
          ASSERT_TRUE(most.ok()) << most.status();
          EXPECT_LE(static_cast<int64_t>(d->payload.size()), *most)
              << DeltaEncodingName(e) << " density " << density;
        }
      }
    }
  }
  EXPECT_TRUE(
      absl::IsInvalidArgument(MaxDeltaPayloadBytes(DeltaEncoding::kOverwrite, 11, 10, 2).status()));
  EXPECT_TRUE(
      absl::IsInvalidArgument(MaxDeltaPayloadBytes(DeltaEncoding::kXor, -1, 10, 2).status()));
  EXPECT_EQ(*MaxDeltaPayloadBytes(DeltaEncoding::kOverwrite, 0, 10, 2), 0);
}

}  // namespace
}  // namespace rl::weight_sync
