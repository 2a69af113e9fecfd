// One server-streaming call fed by the engine: rl.v1.Worker's Generate and SglangScheduler's
// Generate, on the write queue and lifetime of WriteQueueReactor (common/write_queue_reactor.h,
// shared with the router's Generate).
// docs/life-of-a-request.md follows one request through every layer, with file names.
//
// The engine's reference is the producer's: it is dropped after the last completion's
// on_finish, so engine callbacks never touch a freed reactor. A client that goes away (cancel,
// failed write) aborts the engine request; a completion ended with an error status ends the
// call with it at once (what is queued is dropped) and aborts its siblings (n > 1). Cost: one
// queued message per chunk until the client reads it.
#ifndef RL_SERVICES_WORKER_ENGINE_STREAM_REACTOR_H_
#define RL_SERVICES_WORKER_ENGINE_STREAM_REACTOR_H_

#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "common/write_queue_reactor.h"
#include "services/worker/generate_host.h"

namespace rl::worker {

template <typename Response>
class EngineStreamReactor : public WriteQueueReactor<Response> {
 protected:
  explicit EngineStreamReactor(GenerateHost* server) : server_(server) {}
  ~EngineStreamReactor() override = default;

  void OnClientGone(const grpc::Status& why) override {
    server_->engine().AbortAsync(id_, why.error_message());
  }

  // What the stream thread makes of the engine's outputs (see StreamThreadCallbacks).
  virtual void OnEngineOutput(const engine::OutputChunk& chunk) { (void)chunk; }
  virtual void OnEngineFinish(engine::GenerateResult result) = 0;

  // The callbacks to Submit with: the engine thread only hands each chunk and result over to
  // the stream thread (GenerateHost::RunOnStreamThread), where OnEngineOutput / OnEngineFinish
  // build the messages. Its FIFO keeps a completion's chunks before its final, and every task
  // of this reactor runs before the last CompleteOne drops the producer's reference. Without
  // `stream` no chunk is handed over at all.
  engine::RequestCallbacks StreamThreadCallbacks(bool stream) {
    engine::RequestCallbacks callbacks;
    if (stream) {
      callbacks.on_output = [this](const engine::OutputChunk& chunk) {
        server_->RunOnStreamThread([this, chunk]() { OnEngineOutput(chunk); });
      };
    }
    callbacks.on_finish = [this](engine::GenerateResult result) {
      server_->RunOnStreamThread(
          [this, result = std::move(result)]() mutable { OnEngineFinish(std::move(result)); });
    };
    return callbacks;
  }

  // Start-up failed before anything reached the engine: ends the call with `s`.
  void FailStart(const absl::Status& s) {
    this->EndStream(s);
    this->Unref();
  }

  // Before the request is submitted: how many completions will report their finish.
  void ExpectCompletions(int n) {
    absl::MutexLock lock(&mu_);
    remaining_ = n;
  }

  // Stream thread, once per completion: queues `msgs`, or with an error `status` ends the call
  // with it (the first such status wins). Drops the engine's reference after the last one.
  void CompleteOne(std::vector<Response> msgs, absl::Status status = absl::OkStatus()) {
    bool last;
    bool first_error = false;
    {
      absl::MutexLock lock(&mu_);
      if (!status.ok() && !errored_) errored_ = first_error = true;
      last = --remaining_ == 0;
    }
    if (first_error) {
      this->EndStream(status, /*drop_queue=*/true);
      // Siblings still running end with this one. Not for the last completion: there is none
      // left, and at shutdown the engine may already be gone.
      if (!last && status.code() != absl::StatusCode::kCancelled) {
        server_->engine().AbortAsync(id_, "a sibling completion was aborted");
      }
    } else if (status.ok()) {
      for (Response& m : msgs) this->Enqueue(std::move(m));
    }
    if (!last) return;
    this->EndStream(absl::OkStatus());
    this->Unref();
  }

  GenerateHost* server_;
  std::string id_;

 private:
  absl::Mutex mu_;
  int remaining_ ABSL_GUARDED_BY(mu_) = 0;
  bool errored_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace rl::worker

#endif  // RL_SERVICES_WORKER_ENGINE_STREAM_REACTOR_H_
