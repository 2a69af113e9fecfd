#include "tests/testing/fake_router.h"

#include <chrono>
#include <cmath>
#include <condition_variable>
#include <mutex>
#include <thread>

namespace rl::collector {
namespace {

class OneShot : public grpc::ServerWriteReactor<rl::v1::GenerateResponse> {
 public:
  explicit OneShot(grpc::Status error) : error_(std::move(error)) { Finish(error_); }
  explicit OneShot(rl::v1::GenerateResponse msg) : msg_(std::move(msg)) {
    StartWriteAndFinish(&msg_, grpc::WriteOptions(), grpc::Status::OK);
  }
  void OnDone() override { delete this; }

 private:
  grpc::Status error_;
  rl::v1::GenerateResponse msg_;
};

// Answers after `delay` on its own thread (no callback thread is blocked), or at once with
// CANCELLED when the client cancels first.
class Delayed : public grpc::ServerWriteReactor<rl::v1::GenerateResponse> {
 public:
  Delayed(rl::v1::GenerateResponse msg, std::chrono::milliseconds delay) : msg_(std::move(msg)) {
    std::thread([this, delay] {
      bool cancelled = false;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait_for(lock, delay, [&] { return cancelled_; });
        cancelled = cancelled_;
      }
      // `this` may be deleted (OnDone) once Finish is called: nothing touches it after.
      if (cancelled) {
        Finish(grpc::Status(grpc::StatusCode::CANCELLED, "fake: cancelled"));
      } else {
        StartWriteAndFinish(&msg_, grpc::WriteOptions(), grpc::Status::OK);
      }
    }).detach();
  }
  void OnCancel() override {
    std::lock_guard<std::mutex> lock(mu_);
    cancelled_ = true;
    cv_.notify_all();
  }
  void OnDone() override { delete this; }

 private:
  rl::v1::GenerateResponse msg_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool cancelled_ = false;
};

}  // namespace

grpc::ServerWriteReactor<rl::v1::GenerateResponse>* FakeRouter::Generate(
    grpc::CallbackServerContext*, const rl::v1::GenerateRequest* request) {
  calls_.fetch_add(1);
  int seen = 0;
  if (options_.unavailable_first > 0 || options_.abort_first > 0) {
    absl::MutexLock lock(&mu_);
    seen = seen_[request->request_id()]++;
  }
  if (seen < options_.unavailable_first) {
    return new OneShot(grpc::Status(grpc::StatusCode::UNAVAILABLE, "fake: not yet"));
  }
  if (!options_.invalid_text.empty() && request->text() == options_.invalid_text) {
    return new OneShot(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "fake: bad prompt"));
  }
  rl::v1::GenerateResponse msg;
  msg.set_request_id(request->request_id());
  rl::v1::GenerateFinal* f = msg.mutable_final();
  if (seen < options_.unavailable_first + options_.abort_first) {
    f->set_finish_reason(rl::v1::FINISH_REASON_ABORT);
    f->set_abort_message("fake: paused with abort");
    return new OneShot(std::move(msg));
  }
  rl::v1::Trajectory* t = f->mutable_trajectory();
  int64_t sum = 0;
  if (request->has_input_ids()) {
    for (int32_t id : request->input_ids().ids()) {
      t->add_tokens(id);
      sum += id;
    }
  } else {
    for (unsigned char c : request->text()) {
      t->add_tokens(c);
      sum += c;
    }
  }
  const int64_t seed = request->sampling_params().has_seed()
                           ? static_cast<int64_t>(request->sampling_params().seed() % 1000)
                           : 0;
  const int num_out =
      request->sampling_params().has_max_new_tokens()
          ? std::min(options_.num_output_tokens, request->sampling_params().max_new_tokens())
          : options_.num_output_tokens;
  for (int i = 0; i < num_out; ++i) {
    const int32_t id = static_cast<int32_t>((sum + i * 7 + seed) % 500);
    f->add_output_ids(id);
    t->add_tokens(id);
    rl::v1::TokenLogprob* lp = f->add_output_logprobs();
    lp->set_token_id(id);
    lp->set_logprob(-0.25f * static_cast<float>(i + 1));
  }
  f->set_finish_reason(rl::v1::FINISH_REASON_LENGTH);
  f->set_text("fake completion");
  f->set_prompt_tokens(t->tokens_size() - num_out);
  f->set_completion_tokens(num_out);
  f->set_attempts(1);
  const int64_t v = options_.weight_version;
  if (options_.two_segments && num_out >= 2) {
    f->set_weight_version(v + 1);
    if (options_.send_segments) {
      rl::v1::VersionSegment* a = f->add_weight_version_segments();
      a->set_weight_version(v);
      a->set_num_tokens(num_out / 2);
      rl::v1::VersionSegment* b = f->add_weight_version_segments();
      b->set_weight_version(v + 1);
      b->set_num_tokens(num_out - num_out / 2);
    }
  } else {
    f->set_weight_version(v);
    if (options_.send_segments && num_out > 0) {
      rl::v1::VersionSegment* a = f->add_weight_version_segments();
      a->set_weight_version(v);
      a->set_num_tokens(num_out);
    }
  }
  if (!options_.slow_text.empty() && request->text() == options_.slow_text) {
    slow_calls_.fetch_add(1);
    return new Delayed(std::move(msg), std::chrono::milliseconds(slow_ms_.load()));
  }
  return new OneShot(std::move(msg));
}

}  // namespace rl::collector
