#include "services/worker/tensor_update_reactor.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/grpc_status.h"
#include "common/model_io/dtype.h"
#include "common/status.h"
#include "services/worker/admin_convert.h"
#include "services/worker/admin_service.h"
#include "services/worker/weights/peer_sender.h"
#include "services/worker/weights/update_validation.h"

namespace rl::worker {
namespace {

constexpr char kNothingApplied[] = "nothing applied, the old weights keep serving";

// INVALID_ARGUMENT naming the first non-finite element of `t` at or after element `index`.
absl::Status NonFinite(const NamedTensor& t, model_io::DType dtype, int64_t index) {
  std::vector<int64_t> at(t.info.shape.size());
  int64_t rest = index;
  for (size_t d = at.size(); d-- > 0;) {
    at[d] = t.info.shape[d] > 0 ? rest % t.info.shape[d] : 0;
    rest = t.info.shape[d] > 0 ? rest / t.info.shape[d] : 0;
  }
  const uint8_t* p = t.bytes.data() + index * model_io::DTypeSize(dtype);
  return absl::InvalidArgumentError(absl::StrCat(
      "chunk.data: tensor ", QuoteForError(t.info.name), " (", t.info.dtype, " [",
      absl::StrJoin(t.info.shape, ", "), "]) holds ", model_io::NonFiniteName(dtype, p),
      " at element ", index, " (index [", absl::StrJoin(at, ", "),
      "]): non-finite weights are refused (rl-worker --allow-non-finite-weights accepts them); ",
      kNothingApplied));
}

}  // namespace

TensorUpdateReactor::TensorUpdateReactor(WeightUpdates& weights, const RequestLimits& limits,
                                         BoundedExecutor& executor, absl::Status admitted,
                                         bool allow_non_finite_weights,
                                         grpc::CallbackServerContext* context,
                                         rl::v1::AdminResponse* response)
    : weights_(weights),
      limits_(limits),
      executor_(executor),
      allow_non_finite_(allow_non_finite_weights),
      context_(context),
      response_(response) {
  if (!admitted.ok()) {
    Finish(ToGrpcStatus(admitted));
    return;
  }
  StartRead(&msg_);
}

void TensorUpdateReactor::OnReadDone(bool ok) {
  if (!ok) {
    OnStreamEnded();
    return;
  }
  ++num_messages_;
  if (absl::Status s = AddMessage(); !s.ok()) {
    FinishUnapplied(ToGrpcStatus(s));
    return;
  }
  StartRead(&msg_);
}

void TensorUpdateReactor::OnStreamEnded() {
  // gRPC reports a half-close, a cancelled call, a broken connection and a message that does not
  // parse alike (a failed read); only the `end` message tells a complete stream from a cut one.
  if (context_->IsCancelled()) {
    FinishUnapplied(
        grpc::Status(grpc::StatusCode::CANCELLED,
                     absl::StrCat("UpdateWeightsFromTensor: the call was cancelled (by the "
                                  "client, its deadline or a broken connection) after ",
                                  num_messages_, " messages; ", kNothingApplied)));
    return;
  }
  if (!ended_) {
    FinishUnapplied(ToGrpcStatus(absl::InvalidArgumentError(absl::StrCat(
        "end: the stream ended after ", num_messages_,
        " messages without its end message (TensorStreamEnd): the client half-closed early, or "
        "a message did not parse as an UpdateWeightsFromTensorRequest; ",
        kNothingApplied))));
    return;
  }
  // The explicit end: apply, off the gRPC thread.
  if (!executor_.Submit([this] { Finish(ToGrpcStatus(Apply())); })) {
    FinishUnapplied(ToGrpcStatus(AdminService::ExecutorFull("UpdateWeightsFromTensor", executor_)));
  }
}

void TensorUpdateReactor::FinishUnapplied(const grpc::Status& status) {
  stage_.reset();  // a staged stream releases the staged slot (nothing staged) before the answer
  Finish(status);
}

absl::Status TensorUpdateReactor::AddMessage() {
  if (ended_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "end: message ", num_messages_, " came after the stream's end message; ", kNothingApplied));
  }
  if (num_messages_ == 1) {
    policy_ = PolicyFrom(msg_);
    if (msg_.stage()) RETURN_IF_ERROR(CheckStagePolicy(policy_));
    RETURN_IF_ERROR(TakeDeltaOptions());
    if (msg_.stage()) {
      std::optional<int64_t> version = policy_.weight_version;
      if (!version.has_value() && manifest_.has_value()) version = manifest_->version;
      ASSIGN_OR_RETURN(stage_, weights_.BeginStage("tensor", version));
    }
  }
  // The first message may carry the options alone, the last one the end alone.
  if (msg_.has_chunk()) {
    RETURN_IF_ERROR(AddChunk(msg_.chunk()));
  } else if (num_messages_ > 1 && !msg_.has_end()) {
    return absl::InvalidArgumentError(
        absl::StrCat("chunk: message ", num_messages_,
                     " carries neither a chunk nor the end (only the first message may carry "
                     "options alone)"));
  }
  if (msg_.has_end()) {
    RETURN_IF_ERROR(CheckEnd(msg_.end()));
    ended_ = true;
    expected_rank_sha256_ = msg_.end().rank_sha256();
  }
  return absl::OkStatus();
}

