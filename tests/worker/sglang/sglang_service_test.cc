// SglangScheduler on an in-process worker (stories260K), and the pure translation under it.
#include <cmath>
#include <filesystem>
#include <map>
#include <set>
#include <thread>

#include "common/sha256.h"
#include "gmock/gmock.h"
#include "services/worker/sglang/sglang_convert.h"
#include "sglang_scheduler.grpc.pb.h"
#include "tests/worker/worker_test_util.h"

namespace rl::worker {
namespace {

using ::testing::HasSubstr;
namespace common = ::smg::grpc::common;

engine::EngineLimits Limits() {
  engine::EngineLimits l;
  l.vocab_size = 512;
  l.max_context_len = 512;
  l.max_kv_tokens = 100000;
  l.has_text_decoder = true;
  return l;
}

sgl::GenerateRequest Tokens(std::vector<uint32_t> ids) {
  sgl::GenerateRequest r;
  r.set_request_id("r");
  r.mutable_tokenized();
  for (uint32_t t : ids) r.mutable_tokenized()->add_input_ids(t);
  return r;
}

TEST(SglangConvertTest, ProtoZerosMeanDefaults) {
  sgl::GenerateRequest in = Tokens({1, 2, 3});
  auto r = SglangToEngineRequest(in, "id", Limits());
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->id, "id");
  EXPECT_EQ(r->input_ids, (std::vector<int32_t>{1, 2, 3}));
  EXPECT_EQ(r->sampling.temperature, 0.0);  // greedy
  EXPECT_EQ(r->sampling.top_p, 1.0);
  EXPECT_EQ(r->sampling.top_k, -1);
  EXPECT_EQ(r->sampling.repetition_penalty, 1.0);
  EXPECT_EQ(r->sampling.n, 1);
  EXPECT_EQ(r->sampling.max_new_tokens, kSglangDefaultMaxNewTokens);
  EXPECT_FALSE(r->return_logprob);
  EXPECT_EQ(r->logprob_start_len, -1);
}

TEST(SglangConvertTest, SamplingFieldsAndClampedDefault) {
  sgl::GenerateRequest in = Tokens(std::vector<uint32_t>(500, 7));
  sgl::SamplingParams* sp = in.mutable_sampling_params();
  sp->set_temperature(0.7f);
  sp->set_top_p(0.9f);
  sp->set_top_k(5);
  sp->set_min_p(0.1f);
  sp->set_repetition_penalty(1.2f);
  sp->set_frequency_penalty(0.5f);
  sp->set_presence_penalty(0.25f);
  sp->set_min_new_tokens(2);
  sp->set_ignore_eos(true);
  sp->add_stop_token_ids(9);
  sp->add_stop("end");
  sp->set_n(3);
  auto r = SglangToEngineRequest(in, "id", Limits());
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_FLOAT_EQ(r->sampling.temperature, 0.7f);
  EXPECT_FLOAT_EQ(r->sampling.top_p, 0.9f);
  EXPECT_EQ(r->sampling.top_k, 5);
  EXPECT_FLOAT_EQ(r->sampling.min_p, 0.1f);
  EXPECT_FLOAT_EQ(r->sampling.repetition_penalty, 1.2f);
  EXPECT_FLOAT_EQ(r->sampling.frequency_penalty, 0.5f);
  EXPECT_FLOAT_EQ(r->sampling.presence_penalty, 0.25f);
  EXPECT_EQ(r->sampling.min_new_tokens, 2);
  EXPECT_TRUE(r->sampling.ignore_eos);
  EXPECT_EQ(r->sampling.stop_token_ids, std::vector<int32_t>{9});
  EXPECT_EQ(r->sampling.stop, std::vector<std::string>{"end"});
  EXPECT_EQ(r->sampling.n, 3);
  // Unset max_new_tokens: the default, clamped to what the context leaves (512 - 500).
  EXPECT_EQ(r->sampling.max_new_tokens, 12);
}

TEST(SglangConvertTest, TooLongIsInvalidArgumentNotResourceExhausted) {
  sgl::GenerateRequest in = Tokens({1, 2, 3});
  in.mutable_sampling_params()->set_max_new_tokens(510);
  auto r = SglangToEngineRequest(in, "id", Limits());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(), HasSubstr("max_new_tokens"));
  in.mutable_sampling_params()->set_max_new_tokens(509);
  EXPECT_TRUE(SglangToEngineRequest(in, "id", Limits()).ok());
  sgl::GenerateRequest whole = Tokens(std::vector<uint32_t>(513, 7));
  EXPECT_EQ(SglangToEngineRequest(whole, "id", Limits()).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(SglangConvertTest, InputIsChecked) {
  sgl::GenerateRequest none;
  EXPECT_THAT(SglangToEngineRequest(none, "id", Limits()).status().message(),
              HasSubstr("tokenized"));
  EXPECT_THAT(SglangToEngineRequest(Tokens({}), "id", Limits()).status().message(),
              HasSubstr("must not be empty"));
  EXPECT_THAT(SglangToEngineRequest(Tokens({0x80000000u}), "id", Limits()).status().message(),
              HasSubstr("out of range"));
  sgl::GenerateRequest many = Tokens({1});
  many.mutable_sampling_params()->set_n(1000);
  EXPECT_THAT(SglangToEngineRequest(many, "id", Limits()).status().message(),
              HasSubstr("sampling_params.n"));
}

TEST(SglangConvertTest, UnsupportedFeaturesAreRefusedByName) {
  auto refused = [](const sgl::GenerateRequest& in, const char* field) {
    absl::Status s = SglangToEngineRequest(in, "id", Limits()).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << field;
    EXPECT_THAT(s.message(), HasSubstr(field));
  };
  sgl::GenerateRequest in = Tokens({1, 2});
  in.mutable_sampling_params()->set_json_schema("{}");
  refused(in, "json_schema");
  in = Tokens({1, 2});
  in.mutable_sampling_params()->set_regex("a+");
  refused(in, "regex");
  in = Tokens({1, 2});
  (*in.mutable_sampling_params()->mutable_logit_bias())["5"] = 1.0f;
  refused(in, "logit_bias");
  in = Tokens({1, 2});
  in.set_lora_id("l");
  refused(in, "lora_id");
  in = Tokens({1, 2});
  in.set_return_hidden_states(true);
  refused(in, "return_hidden_states");
  in = Tokens({1, 2});
  in.mutable_mm_inputs()->add_image_urls("http://x/y.png");
  refused(in, "mm_inputs");
  in = Tokens({1, 2});
  in.add_token_ids_logprob(3);
  refused(in, "token_ids_logprob");
  in = Tokens({1, 2});
  in.set_data_parallel_rank(1);
  refused(in, "data_parallel_rank");
  in = Tokens({1, 2});
  (*in.mutable_sampling_params()->mutable_custom_params()->mutable_fields())["beam"]
      .set_number_value(2);
  refused(in, "custom_params.beam");
  // Present but empty, or neutral: accepted.
  in = Tokens({1, 2});
  in.mutable_mm_inputs();
  in.set_data_parallel_rank(0);
  (*in.mutable_sampling_params()->mutable_custom_params()->mutable_fields())["seed"]
      .set_number_value(42);
  auto r = SglangToEngineRequest(in, "id", Limits());
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->sampling.seed, 42u);
}

TEST(SglangConvertTest, LogprobOptions) {
  sgl::GenerateRequest in = Tokens({1, 2, 3});
  in.set_logprob_start_len(0);
  in.set_top_logprobs_num(3);
  auto r = SglangToEngineRequest(in, "id", Limits());
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->logprob_start_len, -1);  // without return_logprob nothing is computed
  EXPECT_EQ(r->top_logprobs_num, 0);
  in.set_return_logprob(true);
  r = SglangToEngineRequest(in, "id", Limits());
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(r->return_logprob);
  EXPECT_EQ(r->logprob_start_len, 0);
  EXPECT_EQ(r->top_logprobs_num, 3);
  in.set_logprob_start_len(-1);
  EXPECT_EQ(SglangToEngineRequest(in, "id", Limits())->logprob_start_len, -1);
  in.set_logprob_start_len(3);  // at the prompt's end: no prompt position asked for
  EXPECT_EQ(SglangToEngineRequest(in, "id", Limits())->logprob_start_len, -1);
  in.set_logprob_start_len(4);
  EXPECT_EQ(SglangToEngineRequest(in, "id", Limits()).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(SglangConvertTest, CompleteCarriesMatchAndLogprobs) {
  engine::GenerateRequest req;
  req.input_ids = {1, 2, 3};
  req.return_logprob = true;
  req.top_logprobs_num = 1;
  req.logprob_start_len = 0;
  engine::GenerateResult res;
  res.index = 1;
  res.finish_reason.kind = engine::FinishKind::kStop;
  res.finish_reason.matched_token_id = 2;
  res.output_ids = {5, 2};
  res.output_logprobs = {{5, -0.5, {{5, -0.5}}}, {2, -0.25, {{2, -0.25}}}};
  res.prompt_logprobs = {{2, -1.0, {{4, -0.5}}}, {3, -2.0, {{3, -2.0}}}};
  res.prompt_logprob_start = 1;
  res.prompt_tokens = 3;
  res.completion_tokens = 2;
  res.cached_tokens = 1;
  sgl::GenerateComplete c;
  FillComplete(res, req, /*stream=*/false, &c);
  EXPECT_EQ(c.finish_reason(), "stop");
  EXPECT_EQ(c.matched_token_id(), 2u);
  EXPECT_EQ(c.index(), 1u);
  EXPECT_EQ(c.prompt_tokens(), 3u);
  EXPECT_EQ(c.completion_tokens(), 2u);
  EXPECT_EQ(c.cached_tokens(), 1u);
  EXPECT_EQ(std::vector<uint32_t>(c.output_ids().begin(), c.output_ids().end()),
            (std::vector<uint32_t>{5, 2}));
  ASSERT_EQ(c.output_logprobs().token_logprobs_size(), 2);
  EXPECT_FLOAT_EQ(c.output_logprobs().token_logprobs(1), -0.25f);
  ASSERT_EQ(c.output_logprobs().top_logprobs_size(), 2);
  EXPECT_EQ(c.output_logprobs().top_logprobs(0).token_ids(0), 5u);
  // Input logprobs from position 0: the first token without a value.
  const sgl::InputLogProbs& in = c.input_logprobs();
  ASSERT_EQ(in.token_logprobs_size(), 3);
  EXPECT_FALSE(in.token_logprobs(0).has_value());
  EXPECT_FLOAT_EQ(in.token_logprobs(1).value(), -1.0f);
  EXPECT_EQ(std::vector<uint32_t>(in.token_ids().begin(), in.token_ids().end()),
            (std::vector<uint32_t>{1, 2, 3}));
  ASSERT_EQ(in.top_logprobs_size(), 3);
  EXPECT_EQ(in.top_logprobs(1).token_ids(0), 4u);

  // Streaming: the tokens went out in chunks; a stop string is reported as a string.
  res.finish_reason.matched_token_id = -1;
  res.finish_reason.matched_stop = "end";
  sgl::GenerateComplete s;
  FillComplete(res, req, /*stream=*/true, &s);
  EXPECT_EQ(s.output_ids_size(), 0);
  EXPECT_EQ(s.matched_stop_str(), "end");
  EXPECT_EQ(s.completion_tokens(), 2u);
}

TEST(SglangConvertTest, SeedFromTheRequestId) {
  auto seed = [](absl::string_view id) { return SeedFromRequestId(id); };
  EXPECT_EQ(*seed("seed=42"), 42u);
  EXPECT_EQ(*seed("ep7/seed=42"), 42u);
  // As the gateway derives ids: "<x-request-id>-<uuid>", "<rid>-p<i>".
  EXPECT_EQ(*seed("seed=9-01a2144f-44fa-77fe-95da-a7225822c5f0"), 9u);
  EXPECT_EQ(*seed("run:seed=0-p1"), 0u);
  EXPECT_EQ(*seed("seed=18446744073709551615"), UINT64_MAX);
  EXPECT_FALSE(seed("").value().has_value());
  EXPECT_FALSE(seed("cmpl-abc-01a2").value().has_value());
  EXPECT_FALSE(seed("myseed=4").value().has_value());  // not the token
  EXPECT_FALSE(seed("re_seed=4").value().has_value());
  auto refused = [&](absl::string_view id, const char* why) {
    absl::StatusOr<std::optional<uint64_t>> s = seed(id);
    EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument) << id;
    EXPECT_THAT(s.status().message(), HasSubstr(why)) << id;
  };
  refused("seed=", "decimal integer");
  refused("seed=x", "decimal integer");
  refused("seed=12abc", "decimal integer");
  refused("seed=1.5", "decimal integer");
  refused("seed=18446744073709551616", "out of range");
  refused("seed=99999999999999999999999", "out of range");
  refused("seed=1/seed=2", "more than one");

  // Through the conversion: the id's seed, which custom_params may repeat but not contradict.
  sgl::GenerateRequest in = Tokens({1, 2});
  in.set_request_id("ep/seed=7-p0");
  auto r = SglangToEngineRequest(in, "ep/seed=7-p0", Limits());
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->sampling.seed, 7u);
  auto& fields = *in.mutable_sampling_params()->mutable_custom_params()->mutable_fields();
  fields["seed"].set_number_value(7);
  EXPECT_EQ(SglangToEngineRequest(in, "id", Limits())->sampling.seed, 7u);
  fields["seed"].set_number_value(8);
  absl::Status s = SglangToEngineRequest(in, "id", Limits()).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("differs from custom_params.seed"));
  in.set_request_id("seed=oops");
  EXPECT_EQ(SglangToEngineRequest(in, "id", Limits()).status().code(),
            absl::StatusCode::kInvalidArgument);
  in.set_request_id("no-seed-here");
  in.mutable_sampling_params()->clear_custom_params();
  EXPECT_FALSE(SglangToEngineRequest(in, "id", Limits())->sampling.seed.has_value());
}

