// Issue 34, resume within the budget and group aborts, through rl-router over an in-process
// rl-worker (stories260K):
// - resume by tokens: the router's final and trajectory are one sample (the earlier tokens with
//   loss mask 1 and their given logprobs and versions), equal to the uninterrupted greedy one
//   token for token and logprob for logprob (float tolerance);
// - resume by request id: a request interrupted by Router.Abort (caught running by an in-place
//   pause) is kept by the router and resumed with its id alone to the uninterrupted sample; the
//   kept sample is forgotten once resumed; a LENGTH sample is never kept; refusals named;
// - Router.Abort(group_id) ends every running request of the group with its partial output and
//   leaves other groups alone.
#include <memory>
#include <thread>

#include "absl/synchronization/mutex.h"
#include "services/router/resume_store.h"
#include "tests/testing/generate_stream.h"
#include "tests/testing/router_fleet.h"
#include "tests/worker/worker_test_util.h"

namespace rl::router::testing {
namespace {

using Stream = ::rl::testing::GenerateStream<rl::v1::Router::Stub>;

constexpr int kMaxNew = 200;
constexpr float kLogprobTolerance = 2e-3f;

class ResumeRouterTest : public RouterFleetTest {
 protected:
  static rl::v1::GenerateRequest Request(int max_new = kMaxNew) {
    rl::v1::GenerateRequest req;
    for (int32_t id : worker::testing::kPromptIds) req.mutable_input_ids()->add_ids(id);
    req.mutable_sampling_params()->set_temperature(0);
    req.mutable_sampling_params()->set_max_new_tokens(max_new);
    req.mutable_sampling_params()->set_ignore_eos(true);
    req.set_return_logprob(true);
    req.set_return_trajectory(true);
    return req;
  }
  grpc::Status Pause(rl::v1::PauseMode mode) {
    rl::v1::PauseGenerationRequest req;
    req.set_mode(mode);
    grpc::ClientContext ctx;
    rl::v1::AdminResponse resp;
    return admin_->PauseGeneration(&ctx, req, &resp);
  }
  grpc::Status Continue() {
    grpc::ClientContext ctx;
    rl::v1::AdminResponse resp;
    return admin_->ContinueGeneration(&ctx, rl::v1::ContinueGenerationRequest(), &resp);
  }
  int Running() {
    grpc::ClientContext ctx;
    rl::v1::GetServerInfoResponse info;
    EXPECT_TRUE(admin_->GetServerInfo(&ctx, rl::v1::GetServerInfoRequest(), &info).ok());
    int n = 0;
    for (const auto& w : info.workers()) n += w.info().num_running();
    return n;
  }
  absl::StatusOr<int> Abort(const rl::v1::AbortRequest& req) {
    grpc::ClientContext ctx;
    rl::v1::AbortResponse resp;
    grpc::Status s = stub_->Abort(&ctx, req, &resp);
    if (!s.ok()) return absl::InternalError(s.error_message());
    return resp.num_aborted();
  }
  // Starts the requests `make` returns, pauses in place once each streamed a token and returns
  // their streams once the pause caught all of them running (a request can finish before the
  // pause lands on this fast model: then the round runs again, a precondition, not a timing
  // assertion). The fleet stays paused in place.
  std::vector<std::unique_ptr<Stream>> CaughtRunning(
      const std::function<std::vector<rl::v1::GenerateRequest>(int)>& make) {
    for (int attempt = 0; attempt < 20; ++attempt) {
      std::vector<std::unique_ptr<Stream>> streams;
      for (rl::v1::GenerateRequest& req : make(attempt)) {
        streams.push_back(std::make_unique<Stream>(stub_.get(), std::move(req)));
      }
      for (auto& s : streams) s->WaitTokens(3);
      EXPECT_TRUE(Pause(rl::v1::PAUSE_MODE_IN_PLACE).ok());
      bool running = Running() == static_cast<int>(streams.size());
      for (auto& s : streams) running = running && !s->done();
      if (running) return streams;
      EXPECT_TRUE(Continue().ok());
      for (auto& s : streams) s->Wait();
    }
    ADD_FAILURE() << "never caught running";
    return {};
  }
  static void ExpectSameSample(const rl::v1::GenerateFinal& resumed,
                               const rl::v1::GenerateFinal& full, int earlier) {
    EXPECT_EQ(resumed.resumed_tokens(), earlier);
    EXPECT_EQ(resumed.finish_reason(), rl::v1::FINISH_REASON_LENGTH);
    ASSERT_EQ(resumed.output_ids_size(), full.output_ids_size());
    for (int i = 0; i < full.output_ids_size(); ++i) {
      EXPECT_EQ(resumed.output_ids(i), full.output_ids(i)) << "token " << i;
      EXPECT_NEAR(resumed.output_logprobs(i).logprob(), full.output_logprobs(i).logprob(),
                  kLogprobTolerance)
          << "token " << i;
    }
    // The trajectory: one sample, every output token trained on.
    const rl::v1::Trajectory& t = resumed.trajectory();
    const int prompt = static_cast<int>(worker::testing::kPromptIds.size());
    ASSERT_EQ(t.tokens_size(), prompt + full.output_ids_size());
    ASSERT_EQ(t.loss_mask_size(), t.tokens_size());
    for (int i = 0; i < t.tokens_size(); ++i) {
      EXPECT_EQ(t.loss_mask(i), i < prompt ? 0 : 1) << i;
      if (i >= prompt) {
        EXPECT_EQ(t.tokens(i), full.output_ids(i - prompt));
        EXPECT_NEAR(t.rollout_logp(i), full.output_logprobs(i - prompt).logprob(),
                    kLogprobTolerance);
      }
    }
  }
};

TEST_F(ResumeRouterTest, ResumeByTokensIsOneSampleEqualToTheUninterruptedOne) {
  ASSERT_NO_FATAL_FAILURE(StartFleet(1));
  rl::v1::GenerateFinal full;
  ASSERT_TRUE(Generate(Request(), &full).ok());
  ASSERT_EQ(full.output_ids_size(), kMaxNew);
  constexpr int k = 37;
  rl::v1::GenerateRequest req = Request();
  rl::v1::ResumeFrom* rf = req.mutable_resume_from();
  for (int i = 0; i < k; ++i) {
    rf->add_output_ids(full.output_ids(i));
    rf->add_output_logprobs(full.output_logprobs(i).logprob());
  }
  // Versions the client says: 20 tokens of version 7, the rest of version 8.
  rl::v1::VersionSegment* a = rf->add_weight_version_segments();
  a->set_weight_version(7);
  a->set_num_tokens(20);
  rl::v1::VersionSegment* b = rf->add_weight_version_segments();
  b->set_weight_version(8);
  b->set_num_tokens(k - 20);
  rl::v1::GenerateFinal resumed;
  grpc::Status s = Generate(req, &resumed);
  ASSERT_TRUE(s.ok()) << s.error_message();
  ExpectSameSample(resumed, full, k);
  EXPECT_TRUE(resumed.resumed_from_request_id().empty());
  const rl::v1::Trajectory& t = resumed.trajectory();
  const int prompt = static_cast<int>(worker::testing::kPromptIds.size());
  EXPECT_EQ(t.token_weight_versions(prompt), 7);
  EXPECT_EQ(t.token_weight_versions(prompt + 19), 7);
  EXPECT_EQ(t.token_weight_versions(prompt + 20), 8);
  EXPECT_EQ(t.token_weight_versions(prompt + k), full.weight_version());  // the new part
  EXPECT_EQ(t.rollout_logp(prompt), full.output_logprobs(0).logprob());   // as given
}

TEST_F(ResumeRouterTest, ResumeByIdOfARequestInterruptedByAbort) {
  ASSERT_NO_FATAL_FAILURE(StartFleet(1));
  rl::v1::GenerateFinal full;
  ASSERT_TRUE(Generate(Request(), &full).ok());
  std::string id;
  auto streams = CaughtRunning([&](int attempt) {
    id = absl::StrCat("to-resume-", attempt);
    rl::v1::GenerateRequest req = Request();
    req.set_request_id(id);
    return std::vector{req};
  });
  ASSERT_EQ(streams.size(), 1u);
  rl::v1::AbortRequest abort;
  abort.set_request_id(id);
  ASSERT_TRUE(Abort(abort).ok());
  ASSERT_TRUE(Continue().ok());
  ASSERT_TRUE(streams[0]->Wait().ok());
  const rl::v1::GenerateFinal partial = streams[0]->final_msg();
  ASSERT_EQ(partial.finish_reason(), rl::v1::FINISH_REASON_ABORT);
  const int k = partial.output_ids_size();
  ASSERT_GE(k, 3);
  ASSERT_LT(k, kMaxNew);

  // Refusals: a prompt with an id, an unknown id.
  rl::v1::GenerateRequest with_prompt = Request();
  with_prompt.mutable_resume_from()->set_request_id(id);
  rl::v1::GenerateFinal f;
  grpc::Status s = Generate(with_prompt, &f);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
  rl::v1::GenerateRequest unknown;
  unknown.mutable_resume_from()->set_request_id("never-ran");
  s = Generate(unknown, &f);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND) << s.error_message();
  EXPECT_NE(s.error_message().find("LENGTH one has no budget left"), std::string::npos);

