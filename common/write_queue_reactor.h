// WriteQueueReactor: one server-streaming call fed by a producer that runs elsewhere (the
// worker's engine thread, the router's worker call): the write queue and lifetime that
// rl.v1.Worker's Generate, SglangScheduler's Generate and rl.v1.Router's Generate share.
//
// Lifetime: gRPC holds one reference (dropped in OnDone) and the producer holds references
// (Ref/Unref, one taken at construction); whichever goes last deletes the object, so producer
// callbacks never touch a freed reactor. Writes: at most one in flight, a queue behind it;
// StartWrite and Finish are issued outside the mutex. The queue is bounded in bytes
// (`max_buffered_bytes`, 0: unbounded): a client that stops reading while the producer goes on
// ends the call with RESOURCE_EXHAUSTED naming the bound. A client that goes away (cancel,
// failed write, buffer bound) calls OnClientGone once, so the producer stops its work.
// Cost: the queued messages until the client reads them, one ByteSizeLong per message when
// bounded.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/grpc_status.h"
#include "grpcpp/grpcpp.h"

namespace rl {

template <typename Response>
class WriteQueueReactor : public grpc::ServerWriteReactor<Response> {
 public:
  void OnWriteDone(bool ok) override {
    bool first_gone = false;
    {
      absl::MutexLock lock(&mu_);
      writing_ = false;
      buffered_bytes_ -= current_bytes_;
      current_bytes_ = 0;
      if (!ok && !gone_) {
        gone_ = true;
        gone_status_ = grpc::Status(grpc::StatusCode::CANCELLED, "client stream closed");
        first_gone = true;
      }
    }
    if (first_gone) OnClientGone(grpc::Status(grpc::StatusCode::CANCELLED, "client stream closed"));
    Pump();
  }

  void OnCancel() override {
    bool first;
    {
      absl::MutexLock lock(&mu_);
      first = !gone_;
      if (first) {
        gone_ = true;
        gone_status_ = grpc::Status(grpc::StatusCode::CANCELLED, "client cancelled");
      }
    }
    if (first) OnClientGone(grpc::Status(grpc::StatusCode::CANCELLED, "client cancelled"));
    Pump();
  }

  void OnDone() override { Unref(); }

 protected:
  explicit WriteQueueReactor(int64_t max_buffered_bytes = 0)
      : max_buffered_bytes_(max_buffered_bytes) {}
  ~WriteQueueReactor() override = default;

  // The client went away (cancelled, a write failed, or it read too slowly): stop producing.
  // Called once, outside the mutex, from a gRPC or producer thread.
  // `why` is the status the call ends with (CANCELLED, or RESOURCE_EXHAUSTED for the bound).
  virtual void OnClientGone(const grpc::Status& why) { (void)why; }

  // Producer references: the constructor holds one for the producer; take more for every
  // callback that may still arrive (a timer, a task on another thread).
  void Ref() { refs_.fetch_add(1, std::memory_order_relaxed); }
  void Unref() {
    if (refs_.fetch_sub(1, std::memory_order_acq_rel) == 1) delete this;
  }

  // Any thread while a reference is held: queues one message and writes it when it can. False
  // when the stream is over (the message is dropped); a message that takes the queue past the
  // byte bound ends the call with RESOURCE_EXHAUSTED and calls OnClientGone.
  bool Enqueue(Response msg) {
    bool overflow = false;
    grpc::Status why;
    {
      absl::MutexLock lock(&mu_);
      if (gone_ || ended_) return false;
      const int64_t bytes = max_buffered_bytes_ > 0 ? static_cast<int64_t>(msg.ByteSizeLong()) : 0;
      if (max_buffered_bytes_ > 0 && buffered_bytes_ + bytes > max_buffered_bytes_ &&
          !queue_.empty()) {
        overflow = true;
        gone_ = true;
        gone_status_ = grpc::Status(
            grpc::StatusCode::RESOURCE_EXHAUSTED,
            absl::StrCat("the client did not read its stream: more than ", max_buffered_bytes_,
                         " bytes were waiting to be sent (--max-stream-buffer-bytes); the "
                         "generation was cancelled"));
        why = gone_status_;
      } else {
        buffered_bytes_ += bytes;
        queue_.emplace_back(std::move(msg), bytes);
      }
    }
    if (overflow) OnClientGone(why);
    Pump();
    return !overflow;
  }

  // The producer is done: the call finishes with `status` once the queue is written (or at
  // once, dropping the queue, when `drop_queue`). The first EndStream wins. Does not drop the
  // producer's reference.
  void EndStream(const absl::Status& status, bool drop_queue = false) {
    {
      absl::MutexLock lock(&mu_);
      if (ended_) return;
      ended_ = true;
      end_status_ = ToGrpcStatus(status);
      if (drop_queue) queue_.clear();
    }
    Pump();
  }

 private:
  // Starts the next write, or finishes the call when everything is written (or the client is
  // gone). Safe from any thread while a reference is held.
  void Pump() {
    enum { kNothing, kWrite, kFinish } action = kNothing;
    grpc::Status status;
    {
      absl::MutexLock lock(&mu_);
      if (finished_ || writing_) return;
      if (gone_) {
        action = kFinish;
        status = gone_status_;
      } else if (!queue_.empty()) {
        current_ = std::move(queue_.front().first);
        current_bytes_ = queue_.front().second;
        queue_.pop_front();
        writing_ = true;
        action = kWrite;
      } else if (ended_) {
        action = kFinish;
        status = end_status_;
      }
      if (action == kFinish) {
        finished_ = true;
        queue_.clear();
      }
    }
    if (action == kWrite) this->StartWrite(&current_);
    if (action == kFinish) this->Finish(status);
  }

  const int64_t max_buffered_bytes_;
  std::atomic<int> refs_{2};  // gRPC's and the producer's
  absl::Mutex mu_;
  std::deque<std::pair<Response, int64_t>> queue_ ABSL_GUARDED_BY(mu_);
  Response current_;  // the message being written
  int64_t current_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t buffered_bytes_ ABSL_GUARDED_BY(mu_) = 0;  // queued + being written
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  bool gone_ ABSL_GUARDED_BY(mu_) = false;
  grpc::Status gone_status_ ABSL_GUARDED_BY(mu_);
  bool ended_ ABSL_GUARDED_BY(mu_) = false;
  grpc::Status end_status_ ABSL_GUARDED_BY(mu_);
};

}  // namespace rl
