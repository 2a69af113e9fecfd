#include "services/worker/weight_sync/session.h"

#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status.h"
#include "services/worker/weight_sync/crc32c.h"
#include "spdlog/spdlog.h"

namespace rl::weight_sync {
namespace {

constexpr auto kCloseBudget = std::chrono::milliseconds(1000);

double SecondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

}  // namespace

ReceiverSession::ReceiverSession(GroupOptions options, Socket control)
    : options_(std::move(options)),
      stall_(StallTimeout(options_)),
      context_(GroupContext(options_)),
      control_(std::move(control)) {}

absl::Status ReceiverSession::Break(absl::Status status) {
  if (broken_.ok()) broken_ = status;
  return status;
}

absl::Status ReceiverSession::Receive(const std::vector<TensorSpec>& specs,
                                      const TensorCallback& on_tensor,
                                      const std::function<void()>& on_posted) {
  absl::MutexLock lock(&mu_);
  absl::Status status = ReceiveLocked(specs, on_tensor, on_posted);
  if (status.ok()) return status;
  return absl::Status(status.code(), absl::StrCat(context_, ": ", status.message()));
}

absl::Status ReceiverSession::ReceiveLocked(const std::vector<TensorSpec>& specs,
                                            const TensorCallback& on_tensor,
                                            const std::function<void()>& on_posted) {
  if (closing_.load() || released_) return absl::FailedPreconditionError("group closed");
  if (!broken_.ok()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "group broken by an earlier error (destroy and re-init it): ", broken_.message()));
  }
  const auto start = Clock::now();
  absl::Status verdict = absl::OkStatus();
  for (const TensorSpec& spec : specs) {
    if (auto bytes = TensorBytes(spec); !bytes.ok()) {
      verdict = absl::InvalidArgumentError(
          absl::StrCat("metadata tensor '", spec.name, "': ", bytes.status().message()));
      break;
    }
  }
  if (on_posted) on_posted();  // from here the bucket header is awaited
  bool started = false;
  auto body = ReadMessage(control_, stall_, "bucket header", &started);
  if (!body.ok()) {
    if (closing_.load()) return absl::FailedPreconditionError("group closed during Receive");
    if (absl::IsDeadlineExceeded(body.status()) && !started) {
      // Nothing of the bucket arrived: the stream is still in step, the group stays usable.
      return absl::DeadlineExceededError(
          absl::StrCat("no bucket from the sender within ", stall_.count(), " ms"));
    }
    return Break(body.status());
  }
  auto frame = DecodeFrame(*body);
  if (!frame.ok()) return Break(frame.status());
  if (frame->kind == FrameKind::kClose) {
    return Break(absl::FailedPreconditionError("the sender closed the group"));
  }
  if (frame->seq != next_seq_) {
    return Break(absl::DataLossError(
        absl::StrCat("bucket sequence ", frame->seq, " where ", next_seq_, " was expected")));
  }
  ++next_seq_;
  const BucketHeader& header = frame->bucket;
  if (verdict.ok()) verdict = MatchBucket(specs, header);
  uint32_t crc = 0;
  auto payload = ReceivePayload(header, verdict.ok(), &crc);
  if (!payload.ok()) {
    if (closing_.load()) return absl::FailedPreconditionError("group closed during Receive");
    return Break(payload.status());
  }
  if (verdict.ok() && crc != header.payload_crc32c) {
    verdict = absl::DataLossError(
        absl::StrCat("bucket ", frame->seq, " checksum mismatch: CRC32C 0x", absl::Hex(crc),
                     ", the sender announced 0x", absl::Hex(header.payload_crc32c), " (",
                     header.payload_bytes, " bytes)"));
  }
  Ack ack{frame->seq, verdict.code(), std::string(verdict.message())};
  if (absl::Status sent = WriteMessage(control_, EncodeAck(ack), stall_, "ack"); !sent.ok()) {
    return Break(sent);
  }
  if (!verdict.ok()) return verdict;
  const double seconds = SecondsSince(start);
  spdlog::debug("{}: bucket {} ({} tensors, {} bytes) in {:.3f} s", context_, frame->seq,
                header.tensors.size(), header.payload_bytes, seconds);
  int64_t offset = 0;
  for (size_t i = 0; i < header.tensors.size(); ++i) {
    auto bytes = payload->subspan(offset, header.tensor_bytes[i]);
    offset += header.tensor_bytes[i];
    absl::Status applied = on_tensor(specs[i], bytes);
    if (!applied.ok()) {
      return absl::Status(applied.code(), absl::StrCat("applying tensor '", specs[i].name,
                                                       "': ", applied.message()));
    }
  }
  return absl::OkStatus();
}