  // By id alone: the kept prompt, budget and earlier output.
  rl::v1::GenerateRequest by_id;
  by_id.mutable_resume_from()->set_request_id(id);
  by_id.set_return_logprob(true);
  by_id.set_return_trajectory(true);
  rl::v1::GenerateFinal resumed;
  s = Generate(by_id, &resumed);
  ASSERT_TRUE(s.ok()) << s.error_message();
  ExpectSameSample(resumed, full, k);
  EXPECT_EQ(resumed.resumed_from_request_id(), id);
  // Resumed once: forgotten. A LENGTH sample (the one just finished) is never kept.
  s = Generate(by_id, &f);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND) << s.error_message();
}

TEST_F(ResumeRouterTest, AbortByGroupIdEndsTheGroupWithPartialOutputs) {
  ASSERT_NO_FATAL_FAILURE(StartFleet(1));
  auto streams = CaughtRunning([&](int attempt) {
    std::vector<rl::v1::GenerateRequest> reqs;
    for (int i = 0; i < 3; ++i) {
      rl::v1::GenerateRequest req = Request();
      req.set_group_id(absl::StrCat(i < 2 ? "grp-a-" : "grp-b-", attempt));
      req.set_request_id(absl::StrCat("member-", attempt, "-", i));
      reqs.push_back(req);
    }
    return reqs;
  });
  ASSERT_EQ(streams.size(), 3u);
  rl::v1::AbortRequest bad;
  bad.set_group_id("grp-a-0");
  bad.set_request_id("x");
  EXPECT_FALSE(Abort(bad).ok());
  // The attempt that caught all three running: its group "a".
  std::string group;
  for (int attempt = 0; attempt < 20 && group.empty(); ++attempt) {
    rl::v1::AbortRequest req;
    req.set_group_id(absl::StrCat("grp-a-", attempt));
    absl::StatusOr<int> n = Abort(req);
    ASSERT_TRUE(n.ok()) << n.status();
    if (*n > 0) {
      EXPECT_EQ(*n, 2);
      group = req.group_id();
    }
  }
  ASSERT_FALSE(group.empty());
  ASSERT_TRUE(Continue().ok());
  for (auto& st : streams) ASSERT_TRUE(st->Wait().ok());
  EXPECT_EQ(streams[0]->final_msg().finish_reason(), rl::v1::FINISH_REASON_ABORT);
  EXPECT_EQ(streams[1]->final_msg().finish_reason(), rl::v1::FINISH_REASON_ABORT);
  EXPECT_GE(streams[0]->final_msg().output_ids_size(), 3);
  EXPECT_EQ(streams[2]->final_msg().finish_reason(), rl::v1::FINISH_REASON_LENGTH);
  EXPECT_EQ(streams[2]->final_msg().output_ids_size(), kMaxNew);
}

