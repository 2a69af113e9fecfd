#include "services/router/admin/tensor_fanout.h"

#include <utility>

#include "common/grpc_status.h"

namespace rl::router::admin {
namespace {

// Replays a buffered client stream of tensor chunks to one worker; deletes itself when done.
class TensorWriter final : public grpc::ClientWriteReactor<rl::v1::UpdateWeightsFromTensorRequest> {
 public:
  TensorWriter(const TensorChunks* messages, std::function<void(grpc::Status)> done)
      : messages_(messages), done_(std::move(done)) {}

  void Start(Worker& w, grpc::ClientContext* ctx, rl::v1::AdminResponse* resp) {
    w.admin_stub().async()->UpdateWeightsFromTensor(ctx, resp, this);
    WriteNext();
    StartCall();
  }
  // A failed write ends the call; OnDone reports why.
  void OnWriteDone(bool ok) override {
    if (ok) WriteNext();
  }
  void OnDone(const grpc::Status& s) override {
    done_(s);
    delete this;
  }

 private:
  void WriteNext() {
    if (next_ < messages_->size()) {
      StartWrite(&(*messages_)[next_++]);
    } else {
      StartWritesDone();
    }
  }

  const TensorChunks* messages_;
  std::function<void(grpc::Status)> done_;
  size_t next_ = 0;
};

// Buffers a client stream of tensor chunks, then applies it (the broadcast) on the executor.
class TensorFanoutReactor final
    : public grpc::ServerReadReactor<rl::v1::UpdateWeightsFromTensorRequest> {
 public:
  TensorFanoutReactor(std::function<absl::Status(const TensorChunks&)> apply,
                      BoundedExecutor* executor)
      : apply_(std::move(apply)), executor_(executor) {
    StartRead(&msg_);
  }

  void OnReadDone(bool ok) override {
    if (ok) {
      messages_.push_back(std::move(msg_));
      StartRead(&msg_);
      return;
    }
    if (!executor_->Submit([this] { Finish(ToGrpcStatus(apply_(messages_))); })) {
      Finish(ToGrpcStatus(executor_->BusyError()));
    }
  }
  void OnDone() override { delete this; }

 private:
  std::function<absl::Status(const TensorChunks&)> apply_;
  BoundedExecutor* executor_;
  rl::v1::UpdateWeightsFromTensorRequest msg_;
  TensorChunks messages_;
};

class RejectReactor final : public grpc::ServerReadReactor<rl::v1::UpdateWeightsFromTensorRequest> {
 public:
  explicit RejectReactor(const absl::Status& s) { Finish(ToGrpcStatus(s)); }
  void OnDone() override { delete this; }
};

}  // namespace

grpc::ServerReadReactor<rl::v1::UpdateWeightsFromTensorRequest>* NewTensorFanout(
    std::function<absl::Status(const TensorChunks&)> apply, BoundedExecutor* executor) {
  return new TensorFanoutReactor(std::move(apply), executor);
}

grpc::ServerReadReactor<rl::v1::UpdateWeightsFromTensorRequest>* NewRejectedTensorStream(
    const absl::Status& status) {
  return new RejectReactor(status);
}

void ReplayTensorStream(Worker& w, const TensorChunks* chunks, grpc::ClientContext* ctx,
                        rl::v1::AdminResponse* resp, std::function<void(grpc::Status)> done) {
  (new TensorWriter(chunks, std::move(done)))->Start(w, ctx, resp);
}

}  // namespace rl::router::admin
