// Issue 34, resume within the budget, on an in-process rl-worker (stories260K):
// - a greedy sample resumed from any prefix of its output (GenerateRequest.resume_from by
//   tokens) equals the uninterrupted one token for token and logprob for logprob (float
//   tolerance); the earlier tokens are output (resumed_tokens, output_ids / logprobs / segments
//   hold both parts), not prompt (prompt_tokens unchanged);
// - a sample interrupted by Abort (caught running by an in-place pause) resumes to the same;
// - refusals, before anything runs: no budget left, prompt + earlier + remaining over the
//   context (the numbers named), n > 1, a request id (router only), logprobs that do not match.
#include <thread>

#include "absl/synchronization/mutex.h"
#include "tests/worker/worker_test_util.h"

namespace rl::worker::testing {
namespace {

constexpr int kMaxNew = 48;
constexpr float kLogprobTolerance = 2e-3f;

class ResumeTest : public WorkerFixture {
 protected:
  static rl::v1::GenerateRequest Request(int max_new = kMaxNew) {
    rl::v1::GenerateRequest req = Greedy(kPromptIds, max_new);
    req.mutable_sampling_params()->set_ignore_eos(true);
    req.set_return_logprob(true);
    return req;
  }
  // `full`'s first `k` output tokens (with logprobs and one segment) as a resume.
  static rl::v1::GenerateRequest ResumeFromPrefix(const rl::v1::GenerateFinal& full, int k,
                                                  int max_new = kMaxNew) {
    rl::v1::GenerateRequest req = Request(max_new);
    rl::v1::ResumeFrom* rf = req.mutable_resume_from();
    for (int i = 0; i < k; ++i) {
      rf->add_output_ids(full.output_ids(i));
      rf->add_output_logprobs(full.output_logprobs(i).logprob());
    }
    rl::v1::VersionSegment* seg = rf->add_weight_version_segments();
    seg->set_weight_version(full.weight_version());
    seg->set_num_tokens(k);
    return req;
  }
  static void ExpectSameSample(const rl::v1::GenerateFinal& resumed,
                               const rl::v1::GenerateFinal& full, int earlier) {
    EXPECT_EQ(resumed.resumed_tokens(), earlier);
    EXPECT_EQ(resumed.finish_reason(), full.finish_reason());
    EXPECT_EQ(resumed.prompt_tokens(), full.prompt_tokens());  // earlier tokens are output
    EXPECT_EQ(resumed.completion_tokens(), full.completion_tokens());
    ASSERT_EQ(resumed.output_ids_size(), full.output_ids_size());
    ASSERT_EQ(resumed.output_logprobs_size(), full.output_logprobs_size());
    for (int i = 0; i < full.output_ids_size(); ++i) {
      EXPECT_EQ(resumed.output_ids(i), full.output_ids(i)) << "token " << i;
      EXPECT_NEAR(resumed.output_logprobs(i).logprob(), full.output_logprobs(i).logprob(),
                  kLogprobTolerance)
          << "token " << i;
    }
    int covered = 0;
    for (const auto& seg : resumed.weight_version_segments()) covered += seg.num_tokens();
    EXPECT_EQ(covered, full.output_ids_size());
  }
};

TEST_F(ResumeTest, ResumedGreedySampleEqualsTheUninterruptedOne) {
  StartWorker();
  rl::v1::GenerateFinal full;
  ASSERT_TRUE(Generate(Request(), &full).ok());
  ASSERT_EQ(full.output_ids_size(), kMaxNew);
  for (int k : {1, 17, kMaxNew - 1}) {
    SCOPED_TRACE(k);
    rl::v1::GenerateFinal resumed;
    std::vector<rl::v1::GenerateChunk> chunks;
    grpc::Status s = Generate(ResumeFromPrefix(full, k), &resumed, &chunks);
    ASSERT_TRUE(s.ok()) << s.error_message();
    ExpectSameSample(resumed, full, k);
    // Only the new tokens are streamed; the earlier logprobs come back as given.
    int streamed = 0;
    for (const auto& c : chunks) streamed += c.token_ids_size();
    EXPECT_EQ(streamed, kMaxNew - k);
    EXPECT_EQ(resumed.output_logprobs(0).logprob(), full.output_logprobs(0).logprob());
  }
}

TEST_F(ResumeTest, UnknownVersionsAndLogprobsOfTheEarlierPart) {
  StartWorker();
  rl::v1::GenerateFinal full;
  ASSERT_TRUE(Generate(Request(), &full).ok());
  rl::v1::GenerateRequest req = ResumeFromPrefix(full, 10);
  req.mutable_resume_from()->clear_output_logprobs();
  req.mutable_resume_from()->clear_weight_version_segments();
  rl::v1::GenerateFinal resumed;
  ASSERT_TRUE(Generate(req, &resumed).ok());
  ASSERT_EQ(resumed.output_ids_size(), kMaxNew);
  for (int i = 0; i < kMaxNew; ++i) EXPECT_EQ(resumed.output_ids(i), full.output_ids(i));
  EXPECT_TRUE(std::isnan(resumed.output_logprobs(0).logprob()));
  ASSERT_GE(resumed.weight_version_segments_size(), 2);
  EXPECT_EQ(resumed.weight_version_segments(0).weight_version(), -1);  // unknown
  EXPECT_EQ(resumed.weight_version_segments(0).num_tokens(), 10);
  EXPECT_EQ(resumed.weight_version(), full.weight_version());
}

TEST_F(ResumeTest, SampleInterruptedByAbortResumesToTheUninterruptedOne) {
  StartWorker();
  constexpr int kLong = 300;
  rl::v1::GenerateFinal full;
  ASSERT_TRUE(Generate(Request(kLong), &full).ok());
  ASSERT_EQ(full.output_ids_size(), kLong);
  // Caught running by an in-place pause, then aborted (a request can finish before the pause
  // lands on this fast model: then it runs again, a precondition, not a timing assertion).
  rl::v1::GenerateFinal partial;
  for (int attempt = 0; attempt < 20; ++attempt) {
    rl::v1::GenerateRequest req = Request(kLong);
    req.set_request_id(absl::StrCat("interrupted-", attempt));
    absl::Mutex mu;
    int streamed = 0;
    rl::v1::GenerateFinal fin;
    std::thread t([&] {
      grpc::ClientContext ctx;
      ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
      auto reader = worker_->Generate(&ctx, req);
      rl::v1::GenerateResponse msg;
      while (reader->Read(&msg)) {
        absl::MutexLock lock(&mu);
        if (msg.has_chunk()) streamed += msg.chunk().token_ids_size();
        if (msg.has_final()) fin = msg.final();
      }
      EXPECT_TRUE(reader->Finish().ok());
    });
    {
      absl::MutexLock lock(&mu);
      auto some = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) { return streamed >= 3; };
      mu.AwaitWithTimeout(absl::Condition(&some), absl::Seconds(60));
    }
    rl::v1::PauseGenerationRequest pause;
    pause.set_mode(rl::v1::PAUSE_MODE_IN_PLACE);
    rl::v1::AdminResponse resp;
    ASSERT_TRUE(Call(&rl::v1::Admin::Stub::PauseGeneration, pause, &resp).ok());
    {
      grpc::ClientContext ctx;
      rl::v1::AbortRequest abort;
      abort.set_request_id(req.request_id());
      rl::v1::AbortResponse aborted;
      ASSERT_TRUE(worker_->Abort(&ctx, abort, &aborted).ok());
    }
    ASSERT_TRUE(
        Call(&rl::v1::Admin::Stub::ContinueGeneration, rl::v1::ContinueGenerationRequest(), &resp)
            .ok());
    t.join();
    if (fin.finish_reason() == rl::v1::FINISH_REASON_ABORT) {
      partial = fin;
      break;
    }
  }
  ASSERT_EQ(partial.finish_reason(), rl::v1::FINISH_REASON_ABORT) << "never caught running";
  const int k = partial.output_ids_size();
  ASSERT_GE(k, 3);
  ASSERT_LT(k, kLong);
  rl::v1::GenerateRequest resume = Request(kLong);
  *resume.mutable_resume_from()->mutable_output_ids() = partial.output_ids();
  for (const auto& lp : partial.output_logprobs()) {
    resume.mutable_resume_from()->add_output_logprobs(lp.logprob());
  }
  *resume.mutable_resume_from()->mutable_weight_version_segments() =
      partial.weight_version_segments();
  rl::v1::GenerateFinal resumed;
  ASSERT_TRUE(Generate(resume, &resumed).ok());
  ExpectSameSample(resumed, full, k);
}

TEST_F(ResumeTest, RefusalsNameTheProblemBeforeAnythingRuns) {
  StartWorker();
  rl::v1::GenerateFinal full;
  ASSERT_TRUE(Generate(Request(), &full).ok());
  auto refused = [&](const rl::v1::GenerateRequest& req, const std::string& needle) {
    rl::v1::GenerateFinal f;
    grpc::Status s = Generate(req, &f);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << needle;
    EXPECT_NE(s.error_message().find(needle), std::string::npos) << s.error_message();
  };
  // No budget left: the original max_new_tokens already generated.
  refused(ResumeFromPrefix(full, kMaxNew), "nothing is left to generate");
  // The context (512): prompt 5 + earlier 40 + remaining 470 = 515.
  refused(ResumeFromPrefix(full, 40, 510),
          "prompt (5 tokens) + earlier output (40) + remaining budget (470");
  rl::v1::GenerateRequest two = ResumeFromPrefix(full, 4);
  two.mutable_sampling_params()->set_n(2);
  refused(two, "n must be 1");
  rl::v1::GenerateRequest by_id = Request();
  by_id.mutable_resume_from()->set_request_id("earlier");
  refused(by_id, "the router's");
  rl::v1::GenerateRequest logprobs = ResumeFromPrefix(full, 4);
  logprobs.mutable_resume_from()->add_output_logprobs(-1.0f);
  refused(logprobs, "resume_from.output_logprobs");
  rl::v1::GenerateRequest segments = ResumeFromPrefix(full, 4);
  segments.mutable_resume_from()->mutable_weight_version_segments(0)->set_num_tokens(3);
  refused(segments, "resume_from.weight_version_segments");
  rl::v1::GenerateRequest no_budget = ResumeFromPrefix(full, 4);
  no_budget.mutable_sampling_params()->clear_max_new_tokens();
  refused(no_budget, "ORIGINAL budget");
  EXPECT_EQ(ServerInfo().num_finished(), 1);  // only the reference ran
}

}  // namespace
}  // namespace rl::worker::testing
