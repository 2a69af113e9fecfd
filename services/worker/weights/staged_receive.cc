#include "services/worker/weights/staged_receive.h"

#include <utility>

#include "common/status.h"
#include "services/worker/weights/update_validation.h"

namespace rl::worker {

absl::StatusOr<std::unique_ptr<StagedReceive>> StagedReceive::Post(
    std::shared_ptr<weight_sync::WeightReceiver> receiver, WeightBuckets buckets) {
  std::unique_ptr<StagedReceive> r(new StagedReceive());
  StagedReceive* raw = r.get();
  raw->thread_ = std::thread([raw, receiver = std::move(receiver), buckets = std::move(buckets)] {
    raw->status_ = ReceiveBuckets(receiver.get(), buckets, &raw->tensors_, [raw] {
      raw->posted_ = true;
      raw->settled_.Notify();
    });
    if (!raw->posted_) raw->settled_.Notify();
  });
  raw->settled_.WaitForNotification();
  if (!raw->posted_) {
    raw->thread_.join();
    return raw->status_;
  }
  return r;
}

StagedReceive::~StagedReceive() {
  if (thread_.joinable()) thread_.join();
}

absl::Status StagedReceive::Wait() {
  if (thread_.joinable()) thread_.join();
  return status_;
}

absl::Status ReceiveBuckets(weight_sync::WeightReceiver* receiver, const WeightBuckets& buckets,
                            std::vector<NamedTensor>* out, const std::function<void()>& on_posted) {
  for (size_t b = 0; b < buckets.size(); ++b) {
    const std::vector<model::TensorInfo>& bucket = buckets[b];
    std::vector<weight_sync::TensorSpec> wire;
    for (const auto& s : bucket) wire.push_back({s.name, s.dtype, s.shape});
    size_t next = 0;
    RETURN_IF_ERROR(receiver->Receive(
        wire,
        [&](const weight_sync::TensorSpec&, absl::Span<const uint8_t> bytes) {
          out->push_back({bucket[next++], std::vector<uint8_t>(bytes.begin(), bytes.end())});
          return absl::OkStatus();
        },
        b == 0 ? on_posted : nullptr));
  }
  return absl::OkStatus();
}

absl::Status ApplyStaged(model::ModelRunner& runner, const std::vector<NamedTensor>& tensors) {
  std::vector<const model::TensorInfo*> infos;
  std::vector<int64_t> sizes;
  for (const NamedTensor& t : tensors) {
    infos.push_back(&t.info);
    sizes.push_back(static_cast<int64_t>(t.bytes.size()));
  }
  RETURN_IF_ERROR(ValidateTensors(runner.ListWeights(), infos, sizes));
  for (const NamedTensor& t : tensors) RETURN_IF_ERROR(runner.UpdateWeight(t.info, t.bytes));
  return absl::OkStatus();
}

}  // namespace rl::worker
