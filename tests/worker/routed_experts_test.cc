// R3 over gRPC: a worker started with --enable-return-routed-experts on a tiny Qwen3-MoE returns
// the routed experts (int32 bytes [tokens, layers, top_k]) and weights (float32) in the final
// message, equal to the CPU runner's own routing of prompt + output; without the flag, or on a
// dense model, the request is refused naming the flag.
#include <cstring>

#include "common/model_io/model_maker.h"
#include "services/worker/model/cpu_model_runner.h"
#include "tests/worker/worker_test_util.h"

namespace rl::worker::testing {
namespace {

class RoutedExpertsTest : public WorkerFixture {
 protected:
  void SetUp() override {
    model_io::MakeModelOptions mo;
    mo.arch = "qwen3_moe";
    mo.seed = 21;
    mo.out_dir = dir_.path();
    ASSERT_TRUE(model_io::MakeModel(mo).ok());
  }

  rl::v1::GenerateRequest R3Request(int start) {
    rl::v1::GenerateRequest req = Greedy({5, 17, 300, 42, 7, 250}, 7);
    req.mutable_sampling_params()->set_ignore_eos(true);
    req.set_return_routed_experts(true);
    req.set_return_expert_weights(true);
    req.set_routed_experts_start_len(start);
    return req;
  }

  TempDir dir_;
};

TEST_F(RoutedExpertsTest, FinalMessageCarriesTheRoutingOfEveryToken) {
  WorkerConfig config;
  config.model_path = dir_.path();
  config.enable_return_routed_experts = true;
  StartWorker(config);
  rl::v1::GenerateFinal f;
  grpc::Status s = Generate(R3Request(2), &f);
  ASSERT_TRUE(s.ok()) << s.error_message();
  ASSERT_EQ(f.output_ids_size(), 7);
  const rl::v1::RoutedExperts& r = f.routed_experts();
  // 6 prompt + 7 output - 1 (the last output is never fed back) - start 2 = 10 tokens.
  ASSERT_EQ(r.shape_size(), 3);
  EXPECT_EQ(r.shape(0), 10);
  EXPECT_EQ(r.shape(1), 2);
  EXPECT_EQ(r.shape(2), 4);
  EXPECT_EQ(r.start_pos(), 2);
  ASSERT_EQ(r.expert_ids().size(), 10u * 2 * 4 * sizeof(int32_t));
  ASSERT_EQ(r.expert_weights().size(), r.expert_ids().size());

  model::RunnerOptions ro;
  ro.model_dir = dir_.path();
  ro.num_kv_slots = 64;
  ro.num_threads = 1;
  auto runner = model::CreateCpuModelRunner(ro);
  ASSERT_TRUE(runner.ok()) << runner.status();
  model::SequenceInput seq;
  const rl::v1::GenerateRequest req = R3Request(2);
  seq.token_ids.assign(req.input_ids().ids().begin(), req.input_ids().ids().end());
  seq.token_ids.insert(seq.token_ids.end(), f.output_ids().begin(), f.output_ids().end() - 1);
  for (size_t i = 0; i < seq.token_ids.size(); ++i) seq.kv_slots.push_back(static_cast<int>(i));
  seq.logits = model::LogitsMode::kNone;
  model::ForwardInput in;
  in.seqs = {seq};
  in.return_routing = true;
  model::ForwardOutput out;
  ASSERT_TRUE((*runner)->Forward(in, &out).ok());
  const size_t skip = 2 * 2 * 4;
  EXPECT_EQ(
      std::memcmp(r.expert_ids().data(), out.routed_experts.data() + skip, r.expert_ids().size()),
      0);
  EXPECT_EQ(std::memcmp(r.expert_weights().data(), out.routed_weights.data() + skip,
                        r.expert_weights().size()),
            0);

  // Not asked for: no routing in the final message.
  rl::v1::GenerateFinal plain;
  ASSERT_TRUE(Generate(Greedy({5, 17, 300}, 3), &plain).ok());
  EXPECT_FALSE(plain.has_routed_experts());
}

TEST_F(RoutedExpertsTest, RefusedWithoutTheFlagOrExperts) {
  WorkerConfig config;
  config.model_path = dir_.path();
  StartWorker(config);
  rl::v1::GenerateFinal f;
  grpc::Status s = Generate(R3Request(0), &f);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << s.error_message();
  EXPECT_NE(s.error_message().find("--enable-return-routed-experts"), std::string::npos);
  rl::v1::GenerateRequest start_only = Greedy({5, 17}, 2);
  start_only.set_routed_experts_start_len(1);
  EXPECT_EQ(Generate(start_only, &f).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  server_->Shutdown();
  server_.reset();

  WorkerConfig dense;  // stories260K has no experts
  dense.enable_return_routed_experts = true;
  StartWorker(dense);
  EXPECT_EQ(Generate(R3Request(0), &f).error_code(), grpc::StatusCode::FAILED_PRECONDITION);
}

// --rl-on-policy-target is an alias: it turns on the fork's alignment flags and says which.
TEST(OnPolicyTargetTest, TurnsOnTheAlignmentFlags) {
  WorkerConfig c;
  c.model_path = Stories();
  EXPECT_EQ(ApplyOnPolicyTarget(&c), "");
  EXPECT_FALSE(c.fp32_lm_head || c.fp32_router || c.batch_invariant);
  c.rl_on_policy_target = "xorl";
  ASSERT_TRUE(Validate(c).ok());
  std::string line = ApplyOnPolicyTarget(&c);
  EXPECT_TRUE(c.fp32_lm_head && c.fp32_router);
  EXPECT_FALSE(c.batch_invariant);
  EXPECT_NE(line.find("--enable-fp32-router"), std::string::npos) << line;
  c = WorkerConfig();
  c.model_path = Stories();
  c.rl_on_policy_target = "xorl-batch-invariant";
  line = ApplyOnPolicyTarget(&c);
  EXPECT_TRUE(c.fp32_lm_head && c.fp32_router && c.batch_invariant);
  EXPECT_NE(line.find("--batch-invariant"), std::string::npos) << line;
  c.rl_on_policy_target = "sglang";
  const absl::Status s = Validate(c);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("--rl-on-policy-target"), std::string::npos) << s;
}

// --staging-nice (issue 30): a nice increment in [0, 19], named when out of range.
TEST(WorkerConfigTest, StagingNiceIsBounded) {
  WorkerConfig c;
  c.model_path = Stories();
  EXPECT_EQ(c.staging_nice, 10);
  EXPECT_TRUE(Validate(c).ok());
  for (int bad : {-1, 20}) {
    c.staging_nice = bad;
    const absl::Status s = Validate(c);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(s.message().find("--staging-nice"), std::string::npos) << s;
  }
}

}  // namespace
}  // namespace rl::worker::testing
