#include "services/worker/sglang/kv_events_reactor.h"

#include <chrono>
#include <deque>
#include <memory>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/grpc_status.h"
#include "grpcpp/alarm.h"

namespace rl::worker {
namespace {

namespace common = ::smg::grpc::common;

constexpr size_t kMaxBatchesPerTake = 16;

class KvEventsReactor final : public grpc::ServerWriteReactor<common::KvEventBatch> {
 public:
  KvEventsReactor(engine::Engine* engine, BoundedExecutor* executor, int32_t page_size,
                  const absl::Status& auth, const common::SubscribeKvEventsRequest& request)
      : engine_(engine), page_size_(page_size) {
    absl::Status s = auth;
    if (s.ok() && request.start_sequence_number() > 0) {
      s = absl::OutOfRangeError(absl::StrCat(
          "SubscribeKvEvents: cannot resume from sequence ", request.start_sequence_number(),
          ": this worker keeps no replay history (subscribe from 0 for a snapshot)"));
    }
    if (!s.ok()) {
      End(s);
      Unref();
      return;
    }
    // Subscribing waits for the engine thread: off gRPC's callback thread.
    Ref();
    absl::AnyInvocable<void()&&> task = [this] {
      Subscribe();
      Unref();
    };
    if (!executor->Submit(std::move(task))) {
      End(executor->BusyError());
      Unref();  // the task's
    }
    Unref();  // the constructor's
  }

  ~KvEventsReactor() override {
    std::unique_ptr<engine::KvEventLog::Subscription> sub;
    {
      absl::MutexLock lock(&mu_);
      sub = std::move(subscription_);
    }
  }

  void OnWriteDone(bool ok) override {
    bool finish = false;
    grpc::Status status;
    {
      absl::MutexLock lock(&mu_);
      writing_ = false;
      if (!ok && !ending_) {
        ending_ = true;
        end_status_ = grpc::Status(grpc::StatusCode::CANCELLED, "subscriber gone");
      }
      if (ending_ && !finished_) {
        finished_ = finish = true;
        status = end_status_;
      }
    }
    if (finish) {
      Finish(status);
      return;
    }
    Pump();
  }
  void OnCancel() override { End(absl::CancelledError("subscriber cancelled")); }
  void OnDone() override {
    // Unsubscribes (the log's lock; never under mu_: the engine thread calls Wake under it).
    std::unique_ptr<engine::KvEventLog::Subscription> sub;
    {
      absl::MutexLock lock(&mu_);
      sub = std::move(subscription_);
    }
    sub.reset();
    Unref();  // gRPC's
  }

 private:
  void Ref() {
    absl::MutexLock lock(&mu_);
    ++refs_;
  }
  void Unref() {
    bool last;
    {
      absl::MutexLock lock(&mu_);
      last = --refs_ == 0;
    }
    if (last) delete this;
  }

  void Subscribe() {
    auto sub = engine_->SubscribeKvEvents([this] { Wake(); });
    if (!sub.ok()) {
      End(sub.status());
      return;
    }
    bool ending;
    {
      absl::MutexLock lock(&mu_);
      subscription_ = *std::move(sub);
      ending = ending_;
    }
    if (!ending) Pump();
  }

  // Runs under the log's lock (engine thread): schedules a Pump when the stream is idle.
  void Wake() {
    absl::MutexLock lock(&mu_);
    if (ending_) return;
    if (busy_) {
      wake_pending_ = true;
      return;
    }
    busy_ = true;
    ++refs_;
    // A fresh alarm per wake: the one whose callback runs now may be destroyed here.
    alarm_ = std::make_unique<grpc::Alarm>();
    alarm_->Set(std::chrono::system_clock::now(), [this](bool) {
      Pump();
      Unref();
    });
  }

