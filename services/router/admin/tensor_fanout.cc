#include "services/router/admin/tensor_fanout.h"

#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/grpc_status.h"
#include "common/model_io/dtype.h"
#include "common/status.h"
#include "common/weight_sync/delta.h"
#include "grpcpp/alarm.h"
#include "spdlog/spdlog.h"

namespace rl::router::admin {
namespace {

using Request = rl::v1::UpdateWeightsFromTensorRequest;

class Relay;

// One worker's forwarding stream. The relay holds a hold on it (so OnDone waits) until it has
// issued the stream's last operation: the half-close, a cancel, or nothing more after a failed
// write. Deletes itself in OnDone.
class TensorSink final : public grpc::ClientWriteReactor<Request> {
 public:
  TensorSink(std::shared_ptr<Relay> relay, size_t id, Done done)
      : relay_(std::move(relay)), id_(id), done_(std::move(done)) {}

  void Start(Worker& w, grpc::ClientContext* ctx, rl::v1::AdminResponse* resp) {
    w.admin_stub().async()->UpdateWeightsFromTensor(ctx, resp, this);
    AddHold();
    StartCall();
  }
  void OnWriteDone(bool ok) override;
  void OnDone(const grpc::Status& s) override;

 private:
  std::shared_ptr<Relay> relay_;
  const size_t id_;
  Done done_;
};

// The shared state of one client stream: the message in flight, the workers' streams, the phase.
class Relay final : public std::enable_shared_from_this<Relay> {
 public:
  Relay(grpc::CallbackServerContext* context, StartTensorBroadcast start, BoundedExecutor* executor,
        WorkerPool* pool, TensorRelayOptions options)
      : context_(context),
        start_(std::move(start)),
        executor_(executor),
        pool_(pool),
        options_(std::move(options)) {}

  void Attach(grpc::ServerReadReactor<Request>* reactor) {
    absl::MutexLock lock(&mu_);
    reactor_ = reactor;
  }
  Request* message() { return &msg_; }

  // ---- the client's side (server reactor callbacks) ----
  void OnRead(bool ok) {
    if (!ok) {
      OnClientEnded();
      return;
    }
    absl::Status check;
    bool first = false;
    {
      absl::MutexLock lock(&mu_);
      if (phase_ != Phase::kForwarding) return;  // cut or finished meanwhile
      ++num_messages_;
      check = CheckLocked();
      first = num_messages_ == 1;
    }
    if (!check.ok()) {
      Cut(check);
      return;
    }
    if (first) {
      StartBroadcast();
    } else {
      Forward();
    }
  }

  void OnClientCancel() {
    Cut(
        absl::CancelledError("the client cancelled the call (or its deadline passed, or its "
                             "connection broke)"));
  }

  // ---- the workers' side ----
  void StartSink(Worker& w, grpc::ClientContext* ctx, rl::v1::AdminResponse* resp, Done done) {
    // The relay bounds the transfer and the answer itself (alarms below): the call has no
    // deadline, so a slow client never makes a worker look hung.
    ctx->set_deadline(std::chrono::system_clock::time_point::max());
    size_t id;
    {
      absl::MutexLock lock(&mu_);
      id = sinks_.size();
      sinks_.push_back(Slot{nullptr, ctx, &w});
    }
    auto* sink = new TensorSink(shared_from_this(), id, std::move(done));
    sink->Start(w, ctx, resp);
    bool cut = false;
    {
      absl::MutexLock lock(&mu_);
      sinks_[id].sink = sink;
      sinks_[id].open = true;
      cut = phase_ == Phase::kCut;
      if (cut) sinks_[id].open = false;
    }
    if (cut) {
      ctx->TryCancel();
      sink->RemoveHold();
    }
  }

  void OnStarted(size_t) {
    bool cut;
    {
      absl::MutexLock lock(&mu_);
      cut = phase_ == Phase::kCut;
    }
    if (!cut) Forward();  // the first message
  }

  void OnSinkWriteDone(size_t id, bool ok) {
    TensorSink* release = nullptr;
    bool read_next = false;
    {
      absl::MutexLock lock(&mu_);
      Slot& s = sinks_[id];
      s.writing = false;
      if (!ok && s.open) {  // the worker's stream broke: drop it from the update
        s.open = false;
        release = s.sink;
      }
      read_next = --writes_pending_ == 0 && phase_ == Phase::kForwarding && AnyOpenLocked() &&
                  reactor_ != nullptr;
      if (read_next) reactor_->StartRead(&msg_);
    }
    if (release != nullptr) release->RemoveHold();
  }