TEST(ResumeStoreTest, BoundedInEntriesAndBytesLeastRecentlyUsedFirst) {
  auto entry = [](int tokens) {
    rl::v1::GenerateRequest r;
    r.mutable_input_ids()->add_ids(1);
    r.mutable_sampling_params()->set_max_new_tokens(100);
    for (int i = 0; i < tokens; ++i) r.mutable_resume_from()->add_output_ids(5);
    return r;
  };
  ResumeStore store(ResumeStoreOptions{2, 1 << 20});
  store.Put("a", entry(3));
  store.Put("b", entry(3));
  ASSERT_TRUE(store.Get("a").ok());  // a is now the most recent
  store.Put("c", entry(3));
  EXPECT_TRUE(store.Get("a").ok());
  EXPECT_EQ(store.Get("b").status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(store.Get("c").ok());
  EXPECT_EQ(store.size(), 2u);
  store.Erase("a");
  EXPECT_EQ(store.size(), 1u);

  ResumeStore small(ResumeStoreOptions{100, 200});
  small.Put("big", entry(1000));  // more than the bound alone: not kept
  EXPECT_EQ(small.size(), 0u);
  for (int i = 0; i < 10; ++i) small.Put(absl::StrCat("k", i), entry(20));
  EXPECT_LE(small.bytes(), 200);
  EXPECT_TRUE(small.Get("k9").ok());
  EXPECT_FALSE(small.Get("k0").ok());

  ResumeStore off(ResumeStoreOptions{0, 1 << 20});
  off.Put("a", entry(1));
  EXPECT_FALSE(off.enabled());
  EXPECT_EQ(off.size(), 0u);
}

}  // namespace
}  // namespace rl::router::testing
