// The CUDA runner against the CPU oracle and the goldens: stories260K greedy tokens identical to
// golden_greedy.json (float32 and bf16, with and without the FP32 LM head), logits of made
// Llama / Qwen2 / Qwen3 checkpoints within a declared tolerance of the CPU runner, the
// batch-invariant mode (a row's logits bit-identical alone and in any batch), weight updates
// (disk, single tensor) and the sleep/wake round trip (device memory really freed).
// Label gpu: skipped when no CUDA device is visible.
#include "services/worker/model/cuda_runner.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>

#include "common/model_io/model_maker.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "services/worker/model/cpu_model_runner.h"
#include "services/worker/model/weights.h"
#include "services/worker/weights/staged_receive.h"
#include "tests/testing/numeric.h"
#include "tests/worker/model/test_util.h"

namespace rl::model {
namespace {

using testing::DataDir;
using testing::Greedy;
using testing::ReadJson;

using ::rl::testing::MaxAbsDiff;

// float32 KV unless the test says otherwise, so the CUDA runner is compared with the CPU oracle
// on equal terms.
std::unique_ptr<ModelRunner> MustCreate(bool cuda, RunnerOptions o) {
  if (o.num_kv_slots == 0) o.num_kv_slots = 1024;
  if (!cuda || o.kv_cache_dtype == "auto") o.kv_cache_dtype = "float32";
  auto r = cuda ? CreateCudaModelRunner(o) : CreateCpuModelRunner(o);
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? std::move(*r) : nullptr;
}

float MaxAbs(const std::vector<float>& v) {
  float m = 0.0f;
  for (float x : v) m = std::max(m, std::abs(x));
  return m;
}

// A bf16 model runs bf16 GEMMs on the GPU (activations rounded to bf16, about 2^-8 relative per
// operation) against the CPU's float32 exact mode: the bound scales with the logits (1% of the
// largest), never below 0.05.
float Bf16Tolerance(const std::vector<float>& oracle) {
  return std::max(5e-2f, 1e-2f * MaxAbs(oracle));
}

// One forward of tokens[from..] on KV slots from..end (slot i holds position i): the last
// position's logits.
std::vector<float> LastLogits(ModelRunner* r, const std::vector<int32_t>& tokens, size_t from) {
  SequenceInput s;
  s.token_ids.assign(tokens.begin() + static_cast<std::ptrdiff_t>(from), tokens.end());
  s.start_pos = static_cast<int32_t>(from);
  for (size_t i = 0; i < tokens.size(); ++i) s.kv_slots.push_back(static_cast<int32_t>(i));
  s.logits = LogitsMode::kLast;
  ForwardInput in;
  in.seqs = {s};
  ForwardOutput out;
  absl::Status st = r->Forward(in, &out);
  EXPECT_TRUE(st.ok()) << st;
  return out.logits;
}

// Logits of every prompt position (kAll) in one prefill.
std::vector<float> PromptLogits(ModelRunner* r, const std::vector<int32_t>& prompt) {
  SequenceInput s;
  s.token_ids = prompt;
  for (size_t i = 0; i < prompt.size(); ++i) s.kv_slots.push_back(static_cast<int32_t>(i));
  s.logits = LogitsMode::kAll;
  ForwardInput in;
  in.seqs = {s};
  ForwardOutput out;
  absl::Status st = r->Forward(in, &out);
  EXPECT_TRUE(st.ok()) << st;
  return out.logits;
}

class CudaRunnerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (NumCudaDevices() == 0) GTEST_SKIP() << "no CUDA device visible";
  }
  void TearDown() override {
    if (!dir_.empty()) std::filesystem::remove_all(dir_);
  }
  std::string Make(const std::string& arch, uint64_t seed, const std::string& dtype = "") {
    if (dir_.empty()) dir_ = testing::FreshTempDir("cuda_runner");
    model_io::MakeModelOptions mo;
    mo.arch = arch;
    mo.seed = seed;
    mo.dtype = dtype;
    mo.out_dir = absl::StrCat(dir_, "/", arch, "_", seed, dtype);
    EXPECT_TRUE(model_io::MakeModel(mo).ok());
    return mo.out_dir;
  }
  std::string dir_;
};

struct GoldenCase {
  std::string model;
  bool fp32_lm_head;
  bool batch_invariant;
};

class CudaStoriesGoldenTest : public ::testing::TestWithParam<GoldenCase> {};

