#include "services/worker/tensor_update_reactor.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/grpc_status.h"
#include "common/status.h"
#include "services/worker/admin_convert.h"
#include "services/worker/admin_service.h"
#include "services/worker/weights/update_validation.h"

namespace rl::worker {

TensorUpdateReactor::TensorUpdateReactor(WeightUpdates& weights, const RequestLimits& limits,
                                         BoundedExecutor& executor, const BearerAuth& auth,
                                         grpc::CallbackServerContext* context,
                                         rl::v1::AdminResponse* response)
    : weights_(weights), limits_(limits), executor_(executor), response_(response) {
  if (absl::Status s = auth.Check(*context); !s.ok()) {
    Finish(ToGrpcStatus(s));
    return;
  }
  StartRead(&msg_);
}

void TensorUpdateReactor::OnReadDone(bool ok) {
  if (!ok) {  // client half-closed: apply, off the gRPC thread
    if (!executor_.Submit([this] { Finish(ToGrpcStatus(Apply())); })) {
      Finish(ToGrpcStatus(AdminService::ExecutorFull("UpdateWeightsFromTensor", executor_)));
    }
    return;
  }
  if (absl::Status s = AddChunk(); !s.ok()) {
    Finish(ToGrpcStatus(s));
    return;
  }
  StartRead(&msg_);
}

absl::Status TensorUpdateReactor::AddChunk() {
  if (first_) {
    first_ = false;
    policy_ = PolicyFrom(msg_);
  }
  const rl::v1::TensorChunk& c = msg_.chunk();
  // The header is checked against the served weights (name, shape, bounded dtype size)
  // before anything is allocated for it; the stream's total stays under --max-update-bytes.
  int64_t total = 0;
  RETURN_IF_ERROR(CheckChunkForModel(c, weights_.served_shapes(), limits_, &total));
  auto [it, inserted] = pending_.try_emplace(c.name());
  Pending& p = it->second;
  if (inserted) {
    if (total > limits_.max_update_bytes - allocated_) {
      pending_.erase(it);
      return absl::InvalidArgumentError(
          absl::StrCat("chunk: the stream's tensors need more than --max-update-bytes (",
                       limits_.max_update_bytes, ")"));
    }
    allocated_ += total;
    p.tensor.info = {c.name(), c.dtype(), std::vector<int64_t>(c.shape().begin(), c.shape().end())};
    p.tensor.bytes.resize(static_cast<size_t>(total));
  } else if (p.tensor.info.dtype != c.dtype()) {
    return absl::InvalidArgumentError(
        absl::StrCat("chunk: ", QuoteForError(c.name()), " changed dtype between chunks"));
  }
  const uint64_t begin = c.offset(), end = begin + c.data().size();
  if (end > static_cast<uint64_t>(total) || end < begin) {
    return absl::InvalidArgumentError(absl::StrCat("chunk.offset: bytes [", begin, ", ", end,
                                                   ") outside ", QuoteForError(c.name()), " (",
                                                   total, " bytes)"));
  }
  for (const auto& [b, e] : p.ranges) {
    if (begin < e && b < end) {
      return absl::InvalidArgumentError(
          absl::StrCat("chunk.offset: overlapping chunks of ", QuoteForError(c.name())));
    }
  }
  p.ranges.emplace_back(begin, end);
  std::copy(c.data().begin(), c.data().end(), p.tensor.bytes.begin() + static_cast<int64_t>(begin));
  p.received += static_cast<int64_t>(c.data().size());
  return absl::OkStatus();
}

absl::Status TensorUpdateReactor::Apply() {
  std::vector<NamedTensor> tensors;
  for (auto& [name, p] : pending_) {
    if (p.received != static_cast<int64_t>(p.tensor.bytes.size())) {
      return absl::InvalidArgumentError(absl::StrCat("chunk: '", name, "' incomplete: ", p.received,
                                                     " of ", p.tensor.bytes.size(), " bytes"));
    }
    tensors.push_back(std::move(p.tensor));
  }
  pending_.clear();
  return FillFrom(weights_.UpdateWeightsFromTensors(std::move(tensors), policy_), response_);
}

}  // namespace rl::worker
