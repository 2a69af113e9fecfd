// Batch invariance and the paged KV contract: a request's logits are bit-identical alone and
// inside batches of 1..16 with other requests (mixed prefill chunks and decode tokens, any
// position in the batch); chunked prefill equals one-shot prefill; slots need not be
// contiguous. Every case runs on each SIMD target the CPU kernels can take here.
#include <algorithm>
#include <cstring>
#include <random>
#include <tuple>

#include "common/model_io/model_maker.h"
#include "gtest/gtest.h"
#include "services/worker/model/cpu_model_runner.h"
#include "tests/testing/simd_targets.h"
#include "tests/worker/model/test_util.h"

namespace rl::model {
namespace {

constexpr int32_t kRegion = 64;  // slots per request

struct Req {
  std::vector<int32_t> tokens;  // all tokens the request will feed
  int32_t fed = 0;              // tokens already in the KV cache
  std::vector<int32_t> slots;   // slot of every position
};

bool BitEqual(const float* a, const float* b, int64_t n) {
  return std::memcmp(a, b, static_cast<size_t>(n) * sizeof(float)) == 0;
}

class BatchInvarianceTest : public ::testing::TestWithParam<std::tuple<std::string, int64_t>> {
 protected:
  BatchInvarianceTest() : target_(std::get<1>(GetParam())) {}

  void SetUp() override {
    const std::string which = std::get<0>(GetParam());
    if (which == "stories") {
      dir_ = testing::DataDir() + "/stories260K";
    } else {
      dir_ = testing::FreshTempDir("batch_" + which);
      model_io::MakeModelOptions mo;
      mo.arch = which;
      mo.seed = 3;
      mo.out_dir = dir_;
      ASSERT_TRUE(model_io::MakeModel(mo).ok());
      made_ = true;
    }
    RunnerOptions ro;
    ro.model_dir = dir_;
    ro.num_kv_slots = 18 * kRegion;
    ro.num_threads = 2;
    auto r = CpuModelRunner::Create(ro);
    ASSERT_TRUE(r.ok()) << r.status();
    runner_ = std::move(*r);
    vocab_ = runner_->config().vocab_size;
  }
  void TearDown() override {
    if (made_) std::filesystem::remove_all(dir_);
  }

  Req MakeReq(std::mt19937* rng, int32_t region, int32_t len, bool shuffled_slots) {
    Req r;
    std::uniform_int_distribution<int32_t> tok(0, static_cast<int32_t>(vocab_ - 1));
    for (int32_t i = 0; i < len; ++i) r.tokens.push_back(tok(*rng));
    for (int32_t i = 0; i < kRegion; ++i) r.slots.push_back(region * kRegion + i);
    if (shuffled_slots) std::shuffle(r.slots.begin(), r.slots.end(), *rng);
    return r;
  }

  static SequenceInput Step(Req* r, int32_t n, LogitsMode mode) {
    SequenceInput s;
    s.start_pos = r->fed;
    s.token_ids.assign(r->tokens.begin() + r->fed, r->tokens.begin() + r->fed + n);
    s.kv_slots.assign(r->slots.begin(), r->slots.begin() + r->fed + n);
    s.logits = mode;
    r->fed += n;
    return s;
  }