  void OnSinkDone(size_t id) {
    absl::MutexLock lock(&mu_);
    sinks_[id].done = true;
    if (++num_done_ == sinks_.size()) {
      CancelAlarmLocked(transfer_alarm_, transfer_alarm_set_);
      CancelAlarmLocked(answer_alarm_, answer_alarm_set_);
    }
  }

  // ---- the broadcast ----
  void StartBroadcast() {
    const bool keep_pause = msg_.keep_pause();
    const bool stage = msg_.stage();
    {
      absl::MutexLock lock(&mu_);
      started_at_ = std::chrono::system_clock::now();
    }
    std::shared_ptr<Relay> self = shared_from_this();
    {
      absl::MutexLock lock(&mu_);
      broadcast_submitted_ = true;
    }
    const bool submitted = executor_->Submit([self, keep_pause, stage] {
      absl::Status cut;
      {
        absl::MutexLock lock(&self->mu_);
        if (self->phase_ == Phase::kCut) cut = self->cut_status_;
      }
      if (!cut.ok()) {  // cut while waiting for a thread
        self->Finish(cut);
        return;
      }
      std::weak_ptr<Relay> weak = self;
      TensorRelayStart start;
      start.keep_pause = keep_pause;
      start.stage = stage;
      start.call = [weak](Worker& w, size_t, grpc::ClientContext* ctx, rl::v1::AdminResponse* r,
                          Done done) {
        if (auto relay = weak.lock()) relay->StartSink(w, ctx, r, std::move(done));
      };
      start.started = [weak](size_t n) {
        if (auto relay = weak.lock()) relay->OnStarted(n);
      };
      self->SetTransferAlarm();
      absl::Status s = self->start_(start);
      {
        absl::MutexLock lock(&self->mu_);
        if (self->phase_ == Phase::kCut) s = self->cut_status_;
      }
      self->Finish(s);
    });
    if (!submitted) Finish(executor_->BusyError());
  }

 private:
  enum class Phase {
    kForwarding,  // reading the client and forwarding its messages
    kEnded,       // the client ended explicitly: the workers got the half-close
    kCut,         // cut before the end: every worker's stream was cancelled
  };
  struct Slot {
    TensorSink* sink = nullptr;
    grpc::ClientContext* ctx = nullptr;
    Worker* worker = nullptr;
    bool open = false;  // the relay still holds its hold
    bool writing = false;
    bool done = false;
  };

  bool AnyOpenLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    for (const Slot& s : sinks_) {
      if (s.open) return true;
    }
    return false;
  }