TEST(SglangConfigTest, FlagsAreValidated) {
  WorkerConfig c;
  c.model_path = testing::Stories();
  ASSERT_TRUE(Validate(c).ok());
  auto refused = [](const WorkerConfig& bad, const char* flag) {
    absl::Status s = Validate(bad);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << flag;
    EXPECT_THAT(s.message(), HasSubstr(flag));
  };
  WorkerConfig bad = c;
  bad.model_alias = "has space";
  refused(bad, "--model-alias");
  bad.model_alias = std::string(kMaxModelAliasBytes + 1, 'a');
  refused(bad, "--model-alias");
  bad = c;
  bad.sglang_port = 70000;
  refused(bad, "--sglang-port");
  bad = c;
  bad.port = 5000;
  bad.sglang_port = 5000;
  refused(bad, "--sglang-port");
  bad = c;
  bad.sglang_host = "0.0.0.0";
  refused(bad, "--sglang-host");
  bad = c;
  bad.sglang_pause_timeout_s = -1;
  refused(bad, "--sglang-pause-timeout-s");
  bad.sglang_pause_timeout_s = std::nan("");
  refused(bad, "--sglang-pause-timeout-s");
  c.model_alias = "stories";
  c.sglang_port = 0;
  c.sglang_pause_timeout_s = 0;
  EXPECT_TRUE(Validate(c).ok());
}