void ReceiverSession::Close() {
  closing_.store(true);
  control_.Shutdown();
  absl::MutexLock lock(&mu_);
  if (released_) return;
  released_ = true;
  ReleaseBackend();
  spdlog::info("{}: left the group", context_);
}

SenderSession::SenderSession(GroupOptions options, BackendId backend)
    : options_(std::move(options)), backend_(backend), stall_(StallTimeout(options_)) {}

absl::Status SenderSession::Listen() {
  ASSIGN_OR_RETURN(GroupListener listener, GroupListener::Listen(options_, backend_));
  port_ = listener.port();
  context_ = absl::StrCat("weight-sync group '", options_.group_name, "' sender on ",
                          options_.master_address, ":", port_);
  absl::MutexLock lock(&sockets_mu_);
  listener_ = std::make_unique<GroupListener>(std::move(listener));
  return absl::OkStatus();
}

absl::Status SenderSession::WaitForReceivers() {
  absl::MutexLock lock(&mu_);
  if (ready_) return absl::FailedPreconditionError(context_ + ": receivers already joined");
  if (closing_.load() || released_) return absl::FailedPreconditionError(context_ + ": closed");
  ASSIGN_OR_RETURN(std::string join_payload, PrepareGroup());
  auto joined = listener_->AcceptAll(join_payload);
  if (!joined.ok()) {
    if (closing_.load()) return absl::FailedPreconditionError(context_ + ": closed");
    return joined.status();
  }
  {
    absl::MutexLock sockets_lock(&sockets_mu_);
    receivers_ = *std::move(joined);
    listener_.reset();
  }
  broken_.assign(receivers_.size(), absl::OkStatus());
  RETURN_IF_ERROR(CompleteGroup());
  ready_ = true;
  return absl::OkStatus();
}

absl::Status SenderSession::ReadAck(size_t index, uint64_t seq) {
  const std::string what = absl::StrCat("ack from rank ", index + 1);
  ASSIGN_OR_RETURN(std::string body, ReadMessage(receivers_[index], stall_, what));
  ASSIGN_OR_RETURN(Ack ack, DecodeAck(body));
  if (ack.seq != seq) {
    return absl::DataLossError(absl::StrCat(what, ": for bucket ", ack.seq, ", expected ", seq));
  }
  if (ack.code == absl::StatusCode::kOk) return absl::OkStatus();
  // The receiver consumed the bucket and rejected it; the stream is still in step. Report the
  // verdict with a code no I/O error uses so the caller does not mark the link broken.
  return absl::FailedPreconditionError(
      absl::StrCat("rank ", index + 1, " rejected the bucket: ", ack.message));
}