  // One client message against the router's limits and the stream's shape.
  absl::Status CheckLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (end_seen_) {
      return absl::InvalidArgumentError(
          absl::StrCat("end: message ", num_messages_, " came after the stream's end message"));
    }
    if (!msg_.has_chunk() && !msg_.has_end() && num_messages_ > 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("chunk: message ", num_messages_,
                       " carries neither a chunk nor the end (only the first message may carry "
                       "options alone)"));
    }
    if (msg_.has_chunk()) {
      const rl::v1::TensorChunk& c = msg_.chunk();
      int64_t tensor_bytes = 0;
      RETURN_IF_ERROR(CheckTensorChunk(c, options_.limits, &tensor_bytes));
      const uint64_t size = c.data().size();
      // A delta chunk (issue 30) carries payload bytes: its bound is the largest encoding of its
      // count, not the tensor's size; the workers check the payload whole.
      uint64_t bound = static_cast<uint64_t>(tensor_bytes);
      if (!c.encoding().empty() && c.encoding() != "dense") {
        const std::optional<weight_sync::DeltaEncoding> e =
            weight_sync::ParseDeltaEncoding(c.encoding());
        if (!e.has_value()) {
          return absl::InvalidArgumentError(absl::StrCat(
              "chunk.encoding: ", QuoteForError(c.encoding()), " for ", QuoteForError(c.name()),
              " (\"\", \"dense\", \"overwrite\" or \"xor\")"));
        }
        const model_io::DType dtype = *model_io::ParseDType(c.dtype());  // checked above
        ASSIGN_OR_RETURN(const int width, weight_sync::DeltaWordBytes(dtype));
        absl::StatusOr<int64_t> most =
            weight_sync::MaxDeltaPayloadBytes(*e, c.delta_count(), tensor_bytes / width, width);
        if (!most.ok()) {
          return Annotate(most.status(),
                          absl::StrCat("chunk.delta_count of ", QuoteForError(c.name())));
        }
        bound = static_cast<uint64_t>(*most);
      }
      if (c.offset() > bound || size > bound - c.offset()) {
        return absl::InvalidArgumentError(
            absl::StrCat("chunk.offset: ", size, " bytes at offset ", c.offset(), " do not fit in ",
                         QuoteForError(c.name()), " (", tensor_bytes, " bytes)"));
      }
      if (static_cast<int64_t>(size) > options_.limits.max_update_bytes - data_bytes_) {
        return absl::InvalidArgumentError(
            absl::StrCat("chunk: the stream's data is more than --max-update-bytes (",
                         options_.limits.max_update_bytes, ")"));
      }
      data_bytes_ += static_cast<int64_t>(size);
    }
    if (msg_.has_end()) {
      if (msg_.end().num_bytes() != data_bytes_) {
        return absl::InvalidArgumentError(absl::StrCat("end: the stream announces ",
                                                       msg_.end().num_bytes(), " data bytes, but ",
                                                       data_bytes_, " arrived"));
      }
      end_seen_ = true;
    }
    return absl::OkStatus();
  }

  // Writes msg_ to every worker still in the update.
  void Forward() {
    std::vector<TensorSink*> targets;
    {
      absl::MutexLock lock(&mu_);
      if (phase_ != Phase::kForwarding) return;
      for (Slot& s : sinks_) {
        if (!s.open) continue;
        s.writing = true;
        targets.push_back(s.sink);
      }
      writes_pending_ = static_cast<int>(targets.size());
    }
    // No worker left: nothing more is read; the broadcast ends with every worker's reason.
    for (TensorSink* sink : targets) sink->StartWrite(&msg_);
  }

  // The client's stream is over: its explicit end, or a cut.
  void OnClientEnded() {
    std::vector<TensorSink*> close;
    absl::Status cut;
    {
      absl::MutexLock lock(&mu_);
      if (phase_ != Phase::kForwarding) return;
      if (context_->IsCancelled()) {
        cut = absl::CancelledError("the client's call was cancelled before its end");
      } else if (!end_seen_) {
        cut = absl::InvalidArgumentError(absl::StrCat(
            "end: the stream ended after ", num_messages_,
            " messages without its end message (TensorStreamEnd): the client half-closed "
            "early, or a message did not parse"));
      }
    }
    if (!cut.ok()) {
      Cut(cut);
      return;
    }
    {
      absl::MutexLock lock(&mu_);
      if (phase_ != Phase::kForwarding) return;
      phase_ = Phase::kEnded;
      CancelAlarmLocked(transfer_alarm_, transfer_alarm_set_);
      for (Slot& s : sinks_) {
        if (!s.open) continue;
        s.open = false;
        close.push_back(s.sink);
      }
      if (!close.empty()) SetAnswerAlarmLocked();
    }
    for (TensorSink* sink : close) {
      sink->StartWritesDone();
      sink->RemoveHold();
    }
  }

  // Cuts every worker's stream (nothing is applied anywhere); the client is answered `status`
  // once the broadcast has every worker's result.
  void Cut(const absl::Status& status) {
    std::vector<std::pair<TensorSink*, grpc::ClientContext*>> cancel;
    bool finish_now = false;
    {
      absl::MutexLock lock(&mu_);
      if (phase_ != Phase::kForwarding) return;  // ended (the apply runs) or cut already
      phase_ = Phase::kCut;
      cut_status_ =
          absl::Status(status.code(), absl::StrCat("UpdateWeightsFromTensor: ", status.message(),
                                                   "; the stream was cut on every worker (",
                                                   sinks_.size(), "), nothing applied"));
      CancelAlarmLocked(transfer_alarm_, transfer_alarm_set_);
      for (Slot& s : sinks_) {
        if (!s.open) continue;
        s.open = false;
        cancel.emplace_back(s.sink, s.ctx);
      }
      spdlog::warn("{}", std::string(cut_status_.message()));
      // Before a broadcast was submitted there is nothing to wait for.
      finish_now = !broadcast_submitted_;
    }
    for (auto& [sink, ctx] : cancel) {
      ctx->TryCancel();
      sink->RemoveHold();
    }
    if (finish_now) Finish(cut_status_);
  }

  static void CancelAlarmLocked(grpc::Alarm& alarm, bool& set) {
    if (!set) return;
    set = false;
    alarm.Cancel();
  }

  void SetTransferAlarm() {
    std::weak_ptr<Relay> weak = shared_from_this();
    absl::MutexLock lock(&mu_);
    transfer_alarm_set_ = true;
    transfer_alarm_.Set(started_at_ + options_.load_timeout, [weak](bool fired) {
      auto relay = weak.lock();
      if (!fired || relay == nullptr) return;
      relay->Cut(absl::DeadlineExceededError(
          absl::StrCat("the stream did not end within --admin-load-timeout-ms (",
                       relay->options_.load_timeout.count(), " ms)")));
    });
  }

  // After the end: a worker that has not answered within the load timeout is marked dead (the
  // pool cancels its call; it is left out and readmitted by health checks).
  void SetAnswerAlarmLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    std::weak_ptr<Relay> weak = shared_from_this();
    answer_alarm_set_ = true;
    answer_alarm_.Set(std::chrono::system_clock::now() + options_.load_timeout, [weak](bool fired) {
      auto relay = weak.lock();
      if (!fired || relay == nullptr) return;
      std::vector<Worker*> late;
      {
        absl::MutexLock lock(&relay->mu_);
        for (const Slot& s : relay->sinks_) {
          if (!s.done) late.push_back(s.worker);
        }
      }
      for (Worker* w : late) {
        relay->pool_->MarkDead(
            w, absl::StrCat("UpdateWeightsFromTensor missed its per-worker deadline of ",
                            relay->options_.load_timeout.count(), " ms after the stream's end"));
      }
    });
  }

  // Answers the client (once). Never under mu_: a pending read may complete inline.
  void Finish(const absl::Status& status) ABSL_LOCKS_EXCLUDED(mu_) {
    grpc::ServerReadReactor<Request>* r;
    {
      absl::MutexLock lock(&mu_);
      r = reactor_;
      reactor_ = nullptr;  // nothing is read after this
    }
    if (r != nullptr) r->Finish(ToGrpcStatus(status));
  }

  grpc::CallbackServerContext* const context_;
  const StartTensorBroadcast start_;
  BoundedExecutor* const executor_;
  WorkerPool* const pool_;
  const TensorRelayOptions options_;
  Request msg_;  // read into when no write uses it, written from when every sink has it

  absl::Mutex mu_;
  grpc::ServerReadReactor<Request>* reactor_ ABSL_GUARDED_BY(mu_) = nullptr;  // null: finished
  Phase phase_ ABSL_GUARDED_BY(mu_) = Phase::kForwarding;
  std::vector<Slot> sinks_ ABSL_GUARDED_BY(mu_);
  size_t num_done_ ABSL_GUARDED_BY(mu_) = 0;
  int writes_pending_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t num_messages_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t data_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  bool end_seen_ ABSL_GUARDED_BY(mu_) = false;
  bool broadcast_submitted_ ABSL_GUARDED_BY(mu_) = false;
  bool transfer_alarm_set_ ABSL_GUARDED_BY(mu_) = false;
  bool answer_alarm_set_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status cut_status_ ABSL_GUARDED_BY(mu_);
  std::chrono::system_clock::time_point started_at_ ABSL_GUARDED_BY(mu_);
  grpc::Alarm transfer_alarm_;
  grpc::Alarm answer_alarm_;
};