TEST_P(CudaStoriesGoldenTest, GreedyTokensMatchGolden) {
  if (NumCudaDevices() == 0) GTEST_SKIP() << "no CUDA device visible";
  const GoldenCase& c = GetParam();
  const nlohmann::json golden = ReadJson(DataDir() + "/stories260K/golden_greedy.json");
  RunnerOptions o;
  o.model_dir = DataDir() + "/" + c.model;
  o.kv_cache_dtype = "float32";
  o.fp32_lm_head = c.fp32_lm_head;
  o.batch_invariant = c.batch_invariant;
  auto gpu = MustCreate(true, o);
  auto cpu = MustCreate(false, o);
  ASSERT_TRUE(gpu && cpu);
  EXPECT_EQ(gpu->backend_name(), "cuda");
  const auto prompt = golden["prompt_ids"].get<std::vector<int32_t>>();
  const auto expected = golden["generated_ids"].get<std::vector<int32_t>>();
  auto g = Greedy(gpu.get(), prompt, static_cast<int>(expected.size()));
  auto r = Greedy(cpu.get(), prompt, static_cast<int>(expected.size()));
  EXPECT_EQ(g.tokens, expected);
  const float diff = MaxAbsDiff(g.first_logits, r.first_logits);
  // float32 weights: SGEMM vs the CPU's SIMD order; bf16 weights: cuBLAS rounds activations.
  const bool f32 = c.model == "stories260K" || c.batch_invariant;
  EXPECT_LE(diff, f32 ? 1e-3f : 5e-2f);
  RecordProperty("max_abs_diff_vs_cpu", std::to_string(diff));
  if (c.model == "stories260K") {
    const auto ref = golden["first_step_logits"].get<std::vector<double>>();
    double to_golden = 0;
    for (size_t i = 0; i < ref.size(); ++i) {
      to_golden = std::max(to_golden, std::abs(g.first_logits[i] - ref[i]));
    }
    EXPECT_LE(to_golden, 1e-3);
  }
}

INSTANTIATE_TEST_SUITE_P(Models, CudaStoriesGoldenTest,
                         ::testing::Values(GoldenCase{"stories260K", false, false},
                                           GoldenCase{"stories260K", false, true},
                                           GoldenCase{"stories260K-bf16", false, false},
                                           GoldenCase{"stories260K-bf16", true, false},
                                           GoldenCase{"stories260K-bf16", false, true}),
                         [](const auto& info) {
                           return std::string(info.param.model == "stories260K" ? "F32" : "BF16") +
                                  (info.param.fp32_lm_head ? "_Fp32Head" : "") +
                                  (info.param.batch_invariant ? "_Invariant" : "");
                         });

TEST_F(CudaRunnerTest, MadeModelsMatchCpu) {
  for (const std::string arch : {"llama", "qwen2", "qwen3"}) {
    for (const std::string dtype : {"float32", "bfloat16"}) {
      RunnerOptions o;
      o.model_dir = Make(arch, 21, dtype);
      auto gpu = MustCreate(true, o);
      auto cpu = MustCreate(false, o);
      ASSERT_TRUE(gpu && cpu);
      const std::vector<int32_t> prompt = {1, 17, 99, 4, 250, 33, 7, 7, 120, 64};
      const std::vector<float> cpu_logits = PromptLogits(cpu.get(), prompt);
      const float diff = MaxAbsDiff(PromptLogits(gpu.get(), prompt), cpu_logits);
      EXPECT_LE(diff, dtype == "float32" ? 1e-3f : Bf16Tolerance(cpu_logits))
          << arch << " " << dtype << ", max |logit| " << MaxAbs(cpu_logits);
      if (dtype == "float32") {
        EXPECT_EQ(Greedy(gpu.get(), prompt, 16).tokens, Greedy(cpu.get(), prompt, 16).tokens)
            << arch;
      }
    }
  }
}

