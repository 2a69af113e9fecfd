// R3 through the engine on the real CPU runner and a tiny Qwen3-MoE: the routed experts (and
// weights) a request gets back equal the runner's own routing of prompt + output (all tokens
// but the last), from the requested start position; a prefix-cache hit still reports the whole
// prompt; a retract → weight update → continue keeps the routing recorded before the update.
#include <cstring>
#include <filesystem>

#include "common/model_io/model_maker.h"
#include "common/status.h"
#include "gtest/gtest.h"
#include "services/worker/engine/engine.h"
#include "services/worker/model/cpu_model_runner.h"
#include "tests/testing/test_data.h"
#include "tests/worker/engine/engine_test_util.h"

namespace rl::engine::testing {
namespace {

constexpr int64_t kSlots = 512;

class EngineMoeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = tmp_.path();
    model_io::MakeModelOptions mo;
    mo.arch = "qwen3_moe";
    mo.seed = 11;
    mo.out_dir = dir_;
    ASSERT_TRUE(model_io::MakeModel(mo).ok());
    reference_ = MakeRunner();
  }

  std::unique_ptr<model::ModelRunner> MakeRunner() {
    model::RunnerOptions ro;
    ro.model_dir = dir_;
    ro.page_size = 4;
    ro.num_kv_slots = kSlots;
    ro.num_threads = 1;
    auto runner = model::CreateCpuModelRunner(ro);
    EXPECT_TRUE(runner.ok()) << runner.status();
    return std::move(runner).value();
  }

  std::unique_ptr<Engine> MakeEngine(bool routing, GatedRunner** gate = nullptr) {
    auto gated = std::make_unique<GatedRunner>(MakeRunner());
    if (gate != nullptr) *gate = gated.get();
    EngineOptions eo;
    eo.check_invariants = true;
    eo.enable_return_routed_experts = routing;
    auto engine = Engine::Create(std::move(gated), eo);
    EXPECT_TRUE(engine.ok()) << engine.status();
    return std::move(engine).value();
  }

  // The reference runner's routing of `tokens` in one prefill: [tokens, layers, k].
  model::ForwardOutput Route(const std::vector<int32_t>& tokens) {
    model::SequenceInput seq;
    seq.token_ids = tokens;
    for (size_t i = 0; i < tokens.size(); ++i) seq.kv_slots.push_back(static_cast<int32_t>(i));
    seq.logits = model::LogitsMode::kNone;
    model::ForwardInput in;
    in.seqs = {seq};
    in.return_routing = true;
    model::ForwardOutput out;
    EXPECT_TRUE(reference_->Forward(in, &out).ok());
    return out;
  }

  static GenerateRequest R3(const std::string& id, std::vector<int32_t> prompt, int32_t new_tokens,
                            int32_t start = 0) {
    GenerateRequest r = Greedy(id, std::move(prompt), new_tokens);
    r.sampling.ignore_eos = true;
    r.return_routed_experts = true;
    r.return_expert_weights = true;
    r.routed_experts_start_len = start;
    return r;
  }

  // Every processed token of `r` (prompt + output but the last).
  static std::vector<int32_t> Processed(const GenerateRequest& req, const GenerateResult& r) {
    std::vector<int32_t> t = req.input_ids;
    t.insert(t.end(), r.output_ids.begin(), r.output_ids.end() - 1);
    return t;
  }

  int64_t Width() const {
    const auto& c = reference_->config();
    return static_cast<int64_t>(c.MoeLayers().size()) * c.num_experts_per_tok;
  }

  const rl::testing::TempDir tmp_;
  std::string dir_;
  std::unique_ptr<model::ModelRunner> reference_;
};

TEST_F(EngineMoeTest, RoutedExpertsEqualTheRunnersRouting) {
  auto engine = MakeEngine(true);
  Collector c;
  const std::vector<int32_t> prompt = Prompt(13, 5, 500);
  for (int32_t start : {0, 6, 13}) {
    const std::string id = absl::StrCat("r", start);
    const GenerateRequest req = R3(id, prompt, 9, start);
    ASSERT_TRUE(engine->Submit(req, c.Callbacks()).ok());
    ASSERT_TRUE(c.WaitFor(static_cast<size_t>(start == 0 ? 1 : start == 6 ? 2 : 3)));
    const GenerateResult r = c.result(id);
    ASSERT_EQ(r.output_ids.size(), 9u);
    EXPECT_EQ(r.routed_experts_start, start);
    EXPECT_EQ(r.routed_num_layers, 2);  // tiny qwen3_moe: layers 0 and 2 are sparse
    EXPECT_EQ(r.routed_top_k, 4);
    const std::vector<int32_t> processed = Processed(req, r);
    const model::ForwardOutput ref = Route(processed);
    const int64_t w = Width();
    const size_t skip = static_cast<size_t>(start * w);
    ASSERT_EQ(r.routed_experts.size(), (processed.size() - start) * w);
    EXPECT_TRUE(std::equal(r.routed_experts.begin(), r.routed_experts.end(),
                           ref.routed_experts.begin() + skip));
    ASSERT_EQ(r.expert_weights.size(), r.routed_experts.size());
    EXPECT_TRUE(std::equal(r.expert_weights.begin(), r.expert_weights.end(),
                           ref.routed_weights.begin() + skip));
  }
  ExpectNoLeak(*engine);
}