  // Writes the next message, or goes idle (busy_ false) when there is none. One Pump at a time:
  // a write in flight or a scheduled alarm keeps busy_.
  void Pump() {
    for (;;) {
      engine::KvEventLog::Subscription* sub;
      {
        absl::MutexLock lock(&mu_);
        if (ending_) return;
        sub = subscription_.get();
      }
      if (queue_.empty()) {
        std::vector<std::shared_ptr<const engine::KvEventBatch>> taken;
        absl::Status s = sub->Take(kMaxBatchesPerTake, kMaxKvEventMessageUnits, &taken);
        if (!s.ok()) {
          End(s);
          return;
        }
        for (auto& b : taken) queue_.push_back(std::move(b));
      }
      if (!queue_.empty()) {
        msg_.Clear();
        FillKvEventBatch(*queue_.front(), page_size_, ++sequence_, &msg_);
        queue_.pop_front();
        {
          absl::MutexLock lock(&mu_);
          if (ending_) return;
          writing_ = true;
        }
        StartWrite(&msg_);
        return;
      }
      absl::MutexLock lock(&mu_);
      if (!wake_pending_) {
        busy_ = false;
        return;
      }
      wake_pending_ = false;  // something came while this Pump ran: look again
    }
  }

  // Ends the call with `s` (the first End wins), once no write is in flight.
  void End(const absl::Status& s) {
    grpc::Status status;
    {
      absl::MutexLock lock(&mu_);
      if (ending_) return;
      ending_ = true;
      end_status_ = ToGrpcStatus(s);
      if (writing_) return;  // OnWriteDone finishes
      finished_ = true;
      status = end_status_;
    }
    Finish(status);
  }

  engine::Engine* const engine_;
  const int32_t page_size_;
  // Pump's (one at a time):
  std::deque<std::shared_ptr<const engine::KvEventBatch>> queue_;
  uint64_t sequence_ = 0;
  common::KvEventBatch msg_;

  absl::Mutex mu_;
  int refs_ ABSL_GUARDED_BY(mu_) = 2;           // gRPC's (OnDone) and the constructor's
  bool ending_ ABSL_GUARDED_BY(mu_) = false;    // End was called (end_status_)
  bool finished_ ABSL_GUARDED_BY(mu_) = false;  // Finish was called
  bool writing_ ABSL_GUARDED_BY(mu_) = false;   // a StartWrite is in flight
  grpc::Status end_status_ ABSL_GUARDED_BY(mu_);
  bool busy_ ABSL_GUARDED_BY(mu_) = true;  // subscribing, then the first Pump
  bool wake_pending_ ABSL_GUARDED_BY(mu_) = false;
  std::unique_ptr<engine::KvEventLog::Subscription> subscription_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<grpc::Alarm> alarm_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

void FillKvEventBatch(const engine::KvEventBatch& batch, int32_t page_size, uint64_t sequence,
                      common::KvEventBatch* out) {
  out->set_sequence_number(sequence);
  out->set_timestamp(batch.unix_s);
  for (const engine::KvCacheEvent& e : batch.events) {
    common::KvCacheEvent* ev = out->add_events();
    switch (e.kind) {
      case engine::KvCacheEvent::Kind::kStored: {
        common::KvBlocksStored* stored = ev->mutable_stored();
        if (e.has_parent) stored->set_parent_block_hash(e.parent_hash);
        for (size_t b = 0; b < e.hashes.size(); ++b) {
          common::KvBlock* block = stored->add_blocks();
          block->set_block_hash(e.hashes[b]);
          block->set_block_size(page_size);
          const size_t begin = b * static_cast<size_t>(page_size);
          for (size_t t = begin; t < begin + static_cast<size_t>(page_size) && t < e.tokens.size();
               ++t) {
            block->add_token_ids(static_cast<uint32_t>(e.tokens[t]));
          }
        }
        break;
      }
      case engine::KvCacheEvent::Kind::kRemoved:
        for (int64_t h : e.hashes) ev->mutable_removed()->add_block_hashes(h);
        break;
      case engine::KvCacheEvent::Kind::kCleared:
        ev->mutable_cleared();
        break;
    }
  }
}

grpc::ServerWriteReactor<common::KvEventBatch>* StartKvEvents(
    engine::Engine* engine, BoundedExecutor* executor, int32_t page_size, const absl::Status& auth,
    const common::SubscribeKvEventsRequest& request) {
  return new KvEventsReactor(engine, executor, page_size, auth, request);
}

}  // namespace rl::worker