// Qwen3-MoE on the GPU against the CPU oracle: logits, greedy tokens and the routed experts of
// every prompt token (float32), and bf16 weights with the FP32 router copy.
TEST_F(CudaRunnerTest, MoeMatchesCpu) {
  const std::vector<int32_t> prompt = {1, 17, 99, 4, 250, 33, 7, 7, 120, 64};
  for (const std::string dtype : {"float32", "bfloat16"}) {
    RunnerOptions o;
    o.model_dir = Make("qwen3_moe", 21, dtype);
    o.fp32_router = true;
    o.kv_cache_dtype = "float32";
    auto gpu = MustCreate(true, o);
    o.kv_cache_dtype = "auto";
    auto cpu = MustCreate(false, o);
    ASSERT_TRUE(gpu && cpu);
    const float diff = MaxAbsDiff(PromptLogits(gpu.get(), prompt), PromptLogits(cpu.get(), prompt));
    EXPECT_LE(diff, dtype == "float32" ? 1e-3f : 5e-2f) << dtype;
    if (dtype != "float32") continue;
    EXPECT_EQ(Greedy(gpu.get(), prompt, 16).tokens, Greedy(cpu.get(), prompt, 16).tokens);
    SequenceInput seq;
    seq.token_ids = prompt;
    for (size_t i = 0; i < prompt.size(); ++i) seq.kv_slots.push_back(static_cast<int32_t>(i));
    seq.logits = LogitsMode::kNone;
    ForwardInput in;
    in.seqs = {seq};
    in.return_routing = true;
    ForwardOutput g, c;
    ASSERT_TRUE(gpu->Forward(in, &g).ok());
    ASSERT_TRUE(cpu->Forward(in, &c).ok());
    EXPECT_EQ(g.routed_experts, c.routed_experts);
    ASSERT_EQ(g.routed_weights.size(), c.routed_weights.size());
    EXPECT_LE(MaxAbsDiff(g.routed_weights, c.routed_weights), 1e-5f);
  }
}

// The same request alone and inside batches of other requests (prefill chunks and decodes at
// other positions, before and after it) gives bit-identical logits in batch-invariant mode.
TEST_F(CudaRunnerTest, BatchInvariantModeIsBitIdentical) {
  RunnerOptions o;
  o.model_dir = Make("qwen3", 22, "bfloat16");
  o.batch_invariant = true;
  o.num_kv_slots = 4096;
  auto gpu = MustCreate(true, o);
  ASSERT_TRUE(gpu);
  std::mt19937 rng(5);
  std::uniform_int_distribution<int32_t> tok(0, static_cast<int32_t>(gpu->config().vocab_size - 1));
  auto make_seq = [&](int32_t region, int32_t len, LogitsMode mode) {
    SequenceInput s;
    for (int32_t i = 0; i < len; ++i) {
      s.token_ids.push_back(tok(rng));
      s.kv_slots.push_back(region * 512 + i);
    }
    s.logits = mode;
    return s;
  };
  const SequenceInput target = make_seq(0, 37, LogitsMode::kAll);
  std::vector<float> alone;
  for (int others : {0, 1, 3, 7}) {
    ForwardInput in;
    for (int i = 0; i < others; ++i)
      in.seqs.push_back(make_seq(1 + i, 5 + 9 * i, LogitsMode::kLast));
    const size_t at = in.seqs.size() / 2;
    in.seqs.insert(in.seqs.begin() + static_cast<std::ptrdiff_t>(at), target);
    ForwardOutput out;
    ASSERT_TRUE(gpu->Forward(in, &out).ok());
    std::vector<float> mine(out.logits.begin() + out.row_begin[at] * out.vocab_size,
                            out.logits.begin() + out.row_begin[at + 1] * out.vocab_size);
    if (alone.empty()) {
      alone = mine;
    } else {
      ASSERT_EQ(alone.size(), mine.size());
      EXPECT_EQ(std::memcmp(alone.data(), mine.data(), alone.size() * sizeof(float)), 0)
          << "with " << others << " other sequences";
    }
  }
}