absl::StatusOr<BroadcastStats> SenderSession::Broadcast(
    const std::vector<TensorSpec>& specs, const std::vector<absl::Span<const uint8_t>>& data) {
  absl::MutexLock lock(&mu_);
  if (closing_.load() || released_) return absl::FailedPreconditionError(context_ + ": closed");
  if (!ready_) {
    return absl::FailedPreconditionError(context_ + ": WaitForReceivers has not completed");
  }
  std::vector<std::string> broken;
  for (size_t i = 0; i < broken_.size(); ++i) {
    if (!broken_[i].ok())
      broken.push_back(absl::StrCat("rank ", i + 1, ": ", broken_[i].message()));
  }
  if (!broken.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat(context_, ": group broken by an earlier error (destroy and re-create it): ",
                     absl::StrJoin(broken, "; ")));
  }
  if (specs.size() != data.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat(context_, ": ", specs.size(), " specs but ", data.size(), " data spans"));
  }
  auto header = MakeBucketHeader(specs);
  if (!header.ok()) {
    return absl::Status(header.status().code(),
                        absl::StrCat(context_, ": ", header.status().message()));
  }
  const auto start = Clock::now();
  uint32_t crc = 0;
  for (size_t i = 0; i < specs.size(); ++i) {
    if (static_cast<int64_t>(data[i].size()) != header->tensor_bytes[i]) {
      return absl::InvalidArgumentError(
          absl::StrCat(context_, ": tensor '", specs[i].name, "' has ", data[i].size(),
                       " bytes, its ", DescribeSpec(specs[i]), " needs ", header->tensor_bytes[i]));
    }
    crc = Crc32cExtend(crc, data[i].data(), data[i].size());
  }
  header->payload_crc32c = crc;
  const uint64_t seq = next_seq_++;
  Frame frame{FrameKind::kBucket, seq, *std::move(header)};
  const int64_t payload_bytes = frame.bucket.payload_bytes;
  std::vector<absl::Status> results = Transmit(EncodeFrame(frame), seq, payload_bytes, data);
  std::vector<std::string> failures;
  for (size_t i = 0; i < results.size(); ++i) {
    if (results[i].ok()) continue;
    failures.push_back(absl::StrCat("rank ", i + 1, ": ", results[i].message()));
    if (!absl::IsFailedPrecondition(results[i])) broken_[i] = results[i];
  }
  if (!failures.empty()) {
    if (closing_.load()) return absl::FailedPreconditionError(context_ + ": closed");
    // The most telling code: a receiver's verdict (e.g. a metadata mismatch) over I/O trouble.
    absl::StatusCode code = absl::StatusCode::kOk;
    for (const absl::Status& r : results) {
      if (!r.ok() && (code == absl::StatusCode::kOk || absl::IsFailedPrecondition(r))) {
        code = r.code();
      }
    }
    return absl::Status(
        code, absl::StrCat(context_, ": bucket ", seq, " failed: ", absl::StrJoin(failures, "; ")));
  }
  BroadcastStats stats;
  stats.bytes = payload_bytes;
  stats.seconds = SecondsSince(start);
  spdlog::debug("{}: bucket {} ({} tensors, {} bytes) to {} receivers in {:.3f} s", context_, seq,
                specs.size(), payload_bytes, receivers_.size(), stats.seconds);
  return stats;
}

void SenderSession::Close() {
  const bool first = !closing_.exchange(true);
  {
    absl::MutexLock sockets_lock(&sockets_mu_);
    if (listener_ != nullptr) listener_->Shutdown();
  }
  if (!mu_.TryLock()) {
    // A call is in flight: abort it so it returns promptly, then take over.
    {
      absl::MutexLock sockets_lock(&sockets_mu_);
      for (Socket& s : receivers_) s.Shutdown();
    }
    mu_.Lock();
  }
  if (released_) {
    mu_.Unlock();
    return;
  }
  released_ = true;
  if (first && ready_) {
    const std::string bye = EncodeFrame(Frame{FrameKind::kClose, next_seq_, {}});
    const auto budget = std::min(stall_, kCloseBudget);
    for (size_t i = 0; i < receivers_.size(); ++i) {
      if (!broken_[i].ok()) continue;
      absl::Status sent = WriteMessage(receivers_[i], bye, budget, "close");
      if (!sent.ok()) spdlog::debug("{}: close not delivered to rank {}", context_, i + 1);
    }
  }
  for (Socket& s : receivers_) s.Shutdown();
  ReleaseBackend();
  mu_.Unlock();
  spdlog::info("{}: closed", context_);
}

}  // namespace rl::weight_sync