  ::rl::testing::ScopedSimdTarget target_;  // for the whole test, runners included
  std::string dir_;
  bool made_ = false;
  std::unique_ptr<CpuModelRunner> runner_;
  int64_t vocab_ = 0;
};

// Target schedule: prefill 7 tokens (all logits), then 4 decode steps.
constexpr int32_t kPrefill = 7;
constexpr int32_t kDecodes = 4;

TEST_P(BatchInvarianceTest, SameLogitsAloneAndInAnyBatch) {
  std::mt19937 rng(1234);
  const Req target_template = MakeReq(&rng, 0, kPrefill + kDecodes, /*shuffled_slots=*/true);

  // Alone.
  std::vector<std::vector<float>> alone;
  {
    Req t = target_template;
    ForwardInput in;
    ForwardOutput out;
    for (int step = 0; step <= kDecodes; ++step) {
      in.seqs = {step == 0 ? Step(&t, kPrefill, LogitsMode::kAll) : Step(&t, 1, LogitsMode::kLast)};
      ASSERT_TRUE(runner_->Forward(in, &out).ok());
      alone.push_back(out.logits);
    }
    ASSERT_EQ(alone[0].size(), static_cast<size_t>(kPrefill * vocab_));
  }

  for (int batch = 1; batch <= 16; ++batch) {
    Req t = target_template;
    // The target moves to another slot region too: slots must not matter either.
    for (int32_t& s : t.slots) s += kRegion * (1 + batch % 2);
    std::vector<Req> others;
    for (int i = 1; i < batch; ++i) {
      std::uniform_int_distribution<int32_t> len(12, 40);
      others.push_back(MakeReq(&rng, 2 + i, len(rng), i % 2 == 0));
    }
    ForwardInput in;
    ForwardOutput out;
    for (int step = 0; step <= kDecodes; ++step) {
      std::vector<SequenceInput> seqs;
      std::vector<int> owner;  // -1: target
      seqs.push_back(step == 0 ? Step(&t, kPrefill, LogitsMode::kAll)
                               : Step(&t, 1, LogitsMode::kLast));
      owner.push_back(-1);
      for (size_t i = 0; i < others.size(); ++i) {
        Req& o = others[i];
        const int32_t left = static_cast<int32_t>(o.tokens.size()) - o.fed;
        if (left <= 0) continue;
        std::uniform_int_distribution<int32_t> chunk(1, std::min(left, 9));
        const int32_t n = (step > 0 && rng() % 2 == 0) ? 1 : chunk(rng);
        const LogitsMode mode = static_cast<LogitsMode>(rng() % 3);
        seqs.push_back(Step(&o, n, mode));
        owner.push_back(static_cast<int>(i));
      }
      // Put the target anywhere in the batch.
      std::vector<size_t> order(seqs.size());
      for (size_t i = 0; i < order.size(); ++i) order[i] = i;
      std::shuffle(order.begin(), order.end(), rng);
      in.seqs.clear();
      size_t target_index = 0;
      for (size_t i = 0; i < order.size(); ++i) {
        if (owner[order[i]] == -1) target_index = i;
        in.seqs.push_back(seqs[order[i]]);
      }
      absl::Status st = runner_->Forward(in, &out);
      ASSERT_TRUE(st.ok()) << st;
      const int64_t b = out.row_begin[target_index];
      const int64_t e = out.row_begin[target_index + 1];
      ASSERT_EQ((e - b) * vocab_, static_cast<int64_t>(alone[step].size()));
      EXPECT_TRUE(BitEqual(out.logits.data() + b * vocab_, alone[step].data(),
                           static_cast<int64_t>(alone[step].size())))
          << "batch " << batch << " step " << step << " position " << target_index;
    }
  }
}

TEST_P(BatchInvarianceTest, ChunkedPrefillEqualsOneShotAndSlotsNeedNotBeContiguous) {
  std::mt19937 rng(99);
  const Req base = MakeReq(&rng, 0, 24, /*shuffled_slots=*/false);
  ForwardInput in;
  ForwardOutput out;

  // One shot, contiguous slots, then two decode steps.
  std::vector<std::vector<float>> ref;
  {
    Req r = base;
    r.tokens.resize(22);
    in.seqs = {Step(&r, 20, LogitsMode::kAll)};
    ASSERT_TRUE(runner_->Forward(in, &out).ok());
    ref.push_back(out.logits);
    for (int i = 0; i < 2; ++i) {
      in.seqs = {Step(&r, 1, LogitsMode::kLast)};
      ASSERT_TRUE(runner_->Forward(in, &out).ok());
      ref.push_back(out.logits);
    }
  }
  // Chunks 7 + 5 + 8 over shuffled slots in another region, then the same decode steps.
  Req r = base;
  r.tokens.resize(22);
  r.slots.clear();
  for (int32_t i = 0; i < kRegion; ++i) r.slots.push_back(5 * kRegion + (i * 37) % kRegion);
  std::vector<float> all;
  for (int32_t n : {7, 5, 8}) {
    in.seqs = {Step(&r, n, LogitsMode::kAll)};
    ASSERT_TRUE(runner_->Forward(in, &out).ok());
    all.insert(all.end(), out.logits.begin(), out.logits.end());
  }
  EXPECT_TRUE(BitEqual(all.data(), ref[0].data(), static_cast<int64_t>(ref[0].size())));
  for (int i = 0; i < 2; ++i) {
    in.seqs = {Step(&r, 1, LogitsMode::kLast)};
    ASSERT_TRUE(runner_->Forward(in, &out).ok());
    EXPECT_TRUE(BitEqual(out.logits.data(), ref[i + 1].data(), vocab_)) << "decode " << i;
  }
  // kLast of a chunk equals the last row of kAll; kNone returns no row.
  Req again = base;
  again.tokens.resize(20);
  in.seqs = {Step(&again, 20, LogitsMode::kLast)};
  ASSERT_TRUE(runner_->Forward(in, &out).ok());
  EXPECT_TRUE(BitEqual(out.logits.data(), ref[0].data() + 19 * vocab_, vocab_));
  Req none = base;
  in.seqs = {Step(&none, 3, LogitsMode::kNone)};
  ASSERT_TRUE(runner_->Forward(in, &out).ok());
  EXPECT_TRUE(out.logits.empty());
  EXPECT_EQ(out.row_begin, (std::vector<int64_t>{0, 0}));
}

TEST_P(BatchInvarianceTest, ThreadCountDoesNotChangeLogits) {
  RunnerOptions ro;
  ro.model_dir = dir_;
  ro.num_kv_slots = 4 * kRegion;
  ro.num_threads = 1;
  auto single = CpuModelRunner::Create(ro);
  ASSERT_TRUE(single.ok());
  std::mt19937 rng(5);
  Req a = MakeReq(&rng, 0, 12, false);
  Req b = a;
  ForwardInput in;
  ForwardOutput out1, out2;
  in.seqs = {Step(&a, 12, LogitsMode::kAll)};
  ASSERT_TRUE(runner_->Forward(in, &out1).ok());
  in.seqs = {Step(&b, 12, LogitsMode::kAll)};
  ASSERT_TRUE((*single)->Forward(in, &out2).ok());
  EXPECT_TRUE(
      BitEqual(out1.logits.data(), out2.logits.data(), static_cast<int64_t>(out1.logits.size())));
}

INSTANTIATE_TEST_SUITE_P(Models, BatchInvarianceTest,
                         ::testing::Combine(::testing::Values("stories", "llama", "qwen2", "qwen3",
                                                              "qwen3_moe"),
                                            ::testing::ValuesIn(::rl::testing::SimdTargets())),
                         [](const auto& info) {
                           return std::get<0>(info.param) + "_" +
                                  ::rl::testing::SimdTargetName(std::get<1>(info.param));
                         });

}  // namespace
}  // namespace rl::model