// Decode steps through captured graphs (padded buckets, bucketed attention splits) against the
// same steps run eagerly: bit-identical in batch-invariant mode (padding cannot change a row),
// within GEMM rounding otherwise; greedy tokens identical. Batch sizes cross bucket borders and
// contexts cross split borders, so graphs are captured, replayed and re-captured.
TEST_F(CudaRunnerTest, GraphReplayEqualsEager) {
  for (bool invariant : {true, false}) {
    RunnerOptions o;
    o.model_dir = Make("qwen3", 27, "bfloat16");
    o.batch_invariant = invariant;
    o.num_kv_slots = 8192;
    RunnerOptions eager_o = o;
    eager_o.cuda_graphs = false;
    auto graphs = MustCreate(true, o);
    auto eager = MustCreate(true, eager_o);
    ASSERT_TRUE(graphs && eager);
    for (int batch : {1, 3, 17}) {
      // Each sequence prefills 250 tokens (eager), then decodes 12 steps (graphs).
      ForwardInput in;
      for (int b = 0; b < batch; ++b) {
        SequenceInput s;
        for (int i = 0; i < 250; ++i) {
          s.token_ids.push_back((b * 31 + i * 7) % 200 + 1);
          s.kv_slots.push_back(b * 300 + i);
        }
        in.seqs.push_back(s);
      }
      ForwardOutput og, oe;
      for (int step = 0; step < 13; ++step) {
        ASSERT_TRUE(graphs->Forward(in, &og).ok());
        ASSERT_TRUE(eager->Forward(in, &oe).ok());
        ASSERT_EQ(og.logits.size(), oe.logits.size());
        if (invariant) {
          EXPECT_EQ(std::memcmp(og.logits.data(), oe.logits.data(), og.logits.size() * 4), 0)
              << "batch " << batch << " step " << step;
        } else {
          EXPECT_LE(MaxAbsDiff(og.logits, oe.logits), 5e-2f) << "batch " << batch;
        }
        for (int b = 0; b < batch; ++b) {
          SequenceInput& s = in.seqs[static_cast<size_t>(b)];
          const int32_t next = testing::Argmax(&oe.logits[b * oe.vocab_size], oe.vocab_size);
          if (invariant)
            EXPECT_EQ(testing::Argmax(&og.logits[b * og.vocab_size], og.vocab_size), next);
          s.start_pos += static_cast<int32_t>(s.token_ids.size());
          s.token_ids = {next};
          s.kv_slots.push_back(b * 300 + s.start_pos);
        }
      }
    }
  }
}

