#include "services/worker/weight_sync/tcp_transport.h"

#include <algorithm>
#include <thread>

#include "common/status.h"
#include "services/worker/weight_sync/crc32c.h"
#include "services/worker/weight_sync/group.h"
#include "services/worker/weight_sync/session.h"

namespace rl::weight_sync {
namespace {

constexpr size_t kDrainChunk = size_t{4} << 20;

class TcpReceiver final : public ReceiverSession {
 public:
  TcpReceiver(GroupOptions options, Socket control)
      : ReceiverSession(std::move(options), std::move(control)) {}

 protected:
  absl::StatusOr<absl::Span<const uint8_t>> ReceivePayload(const BucketHeader& header, bool keep,
                                                           uint32_t* crc) override {
    const size_t size = static_cast<size_t>(header.payload_bytes);
    if (!keep) {
      auto scratch = std::make_unique<uint8_t[]>(std::min(size, kDrainChunk));
      for (size_t done = 0; done < size;) {
        size_t n = std::min(size - done, kDrainChunk);
        RETURN_IF_ERROR(RecvAll(control(), scratch.get(), n, stall(), "bucket payload (drain)"));
        done += n;
      }
      return absl::Span<const uint8_t>();
    }
    if (capacity_ < size) {
      staging_.reset();
      staging_ = std::unique_ptr<uint8_t[]>(new uint8_t[size]);
      capacity_ = size;
    }
    uint32_t c = 0;
    RETURN_IF_ERROR(
        RecvAll(control(), staging_.get(), size, stall(), "bucket payload",
                [&c](const uint8_t* chunk, size_t n) { c = Crc32cExtend(c, chunk, n); }));
    *crc = c;
    return absl::Span<const uint8_t>(staging_.get(), size);
  }

  void ReleaseBackend() override {
    staging_.reset();
    capacity_ = 0;
  }

 private:
  std::unique_ptr<uint8_t[]> staging_;
  size_t capacity_ = 0;
};

class TcpSender final : public SenderSession {
 public:
  explicit TcpSender(GroupOptions options) : SenderSession(std::move(options), BackendId::kTcp) {}

 protected:
  absl::StatusOr<std::string> PrepareGroup() override { return std::string(); }
  absl::Status CompleteGroup() override { return absl::OkStatus(); }

  std::vector<absl::Status> Transmit(const std::string& frame, uint64_t seq,
                                     int64_t /*payload_bytes*/,
                                     const std::vector<absl::Span<const uint8_t>>& data) override {
    std::vector<absl::Status> results(receivers().size());
    auto serve = [&](size_t i) {
      const Socket& s = receivers()[i];
      absl::Status st = WriteMessage(s, frame, stall(), "bucket header");
      if (st.ok()) st = SendAll(s, data, stall(), "bucket payload");
      if (st.ok()) st = ReadAck(i, seq);
      results[i] = st;
    };
    if (receivers().size() == 1) {
      serve(0);
      return results;
    }
    std::vector<std::thread> threads;
    threads.reserve(receivers().size());
    for (size_t i = 0; i < receivers().size(); ++i) threads.emplace_back(serve, i);
    for (std::thread& t : threads) t.join();
    return results;
  }

  void ReleaseBackend() override {}
};

}  // namespace

absl::StatusOr<std::unique_ptr<WeightReceiver>> ConnectTcpReceiver(const GroupOptions& options) {
  ASSIGN_OR_RETURN(JoinedGroup joined, JoinGroup(options, BackendId::kTcp));
  return std::unique_ptr<WeightReceiver>(
      std::make_unique<TcpReceiver>(options, std::move(joined.control)));
}

absl::StatusOr<std::unique_ptr<WeightSender>> CreateTcpSender(const GroupOptions& options) {
  auto sender = std::make_unique<TcpSender>(options);
  RETURN_IF_ERROR(sender->Listen());
  return std::unique_ptr<WeightSender>(std::move(sender));
}

}  // namespace rl::weight_sync
