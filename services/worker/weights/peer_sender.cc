#include "services/worker/weights/peer_sender.h"

#include <algorithm>
#include <map>
#include <optional>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "rl/v1/admin.grpc.pb.h"
#include "services/worker/weights/weights_checker.h"
#include "spdlog/spdlog.h"

namespace rl::worker {
namespace {

constexpr int64_t kDefaultChunkBytes = int64_t{1} << 20;
constexpr int64_t kMinChunkBytes = 4096;
constexpr std::chrono::milliseconds kDefaultTimeout{600000};
constexpr std::chrono::milliseconds kMaxTimeout{3600000};
constexpr size_t kMaxTargetBytes = 256;
constexpr char kNothingApplied[] = "nothing was applied there";

absl::Status CheckTarget(const std::string& target) {
  if (target.empty()) return absl::InvalidArgumentError("target: empty (HOST:PORT of a worker)");
  if (target.size() > kMaxTargetBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("target: longer than ", kMaxTargetBytes, " bytes"));
  }
  for (char ch : target) {
    if (ch <= ' ' || ch > '~') {
      return absl::InvalidArgumentError(absl::StrCat(
          "target: ", QuoteForError(target), " holds a space or a non-printable character"));
    }
  }
  const size_t colon = target.rfind(':');
  int port = 0;
  if (colon == std::string::npos || colon == 0 ||
      !absl::SimpleAtoi(target.substr(colon + 1), &port) || port <= 0 || port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("target: ", QuoteForError(target), " is not HOST:PORT"));
  }
  return absl::OkStatus();
}

// Bytes [offset, offset + size) of tensor `index`, at `at` in the slice buffer.
struct Piece {
  size_t index = 0;
  int64_t offset = 0;
  int64_t size = 0;
  int64_t at = 0;
};

}  // namespace

PeerSender::PeerSender(Deps deps) : deps_(std::move(deps)) {}

absl::Status PeerSender::CheckRequest(const Request& r) const {
  RETURN_IF_ERROR(CheckTarget(r.target));
  if (r.weight_version < 0) {
    return absl::InvalidArgumentError("weight_version: must be >= 0 (the version to send)");
  }
  if (r.chunk_bytes != 0 &&
      (r.chunk_bytes < kMinChunkBytes || r.chunk_bytes > deps_.limits.max_tensor_chunk_bytes)) {
    return absl::InvalidArgumentError(
        absl::StrCat("chunk_bytes: ", r.chunk_bytes, " is outside [", kMinChunkBytes, ", ",
                     deps_.limits.max_tensor_chunk_bytes, "] (--max-tensor-chunk-bytes)"));
  }
  if (r.timeout.count() < 0 || r.timeout > kMaxTimeout) {
    return absl::InvalidArgumentError(absl::StrCat("timeout_ms: ", r.timeout.count(),
                                                   " is outside [0, ", kMaxTimeout.count(), "]"));
  }
  return absl::OkStatus();
}

void PeerSender::Shutdown() {
  absl::MutexLock lock(&mu_);
  shut_down_ = true;
  if (in_flight_ != nullptr) in_flight_->TryCancel();
}

absl::StatusOr<PeerSender::Outcome> PeerSender::Send(const Request& request,
                                                     const std::function<bool()>& cancelled) {
  RETURN_IF_ERROR(CheckRequest(request));
  grpc::ClientContext ctx;
  {
    absl::MutexLock lock(&mu_);
    if (shut_down_) return absl::CancelledError("SendWeightsToPeer: the worker is shutting down");
    if (busy_) {
      return absl::FailedPreconditionError(
          "SendWeightsToPeer: another send is in progress on this worker (one at a time)");
    }
    busy_ = true;
    in_flight_ = &ctx;
  }
  absl::StatusOr<Outcome> out = SendLocked(request, cancelled, &ctx);
  absl::MutexLock lock(&mu_);
  busy_ = false;
  in_flight_ = nullptr;
  return out;
}