// The default bf16 KV cache: logits close to the float32 cache's, greedy stories260K tokens as
// the golden, half the bytes per slot.
TEST_F(CudaRunnerTest, Bf16KvCache) {
  const nlohmann::json golden = ReadJson(DataDir() + "/stories260K/golden_greedy.json");
  RunnerOptions o;
  o.model_dir = DataDir() + "/stories260K";
  o.num_kv_slots = 1024;
  RunnerOptions f32 = o;
  o.kv_cache_dtype = "bfloat16";
  auto bf16_runner = CreateCudaModelRunner(o);
  ASSERT_TRUE(bf16_runner.ok()) << bf16_runner.status();
  auto f32_runner = MustCreate(true, f32);
  ASSERT_TRUE(f32_runner);
  const auto prompt = golden["prompt_ids"].get<std::vector<int32_t>>();
  const auto expected = golden["generated_ids"].get<std::vector<int32_t>>();
  auto b = Greedy(bf16_runner->get(), prompt, static_cast<int>(expected.size()));
  auto f = Greedy(f32_runner.get(), prompt, static_cast<int>(expected.size()));
  EXPECT_EQ(b.tokens, expected);
  EXPECT_LE(MaxAbsDiff(b.first_logits, f.first_logits), 5e-2f);
  o.kv_cache_dtype = "float16x";
  EXPECT_EQ(CreateCudaModelRunner(o).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(CudaRunnerTest, WeightUpdatesFollowTheCpu) {
  RunnerOptions a;
  a.model_dir = Make("qwen2", 23, "float32");
  RunnerOptions b = a;
  b.model_dir = Make("qwen2", 24, "float32");
  auto gpu = MustCreate(true, a);
  auto cpu_b = MustCreate(false, b);
  ASSERT_TRUE(gpu && cpu_b);
  const std::vector<int32_t> prompt = {5, 6, 7, 8, 9};
  const std::vector<float> before = PromptLogits(gpu.get(), prompt);
  ASSERT_TRUE(gpu->LoadWeightsFromDisk(b.model_dir).ok());
  const std::vector<float> after = PromptLogits(gpu.get(), prompt);
  EXPECT_GT(MaxAbsDiff(before, after), 1e-2f);
  EXPECT_LE(MaxAbsDiff(after, PromptLogits(cpu_b.get(), prompt)), 1e-3f);
  // A bad checkpoint leaves the weights serving.
  EXPECT_FALSE(gpu->LoadWeightsFromDisk(a.model_dir + "/missing").ok());
  EXPECT_EQ(PromptLogits(gpu.get(), prompt), after);
  // A staged version (issue 30): read ahead on the host, copied to the device at activation.
  auto staged = LoadWeights(a.model_dir, gpu->config());
  ASSERT_TRUE(staged.ok()) << staged.status();
  EXPECT_EQ(PromptLogits(gpu.get(), prompt), after);
  ASSERT_TRUE(gpu->ActivateWeights(&*staged, a.model_dir, "").ok());
  EXPECT_LE(MaxAbsDiff(PromptLogits(gpu.get(), prompt), before), 1e-3f);
  ASSERT_TRUE(gpu->LoadWeightsFromDisk(b.model_dir).ok());
  // One tensor, converted from bf16.
  const std::string name = "model.layers.0.mlp.down_proj.weight";
  TensorInfo info;
  for (const TensorInfo& t : gpu->ListWeights()) {
    if (t.name == name) info = t;
  }
  ASSERT_EQ(info.name, name);
  int64_t numel = 1;
  for (int64_t d : info.shape) numel *= d;
  std::vector<float> values(static_cast<size_t>(numel), 0.01f);
  std::vector<uint8_t> raw(static_cast<size_t>(numel) * 2);
  model_io::ConvertFromF32(values.data(), numel, model_io::DType::kBF16, raw.data());
  info.dtype = "BF16";
  ASSERT_TRUE(gpu->UpdateWeight(info, raw).ok());
  ASSERT_TRUE(cpu_b->UpdateWeight(info, raw).ok());
  EXPECT_LE(MaxAbsDiff(PromptLogits(gpu.get(), prompt), PromptLogits(cpu_b.get(), prompt)), 1e-3f);
}

// Staged tensors (a staged tensor stream or group receive, issue 30) activate on CUDA by the
// same path as on the CPU (worker::ApplyStaged: validated, then copied into the device mirror
// inside the pause): a whole checkpoint staged as tensors serves like the CPU runner that loaded
// it, and a staged set with a wrong shape changes nothing.
TEST_F(CudaRunnerTest, StagedTensorsActivateLikeTheCpu) {
  RunnerOptions a;
  a.model_dir = Make("qwen2", 25, "float32");
  RunnerOptions b = a;
  b.model_dir = Make("qwen2", 26, "float32");
  auto gpu = MustCreate(true, a);
  auto cpu_b = MustCreate(false, b);
  ASSERT_TRUE(gpu && cpu_b);
  const std::vector<int32_t> prompt = {5, 6, 7, 8, 9};
  const std::vector<float> before = PromptLogits(gpu.get(), prompt);
  std::vector<worker::NamedTensor> staged;
  ASSERT_TRUE(cpu_b
                  ->VisitWeights([&](const TensorInfo& info, absl::Span<const uint8_t> bytes) {
                    staged.push_back({info, std::vector<uint8_t>(bytes.begin(), bytes.end())});
                  })
                  .ok());
  ASSERT_FALSE(staged.empty());
  std::vector<worker::NamedTensor> bad = {staged.front()};
  bad.front().info.shape.push_back(1);
  EXPECT_FALSE(worker::ApplyStaged(*gpu, bad).ok());
  EXPECT_EQ(PromptLogits(gpu.get(), prompt), before);
  ASSERT_TRUE(worker::ApplyStaged(*gpu, staged).ok());
  EXPECT_LE(MaxAbsDiff(PromptLogits(gpu.get(), prompt), PromptLogits(cpu_b.get(), prompt)), 1e-3f);
}

// In-flight update (issue 34, keep_kv): a sequence prefilled and decoded with weights A goes on
// decoding on its existing KV after a staged activation of weights B (no recompute). The CUDA
// runner keeps the KV pool and its decode graphs across the activation and follows the CPU
// oracle doing the same; the kept-KV logits differ from a recompute under B (the KV is A's).
TEST_F(CudaRunnerTest, KeepKvAcrossAnActivationFollowsTheCpu) {
  RunnerOptions a;
  a.model_dir = Make("qwen2", 23, "float32");
  const std::string b_dir = Make("qwen2", 24, "float32");
  auto gpu = MustCreate(true, a);
  auto cpu = MustCreate(false, a);
  RunnerOptions b = a;
  b.model_dir = b_dir;
  auto cpu_fresh = MustCreate(false, b);
  ASSERT_TRUE(gpu && cpu && cpu_fresh);
  std::vector<int32_t> tokens = {5, 6, 7, 8, 9, 10, 11};
  auto step = [&](ModelRunner* r, size_t from) { return LastLogits(r, tokens, from); };
  size_t from = 0;
  for (int i = 0; i < 4; ++i) {  // prefill, then three decode steps, under A
    const std::vector<float> g = step(gpu.get(), from), c = step(cpu.get(), from);
    EXPECT_LE(MaxAbsDiff(g, c), 1e-3f) << "step " << i;
    from = tokens.size();
    tokens.push_back(testing::Argmax(c.data(), static_cast<int64_t>(c.size())));
  }
  for (ModelRunner* r : {gpu.get(), cpu.get()}) {
    auto staged = LoadWeights(b_dir, r->config());
    ASSERT_TRUE(staged.ok()) << staged.status();
    ASSERT_TRUE(r->ActivateWeights(&*staged, b_dir, "").ok());
  }
  for (int i = 0; i < 4; ++i) {  // decode on the kept KV under B
    const std::vector<float> g = step(gpu.get(), from), c = step(cpu.get(), from);
    EXPECT_LE(MaxAbsDiff(g, c), 1e-3f) << "kept-KV step " << i;
    if (i == 0) {
      // A recompute of the whole history under B differs: the kept KV really is A's.
      const std::vector<float> fresh = step(cpu_fresh.get(), 0);
      EXPECT_GT(MaxAbsDiff(c, fresh), 1e-3f);
    }
    from = tokens.size();
    tokens.push_back(testing::Argmax(c.data(), static_cast<int64_t>(c.size())));
  }
}

// Staging into a second device copy (issue 30, model/staged_mirror.h): StageOnDevice uploads a
// staged version in slices while the runner serves the old one (its logits unchanged), then
// ActivateWeights copies it on the device; the result equals the CPU oracle under the new
// weights, with and without the FP32 LM head, and equals the host-staged path. A staged copy
// made for other weights is not used (the activation falls back to the host copy).
TEST_F(CudaRunnerTest, StagedDeviceCopyActivatesLikeTheHostPath) {
  for (bool fp32_head : {false, true}) {
    RunnerOptions a;
    a.model_dir = Make("qwen2", 31, "bfloat16");
    a.fp32_lm_head = fp32_head;
    RunnerOptions b = a;
    b.model_dir = Make("qwen2", 32, "bfloat16");
    auto gpu = MustCreate(true, a);
    auto cpu_b = MustCreate(false, b);
    ASSERT_TRUE(gpu && cpu_b);
    const std::vector<int32_t> prompt = {5, 6, 7, 8, 9};
    const std::vector<float> before = PromptLogits(gpu.get(), prompt);
    auto staged = LoadWeights(b.model_dir, gpu->config());
    ASSERT_TRUE(staged.ok()) << staged.status();
    int steps = 0;
    for (;;) {
      auto step = gpu->StageOnDevice(**staged, int64_t{64} << 10);
      ASSERT_TRUE(step.ok()) << step.status();
      ASSERT_TRUE(step->on_device) << step->note;
      ++steps;
      // Serving the old weights between slices.
      if (steps == 1) EXPECT_EQ(PromptLogits(gpu.get(), prompt), before);
      if (step->done) break;
    }
    EXPECT_GT(steps, 1);
    ASSERT_TRUE(gpu->ActivateWeights(&*staged, b.model_dir, "").ok());
    const std::vector<float> after = PromptLogits(gpu.get(), prompt);
    const std::vector<float> oracle = PromptLogits(cpu_b.get(), prompt);
    EXPECT_LE(MaxAbsDiff(after, oracle), Bf16Tolerance(oracle)) << fp32_head;
    // The same activation through the host path serves the same logits.
    auto host_path = MustCreate(true, a);
    ASSERT_TRUE(host_path);
    auto again = LoadWeights(b.model_dir, gpu->config());
    ASSERT_TRUE(again.ok());
    ASSERT_TRUE(host_path->ActivateWeights(&*again, b.model_dir, "").ok());
    EXPECT_EQ(PromptLogits(host_path.get(), prompt), after);
    // A device copy of other weights is not used: b's content is staged on the device, a's
    // weights are activated, and a's logits are served.
    auto other = LoadWeights(b.model_dir, gpu->config());
    auto third = LoadWeights(a.model_dir, gpu->config());
    ASSERT_TRUE(other.ok() && third.ok());
    for (;;) {
      auto step = gpu->StageOnDevice(**other, int64_t{1} << 30);
      ASSERT_TRUE(step.ok());
      if (step->done) break;
    }
    ASSERT_TRUE(gpu->ActivateWeights(&*third, a.model_dir, "").ok());
    EXPECT_LE(MaxAbsDiff(PromptLogits(gpu.get(), prompt), before), 1e-3f);
  }
}

// Resume within the budget (issue 34) on the CUDA path: the engine resumes a sample by
// prefilling prompt + earlier output in one forward and sampling from the last position. On the
// GPU that one prefill must give the logits the token-by-token decode gave at the same position
// (and the CPU's), so a greedy resumed sample continues exactly as the uninterrupted one.
TEST_F(CudaRunnerTest, ResumePrefillOfEarlierOutputContinuesLikeTheDecode) {
  RunnerOptions o;
  o.model_dir = Make("qwen2", 31, "float32");
  auto gpu = MustCreate(true, o);
  auto resumed = MustCreate(true, o);
  auto cpu = MustCreate(false, o);
  ASSERT_TRUE(gpu && resumed && cpu);
  const std::vector<int32_t> prompt = {1, 17, 99, 4, 250, 33, 7};
  const auto step = &LastLogits;
  // The uninterrupted sample: prefill, then 12 decode steps, logits kept per position.
  std::vector<int32_t> tokens = prompt;
  std::vector<std::vector<float>> logits;
  size_t from = 0;
  for (int i = 0; i < 12; ++i) {
    logits.push_back(step(gpu.get(), tokens, from));
    from = tokens.size();
    tokens.push_back(
        testing::Argmax(logits.back().data(), static_cast<int64_t>(logits.back().size())));
  }
  // Interrupted after 5 output tokens: prompt + those 5 in one prefill, then decode the rest.
  constexpr size_t kEarlier = 5;
  std::vector<int32_t> again(tokens.begin(), tokens.begin() + prompt.size() + kEarlier);
  from = 0;
  for (size_t i = kEarlier; i < 12; ++i) {
    const std::vector<float> g = step(resumed.get(), again, from);
    EXPECT_LE(MaxAbsDiff(g, logits[i]), 1e-3f) << "position " << i;
    if (i == kEarlier) {
      EXPECT_LE(MaxAbsDiff(step(cpu.get(), again, 0), g), 1e-3f);
    }
    from = again.size();
    again.push_back(testing::Argmax(g.data(), static_cast<int64_t>(g.size())));
  }
  EXPECT_EQ(again, tokens);
}

TEST_F(CudaRunnerTest, DestroyFreesDeviceMemoryAndRecreateServesTheSame) {
  RunnerOptions o;
  o.model_dir = Make("llama", 25, "bfloat16");
  o.kv_cache_dtype = "bfloat16";
  o.num_kv_slots = -1;  // sized by kv_cache_bytes (MustCreate gives 0 its 1024 slots)
  o.kv_cache_bytes = int64_t{1} << 30;
  auto free_now = [] { return CudaFreeMemory(0).value_or(0); };
  const int64_t before = free_now();
  const std::vector<int32_t> prompt = {3, 1, 4, 1, 5, 9, 2, 6};
  std::vector<int32_t> tokens;
  {
    auto gpu = MustCreate(true, o);
    ASSERT_TRUE(gpu);
    tokens = Greedy(gpu.get(), prompt, 12).tokens;
    EXPECT_LE(free_now(), before - (int64_t{1} << 30));
  }
  EXPECT_GE(free_now(), before - (int64_t{64} << 20));  // all of it back, bar allocator slack
  auto again = MustCreate(true, o);
  ASSERT_TRUE(again);
  EXPECT_EQ(Greedy(again.get(), prompt, 12).tokens, tokens);
}

TEST_F(CudaRunnerTest, BadOptionsAreErrors) {
  RunnerOptions o;
  o.model_dir = Make("llama", 26);
  o.cuda_device = 999;
  EXPECT_EQ(CreateCudaModelRunner(o).status().code(), absl::StatusCode::kInvalidArgument);
  o.cuda_device = 0;
  o.gpu_memory_fraction = 1.5;
  EXPECT_EQ(CreateCudaModelRunner(o).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(CudaAbsentTest, NoDeviceIsAClearError) {
  if (NumCudaDevices() > 0) GTEST_SKIP() << "a CUDA device is present";
  absl::Status s = CreateCudaBackend({}).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
}

}  // namespace
}  // namespace rl::model