absl::Status TensorUpdateReactor::TakeDeltaOptions() {
  if (msg_.has_parent_version()) {
    if (msg_.parent_version() < 0) {
      return absl::InvalidArgumentError("parent_version: must be >= 0");
    }
    // Before any payload travels: a worker that does not serve the parent refuses at once.
    RETURN_IF_ERROR(weights_.CheckDeltaParent(msg_.parent_version()));
    parent_version_ = msg_.parent_version();
  }
  if (!msg_.manifest_json().empty()) {
    ASSIGN_OR_RETURN(manifest_, weight_sync::ParseManifest(msg_.manifest_json(), "manifest_json"));
    if (policy_.weight_version.has_value() && *policy_.weight_version != manifest_->version) {
      return absl::InvalidArgumentError(absl::StrCat("weight_version: ", *policy_.weight_version,
                                                     ", but manifest_json is of version ",
                                                     manifest_->version));
    }
    if (parent_version_.has_value() && manifest_->parent_version.has_value() &&
        *manifest_->parent_version != *parent_version_) {
      return absl::InvalidArgumentError(absl::StrCat("parent_version: ", *parent_version_,
                                                     ", but manifest_json names parent version ",
                                                     *manifest_->parent_version));
    }
  }
  return absl::OkStatus();
}

absl::Status TensorUpdateReactor::AddDeltaChunk(const rl::v1::TensorChunk& c,
                                                weight_sync::DeltaEncoding encoding) {
  if (!parent_version_.has_value()) {
    return absl::InvalidArgumentError(
        absl::StrCat("chunk.encoding: ", QuoteForError(c.name()), " is ",
                     weight_sync::DeltaEncodingName(encoding),
                     "-encoded but the stream names no parent_version (first message)"));
  }
  // The tensor itself (name, served shape, dtype) as for a whole tensor, before any allocation.
  int64_t total = 0;
  RETURN_IF_ERROR(CheckChunkForModel(c, weights_.served_shapes(), limits_, &total));
  const model_io::DType dtype = *model_io::ParseDType(c.dtype());  // checked above
  ASSIGN_OR_RETURN(const int width, weight_sync::DeltaWordBytes(dtype));
  const int64_t num_words = total / width;
  auto [it, inserted] = pending_.try_emplace(c.name());
  Pending& p = it->second;
  if (inserted) {
    absl::StatusOr<int64_t> most =
        weight_sync::MaxDeltaPayloadBytes(encoding, c.delta_count(), num_words, width);
    absl::Status bad;
    if (!most.ok()) {
      bad = Annotate(most.status(), absl::StrCat("chunk.delta_count of ", QuoteForError(c.name())));
    } else if (c.payload_bytes() < 0 || c.payload_bytes() > *most) {
      bad = absl::InvalidArgumentError(
          absl::StrCat("chunk.payload_bytes: ", c.payload_bytes(), " for ", QuoteForError(c.name()),
                       " (", weight_sync::DeltaEncodingName(encoding), ", ", c.delta_count(),
                       " entries) is outside [0, ", *most, "]"));
    } else if (c.payload_bytes() > limits_.max_update_bytes - allocated_) {
      bad = absl::InvalidArgumentError(
          absl::StrCat("chunk: the stream's tensors need more than --max-update-bytes (",
                       limits_.max_update_bytes, ")"));
    }
    if (!bad.ok()) {
      pending_.erase(it);
      return bad;
    }
    allocated_ += c.payload_bytes();
    p.tensor.info = {c.name(), c.dtype(), std::vector<int64_t>(c.shape().begin(), c.shape().end())};
    p.tensor.bytes.resize(static_cast<size_t>(c.payload_bytes()));
    p.encoding = encoding;
    p.count = c.delta_count();
  } else if (p.encoding != encoding || p.count != c.delta_count() ||
             p.tensor.info.dtype != c.dtype() ||
             (c.payload_bytes() != 0 &&
              c.payload_bytes() != static_cast<int64_t>(p.tensor.bytes.size()))) {
    return absl::InvalidArgumentError(
        absl::StrCat("chunk: ", QuoteForError(c.name()),
                     " changed its encoding, delta_count, payload_bytes or dtype between chunks"));
  }
  const uint64_t payload = p.tensor.bytes.size();
  const uint64_t begin = c.offset(), size = c.data().size();
  if (begin > payload || size > payload - begin) {
    return absl::InvalidArgumentError(
        absl::StrCat("chunk.offset: ", size, " payload bytes at offset ", begin,
                     " do not fit in the ", payload, "-byte payload of ", QuoteForError(c.name())));
  }
  const uint64_t end = begin + size;
  for (const auto& [b, e] : p.ranges) {
    if (begin < e && b < end) {
      return absl::InvalidArgumentError(
          absl::StrCat("chunk.offset: overlapping chunks of ", QuoteForError(c.name())));
    }
  }
  p.ranges.emplace_back(begin, end);
  std::copy(c.data().begin(), c.data().end(), p.tensor.bytes.begin() + static_cast<int64_t>(begin));
  p.received += static_cast<int64_t>(size);
  data_bytes_ += static_cast<int64_t>(size);
  return absl::OkStatus();  // values are checked when the payload is applied, whole
}

