#include "tests/testing/fake_router.h"

#include <algorithm>
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

// A held call's wake-up: its group aborted, or the client gone.
struct HoldSignal {
  std::mutex mu;
  std::condition_variable cv;
  bool aborted = false;
  bool cancelled = false;
};

namespace {

// Held until its group is aborted (then `aborted` after `reply`), the client cancels
// (CANCELLED) or `hold` has passed (then `full`), on its own thread.
class Held : public grpc::ServerWriteReactor<rl::v1::GenerateResponse> {
 public:
  Held(rl::v1::GenerateResponse full, rl::v1::GenerateResponse aborted,
       std::shared_ptr<HoldSignal> signal, std::chrono::milliseconds hold,
       std::chrono::milliseconds reply)
      : full_(std::move(full)), aborted_(std::move(aborted)), signal_(std::move(signal)) {
    std::thread([this, hold, reply] {
      HoldSignal& sig = *signal_;
      bool aborted, cancelled;
      {
        std::unique_lock<std::mutex> lock(sig.mu);
        sig.cv.wait_for(lock, hold, [&] { return sig.aborted || sig.cancelled; });
        if (sig.aborted) sig.cv.wait_for(lock, reply, [&] { return sig.cancelled; });
        aborted = sig.aborted;
        cancelled = sig.cancelled;
      }
      // `this` may be deleted (OnDone) once Finish is called: nothing touches it after.
      if (cancelled) {
        Finish(grpc::Status(grpc::StatusCode::CANCELLED, "fake: cancelled"));
      } else {
        StartWriteAndFinish(aborted ? &aborted_ : &full_, grpc::WriteOptions(), grpc::Status::OK);
      }
    }).detach();
  }
  void OnCancel() override {
    std::lock_guard<std::mutex> lock(signal_->mu);
    signal_->cancelled = true;
    signal_->cv.notify_all();
  }
  void OnDone() override { delete this; }

 private:
  rl::v1::GenerateResponse full_;
  rl::v1::GenerateResponse aborted_;
  std::shared_ptr<HoldSignal> signal_;
};

// `full`'s final cut to the first half of its output and ended FINISH_REASON_ABORT.
rl::v1::GenerateResponse AbortedHalf(const rl::v1::GenerateResponse& full) {
  rl::v1::GenerateResponse out = full;
  rl::v1::GenerateFinal* f = out.mutable_final();
  const int half = f->output_ids_size() / 2;
  f->mutable_output_ids()->Truncate(half);
  f->mutable_output_logprobs()->DeleteSubrange(half, f->output_logprobs_size() - half);
  f->clear_weight_version_segments();
  if (half > 0) {
    rl::v1::VersionSegment* seg = f->add_weight_version_segments();
    seg->set_weight_version(f->weight_version());
    seg->set_num_tokens(half);
  }
  f->clear_trajectory();
  f->set_completion_tokens(half);
  f->set_finish_reason(rl::v1::FINISH_REASON_ABORT);
  f->set_abort_message("fake: the group was aborted");
  return out;
}

}  // namespace

grpc::ServerUnaryReactor* FakeRouter::Abort(grpc::CallbackServerContext* ctx,
                                            const rl::v1::AbortRequest* request,
                                            rl::v1::AbortResponse* response) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  if (request->group_id().empty()) {
    reactor->Finish(grpc::Status(grpc::StatusCode::UNIMPLEMENTED, "fake: group_id only"));
    return reactor;
  }
  absl::MutexLock lock(&mu_);
  if (++aborts_[request->group_id()] <= options_.abort_fail_first) {
    reactor->Finish(grpc::Status(options_.abort_fail_code, "fake: abort failed"));
    return reactor;
  }
  aborted_.insert(request->group_id());
  int32_t n = 0;
  for (const std::shared_ptr<HoldSignal>& sig : held_[request->group_id()]) {
    std::lock_guard<std::mutex> hold(sig->mu);
    sig->aborted = true;
    sig->cv.notify_all();
    ++n;
  }
  response->set_num_aborted(n);
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

absl::flat_hash_map<std::string, int> FakeRouter::aborts() const {
  absl::MutexLock lock(&mu_);
  return aborts_;
}

absl::flat_hash_set<std::string> FakeRouter::generated_groups() const {
  absl::MutexLock lock(&mu_);
  return generated_;
}

grpc::ServerWriteReactor<rl::v1::GenerateResponse>* FakeRouter::Generate(
    grpc::CallbackServerContext*, const rl::v1::GenerateRequest* request) {
  calls_.fetch_add(1);
  int seen = 0;
  {
    absl::MutexLock lock(&mu_);
    if (!request->group_id().empty()) generated_.insert(request->group_id());
    if (options_.unavailable_first > 0 || options_.abort_first > 0) {
      seen = seen_[request->request_id()]++;
    }
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
  if (std::find(options_.hold_texts.begin(), options_.hold_texts.end(), request->text()) !=
      options_.hold_texts.end()) {
    auto sig = std::make_shared<HoldSignal>();
    {
      absl::MutexLock lock(&mu_);
      sig->aborted = aborted_.contains(request->group_id());
      held_[request->group_id()].push_back(sig);
    }
    rl::v1::GenerateResponse aborted = AbortedHalf(msg);
    return new Held(std::move(msg), std::move(aborted), std::move(sig),
                    std::chrono::milliseconds(options_.hold_ms),
                    std::chrono::milliseconds(options_.abort_reply_ms));
  }
  if (!options_.slow_text.empty() && request->text() == options_.slow_text) {
    slow_calls_.fetch_add(1);
    return new Delayed(std::move(msg), std::chrono::milliseconds(slow_ms_.load()));
  }
  return new OneShot(std::move(msg));
}

}  // namespace rl::collector