class SglangServiceTest : public testing::WorkerFixture {
 protected:
  void SetUp() override {
    StartWorker();
    sglang_ = sgl::SglangScheduler::NewStub(channel_);
  }

  // Replaces the worker with one started from `config`.
  void Restart(WorkerConfig config) {
    server_->Shutdown();
    server_.reset();
    StartWorker(std::move(config));
    sglang_ = sgl::SglangScheduler::NewStub(channel_);
  }

  struct Outcome {
    grpc::Status status;
    std::vector<sgl::GenerateStreamChunk> chunks;
    std::vector<sgl::GenerateComplete> completes;
  };

  Outcome Run(const sgl::GenerateRequest& req) { return Run(*sglang_, req); }
  static Outcome Run(sgl::SglangScheduler::Stub& stub, const sgl::GenerateRequest& req) {
    Outcome out;
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
    auto reader = stub.Generate(&ctx, req);
    sgl::GenerateResponse msg;
    while (reader->Read(&msg)) {
      EXPECT_EQ(msg.request_id(), req.request_id());
      if (msg.has_chunk()) out.chunks.push_back(msg.chunk());
      if (msg.has_complete()) out.completes.push_back(msg.complete());
    }
    out.status = reader->Finish();
    return out;
  }

  static sgl::GenerateRequest Greedy(int max_new_tokens, bool stream) {
    sgl::GenerateRequest req;
    req.set_request_id("g");
    for (int32_t t : testing::kPromptIds) req.mutable_tokenized()->add_input_ids(t);
    req.mutable_sampling_params()->set_max_new_tokens(max_new_tokens);
    req.set_stream(stream);
    return req;
  }