absl::Status TensorUpdateReactor::AddChunk(const rl::v1::TensorChunk& c) {
  if (!c.encoding().empty() && c.encoding() != "dense") {
    const std::optional<weight_sync::DeltaEncoding> encoding =
        weight_sync::ParseDeltaEncoding(c.encoding());
    if (!encoding.has_value()) {
      return absl::InvalidArgumentError(
          absl::StrCat("chunk.encoding: ", QuoteForError(c.encoding()), " for ",
                       QuoteForError(c.name()), " (\"\", \"dense\", \"overwrite\" or \"xor\")"));
    }
    return AddDeltaChunk(c, *encoding);
  }
  // The header is checked against the served weights (name, shape, bounded dtype size)
  // before anything is allocated for it; the stream's total stays under --max-update-bytes.
  int64_t total = 0;
  RETURN_IF_ERROR(CheckChunkForModel(c, weights_.served_shapes(), limits_, &total));
  // Offset and size against the tensor's size without a sum that could wrap.
  const uint64_t begin = c.offset(), size = c.data().size();
  if (begin > static_cast<uint64_t>(total) || size > static_cast<uint64_t>(total) - begin) {
    return absl::InvalidArgumentError(
        absl::StrCat("chunk.offset: ", size, " bytes at offset ", begin, " do not fit in ",
                     QuoteForError(c.name()), " (", total, " bytes)"));
  }
  const uint64_t end = begin + size;
  auto [it, inserted] = pending_.try_emplace(c.name());
  Pending& p = it->second;
  if (!inserted && p.encoding.has_value()) {
    return absl::InvalidArgumentError(
        absl::StrCat("chunk: ", QuoteForError(c.name()), " is sent both delta-encoded and whole"));
  }
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
  for (const auto& [b, e] : p.ranges) {
    if (begin < e && b < end) {
      return absl::InvalidArgumentError(
          absl::StrCat("chunk.offset: overlapping chunks of ", QuoteForError(c.name())));
    }
  }
  p.ranges.emplace_back(begin, end);
  std::copy(c.data().begin(), c.data().end(), p.tensor.bytes.begin() + static_cast<int64_t>(begin));
  p.received += static_cast<int64_t>(size);
  data_bytes_ += static_cast<int64_t>(size);
  if (allow_non_finite_ || size == 0) return absl::OkStatus();
  // Non-finite values: the elements wholly inside this chunk now, while they are in cache; an
  // element cut by a chunk boundary once the tensor is complete.
  const model_io::DType dtype = *model_io::ParseDType(c.dtype());  // checked above
  const uint64_t esize = static_cast<uint64_t>(model_io::DTypeSize(dtype));
  const uint64_t first = (begin + esize - 1) / esize, last = end / esize;
  if (last > first) {
    const int64_t found = model_io::FindNonFinite(dtype, p.tensor.bytes.data() + first * esize,
                                                  static_cast<int64_t>(last - first));
    if (found >= 0) return NonFinite(p.tensor, dtype, static_cast<int64_t>(first) + found);
  }
  if (begin % esize != 0) p.straddling.push_back(static_cast<int64_t>(begin / esize));
  if (end % esize != 0) p.straddling.push_back(static_cast<int64_t>(end / esize));
  if (p.received == total) {
    for (int64_t e : p.straddling) {
      if (model_io::FindNonFinite(dtype, p.tensor.bytes.data() + e * esize, 1) >= 0) {
        return NonFinite(p.tensor, dtype, e);
      }
    }
  }
  return absl::OkStatus();
}

