// The seam invariant end to end: rl-router with a real rl-worker (stories260K) on loopback.
// Multi-turn conversations (contractions, runs of spaces, newlines that are byte-fallback
// tokens) must reach the model exactly as sent; every turn's trajectory extends the previous
// one exactly; new prompt tokens are the full text's encoding past the seam; the completion
// text is the completion decoded in the prompt's context (never the prompt again), in the
// router and in the worker; every token carries a weight version; the GC settings and seam
// counters are in the metrics; RetrieveFromText counts one lookup.
#include <cmath>
#include <string>
#include <vector>

#include "common/tokenizer/stream_decoder.h"
#include "common/tokenizer/tokenizer.h"
#include "rl/v1/router.grpc.pb.h"
#include "rl/v1/worker.grpc.pb.h"
#include "services/router/cache/prompt_resolver.h"
#include "services/router/router_server.h"
#include "tests/testing/router_fleet.h"
#include "tests/worker/worker_test_util.h"

namespace rl::router {
namespace {

using worker::testing::Stories;

class RouterSeamTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto w = testing::StartTestWorker();
    ASSERT_TRUE(w.ok()) << w.status();
    worker_ = *std::move(w);
    RouterConfig config;
    config.workers.push_back(worker_->address());
    auto r = testing::StartTestRouter(config);
    ASSERT_TRUE(r.ok()) << r.status();
    router_ = *std::move(r);
    stub_ = rl::v1::Router::NewStub(
        grpc::CreateChannel(router_->address(), grpc::InsecureChannelCredentials()));
    auto tok = tokenizer::Tokenizer::FromDir(Stories());
    ASSERT_TRUE(tok.ok());
    tok_ = *std::move(tok);
  }
  void TearDown() override {
    if (router_) router_->Shutdown();
    if (worker_) worker_->Shutdown();
  }

  grpc::Status Generate(const std::string& text, int max_new, rl::v1::GenerateFinal* f,
                        std::string* streamed) {
    rl::v1::GenerateRequest req;
    req.set_text(text);
    req.mutable_sampling_params()->set_temperature(0.8);
    req.mutable_sampling_params()->set_seed(static_cast<int64_t>(text.size()));
    req.mutable_sampling_params()->set_max_new_tokens(max_new);
    req.set_return_logprob(true);
    req.set_return_trajectory(true);
    grpc::ClientContext ctx;
    auto reader = stub_->Generate(&ctx, req);
    rl::v1::GenerateResponse msg;
    while (reader->Read(&msg)) {
      if (msg.has_chunk()) *streamed += msg.chunk().text();
      if (msg.has_final()) *f = msg.final();
    }
    return reader->Finish();
  }

  rl::v1::GetMetricsResponse Metrics() {
    rl::v1::GetMetricsResponse m;
    grpc::ClientContext ctx;
    EXPECT_TRUE(stub_->GetMetrics(&ctx, {}, &m).ok());
    return m;
  }

  std::unique_ptr<worker::WorkerServer> worker_;
  std::unique_ptr<RouterServer> router_;
  std::unique_ptr<rl::v1::Router::Stub> stub_;
  std::unique_ptr<tokenizer::Tokenizer> tok_;
};