void TensorSink::OnWriteDone(bool ok) { relay_->OnSinkWriteDone(id_, ok); }

void TensorSink::OnDone(const grpc::Status& s) {
  std::shared_ptr<Relay> relay = std::move(relay_);
  Done done = std::move(done_);
  const size_t id = id_;
  delete this;
  relay->OnSinkDone(id);
  done(s);
}

class RelayReactor final : public grpc::ServerReadReactor<Request> {
 public:
  explicit RelayReactor(std::shared_ptr<Relay> relay) : relay_(std::move(relay)) {
    relay_->Attach(this);
    StartRead(relay_->message());
  }
  void OnReadDone(bool ok) override { relay_->OnRead(ok); }
  void OnCancel() override { relay_->OnClientCancel(); }
  void OnDone() override { delete this; }

 private:
  std::shared_ptr<Relay> relay_;
};

class RejectReactor final : public grpc::ServerReadReactor<Request> {
 public:
  explicit RejectReactor(const absl::Status& s) { Finish(ToGrpcStatus(s)); }
  void OnDone() override { delete this; }
};

}  // namespace

grpc::ServerReadReactor<Request>* NewTensorRelay(grpc::CallbackServerContext* context,
                                                 StartTensorBroadcast start,
                                                 BoundedExecutor* executor, WorkerPool* pool,
                                                 TensorRelayOptions options) {
  return new RelayReactor(
      std::make_shared<Relay>(context, std::move(start), executor, pool, std::move(options)));
}

grpc::ServerReadReactor<Request>* NewRejectedTensorStream(const absl::Status& status) {
  return new RejectReactor(status);
}

}  // namespace rl::router::admin
