// The CPU runner's bf16-products mode (RunnerOptions::cpu_bf16_products, the worker's
// --cpu-bf16-products): how far its logprobs move from the default float32-activation path on
// real bf16 checkpoints (printed, and bounded), and that it stays batch-invariant. Runs where the
// CPU has AVX512-BF16; elsewhere the mode is refused, which is checked instead.
// RL_BF16_PRODUCTS_MODEL=DIR measures one more bf16 checkpoint (the README's figure for the
// 0.5B Llama); CI does not set it.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/matmul_bf16.h"
#include "services/worker/model/cpu_model_runner.h"
#include "tests/worker/model/test_util.h"

namespace rl::model {
namespace {

std::unique_ptr<CpuModelRunner> Runner(const std::string& dir, bool bf16_products) {
  RunnerOptions ro;
  ro.model_dir = dir;
  ro.num_kv_slots = 1024;
  ro.num_threads = 2;
  ro.reserve_update_buffers = false;
  ro.cpu_bf16_products = bf16_products;
  auto r = CpuModelRunner::Create(ro);
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? std::move(*r) : nullptr;
}

// Log-softmax of every row of `logits` [rows, vocab] (double accumulation).
std::vector<double> LogSoftmax(const std::vector<float>& logits, int64_t vocab) {
  std::vector<double> out(logits.size());
  for (size_t b = 0; b < logits.size(); b += static_cast<size_t>(vocab)) {
    double mx = -INFINITY, sum = 0;
    for (int64_t v = 0; v < vocab; ++v) mx = std::max<double>(mx, logits[b + v]);
    for (int64_t v = 0; v < vocab; ++v) sum += std::exp(logits[b + v] - mx);
    for (int64_t v = 0; v < vocab; ++v) out[b + v] = logits[b + v] - mx - std::log(sum);
  }
  return out;
}

struct Difference {
  double max_next_token = 0;  // over positions: |Δ log p(next token)|
  double mean_next_token = 0;
  double max_any = 0;  // over positions and the whole vocabulary, tokens with p > 1e-4
};

// Teacher-forced logprobs of a fixed pseudo-random sequence, both modes, from one prefill.
Difference Measure(const std::string& dir, int32_t len) {
  auto exact = Runner(dir, false);
  auto bf16 = Runner(dir, true);
  if (exact == nullptr || bf16 == nullptr) return {};
  const int64_t vocab = exact->config().vocab_size;
  SequenceInput s;
  for (int32_t i = 0; i < len; ++i) {
    s.token_ids.push_back(static_cast<int32_t>((i * 7919 + 13) % vocab));
    s.kv_slots.push_back(i);
  }
  s.logits = LogitsMode::kAll;
  ForwardInput in;
  in.seqs = {s};
  ForwardOutput a, b;
  EXPECT_TRUE(exact->Forward(in, &a).ok());
  EXPECT_TRUE(bf16->Forward(in, &b).ok());
  const std::vector<double> la = LogSoftmax(a.logits, vocab), lb = LogSoftmax(b.logits, vocab);
  Difference d;
  for (int32_t t = 0; t + 1 < len; ++t) {
    const size_t at = static_cast<size_t>(t * vocab + s.token_ids[t + 1]);
    const double diff = std::abs(la[at] - lb[at]);
    d.max_next_token = std::max(d.max_next_token, diff);
    d.mean_next_token += diff / (len - 1);
    for (int64_t v = 0; v < vocab; ++v) {
      const size_t i = static_cast<size_t>(t * vocab + v);
      if (la[i] > std::log(1e-4)) d.max_any = std::max(d.max_any, std::abs(la[i] - lb[i]));
    }
  }
  std::printf(
      "bf16 products vs float32 activations, %s, %d tokens: |dlogprob| of the next "
      "token max %.4f mean %.4f; any token with p > 1e-4 max %.4f\n",
      dir.c_str(), len, d.max_next_token, d.mean_next_token, d.max_any);
  return d;
}

TEST(Bf16ProductsTest, RefusedWithoutAvx512Bf16OrLogprobsStayClose) {
  const std::string dir = testing::DataDir() + "/stories260K-bf16";
  if (!kernels::cpu::Bf16ProductsSupported()) {
    RunnerOptions ro;
    ro.model_dir = dir;
    ro.cpu_bf16_products = true;
    auto r = CpuModelRunner::Create(ro);
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.status().message().find("AVX512-BF16"), std::string::npos) << r.status();
    return;
  }
  const Difference d = Measure(dir, 64);
  EXPECT_GT(d.max_any, 0.0) << "the mode changed nothing: is it applied?";
  // Measured here: next token max 0.044 (mean 0.011), any likely token max 0.069. The bounds
  // catch a broken mode, not the rounding.
  EXPECT_LT(d.max_next_token, 0.1);
  EXPECT_LT(d.max_any, 0.2);
  if (const char* extra = std::getenv("RL_BF16_PRODUCTS_MODEL")) Measure(extra, 128);
}

// A row's logits do not depend on the batch in this mode either.
TEST(Bf16ProductsTest, BatchInvariant) {
  if (!kernels::cpu::Bf16ProductsSupported()) GTEST_SKIP() << "this CPU has no AVX512-BF16";
  auto runner = Runner(testing::DataDir() + "/stories260K-bf16", true);
  ASSERT_NE(runner, nullptr);
  const int64_t vocab = runner->config().vocab_size;
  auto seq = [](int32_t seed, int32_t len, int32_t slot0) {
    SequenceInput s;
    for (int32_t i = 0; i < len; ++i) {
      s.token_ids.push_back((seed * 31 + i * 17) % 500 + 3);
      s.kv_slots.push_back(slot0 + i);
    }
    s.logits = LogitsMode::kAll;
    return s;
  };
  ForwardInput alone_in, batch_in;
  alone_in.seqs = {seq(1, 21, 0)};
  ForwardOutput alone, batch;
  ASSERT_TRUE(runner->Forward(alone_in, &alone).ok());
  batch_in.seqs = {seq(2, 9, 100), seq(1, 21, 200), seq(3, 40, 300)};
  ASSERT_TRUE(runner->Forward(batch_in, &batch).ok());
  const int64_t b = batch.row_begin[1];
  ASSERT_EQ(alone.logits.size(), static_cast<size_t>(21 * vocab));
  EXPECT_EQ(std::memcmp(batch.logits.data() + b * vocab, alone.logits.data(),
                        alone.logits.size() * sizeof(float)),
            0);
}

}  // namespace
}  // namespace rl::model
