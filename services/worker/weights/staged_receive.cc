#include "services/worker/weights/staged_receive.h"

#include <map>
#include <optional>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/model_io/dtype.h"
#include "common/model_io/safetensors.h"
#include "common/request_limits.h"
#include "common/status.h"
#include "services/worker/weights/update_validation.h"

namespace rl::worker {
namespace {

// INVALID_ARGUMENT naming the first NaN / ±Inf of `t`, unless non-finite weights are allowed.
absl::Status CheckFinite(const NamedTensor& t) {
  if (model_io::NonFiniteWeightsAllowed()) return absl::OkStatus();
  const std::optional<model_io::DType> dtype = model_io::ParseDType(t.info.dtype);
  if (!dtype.has_value()) return absl::OkStatus();  // validated before the receive; nothing to scan
  const int64_t esize = model_io::DTypeSize(*dtype);
  const int64_t found =
      model_io::FindNonFinite(*dtype, t.bytes.data(), static_cast<int64_t>(t.bytes.size()) / esize);
  if (found < 0) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "receive: tensor ", QuoteForError(t.info.name), " (", t.info.dtype, " [",
      absl::StrJoin(t.info.shape, ", "), "]) holds ",
      model_io::NonFiniteName(*dtype, t.bytes.data() + found * esize), " at element ", found,
      ": non-finite weights are refused (rl-worker --allow-non-finite-weights accepts them)"));
}

}  // namespace

absl::StatusOr<std::unique_ptr<StagedReceive>> StagedReceive::Post(
    std::shared_ptr<weight_sync::WeightReceiver> receiver, WeightBuckets buckets,
    std::optional<GroupDelta> delta) {
  std::unique_ptr<StagedReceive> r(new StagedReceive());
  StagedReceive* raw = r.get();
  raw->delta_ = std::move(delta);
  raw->thread_ = std::thread([raw, receiver = std::move(receiver), buckets = std::move(buckets)] {
    raw->status_ = ReceiveBuckets(
        receiver.get(), buckets, &raw->tensors_,
        [raw] {
          raw->posted_ = true;
          raw->settled_.Notify();
        },
        raw->delta_.has_value() ? &*raw->delta_ : nullptr);
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

DeltaUpdate StagedReceive::TakeDeltaUpdate() {
  return GroupDeltaUpdate(std::move(tensors_), std::move(*delta_));
}

absl::Status CheckGroupDelta(const WeightBuckets& buckets, const GroupDelta& delta,
                             const RequestLimits& limits) {
  std::map<std::string, const model::TensorInfo*> listed;
  for (const auto& bucket : buckets) {
    for (const model::TensorInfo& t : bucket) listed[t.name] = &t;
  }
  int64_t payload_total = 0;
  for (const auto& [name, e] : delta.encoded) {
    auto it = listed.find(name);
    if (it == listed.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("buckets: encoded tensor ", QuoteForError(name, 128), " is not listed"));
    }
    RETURN_IF_ERROR(CheckEncodedTensor(*it->second, e, limits));
    payload_total += e.payload_bytes;  // each at most --max-update-bytes: no overflow
    if (payload_total > limits.max_update_bytes) {
      return absl::InvalidArgumentError(
          absl::StrCat("buckets: the delta payloads need more than --max-update-bytes (",
                       limits.max_update_bytes, ")"));
    }
  }
  return absl::OkStatus();
}

DeltaUpdate GroupDeltaUpdate(std::vector<NamedTensor> received, GroupDelta delta) {
  DeltaUpdate update;
  update.parent_version = delta.parent_version;
  update.manifest = std::move(delta.manifest);
  for (NamedTensor& t : received) {
    auto it = delta.encoded.find(t.info.name);
    if (it == delta.encoded.end()) {
      update.dense.push_back(std::move(t));
      continue;
    }
    weight_sync::NamedDelta d;
    d.name = t.info.name;
    d.dtype = *model_io::ParseDType(t.info.dtype);  // validated with the buckets
    d.delta.encoding = it->second.encoding;
    d.delta.count = it->second.count;
    d.delta.payload = std::move(t.bytes);
    update.deltas.push_back(std::move(d));
  }
  return update;
}

absl::Status ReceiveBuckets(weight_sync::WeightReceiver* receiver, const WeightBuckets& buckets,
                            std::vector<NamedTensor>* out, const std::function<void()>& on_posted,
                            const GroupDelta* delta) {
  // A refused tensor (non-finite) fails the receive, but only once every bucket has been read:
  // the trainer's broadcast completes and the group stays in step for the next update.
  absl::Status refused;
  for (size_t b = 0; b < buckets.size(); ++b) {
    const std::vector<model::TensorInfo>& bucket = buckets[b];
    std::vector<weight_sync::TensorSpec> wire;
    std::vector<bool> encoded;
    for (const auto& s : bucket) {
      const EncodedTensor* e = nullptr;
      if (delta != nullptr) {
        auto it = delta->encoded.find(s.name);
        if (it != delta->encoded.end()) e = &it->second;
      }
      encoded.push_back(e != nullptr);
      if (e != nullptr) {
        wire.push_back({s.name, "U8", {e->payload_bytes}});
      } else {
        wire.push_back({s.name, s.dtype, s.shape});
      }
    }
    size_t next = 0;
    RETURN_IF_ERROR(receiver->Receive(
        wire,
        [&](const weight_sync::TensorSpec&, absl::Span<const uint8_t> bytes) {
          const bool is_payload = encoded[next];
          const model::TensorInfo& info = bucket[next++];
          if (!refused.ok()) return absl::OkStatus();  // read, not kept
          out->push_back({info, std::vector<uint8_t>(bytes.begin(), bytes.end())});
          if (!is_payload) refused = CheckFinite(out->back());
          if (!refused.ok()) std::vector<NamedTensor>().swap(*out);  // nothing is kept
          return absl::OkStatus();
        },
        b == 0 ? on_posted : nullptr));
  }
  return refused;
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
