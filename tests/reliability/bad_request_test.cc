// Bad requests to real processes: every Generate limit and sampling value, invalid UTF-8 and
// malformed messages, oversized worker addresses, request ids and abort-all. Each case asserts
// the status code, and afterwards the old weights still serve (bad_input_test_util.h).
#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "tests/reliability/bad_input_test_util.h"

namespace rl::testing {
namespace {

namespace fs = std::filesystem;
using grpc::StatusCode;

TEST_F(BadInputTest, GenerateLimitsAndSamplingValues) {
  struct Case {
    std::string name;
    std::function<void(rl::v1::GenerateRequest&)> mutate;
  };
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  auto sp = [](rl::v1::GenerateRequest& r) { return r.mutable_sampling_params(); };
  const std::vector<Case> cases = {
      {"n=2^31-1", [&](auto& r) { sp(r)->set_n(2147483647); }},
      {"n=10^7", [&](auto& r) { sp(r)->set_n(10000000); }},
      {"n=65", [&](auto& r) { sp(r)->set_n(65); }},
      {"n=0", [&](auto& r) { sp(r)->set_n(0); }},
      {"n=-1", [&](auto& r) { sp(r)->set_n(-1); }},
      {"text 50 MB", [&](auto& r) { r.set_text(std::string(50 << 20, 'a')); }},
      {"text 70 KB", [&](auto& r) { r.set_text(std::string(70000, 'a')); }},
      {"text over prompt tokens",
       [&](auto& r) {
         std::string t;
         for (int i = 0; i < 3000; ++i) t += "a b ";
         r.set_text(t);
       }},
      {"input_ids 200k",
       [&](auto& r) {
         r.mutable_input_ids()->clear_ids();
         for (int i = 0; i < 200000; ++i) r.mutable_input_ids()->add_ids(5);
       }},
      {"empty text", [&](auto& r) { r.set_text(""); }},
      {"empty ids", [&](auto& r) { r.mutable_input_ids()->clear_ids(); }},
      {"no prompt", [&](auto& r) { r.clear_prompt(); }},
      {"ids outside vocab", [&](auto& r) { r.mutable_input_ids()->add_ids(1 << 30); }},
      {"negative id", [&](auto& r) { r.mutable_input_ids()->add_ids(-1); }},
      {"max_new_tokens 2^31-1", [&](auto& r) { sp(r)->set_max_new_tokens(2147483647); }},
      {"max_new_tokens over context", [&](auto& r) { sp(r)->set_max_new_tokens(100000); }},
      {"max_new_tokens -1", [&](auto& r) { sp(r)->set_max_new_tokens(-1); }},
      {"min_new_tokens > max", [&](auto& r) { sp(r)->set_min_new_tokens(100); }},
      {"temperature NaN", [&](auto& r) { sp(r)->set_temperature(nan); }},
      {"temperature -1", [&](auto& r) { sp(r)->set_temperature(-1); }},
      {"temperature inf", [&](auto& r) { sp(r)->set_temperature(inf); }},
      {"top_p 0", [&](auto& r) { sp(r)->set_top_p(0); }},
      {"top_p 2", [&](auto& r) { sp(r)->set_top_p(2); }},
      {"top_p NaN", [&](auto& r) { sp(r)->set_top_p(nan); }},
      {"top_k -5", [&](auto& r) { sp(r)->set_top_k(-5); }},
      {"min_p 2", [&](auto& r) { sp(r)->set_min_p(2); }},
      {"repetition_penalty 0", [&](auto& r) { sp(r)->set_repetition_penalty(0); }},
      {"frequency_penalty 10", [&](auto& r) { sp(r)->set_frequency_penalty(10); }},
      {"presence_penalty -inf", [&](auto& r) { sp(r)->set_presence_penalty(-inf); }},
      {"1000 stop strings",
       [&](auto& r) {
         for (int i = 0; i < 1000; ++i) sp(r)->add_stop("x");
       }},
      {"1 MB stop string", [&](auto& r) { sp(r)->add_stop(std::string(1 << 20, 's')); }},
      {"empty stop string", [&](auto& r) { sp(r)->add_stop(""); }},
      {"10k stop token ids",
       [&](auto& r) {
         for (int i = 0; i < 10000; ++i) sp(r)->add_stop_token_ids(2);
       }},
      {"stop token outside vocab", [&](auto& r) { sp(r)->add_stop_token_ids(99999); }},
      {"top_logprobs 1000",
       [&](auto& r) {
         r.set_return_logprob(true);
         r.set_top_logprobs_num(1000);
       }},
      {"top_logprobs -1",
       [&](auto& r) {
         r.set_return_logprob(true);
         r.set_top_logprobs_num(-1);
       }},
      {"logprob_start_len without logprobs", [&](auto& r) { r.set_logprob_start_len(1); }},
      {"request_id 10 KB", [&](auto& r) { r.set_request_id(std::string(10240, 'i')); }},
      {"request_id in the server namespace", [&](auto& r) { r.set_request_id("srv-0123"); }},
  };
  for (const Case& c : cases) {
    rl::v1::GenerateRequest req = Greedy();
    c.mutate(req);
    ExpectError(Generate(worker_stub_.get(), req, nullptr),
                {StatusCode::INVALID_ARGUMENT, StatusCode::RESOURCE_EXHAUSTED},
                "worker: " + c.name);
    ExpectError(Generate(router_stub_.get(), req, nullptr),
                {StatusCode::INVALID_ARGUMENT, StatusCode::RESOURCE_EXHAUSTED,
                 StatusCode::FAILED_PRECONDITION},
                "router: " + c.name);
  }
  // Limits are named in the error.
  rl::v1::GenerateRequest big_n = Greedy();
  big_n.mutable_sampling_params()->set_n(2147483647);
  EXPECT_THAT(Generate(router_stub_.get(), big_n, nullptr).error_message(),
              ::testing::HasSubstr("--max-n"));
  EXPECT_THAT(Generate(worker_stub_.get(), big_n, nullptr).error_message(),
              ::testing::HasSubstr("--max-n"));
  ExpectHealthy("after generate limits");
}

TEST_F(BadInputTest, InvalidUtf8AndMalformedMessages) {
  // Invalid UTF-8 in a proto3 string does not parse on the server: INVALID_ARGUMENT.
  rl::v1::GenerateRequest bad_utf8 = Greedy();
  bad_utf8.set_text("abc\xff\xfe\xc3");
  for (auto* ch : {&wch_, &rch_}) {
    const std::string method = ch == &wch_ ? "/rl.v1.Worker/Generate" : "/rl.v1.Router/Generate";
    ExpectError(RawCall(*ch, method, bad_utf8.SerializeAsString(), kDataKey),
                {StatusCode::INVALID_ARGUMENT, StatusCode::INTERNAL}, method + " invalid UTF-8");
  }
  rl::v1::GenerateRequest good = Greedy();
  good.set_text("Once upon a time there was a little girl");
  const std::string full = good.SerializeAsString();
  const std::string truncated = full.substr(0, full.size() - 7);
  const std::string garbage = "\xff\xff\xff\xff\xff\xff\x0f\x0a\x80";
  struct Raw {
    std::shared_ptr<grpc::Channel>* channel;
    std::string method;
    std::string key;
  };
  const std::vector<Raw> methods = {
      {&wch_, "/rl.v1.Worker/Generate", kDataKey},
      {&wch_, "/rl.v1.Worker/Abort", kDataKey},
      {&wch_, "/rl.v1.Worker/GetLoad", kDataKey},
      {&wch_, "/rl.v1.Admin/GetServerInfo", kAdminKey},
      {&wch_, "/rl.v1.Admin/UpdateWeightsFromDisk", kAdminKey},
      {&wch_, "/rl.v1.Admin/PauseGeneration", kAdminKey},
      {&rch_, "/rl.v1.Router/Generate", kDataKey},
      {&rch_, "/rl.v1.Router/RetrieveFromText", kDataKey},
      {&rch_, "/rl.v1.Router/AddWorker", kAdminKey},
  };
  for (const Raw& m : methods) {
    for (const std::string* body : {&garbage, &truncated}) {
      const grpc::Status s = RawCall(*m.channel, m.method, *body, m.key);
      if (s.ok()) continue;  // some bodies happen to parse for some messages
      ExpectError(s, {StatusCode::INVALID_ARGUMENT, StatusCode::INTERNAL}, m.method);
    }
    ExpectError(RawCall(*m.channel, m.method, garbage, m.key),
                {StatusCode::INVALID_ARGUMENT, StatusCode::INTERNAL}, m.method + " garbage");
  }
  // A garbage chunk in a client stream.
  const grpc::Status stream =
      RawCall(wch_, "/rl.v1.Admin/UpdateWeightsFromTensor", garbage, kAdminKey);
  EXPECT_FALSE(stream.ok());
  EXPECT_NE(stream.error_code(), StatusCode::UNIMPLEMENTED) << stream.error_message();
  // A method that really does not exist stays UNIMPLEMENTED.
  EXPECT_EQ(RawCall(wch_, "/rl.v1.Worker/NoSuchMethod", full, kDataKey).error_code(),
            StatusCode::UNIMPLEMENTED);
  ExpectHealthy("after malformed messages");
}

TEST_F(BadInputTest, RouterAddressesBounded) {
  for (const std::string& address : {std::string(10240, 'h'), std::string()}) {
    rl::v1::AddWorkerRequest req;
    req.set_address(address);
    rl::v1::WorkerListResponse resp;
    grpc::ClientContext ctx;
    ctx.AddMetadata("authorization", std::string("Bearer ") + kAdminKey);
    ExpectError(router_admin_->AddWorker(&ctx, req, &resp), {StatusCode::INVALID_ARGUMENT},
                "AddWorker " + std::to_string(address.size()));
  }
  ExpectHealthy("after addresses");
}

TEST_F(BadInputTest, RequestIdsAndAbortAll) {
  // Server-assigned ids: unguessable, in their own namespace, distinct.
  std::string a, b;
  ASSERT_TRUE(Generate(worker_stub_.get(), Greedy(2), nullptr, &a).ok());
  ASSERT_TRUE(Generate(worker_stub_.get(), Greedy(2), nullptr, &b).ok());
  EXPECT_THAT(a, ::testing::MatchesRegex("srv-[0-9a-f]{32}"));
  EXPECT_NE(a, b);
  // A client's own id stays unique: a second request with an in-flight id is ALREADY_EXISTS.
  auto admin_call = [&](auto fn, const auto& req, const std::string& key) {
    rl::v1::AdminResponse resp;
    grpc::ClientContext ctx;
    ctx.AddMetadata("authorization", "Bearer " + key);
    return (admin_.get()->*fn)(&ctx, req, &resp);
  };
  rl::v1::PauseGenerationRequest pause;
  pause.set_mode(rl::v1::PAUSE_MODE_IN_PLACE);
  ASSERT_TRUE(admin_call(&rl::v1::Admin::Stub::PauseGeneration, pause, kAdminKey).ok());
  rl::v1::GenerateRequest mine = Greedy(4);
  mine.set_request_id("client-7");
  std::thread first([&] { EXPECT_TRUE(Generate(worker_stub_.get(), mine, nullptr).ok()); });
  bool waiting = false;
  for (int i = 0; i < 300 && !waiting; ++i) {
    rl::v1::GetServerInfoResponse info;
    grpc::ClientContext ctx;
    ctx.AddMetadata("authorization", std::string("Bearer ") + kAdminKey);
    waiting = admin_->GetServerInfo(&ctx, {}, &info).ok() && info.num_waiting() == 1;
    if (!waiting) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ASSERT_TRUE(waiting);
  EXPECT_EQ(Generate(worker_stub_.get(), mine, nullptr).error_code(), StatusCode::ALREADY_EXISTS);
  // abort_all needs the admin key: the data-plane key and no key are refused.
  rl::v1::AbortRequest all;
  all.set_abort_all(true);
  rl::v1::AbortResponse aresp;
  {
    grpc::ClientContext ctx;
    ctx.AddMetadata("authorization", std::string("Bearer ") + kDataKey);
    ExpectError(worker_stub_->Abort(&ctx, all, &aresp),
                {StatusCode::PERMISSION_DENIED, StatusCode::UNAUTHENTICATED}, "abort_all data key");
  }
  {
    grpc::ClientContext ctx;
    ExpectError(worker_stub_->Abort(&ctx, all, &aresp), {StatusCode::UNAUTHENTICATED},
                "abort_all no key");
  }
  {
    rl::v1::AbortRequest one;
    one.set_request_id(std::string(10240, 'x'));
    grpc::ClientContext ctx;
    ctx.AddMetadata("authorization", std::string("Bearer ") + kDataKey);
    ExpectError(worker_stub_->Abort(&ctx, one, &aresp), {StatusCode::INVALID_ARGUMENT},
                "abort 10 KB id");
  }
  EXPECT_TRUE(admin_call(&rl::v1::Admin::Stub::ContinueGeneration,
                         rl::v1::ContinueGenerationRequest(), kAdminKey)
                  .ok());
  first.join();
  {
    grpc::ClientContext ctx;
    ctx.AddMetadata("authorization", std::string("Bearer ") + kAdminKey);
    EXPECT_TRUE(worker_stub_->Abort(&ctx, all, &aresp).ok());
  }
  ExpectHealthy("after ids");
}

}  // namespace
}  // namespace rl::testing
