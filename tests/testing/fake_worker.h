// In-process test doubles for router load tests and bench/router: a fake rl.v1.Worker that
// answers Generate from the callback API (optionally after a delay, with many chunks), a hung
// worker (HoldingWorker) and an Admin service that answers or holds (FakeAdmin), and an
// asynchronous Generate caller (ClientReadReactor), so thousands of streams need no thread each.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "grpcpp/alarm.h"
#include "grpcpp/grpcpp.h"
#include "rl/v1/admin.grpc.pb.h"
#include "rl/v1/router.grpc.pb.h"
#include "rl/v1/worker.grpc.pb.h"

namespace rl::router::testing {

struct FakeWorkerOptions {
  int chunks = 1;  // chunk messages before the final
  int tokens_per_chunk = 16;
  std::chrono::milliseconds delay{0};  // before the first message
};

// Answers every Generate with `chunks` chunks of fixed tokens (ids 300..399, valid for the
// stories260K tokenizer) and a final message. Counts streams started, finished and cancelled.
class FakeWorker final : public rl::v1::Worker::CallbackService {
 public:
  explicit FakeWorker(FakeWorkerOptions options) : options_(options) {}

  grpc::ServerWriteReactor<rl::v1::GenerateResponse>* Generate(
      grpc::CallbackServerContext*, const rl::v1::GenerateRequest* req) override {
    started.fetch_add(1);
    return new Reactor(this, *req);
  }

  grpc::ServerUnaryReactor* GetLoad(grpc::CallbackServerContext* ctx, const rl::v1::GetLoadRequest*,
                                    rl::v1::GetLoadResponse*) override {
    auto* r = ctx->DefaultReactor();
    r->Finish(grpc::Status::OK);
    return r;
  }

  std::atomic<int> started{0};
  std::atomic<int> finished{0};
  std::atomic<int> cancelled{0};

 private:
  class Reactor final : public grpc::ServerWriteReactor<rl::v1::GenerateResponse> {
   public:
    Reactor(FakeWorker* w, const rl::v1::GenerateRequest& req)
        : w_(w), prompt_tokens_(req.input_ids().ids_size()) {
      chunk_.set_request_id(req.request_id());
      final_.set_request_id(req.request_id());
      for (int i = 0; i < w->options_.tokens_per_chunk; ++i) {
        chunk_.mutable_chunk()->add_token_ids(300 + i % 100);
      }
      if (w->options_.delay.count() > 0) {
        alarm_.Set(std::chrono::system_clock::now() + w->options_.delay,
                   [this](bool) { Next(true); });
      } else {
        Next(true);
      }
    }
    void OnWriteDone(bool ok) override { Next(ok); }
    void OnCancel() override { gone_.store(true); }
    void OnDone() override { delete this; }

   private:
    void Next(bool ok) {
      if (!ok || gone_.load()) {
        w_->cancelled.fetch_add(1);
        Finish(grpc::Status::CANCELLED);
      } else if (sent_ < w_->options_.chunks) {
        ++sent_;
        StartWrite(&chunk_);
      } else {
        rl::v1::GenerateFinal* f = final_.mutable_final();
        for (int c = 0; c < w_->options_.chunks; ++c) {
          for (int32_t id : chunk_.chunk().token_ids()) {
            f->add_output_ids(id);
            rl::v1::TokenLogprob* lp = f->add_output_logprobs();
            lp->set_token_id(id);
            lp->set_logprob(-0.5f);
          }
        }
        f->set_finish_reason(rl::v1::FINISH_REASON_LENGTH);
        f->set_prompt_tokens(prompt_tokens_);
        f->set_completion_tokens(f->output_ids_size());
        w_->finished.fetch_add(1);
        StartWriteAndFinish(&final_, grpc::WriteOptions(), grpc::Status::OK);
      }
    }
    FakeWorker* w_;
    const int prompt_tokens_;
    grpc::Alarm alarm_;
    rl::v1::GenerateResponse chunk_, final_;
    int sent_ = 0;
    std::atomic<bool> gone_{false};
  };

  const FakeWorkerOptions options_;
};

// One asynchronous Router.Generate (or Worker.Generate): reads every message, then calls
// `done(status, final_seen)` once and deletes itself. With `read` false it reads nothing (a
// stalled client) until ResumeReading(), which must then be called once: the object stays
// alive until then.
template <typename Stub>
class AsyncGenerate final : public grpc::ClientReadReactor<rl::v1::GenerateResponse> {
 public:
  using Done = std::function<void(const grpc::Status&, bool final_seen)>;
  static AsyncGenerate* Start(Stub* stub, const rl::v1::GenerateRequest& req, Done done,
                              const std::string& client_id = "", bool read = true,
                              std::chrono::milliseconds deadline = std::chrono::milliseconds(0)) {
    auto* call = new AsyncGenerate(req, std::move(done), read);
    if (!client_id.empty()) call->ctx_.AddMetadata("rl-client-id", client_id);
    if (deadline.count() > 0) call->ctx_.set_deadline(std::chrono::system_clock::now() + deadline);
    stub->async()->Generate(&call->ctx_, &call->req_, call);
    if (read) {
      call->StartRead(&call->msg_);
    } else {
      call->AddHold();
    }
    call->StartCall();
    return call;
  }
  void ResumeReading() {
    StartRead(&msg_);
    RemoveHold();
  }
  // Cancels the call; only while it is known not to be done (the object deletes itself then).
  void Cancel() { ctx_.TryCancel(); }
  void OnReadDone(bool ok) override {
    if (!ok) return;
    final_seen_ |= msg_.has_final();
    StartRead(&msg_);
  }
  void OnDone(const grpc::Status& s) override {
    done_(s, final_seen_);
    delete this;
  }