absl::StatusOr<PeerSender::Outcome> PeerSender::SendLocked(const Request& r,
                                                           const std::function<bool()>& cancelled,
                                                           grpc::ClientContext* ctx) {
  const auto start = std::chrono::steady_clock::now();
  engine::Engine& engine = *deps_.engine;
  const int64_t chunk_bytes = r.chunk_bytes > 0 ? r.chunk_bytes : kDefaultChunkBytes;
  const std::string to = QuoteForError(r.target, kMaxTargetBytes);
  auto applies = [this]() -> uint64_t { return deps_.applies ? deps_.applies() : 0; };

  // The first hop fixes what is sent: the version, the apply count, the tensors.
  std::vector<model::TensorInfo> list;
  uint64_t applies_at_start = 0;
  RETURN_IF_ERROR(engine.RunOnEngineThread([&](engine::EngineContext& c) -> absl::Status {
    if (c.weight_version() != r.weight_version) {
      return absl::FailedPreconditionError(
          absl::StrCat("SendWeightsToPeer: this worker serves weight_version ", c.weight_version(),
                       ", not ", r.weight_version, "; nothing sent"));
    }
    applies_at_start = applies();
    list = c.runner().ListWeights();
    return absl::OkStatus();
  }));
  if (list.empty()) return absl::FailedPreconditionError("SendWeightsToPeer: no weights to send");

  std::shared_ptr<grpc::Channel> channel;
  if (deps_.channel) {
    channel = deps_.channel(r.target);
  } else {
    grpc::ChannelArguments args;
    args.SetMaxSendMessageSize(-1);
    channel = grpc::CreateCustomChannel(r.target, grpc::InsecureChannelCredentials(), args);
  }
  std::unique_ptr<rl::v1::Admin::Stub> stub = rl::v1::Admin::NewStub(channel);
  ctx->set_deadline(std::chrono::system_clock::now() +
                    (r.timeout.count() > 0 ? r.timeout : kDefaultTimeout));
  for (const auto& [key, value] : r.metadata) ctx->AddMetadata(key, value);
  rl::v1::AdminResponse resp;
  std::unique_ptr<grpc::ClientWriter<rl::v1::UpdateWeightsFromTensorRequest>> writer =
      stub->UpdateWeightsFromTensor(ctx, &resp);

  // Ends the stream early: the receiver sees a cancelled call and applies nothing.
  auto cut = [&](const absl::Status& why) {
    ctx->TryCancel();
    writer->Finish();
    spdlog::warn("SendWeightsToPeer to {} cut: {}", r.target, std::string(why.message()));
    return why;
  };
  // A write failed: the stream is broken; the receiver's status says why.
  // The receiver's failures are ABORTED here, never UNAVAILABLE: a caller must not take this
  // worker for unreachable when the receiver is.
  auto broken = [&]() {
    const grpc::Status s = writer->Finish();
    return absl::AbortedError(
        absl::StrCat("SendWeightsToPeer: the stream to ", to, " broke (",
                     absl::StatusCodeToString(static_cast<absl::StatusCode>(s.error_code())), ": ",
                     s.error_message(), "); ", kNothingApplied));
  };
  auto stop_asked = [&]() -> std::optional<absl::Status> {
    if (cancelled && cancelled()) {
      return absl::CancelledError(
          absl::StrCat("SendWeightsToPeer: the call was cancelled; the stream to ", to,
                       " was cut, ", kNothingApplied));
    }
    return std::nullopt;
  };

  rl::v1::UpdateWeightsFromTensorRequest msg;
  msg.set_weight_version(r.weight_version);
  msg.set_abort_all_requests(r.abort_all_requests);
  msg.set_keep_pause(r.keep_pause);
  if (!writer->Write(msg)) return broken();

  const int64_t slice_bytes = std::max<int64_t>(deps_.slice_bytes, 1);
  std::vector<uint8_t> buffer;
  std::map<std::string, std::string> digests;
  std::unique_ptr<TensorHasher> hasher;
  size_t next = 0;          // the next tensor to copy
  int64_t next_offset = 0;  // and its first byte not copied yet
  int64_t sent_bytes = 0;
  int64_t hops = 0;
  while (next < list.size()) {
    if (auto stop = stop_asked()) return cut(*stop);
    std::vector<Piece> pieces;
    std::vector<int64_t> sizes(list.size(), -1);
    const absl::Status hop = engine.RunOnEngineThread([&](engine::EngineContext& c) {
      if (c.weight_version() != r.weight_version || applies() != applies_at_start) {
        return absl::AbortedError(absl::StrCat(
            "SendWeightsToPeer: the served weights changed during the send (now weight_version ",
            c.weight_version(), ", was ", r.weight_version,
            "): the send was cut so that no mix of two versions goes out; ", kNothingApplied));
      }
      int64_t used = 0;
      size_t k = 0;
      bool order_ok = true;
      buffer.resize(static_cast<size_t>(slice_bytes));
      absl::Status visit = c.runner().VisitWeights(
          [&](const model::TensorInfo& info, absl::Span<const uint8_t> bytes) {
            const size_t index = k++;
            if (index >= list.size() || info.name != list[index].name) {
              order_ok = false;
              return;
            }
            sizes[index] = static_cast<int64_t>(bytes.size());
            if (index < next || used >= slice_bytes) return;
            const int64_t offset = index == next ? next_offset : 0;
            const int64_t n =
                std::min<int64_t>(static_cast<int64_t>(bytes.size()) - offset, slice_bytes - used);
            std::copy_n(bytes.data() + offset, n, buffer.data() + used);
            pieces.push_back({index, offset, n, used});
            used += n;
          });
      if (!visit.ok()) {
        return absl::FailedPreconditionError(absl::StrCat(
            "SendWeightsToPeer: cannot read the served weights (asleep?): ", visit.message()));
      }
      if (!order_ok || k != list.size()) {
        return absl::InternalError(
            "SendWeightsToPeer: the runner visits its weights in another order than it lists "
            "them");
      }
      return absl::OkStatus();
    });
    if (!hop.ok()) return cut(hop);
    ++hops;
    for (const Piece& p : pieces) {
      const model::TensorInfo& info = list[p.index];
      const int64_t size = sizes[p.index];
      if (p.offset == 0) hasher = std::make_unique<TensorHasher>(info);
      const uint8_t* data = buffer.data() + p.at;
      hasher->Update(absl::MakeConstSpan(data, static_cast<size_t>(p.size)));
      // An empty tensor still goes out as one empty chunk, so the receiver counts it.
      for (int64_t o = 0; o < p.size || (size == 0 && o == 0); o += chunk_bytes) {
        if (auto stop = stop_asked()) return cut(*stop);
        const int64_t n = std::min(chunk_bytes, p.size - o);
        msg.Clear();
        rl::v1::TensorChunk* chunk = msg.mutable_chunk();
        chunk->set_name(info.name);
        chunk->set_dtype(info.dtype);
        for (int64_t d : info.shape) chunk->add_shape(d);
        chunk->set_offset(static_cast<uint64_t>(p.offset + o));
        chunk->mutable_data()->assign(reinterpret_cast<const char*>(data + o),
                                      static_cast<size_t>(n));
        if (!writer->Write(msg)) return broken();
        sent_bytes += n;
        if (size == 0) break;
      }
      next_offset = p.offset + p.size;
      if (next_offset >= size) {
        digests[info.name] = hasher->Finish();
        hasher.reset();
        next = p.index + 1;
        next_offset = 0;
      } else {
        next = p.index;
      }
    }
    if (pieces.empty() && next < list.size()) {
      return cut(absl::InternalError("SendWeightsToPeer: a slice copied nothing"));
    }
  }
  std::vector<uint8_t>().swap(buffer);

  const std::string rank = RankDigest(digests);
  msg.Clear();
  rl::v1::TensorStreamEnd* end = msg.mutable_end();
  end->set_num_tensors(static_cast<int64_t>(digests.size()));
  end->set_num_bytes(sent_bytes);
  end->set_rank_sha256(rank);
  if (auto stop = stop_asked()) return cut(*stop);
  if (!writer->Write(msg)) return broken();
  writer->WritesDone();
  const grpc::Status s = writer->Finish();
  if (!s.ok()) {
    return absl::AbortedError(
        absl::StrCat("SendWeightsToPeer: ", to, " answered ",
                     absl::StatusCodeToString(static_cast<absl::StatusCode>(s.error_code())), ": ",
                     s.error_message()));
  }
  if (resp.weights_sha256() != rank) {
    return absl::DataLossError(
        absl::StrCat("SendWeightsToPeer: ", to, " applied the stream but reports weights_sha256 '",
                     QuoteForError(resp.weights_sha256()), "' instead of the digest sent, ", rank,
                     " (an rl-worker that does not verify TensorStreamEnd.rank_sha256?)"));
  }
  Outcome out;
  out.rank_sha256 = rank;
  out.num_tensors = static_cast<int64_t>(digests.size());
  out.num_bytes = sent_bytes;
  out.admin.weight_version = r.weight_version;
  out.admin.duration_us = std::chrono::duration_cast<std::chrono::microseconds>(
                              std::chrono::steady_clock::now() - start)
                              .count();
  out.admin.message =
      absl::StrCat("sent weight_version ", r.weight_version, " (", out.num_tensors, " tensors, ",
                   sent_bytes, " bytes, ", hops, " slices) to ", to, " in ",
                   out.admin.duration_us / 1000, " ms; it answered: ", resp.message());
  spdlog::info("SendWeightsToPeer: {}", out.admin.message);
  return out;
}

absl::StatusOr<std::map<std::string, std::string>> VerifyFullState(
    const std::vector<NamedTensor>& tensors, const WeightShapes& served,
    const std::string& expected_rank_sha256) {
  std::map<std::string, std::string> digests;
  for (const NamedTensor& t : tensors) digests[t.info.name] = TensorDigest(t.info, t.bytes);
  for (const auto& [name, shape] : served) {
    if (!digests.contains(name)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "end.rank_sha256: a full-state stream must carry every served weight, and ",
          QuoteForError(name), " did not arrive; nothing applied, the old weights keep serving"));
    }
  }
  const std::string rank = RankDigest(digests);
  if (rank != expected_rank_sha256) {
    return absl::InvalidArgumentError(
        absl::StrCat("end.rank_sha256: the tensors that arrived digest to ", rank, ", not ",
                     QuoteForError(expected_rank_sha256, 80),
                     "; nothing applied, the old weights keep serving"));
  }
  return digests;
}

}  // namespace rl::worker