TEST_F(EngineMoeTest, PrefixCacheHitStillReportsTheWholePrompt) {
  auto engine = MakeEngine(true);
  Collector c;
  const std::vector<int32_t> prompt = Prompt(24, 7, 500);
  GenerateRequest plain = Greedy("warm", prompt, 4);
  ASSERT_TRUE(engine->Submit(plain, c.Callbacks()).ok());
  ASSERT_TRUE(c.WaitFor(1));
  const GenerateRequest req = R3("r3", prompt, 4);
  ASSERT_TRUE(engine->Submit(req, c.Callbacks()).ok());
  ASSERT_TRUE(c.WaitFor(2));
  const GenerateResult r = c.result("r3");
  EXPECT_TRUE(c.result("warm").routed_experts.empty());
  const model::ForwardOutput ref = Route(Processed(req, r));
  EXPECT_EQ(r.routed_experts, ref.routed_experts);
  EXPECT_EQ(r.expert_weights, ref.routed_weights);
  ExpectNoLeak(*engine);
}

TEST_F(EngineMoeTest, RefusedWithoutTheFlagAndOnBadFields) {
  auto off = MakeEngine(false);
  Collector c;
  absl::Status s = off->Submit(R3("a", Prompt(5, 1, 500), 2), c.Callbacks());
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("--enable-return-routed-experts"), std::string::npos) << s;

  auto on = MakeEngine(true);
  GenerateRequest weights_only = Greedy("b", Prompt(5, 1, 500), 2);
  weights_only.return_expert_weights = true;
  EXPECT_EQ(on->Submit(weights_only, c.Callbacks()).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(on->Submit(R3("c", Prompt(5, 1, 500), 2, 6), c.Callbacks()).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(on->Submit(R3("d", Prompt(5, 1, 500), 2, -1), c.Callbacks()).code(),
            absl::StatusCode::kInvalidArgument);
}

// Retract mid-generation, swap layer 0's router for its negation (routing changes for nearly
// every token), continue: the routing recorded before the update is kept, not recomputed.
TEST_F(EngineMoeTest, RoutingSurvivesRetractAcrossAWeightUpdate) {
  const std::vector<int32_t> prompt = Prompt(10, 9, 500);
  const GenerateRequest req = R3("x", prompt, 16);
  GatedRunner* gate = nullptr;
  auto engine = MakeEngine(true, &gate);
  Collector c;
  gate->SetStepBudget(0);
  ASSERT_TRUE(engine->Submit(req, c.Callbacks()).ok());
  gate->AllowSteps(5);  // prefill + 4 decode steps
  gate->WaitForSteps(5);
  ASSERT_TRUE(PauseGated(*engine, *gate, PauseMode::kRetract).ok());
  const size_t before = c.streamed("x").size();
  ASSERT_GE(before, 5u);
  ASSERT_LT(before, 16u);

  const std::string name = "model.layers.0.mlp.gate.weight";
  std::vector<float> negated;
  ASSERT_TRUE(reference_
                  ->VisitWeights([&](const model::TensorInfo& info, absl::Span<const uint8_t> b) {
                    if (info.name != name) return;
                    negated.resize(b.size() / sizeof(float));
                    std::memcpy(negated.data(), b.data(), b.size());
                  })
                  .ok());
  ASSERT_FALSE(negated.empty());
  for (float& v : negated) v = -v;
  const model::TensorInfo info{name, "F32", {16, 64}};
  const absl::Span<const uint8_t> bytes(reinterpret_cast<const uint8_t*>(negated.data()),
                                        negated.size() * sizeof(float));
  ASSERT_TRUE(engine
                  ->RunOnEngineThread([&](EngineContext& ctx) {
                    // As an update does: new weights, new version (the old KV is not reused).
                    RETURN_IF_ERROR(ctx.runner().UpdateWeight(info, bytes));
                    ctx.set_weight_version(1);
                    return absl::OkStatus();
                  })
                  .ok());
  gate->SetStepBudget(-1);
  ASSERT_TRUE(engine->Continue().ok());
  ASSERT_TRUE(c.WaitFor(1));
  const GenerateResult r = c.result("x");
  ASSERT_EQ(r.output_ids.size(), 16u);
  EXPECT_GE(r.num_retractions, 1);
  const std::vector<int32_t> processed = Processed(req, r);
  ASSERT_EQ(r.routed_experts.size(), processed.size() * static_cast<size_t>(Width()));

  // Old weights: the recorded prefix (prompt + the outputs fed back before the pause).
  const size_t recorded = (prompt.size() + before - 1) * static_cast<size_t>(Width());
  const model::ForwardOutput old_route = Route(processed);
  EXPECT_TRUE(std::equal(r.routed_experts.begin(), r.routed_experts.begin() + recorded,
                         old_route.routed_experts.begin()));
  // New weights: what re-computing would have given differs on that prefix, and the tokens
  // processed after the update follow the new router.
  ASSERT_TRUE(reference_->UpdateWeight(info, bytes).ok());
  const model::ForwardOutput new_route = Route(processed);
  EXPECT_FALSE(std::equal(r.routed_experts.begin(), r.routed_experts.begin() + recorded,
                          new_route.routed_experts.begin()));
  EXPECT_TRUE(std::equal(r.routed_experts.begin() + recorded, r.routed_experts.end(),
                         new_route.routed_experts.begin() + recorded));
  ExpectNoLeak(*engine);
}

}  // namespace
}  // namespace rl::engine::testing
