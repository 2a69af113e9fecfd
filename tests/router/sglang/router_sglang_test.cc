#include <memory>
#include <string>

#include "common/sglang/sglang_request.h"
#include "gtest/gtest.h"
#include "services/router/sglang/router_sglang_service.h"
#include "tests/testing/test_data.h"

namespace rl::router {
namespace {

class SglangToRouterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto t = tokenizer::Tokenizer::FromDir(testing::Stories());
    ASSERT_TRUE(t.ok()) << t.status();
    tok_ = *std::move(t);
  }
  sgl::GenerateRequest Request(const std::string& text, bool with_bos) {
    auto enc = tok_->Encode(text, with_bos);
    EXPECT_TRUE(enc.ok());
    sgl::GenerateRequest r;
    for (int32_t id : enc->ids) r.mutable_tokenized()->add_input_ids(static_cast<uint32_t>(id));
    return r;
  }
  std::unique_ptr<tokenizer::Tokenizer> tok_;
};

TEST_F(SglangToRouterTest, IdsBecomeTheirTextWithoutADoubledBos) {
  for (bool with_bos : {false, true}) {
    sgl::GenerateRequest in = Request("user: Hi\nassistant: ", with_bos);
    auto out = SglangToRouterRequest(in, *tok_, 64);
    ASSERT_TRUE(out.ok()) << out.status();
    EXPECT_EQ(out->text(), "user: Hi\nassistant: ");
  }
}

TEST_F(SglangToRouterTest, SamplingSeedEpisodeAndStreamCarryOver) {
  sgl::GenerateRequest in = Request("Once", false);
  in.set_request_id("episode=ep_1.a;seed=7-0123");
  in.set_stream(true);
  in.set_return_logprob(true);
  in.set_logprob_start_len(-1);
  in.set_top_logprobs_num(2);
  sgl::SamplingParams* sp = in.mutable_sampling_params();
  sp->set_max_new_tokens(9);
  sp->set_temperature(0.5f);
  sp->set_n(2);
  sp->add_stop("\n");
  sp->add_stop_token_ids(2);
  auto out = SglangToRouterRequest(in, *tok_, 64);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(out->episode_id(), "ep_1.a");
  EXPECT_EQ(out->request_id(), in.request_id());
  EXPECT_TRUE(out->stream());
  EXPECT_TRUE(out->return_logprob());
  EXPECT_EQ(out->top_logprobs_num(), 2);
  const rl::v1::SamplingParams& o = out->sampling_params();
  EXPECT_EQ(o.max_new_tokens(), 9);
  EXPECT_FLOAT_EQ(o.temperature(), 0.5f);
  EXPECT_EQ(o.n(), 2);
  EXPECT_EQ(o.seed(), 7u);
  ASSERT_EQ(o.stop_size(), 1);
  EXPECT_EQ(o.stop(0), "\n");
  ASSERT_EQ(o.stop_token_ids_size(), 1);
  // proto3 zeros read as SGLang reads them.
  EXPECT_FLOAT_EQ(o.top_p(), 1.0f);
  EXPECT_EQ(o.top_k(), -1);
  EXPECT_FLOAT_EQ(o.repetition_penalty(), 1.0f);
}

TEST_F(SglangToRouterTest, NoEpisodeNoMaxTokensTakesTheDefaults) {
  auto out = SglangToRouterRequest(Request("Once", false), *tok_, 64);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_TRUE(out->episode_id().empty());
  EXPECT_EQ(out->sampling_params().max_new_tokens(), sglang::kDefaultMaxNewTokens);
  EXPECT_FALSE(out->return_logprob());
}

TEST_F(SglangToRouterTest, WhatTheRouterDoesNotServeIsRefusedByName) {
  sgl::GenerateRequest in = Request("Once", false);
  in.set_return_logprob(true);
  in.set_logprob_start_len(0);
  EXPECT_NE(SglangToRouterRequest(in, *tok_, 64).status().message().find("logprob_start_len"),
            std::string::npos);
  in = Request("Once", false);
  in.set_request_id("episode=a!b");
  EXPECT_EQ(SglangToRouterRequest(in, *tok_, 64).status().code(),
            absl::StatusCode::kInvalidArgument);
  in = Request("Once", false);
  in.mutable_sampling_params()->set_regex("a+");
  EXPECT_EQ(SglangToRouterRequest(in, *tok_, 64).status().code(),
            absl::StatusCode::kInvalidArgument);
  in = Request("Once", false);
  in.mutable_sampling_params()->set_n(65);
  EXPECT_EQ(SglangToRouterRequest(in, *tok_, 64).status().code(),
            absl::StatusCode::kInvalidArgument);
  sgl::GenerateRequest empty;
  EXPECT_EQ(SglangToRouterRequest(empty, *tok_, 64).status().code(),
            absl::StatusCode::kInvalidArgument);
  sgl::GenerateRequest out_of_vocab;
  out_of_vocab.mutable_tokenized()->add_input_ids(1u << 30);
  EXPECT_EQ(SglangToRouterRequest(out_of_vocab, *tok_, 64).status().code(),
            absl::StatusCode::kInvalidArgument);
  sgl::GenerateRequest bos_only;
  bos_only.mutable_tokenized()->add_input_ids(1);
  EXPECT_EQ(SglangToRouterRequest(bos_only, *tok_, 64).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace rl::router