absl::Status TensorUpdateReactor::CheckEnd(const rl::v1::TensorStreamEnd& end) const {
  if (end.num_tensors() != static_cast<int64_t>(pending_.size()) ||
      end.num_bytes() != data_bytes_) {
    return absl::InvalidArgumentError(
        absl::StrCat("end: the stream announces ", end.num_tensors(), " tensors and ",
                     end.num_bytes(), " data bytes, but ", pending_.size(), " tensors and ",
                     data_bytes_, " bytes arrived; ", kNothingApplied));
  }
  for (const auto& [name, p] : pending_) {
    if (p.received != static_cast<int64_t>(p.tensor.bytes.size())) {
      return absl::InvalidArgumentError(absl::StrCat(
          "chunk: ", QuoteForError(name), " incomplete at the stream's end: ", p.received, " of ",
          p.tensor.bytes.size(), " bytes; ", kNothingApplied));
    }
  }
  return absl::OkStatus();
}

absl::Status TensorUpdateReactor::Apply() {
  // Cancelled between the end and now: the client is gone, the stream is not applied.
  if (context_->IsCancelled()) {
    stage_.reset();  // a staged stream: the slot is free before the answer
    return absl::CancelledError(absl::StrCat(
        "UpdateWeightsFromTensor: the call was cancelled before the apply; ", kNothingApplied));
  }
  if (parent_version_.has_value() || manifest_.has_value()) {
    // A delta (or a verified) stream: built on a copy of the served weights, verified, then
    // staged or activated (publication.h).
    DeltaUpdate update;
    update.parent_version = parent_version_;
    update.manifest = std::move(manifest_);
    for (auto& [name, p] : pending_) {
      if (!p.encoding.has_value()) {
        update.dense.push_back(std::move(p.tensor));
        continue;
      }
      weight_sync::NamedDelta d;
      d.name = name;
      d.dtype = *model_io::ParseDType(p.tensor.info.dtype);  // checked with the chunk
      d.delta.encoding = *p.encoding;
      d.delta.count = p.count;
      d.delta.payload = std::move(p.tensor.bytes);
      update.deltas.push_back(std::move(d));
    }
    pending_.clear();
    if (stage_ != nullptr) return FillFrom(stage_->CommitDelta(std::move(update)), response_);
    return FillFrom(weights_.UpdateWeightsFromDelta(std::move(update), policy_), response_);
  }
  std::vector<NamedTensor> tensors;
  tensors.reserve(pending_.size());
  for (auto& [name, p] : pending_) tensors.push_back(std::move(p.tensor));
  pending_.clear();
  // Peer catch-up (peer_sender.h): the whole state, verified against the sender's digest.
  // Its per-tensor digests are kept: the stage or the served digest reuses them (hashed once).
  std::map<std::string, std::string> digests;
  if (!expected_rank_sha256_.empty()) {
    ASSIGN_OR_RETURN(digests,
                     VerifyFullState(tensors, weights_.served_shapes(), expected_rank_sha256_));
  }
  if (stage_ != nullptr) {
    return FillFrom(stage_->Commit(std::move(tensors), std::move(digests)), response_);
  }
  policy_.verified_sha256 = expected_rank_sha256_;  // the served digest once applied (GetLoad)
  policy_.verified_tensor_sha256 = std::move(digests);
  RETURN_IF_ERROR(
      FillFrom(weights_.UpdateWeightsFromTensors(std::move(tensors), policy_), response_));
  if (!expected_rank_sha256_.empty()) response_->set_weights_sha256(expected_rank_sha256_);
  return absl::OkStatus();
}

}  // namespace rl::worker
