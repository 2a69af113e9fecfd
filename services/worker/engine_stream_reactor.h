// One server-streaming call fed by the engine: the write queue and lifetime that rl.v1.Worker's
// Generate and SglangScheduler's Generate share.
//
// Two references keep the object alive: gRPC's (dropped in OnDone) and the engine's (dropped
// after the last completion's on_finish); whichever goes last deletes it, so engine callbacks
// never touch a freed reactor. At most one write is in flight, a queue behind it; StartWrite and
// Finish are issued outside the mutex. A client that goes away (cancel, failed write) aborts the
// engine request; a completion ended with an error status ends the call with it and aborts its
// siblings (n > 1). Cost: one queued message per chunk until the client reads it.
#ifndef RL_SERVICES_WORKER_ENGINE_STREAM_REACTOR_H_
#define RL_SERVICES_WORKER_ENGINE_STREAM_REACTOR_H_

#include <deque>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "common/grpc_status.h"
#include "grpcpp/grpcpp.h"
#include "services/worker/worker_server.h"

namespace rl::worker {

template <typename Response>
class EngineStreamReactor : public grpc::ServerWriteReactor<Response> {
 public:
  void OnWriteDone(bool ok) override {
    {
      absl::MutexLock lock(&mu_);
      writing_ = false;
      if (!ok) broken_ = true;
    }
    if (!ok) server_->engine().AbortAsync(id_, "client stream closed");
    Pump();
  }

  void OnCancel() override {
    server_->engine().AbortAsync(id_, "client cancelled");
    {
      absl::MutexLock lock(&mu_);
      broken_ = true;
    }
    Pump();
  }

  void OnDone() override {
    bool last;
    {
      absl::MutexLock lock(&mu_);
      grpc_ref_ = false;
      last = !engine_ref_;
    }
    if (last) delete this;
  }

 protected:
  explicit EngineStreamReactor(WorkerServer* server) : server_(server) {}
  ~EngineStreamReactor() override = default;

  // Start-up failed before anything reached the engine: ends the call with `s`.
  void FailStart(const absl::Status& s) {
    {
      absl::MutexLock lock(&mu_);
      engine_ref_ = false;
      finished_ = true;
    }
    this->Finish(ToGrpcStatus(s));
  }

  // Before the request is submitted: how many completions will report their finish.
  void ExpectCompletions(int n) {
    absl::MutexLock lock(&mu_);
    remaining_ = n;
  }

  // Any thread while a reference is held: queues one message and writes it when it can.
  void Enqueue(Response msg) {
    {
      absl::MutexLock lock(&mu_);
      queue_.push_back(std::move(msg));
    }
    Pump();
  }

  // Engine thread, once per completion: queues `msgs`, or with an error `status` ends the call
  // with it (the first such status wins). Drops the engine's reference after the last one.
  void CompleteOne(std::vector<Response> msgs, absl::Status status = absl::OkStatus()) {
    bool last;
    {
      absl::MutexLock lock(&mu_);
      if (!status.ok()) {
        if (error_.ok()) error_ = std::move(status);
      } else {
        for (Response& m : msgs) queue_.push_back(std::move(m));
      }
      last = --remaining_ == 0;
    }
    Pump();
    if (!last) return;
    bool del;
    {
      absl::MutexLock lock(&mu_);
      engine_ref_ = false;
      del = !grpc_ref_;
    }
    if (del) delete this;
  }

  WorkerServer* server_;
  std::string id_;

 private:
  // Starts the next write, or finishes the call when everything is written (or the client is
  // gone, or a completion ended with an error). Safe from any thread while a reference is held.
  void Pump() {
    enum { kNothing, kWrite, kFinish } action = kNothing;
    grpc::Status status;
    {
      absl::MutexLock lock(&mu_);
      if (finished_ || writing_) return;
      if (broken_) {
        action = kFinish;
        status = grpc::Status(grpc::StatusCode::CANCELLED, "client cancelled");
      } else if (!error_.ok()) {
        action = kFinish;
        status = ToGrpcStatus(error_);
      } else if (!queue_.empty()) {
        current_ = std::move(queue_.front());
        queue_.pop_front();
        writing_ = true;
        action = kWrite;
      } else if (remaining_ == 0) {
        action = kFinish;
      }
      if (action == kFinish) finished_ = true;
    }
    switch (action) {
      case kWrite:
        this->StartWrite(&current_);
        break;
      case kFinish:
        if (!status.ok() && status.error_code() != grpc::StatusCode::CANCELLED) {
          server_->engine().AbortAsync(id_, "a sibling completion was aborted");
        }
        this->Finish(status);
        break;
      case kNothing:
        break;
    }
  }

  absl::Mutex mu_;
  std::deque<Response> queue_ ABSL_GUARDED_BY(mu_);
  Response current_;  // the message being written
  absl::Status error_ ABSL_GUARDED_BY(mu_);
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  bool broken_ ABSL_GUARDED_BY(mu_) = false;
  int remaining_ ABSL_GUARDED_BY(mu_) = 0;
  bool grpc_ref_ ABSL_GUARDED_BY(mu_) = true;
  bool engine_ref_ ABSL_GUARDED_BY(mu_) = true;
};

}  // namespace rl::worker

#endif  // RL_SERVICES_WORKER_ENGINE_STREAM_REACTOR_H_