 private:
  AsyncGenerate(const rl::v1::GenerateRequest& req, Done done, bool read)
      : req_(req), done_(std::move(done)), read_(read) {}
  grpc::ClientContext ctx_;
  rl::v1::GenerateRequest req_;
  rl::v1::GenerateResponse msg_;
  Done done_;
  bool read_;
  bool final_seen_ = false;
};

// Unary calls held open until Release() (then answered OK, after `on_release` filled the
// response), or answered at once once released. Bounded waits (60 s).
template <typename Resp>
class HeldCalls {
 public:
  grpc::ServerUnaryReactor* Take(grpc::CallbackServerContext* ctx, Resp* resp) {
    grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
    absl::MutexLock lock(&mu_);
    ++calls_;
    if (released_) {
      reactor->Finish(grpc::Status::OK);
    } else {
      held_.push_back({reactor, resp});
    }
    return reactor;
  }
  bool WaitHeld(size_t n) {
    absl::MutexLock lock(&mu_);
    auto enough = [&]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return held_.size() >= n; };
    return mu_.AwaitWithTimeout(absl::Condition(&enough), absl::Seconds(60));
  }
  int calls() {
    absl::MutexLock lock(&mu_);
    return calls_;
  }
  void Release(const std::function<void(Resp*)>& on_release = nullptr) {
    absl::MutexLock lock(&mu_);
    released_ = true;
    for (auto& [reactor, resp] : held_) {
      if (on_release) on_release(resp);
      reactor->Finish(grpc::Status::OK);
    }
    held_.clear();
  }

 private:
  absl::Mutex mu_;
  std::vector<std::pair<grpc::ServerUnaryReactor*, Resp*>> held_ ABSL_GUARDED_BY(mu_);
  int calls_ ABSL_GUARDED_BY(mu_) = 0;
  bool released_ ABSL_GUARDED_BY(mu_) = false;
};

// A hung worker: gRPC health SERVING (the server's), GetLoad answered, every Generate held open
// until the caller cancels it, every Abort held until `aborts.Release()` (then answered
// num_aborted 1): Router.Abort calls forwarded to it stay in flight.
class HoldingWorker final : public rl::v1::Worker::CallbackService {
 public:
  grpc::ServerWriteReactor<rl::v1::GenerateResponse>* Generate(
      grpc::CallbackServerContext*, const rl::v1::GenerateRequest*) override {
    generates.fetch_add(1);
    return new HeldStream();
  }
  grpc::ServerUnaryReactor* GetLoad(grpc::CallbackServerContext* ctx, const rl::v1::GetLoadRequest*,
                                    rl::v1::GetLoadResponse*) override {
    auto* r = ctx->DefaultReactor();
    r->Finish(grpc::Status::OK);
    return r;
  }
  grpc::ServerUnaryReactor* Abort(grpc::CallbackServerContext* ctx, const rl::v1::AbortRequest*,
                                  rl::v1::AbortResponse* resp) override {
    return aborts.Take(ctx, resp);
  }
  void Release() {
    aborts.Release([](rl::v1::AbortResponse* r) { r->set_num_aborted(1); });
  }

  std::atomic<int> generates{0};
  HeldCalls<rl::v1::AbortResponse> aborts;

 private:
  class HeldStream final : public grpc::ServerWriteReactor<rl::v1::GenerateResponse> {
    void OnCancel() override { Finish(grpc::Status::CANCELLED); }
    void OnDone() override { delete this; }
  };
};

// A worker's Admin service for broadcast tests: FlushCache, PauseGeneration and
// ContinueGeneration answered OK at once, or FlushCache held until `flushes.Release()` when
// `hold_flush`.
class FakeAdmin final : public rl::v1::Admin::CallbackService {
 public:
  explicit FakeAdmin(bool hold_flush = false) {
    if (!hold_flush) flushes.Release();
  }
  grpc::ServerUnaryReactor* FlushCache(grpc::CallbackServerContext* ctx,
                                       const rl::v1::FlushCacheRequest*,
                                       rl::v1::AdminResponse* resp) override {
    return flushes.Take(ctx, resp);
  }
  grpc::ServerUnaryReactor* PauseGeneration(grpc::CallbackServerContext* ctx,
                                            const rl::v1::PauseGenerationRequest*,
                                            rl::v1::AdminResponse*) override {
    return Ok(ctx);
  }
  grpc::ServerUnaryReactor* ContinueGeneration(grpc::CallbackServerContext* ctx,
                                               const rl::v1::ContinueGenerationRequest*,
                                               rl::v1::AdminResponse*) override {
    return Ok(ctx);
  }

  HeldCalls<rl::v1::AdminResponse> flushes;

 private:
  static grpc::ServerUnaryReactor* Ok(grpc::CallbackServerContext* ctx) {
    auto* r = ctx->DefaultReactor();
    r->Finish(grpc::Status::OK);
    return r;
  }
};

}  // namespace rl::router::testing