TEST_F(RouterSeamTest, MultiTurnConversationsSeeExactlyTheTextSent) {
  const std::vector<std::string> users = {
      "Lily went to the park", " Tom isn't",         "\n", "  two  spaces ", ".\n\n", "\nOnce",
      " 123 apples",           "She said, \"Hi!\"\n"};
  int turns = 0;
  for (int conv = 0; conv < 6; ++conv) {
    std::string text = conv % 2 == 0 ? "Once upon a time" : "Tom had a red ball.\n";
    std::vector<int32_t> prev_tokens;
    for (int t = 0; t < 3; ++t) {
      text += users[(conv * 3 + t) % users.size()];
      rl::v1::GenerateFinal f;
      std::string streamed;
      ASSERT_TRUE(Generate(text, 6, &f, &streamed).ok()) << text;
      ++turns;
      const rl::v1::Trajectory& tr = f.trajectory();
      const std::vector<int32_t> tokens(tr.tokens().begin(), tr.tokens().end());
      const size_t num_out = static_cast<size_t>(f.output_ids_size());
      ASSERT_GT(num_out, 0u);
      ASSERT_GT(tokens.size(), num_out);
      const std::vector<int32_t> prompt(tokens.begin(), tokens.end() - num_out);
      // (a) The model saw exactly the text.
      EXPECT_TRUE(DecodesTo(*tok_, prompt, text)) << "conversation " << conv << " turn " << t;
      // (b) The previous trajectory is reused exactly.
      ASSERT_GE(prompt.size(), prev_tokens.size());
      EXPECT_TRUE(std::equal(prev_tokens.begin(), prev_tokens.end(), prompt.begin()));
      // (c) New prompt tokens are the full text's encoding past the seam.
      auto full = tok_->Encode(text, true);
      ASSERT_TRUE(full.ok());
      if (prev_tokens.empty()) {
        EXPECT_EQ(prompt, full->ids) << text;
      }
      // The completion is decoded in the prompt's context and never repeats the prompt.
      const std::vector<int32_t> out(f.output_ids().begin(), f.output_ids().end());
      auto in_context = tokenizer::DecodeContinuation(*tok_, prompt, out, false);
      ASSERT_TRUE(in_context.ok());
      EXPECT_EQ(f.text(), *in_context);
      EXPECT_EQ(streamed, f.text());
      EXPECT_EQ(f.text().find(text), std::string::npos);
      // Versions: one per token, the output covered by the segments.
      EXPECT_EQ(tr.token_weight_versions_size(), tr.tokens_size());
      int32_t covered = 0;
      for (const auto& seg : f.weight_version_segments()) covered += seg.num_tokens();
      EXPECT_EQ(covered, f.output_ids_size());
      text += f.text();
      prev_tokens = tokens;
    }
  }
  const rl::v1::GetMetricsResponse m = Metrics();
  EXPECT_EQ(m.cache().max_cache_size(), RouterConfig{}.max_cache_size);
  EXPECT_EQ(m.cache().gc_threshold_k(), RouterConfig{}.gc_threshold_k);
  EXPECT_NE(m.prometheus_text().find("rl_router_cache_max_cache_size"), std::string::npos);
  EXPECT_NE(m.prometheus_text().find("rl_router_cache_gc_threshold_k"), std::string::npos);
  EXPECT_NE(m.prometheus_text().find("rl_router_whole_text_fallbacks_total"), std::string::npos);
  EXPECT_NE(m.prometheus_text().find("rl_router_seam_continuations_total"), std::string::npos);
  EXPECT_EQ(m.cache().hits() + m.cache().misses(), turns);

  // RetrieveFromText counts exactly one lookup.
  rl::v1::RetrieveFromTextRequest rreq;
  rreq.set_text("Once upon a time");
  rl::v1::RetrieveFromTextResponse r;
  grpc::ClientContext ctx;
  ASSERT_TRUE(stub_->RetrieveFromText(&ctx, rreq, &r).ok());
  const rl::v1::GetMetricsResponse after = Metrics();
  EXPECT_EQ(after.cache().hits() + after.cache().misses(), turns + 1);
  EXPECT_EQ(r.trajectory().token_weight_versions_size(), r.trajectory().tokens_size());
}

TEST_F(RouterSeamTest, WorkerCompletionTextAfterANewlinePromptIsNotThePrompt) {
  auto prompt = tok_->Encode("Tom had a red ball.\n", true);
  ASSERT_TRUE(prompt.ok());
  ASSERT_TRUE(tok_->IsFallbackByte(prompt->ids.back()));
  auto stub = rl::v1::Worker::NewStub(
      grpc::CreateChannel(worker_->address(), grpc::InsecureChannelCredentials()));
  rl::v1::GenerateRequest req;
  req.mutable_input_ids()->mutable_ids()->Assign(prompt->ids.begin(), prompt->ids.end());
  req.mutable_sampling_params()->set_temperature(0);
  req.mutable_sampling_params()->set_max_new_tokens(8);
  grpc::ClientContext ctx;
  auto reader = stub->Generate(&ctx, req);
  rl::v1::GenerateResponse msg;
  std::string streamed;
  rl::v1::GenerateFinal f;
  while (reader->Read(&msg)) {
    if (msg.has_chunk()) streamed += msg.chunk().text();
    if (msg.has_final()) f = msg.final();
  }
  ASSERT_TRUE(reader->Finish().ok());
  const std::vector<int32_t> out(f.output_ids().begin(), f.output_ids().end());
  auto in_context = tokenizer::DecodeContinuation(*tok_, prompt->ids, out, false);
  ASSERT_TRUE(in_context.ok());
  EXPECT_EQ(f.text(), *in_context);
  EXPECT_EQ(streamed, f.text());
  EXPECT_EQ(f.text().find("Tom had"), std::string::npos) << f.text();
  EXPECT_EQ(f.text().find("<s>"), std::string::npos) << f.text();
  EXPECT_EQ(f.weight_version_segments_size(), 1);
}

}  // namespace
}  // namespace rl::router