  void WaitForWaiting(int n) {
    for (int i = 0; i < 2000 && ServerInfo().num_waiting() != n; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    ASSERT_EQ(ServerInfo().num_waiting(), n);
  }

  void Pause(const std::string& key = "") {
    rl::v1::PauseGenerationRequest req;
    req.set_mode(rl::v1::PAUSE_MODE_IN_PLACE);
    rl::v1::AdminResponse resp;
    ASSERT_TRUE(Call(&rl::v1::Admin::Stub::PauseGeneration, req, &resp, key).ok());
  }
  void Continue(const std::string& key = "") {
    rl::v1::AdminResponse resp;
    ASSERT_TRUE(Call(&rl::v1::Admin::Stub::ContinueGeneration, rl::v1::ContinueGenerationRequest(),
                     &resp, key)
                    .ok());
  }

  static sgl::GenerateRequest Sampled(const std::string& id) {
    sgl::GenerateRequest req = Greedy(16, /*stream=*/false);
    req.set_request_id(id);
    req.mutable_sampling_params()->set_temperature(1.0f);
    return req;
  }
  std::vector<uint32_t> SampledIds(const std::string& id) {
    Outcome out = Run(Sampled(id));
    EXPECT_TRUE(out.status.ok()) << out.status.error_message();
    if (out.completes.size() != 1) return {};
    return {out.completes[0].output_ids().begin(), out.completes[0].output_ids().end()};
  }

  std::unique_ptr<sgl::SglangScheduler::Stub> sglang_;
};

TEST_F(SglangServiceTest, RegistrationCalls) {
  grpc::ClientContext c1;
  sgl::HealthCheckResponse health;
  ASSERT_TRUE(sglang_->HealthCheck(&c1, {}, &health).ok());
  EXPECT_TRUE(health.healthy());
  grpc::ClientContext c2;
  sgl::GetModelInfoResponse info;
  ASSERT_TRUE(sglang_->GetModelInfo(&c2, {}, &info).ok());
  EXPECT_TRUE(info.is_generation());
  EXPECT_EQ(info.vocab_size(), 512);
  EXPECT_EQ(info.model_path(), testing::Stories());
  EXPECT_EQ(info.served_model_name(), testing::Stories());
  EXPECT_EQ(info.tokenizer_path(), testing::Stories());
  EXPECT_GT(info.max_context_length(), 0);
  EXPECT_GT(info.eos_token_ids_size(), 0);
  EXPECT_EQ(info.weight_version(), "0");
  EXPECT_EQ(info.model_type(), "llama");
  grpc::ClientContext c3;
  sgl::GetServerInfoResponse server;
  ASSERT_TRUE(sglang_->GetServerInfo(&c3, {}, &server).ok());
  EXPECT_EQ(server.server_type(), "grpc");
  EXPECT_GT(server.max_total_num_tokens(), 0);
  EXPECT_FALSE(server.is_paused());
  grpc::ClientContext c4;
  sgl::GetLoadsResponse loads;
  ASSERT_TRUE(sglang_->GetLoads(&c4, {}, &loads).ok());
  ASSERT_EQ(loads.loads_size(), 1);
  EXPECT_EQ(loads.dp_rank_count(), 1);
  EXPECT_GT(loads.loads(0).max_total_num_tokens(), 0);
  grpc::ClientContext c5;
  sgl::GetLoadsRequest bad;
  bad.add_include("bogus");
  EXPECT_EQ(sglang_->GetLoads(&c5, bad, &loads).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  // What has no counterpart says so.
  grpc::ClientContext c6;
  sgl::EmbedResponse embed;
  grpc::Status s = sglang_->Embed(&c6, {}, &embed);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNIMPLEMENTED);
  EXPECT_THAT(s.error_message(), HasSubstr("not supported"));
}

TEST_F(SglangServiceTest, NonStreamingGreedyMatchesGolden) {
  Outcome out = Run(Greedy(20, /*stream=*/false));
  ASSERT_TRUE(out.status.ok()) << out.status.error_message();
  EXPECT_TRUE(out.chunks.empty());
  ASSERT_EQ(out.completes.size(), 1u);
  const sgl::GenerateComplete& c = out.completes[0];
  EXPECT_EQ(std::vector<int32_t>(c.output_ids().begin(), c.output_ids().end()),
            testing::kGoldenIds);
  EXPECT_EQ(c.finish_reason(), "length");
  EXPECT_EQ(c.prompt_tokens(), testing::kPromptIds.size());
  EXPECT_EQ(c.completion_tokens(), 20u);
}

TEST_F(SglangServiceTest, StreamingChunksThenComplete) {
  sgl::GenerateRequest req = Greedy(20, /*stream=*/true);
  req.set_return_logprob(true);
  req.set_top_logprobs_num(2);
  Outcome out = Run(req);
  ASSERT_TRUE(out.status.ok()) << out.status.error_message();
  std::vector<int32_t> ids;
  uint32_t last_count = 0;
  for (const sgl::GenerateStreamChunk& c : out.chunks) {
    ids.insert(ids.end(), c.token_ids().begin(), c.token_ids().end());
    EXPECT_EQ(c.completion_tokens(), ids.size());  // cumulative
    EXPECT_GT(c.completion_tokens(), last_count);
    last_count = c.completion_tokens();
    ASSERT_EQ(c.output_logprobs().token_logprobs_size(), c.token_ids_size());  // incremental
    ASSERT_EQ(c.output_logprobs().top_logprobs_size(), c.token_ids_size());
    EXPECT_EQ(c.output_logprobs().top_logprobs(0).values_size(), 2);
  }
  EXPECT_EQ(ids, testing::kGoldenIds);
  ASSERT_EQ(out.completes.size(), 1u);
  EXPECT_EQ(out.completes[0].finish_reason(), "length");
  EXPECT_EQ(out.completes[0].completion_tokens(), 20u);
  EXPECT_EQ(out.completes[0].output_ids_size(), 0);
}

TEST_F(SglangServiceTest, NTwoAndStopToken) {
  sgl::GenerateRequest req = Greedy(8, /*stream=*/true);
  req.mutable_sampling_params()->set_n(2);
  Outcome out = Run(req);
  ASSERT_TRUE(out.status.ok()) << out.status.error_message();
  ASSERT_EQ(out.completes.size(), 2u);
  std::map<uint32_t, std::vector<int32_t>> by_index;
  for (const auto& c : out.chunks) {
    by_index[c.index()].insert(by_index[c.index()].end(), c.token_ids().begin(),
                               c.token_ids().end());
  }
  ASSERT_EQ(by_index.size(), 2u);
  const std::vector<int32_t> golden8(testing::kGoldenIds.begin(), testing::kGoldenIds.begin() + 8);
  EXPECT_EQ(by_index[0], golden8);
  EXPECT_EQ(by_index[1], golden8);

  sgl::GenerateRequest stop = Greedy(20, /*stream=*/false);
  stop.mutable_sampling_params()->add_stop_token_ids(testing::kGoldenIds[3]);
  out = Run(stop);
  ASSERT_TRUE(out.status.ok()) << out.status.error_message();
  ASSERT_EQ(out.completes.size(), 1u);
  EXPECT_EQ(out.completes[0].finish_reason(), "stop");
  EXPECT_EQ(out.completes[0].matched_token_id(), static_cast<uint32_t>(testing::kGoldenIds[3]));
  EXPECT_EQ(out.completes[0].output_ids_size(), 4);
}

TEST_F(SglangServiceTest, BadRequestIsInvalidArgument) {
  sgl::GenerateRequest req = Greedy(4, false);
  req.mutable_tokenized()->add_input_ids(100000);
  Outcome out = Run(req);
  EXPECT_EQ(out.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(out.status.error_message(), HasSubstr("vocabulary"));
}

TEST_F(SglangServiceTest, AbortFreesAQueuedRequest) {
  Pause();
  Outcome out;
  std::thread t([&] {
    sgl::GenerateRequest req = Greedy(50, /*stream=*/true);
    req.set_request_id("to-abort");
    out = Run(req);
  });
  WaitForWaiting(1);
  grpc::ClientContext ctx;
  sgl::AbortRequest abort;
  abort.set_request_id("to-abort");
  sgl::AbortResponse resp;
  ASSERT_TRUE(sglang_->Abort(&ctx, abort, &resp).ok());
  EXPECT_TRUE(resp.success()) << resp.message();
  t.join();
  // Aborted by the worker: a status the gateway retries, never an empty success.
  EXPECT_EQ(out.status.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_TRUE(out.completes.empty());
  EXPECT_EQ(ServerInfo().num_waiting(), 0);
  grpc::ClientContext again;
  ASSERT_TRUE(sglang_->Abort(&again, abort, &resp).ok());
  EXPECT_FALSE(resp.success());
  Continue();
}

TEST_F(SglangServiceTest, CancelledCallFreesTheRequest) {
  Pause();
  grpc::ClientContext ctx;
  sgl::GenerateRequest req = Greedy(50, /*stream=*/false);
  auto reader = sglang_->Generate(&ctx, req);
  WaitForWaiting(1);
  ctx.TryCancel();
  sgl::GenerateResponse msg;
  while (reader->Read(&msg)) {
  }
  EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::CANCELLED);
  WaitForWaiting(0);
  Continue();
}

TEST_F(SglangServiceTest, FlushCacheTimeoutSemantics) {
  // Idle: flushed at once.
  {
    grpc::ClientContext ctx;
    common::FlushCacheResponse resp;
    ASSERT_TRUE(sglang_->FlushCache(&ctx, {}, &resp).ok());
    EXPECT_TRUE(resp.success()) << resp.message();
  }
  Pause();
  std::thread gen([&] { Run(Greedy(8, /*stream=*/false)); });
  WaitForWaiting(1);
  // timeout 0 with a request in flight: refused as an answer, not an error.
  {
    grpc::ClientContext ctx;
    common::FlushCacheResponse resp;
    ASSERT_TRUE(sglang_->FlushCache(&ctx, {}, &resp).ok());
    EXPECT_FALSE(resp.success());
    EXPECT_THAT(resp.message(), HasSubstr("not flushed"));
  }
  // A short timeout runs out while the engine stays busy.
  {
    grpc::ClientContext ctx;
    common::FlushCacheRequest req;
    req.set_timeout_s(0.2f);
    common::FlushCacheResponse resp;
    ASSERT_TRUE(sglang_->FlushCache(&ctx, req, &resp).ok());
    EXPECT_FALSE(resp.success());
    EXPECT_THAT(resp.message(), HasSubstr("within 0.2 s"));
  }
  // A long one waits for the request to finish, then flushes.
  common::FlushCacheResponse waited;
  grpc::Status waited_status;
  std::thread flusher([&] {
    grpc::ClientContext ctx;
    common::FlushCacheRequest req;
    req.set_timeout_s(60);
    waited_status = sglang_->FlushCache(&ctx, req, &waited);
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  Continue();
  gen.join();
  flusher.join();
  ASSERT_TRUE(waited_status.ok()) << waited_status.error_message();
  EXPECT_TRUE(waited.success()) << waited.message();
  EXPECT_EQ(ServerInfo().tree_cache_tokens(), 0);
  {
    grpc::ClientContext ctx;
    common::FlushCacheRequest req;
    req.set_timeout_s(-1);
    common::FlushCacheResponse resp;
    EXPECT_EQ(sglang_->FlushCache(&ctx, req, &resp).error_code(),
              grpc::StatusCode::INVALID_ARGUMENT);
  }
}

TEST_F(SglangServiceTest, FlushWaitingAtShutdownIsAnswered) {
  Pause();
  std::thread gen([&] { Run(Greedy(8, /*stream=*/false)); });
  WaitForWaiting(1);
  grpc::Status status;
  std::thread flusher([&] {
    grpc::ClientContext ctx;
    common::FlushCacheRequest req;
    req.set_timeout_s(600);
    common::FlushCacheResponse resp;
    status = sglang_->FlushCache(&ctx, req, &resp);
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  server_->Shutdown();
  flusher.join();
  gen.join();
  // Answered, never left hanging: flushed if the aborts left the engine idle before the flush
  // thread stopped, else UNAVAILABLE.
  EXPECT_TRUE(status.ok() || status.error_code() == grpc::StatusCode::UNAVAILABLE)
      << status.error_message();
}

TEST_F(SglangServiceTest, TheRequestIdsSeedReproducesASample) {
  const std::vector<uint32_t> a = SampledIds("a/seed=7");
  ASSERT_EQ(a.size(), 16u);
  EXPECT_EQ(SampledIds("b/seed=7"), a);
  EXPECT_NE(SampledIds("c/seed=8"), a);
  // The same seed as custom_params (a direct client's way) gives the same tokens.
  sgl::GenerateRequest req = Sampled("d");
  (*req.mutable_sampling_params()->mutable_custom_params()->mutable_fields())["seed"]
      .set_number_value(7);
  Outcome out = Run(req);
  ASSERT_TRUE(out.status.ok()) << out.status.error_message();
  ASSERT_EQ(out.completes.size(), 1u);
  EXPECT_EQ(std::vector<uint32_t>(out.completes[0].output_ids().begin(),
                                  out.completes[0].output_ids().end()),
            a);
}

TEST_F(SglangServiceTest, ModelAliasIsTheServedModelName) {
  WorkerConfig config;
  config.model_alias = "stories";
  Restart(config);
  grpc::ClientContext c1;
  sgl::GetModelInfoResponse info;
  ASSERT_TRUE(sglang_->GetModelInfo(&c1, {}, &info).ok());
  EXPECT_EQ(info.served_model_name(), "stories");
  EXPECT_EQ(info.model_path(), testing::Stories());  // where the tokenizer is
  grpc::ClientContext c2;
  sgl::GetServerInfoResponse server;
  ASSERT_TRUE(sglang_->GetServerInfo(&c2, {}, &server).ok());
  EXPECT_EQ(server.server_args().fields().at("served_model_name").string_value(), "stories");
  EXPECT_EQ(server.server_args().fields().at("model_path").string_value(), testing::Stories());
}

TEST_F(SglangServiceTest, APauseLongerThanTheBoundEndsRequestsUnavailable) {
  WorkerConfig config;
  config.sglang_pause_timeout_s = 0.3;
  Restart(config);
  Pause();
  // Queued on the paused worker, then ended with a status the gateway retries.
  Outcome queued = Run(Greedy(8, /*stream=*/true));
  EXPECT_EQ(queued.status.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_THAT(queued.status.error_message(), HasSubstr("--sglang-pause-timeout-s"));
  EXPECT_TRUE(queued.completes.empty());
  // Still paused: a new request is refused at once.
  Outcome refused = Run(Greedy(8, /*stream=*/false));
  EXPECT_EQ(refused.status.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_THAT(refused.status.error_message(), HasSubstr("retry on another worker"));
  WaitForWaiting(0);
  Continue();
  // Resumed: served again (the guard samples the pause every 50 ms).
  Outcome served;
  for (int i = 0; i < 400; ++i) {
    served = Run(Greedy(8, /*stream=*/false));
    if (served.status.error_code() != grpc::StatusCode::UNAVAILABLE) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_TRUE(served.status.ok()) << served.status.error_message();
  ASSERT_EQ(served.completes.size(), 1u);
  EXPECT_EQ(served.completes[0].output_ids_size(), 8);
}

TEST_F(SglangServiceTest, AShortPauseOnlyDelaysARequest) {
  Pause();  // the default bound (60 s) is far away
  Outcome out;
  std::thread t([&] { out = Run(Greedy(8, /*stream=*/false)); });
  WaitForWaiting(1);
  Continue();
  t.join();
  ASSERT_TRUE(out.status.ok()) << out.status.error_message();
  ASSERT_EQ(out.completes.size(), 1u);
}

TEST_F(SglangServiceTest, AKeyedWorkerServesTheGatewayOnTheKeyFreeSglangPort) {
  WorkerConfig config;
  config.api_key = "data-key";
  config.admin_api_key = "admin-key";
  config.sglang_port = 0;
  Restart(config);
  ASSERT_FALSE(server_->sglang_address().empty());
  // The keyed port refuses a call without the key, as before.
  grpc::ClientContext c1;
  sgl::HealthCheckResponse health;
  EXPECT_EQ(sglang_->HealthCheck(&c1, {}, &health).error_code(), grpc::StatusCode::UNAUTHENTICATED);
  // The SGLang port takes none, for every call the gateway makes, FlushCache included.
  auto open = grpc::CreateChannel(server_->sglang_address(), grpc::InsecureChannelCredentials());
  auto gateway = sgl::SglangScheduler::NewStub(open);
  grpc::ClientContext c2;
  ASSERT_TRUE(gateway->HealthCheck(&c2, {}, &health).ok());
  EXPECT_TRUE(health.healthy());
  grpc::ClientContext c3;
  sgl::GetModelInfoResponse info;
  ASSERT_TRUE(gateway->GetModelInfo(&c3, {}, &info).ok());
  Outcome out = Run(*gateway, Greedy(20, /*stream=*/false));
  ASSERT_TRUE(out.status.ok()) << out.status.error_message();
  ASSERT_EQ(out.completes.size(), 1u);
  EXPECT_EQ(std::vector<int32_t>(out.completes[0].output_ids().begin(),
                                 out.completes[0].output_ids().end()),
            testing::kGoldenIds);
  grpc::ClientContext c4;
  common::FlushCacheResponse flushed;
  ASSERT_TRUE(gateway->FlushCache(&c4, {}, &flushed).ok());
  EXPECT_TRUE(flushed.success()) << flushed.message();
  // Only SGLang's protocol is there: rl.v1 stays behind the keys.
  auto admin = rl::v1::Admin::NewStub(open);
  grpc::ClientContext c5;
  rl::v1::AdminResponse resp;
  rl::v1::PauseGenerationRequest pause;
  EXPECT_EQ(admin->PauseGeneration(&c5, pause, &resp).error_code(),
            grpc::StatusCode::UNIMPLEMENTED);
  // The keyed port still serves a keyed client.
  grpc::ClientContext c6;
  c6.AddMetadata("authorization", "Bearer data-key");
  ASSERT_TRUE(sglang_->HealthCheck(&c6, {}, &health).ok());
}

TEST_F(SglangServiceTest, GetTokenizerStreamsTheZip) {
  grpc::ClientContext ctx;
  auto reader = sglang_->GetTokenizer(&ctx, {});
  common::GetTokenizerChunk chunk;
  std::string zip, sha;
  int num_chunks = 0;
  while (reader->Read(&chunk)) {
    EXPECT_TRUE(sha.empty()) << "sha256 only on the last chunk";
    zip += chunk.data();
    sha = chunk.sha256();
    ++num_chunks;
  }
  ASSERT_TRUE(reader->Finish().ok());
  EXPECT_GE(num_chunks, 1);
  EXPECT_EQ(zip.substr(0, 2), "PK");
  EXPECT_EQ(sha, Sha256Hex(zip));
}

}  // namespace
}  // namespace rl::worker
