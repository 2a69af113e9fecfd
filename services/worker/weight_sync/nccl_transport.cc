#include "services/worker/weight_sync/nccl_transport.h"

#include <cstring>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/gpu/gpu_status.h"
#include "common/status.h"
#include "services/worker/weight_sync/crc32c.h"
#include "services/worker/weight_sync/group.h"
#include "services/worker/weight_sync/session.h"
#include "spdlog/spdlog.h"

namespace rl::weight_sync {
namespace {

constexpr auto kPollInterval = std::chrono::microseconds(200);
constexpr auto kTeardownBudget = std::chrono::milliseconds(10000);

absl::Status CheckDevice(int device) {
  const int count = NumCudaDevices();
  if (count == 0) {
    return absl::FailedPreconditionError(
        "nccl backend: no CUDA device is visible to this process (use backend tcp)");
  }
  if (device < 0 || device >= count) {
    return absl::InvalidArgumentError(
        absl::StrCat("cuda_device ", device, " is outside [0, ", count, ")"));
  }
  return absl::OkStatus();
}

// Polls a non-blocking communicator until no operation is in progress. `cancel` (optional)
// ends the wait early. Does not abort: the caller owns that decision.
absl::Status WaitComm(ncclComm_t comm, Clock::time_point deadline, const std::atomic<bool>* cancel,
                      const char* what) {
  while (true) {
    ncclResult_t state = ncclSuccess;
    RETURN_IF_ERROR(RL_GPU_STATUS(ncclCommGetAsyncError(comm, &state)));
    if (state == ncclSuccess) return absl::OkStatus();
    if (state != ncclInProgress) {
      return gpu::GpuCallStatus(state, what, __FILE__, __LINE__);
    }
    if (cancel != nullptr && cancel->load()) {
      return absl::CancelledError(absl::StrCat(what, ": cancelled by Close"));
    }
    if (Clock::now() >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat(what, ": still in progress at deadline"));
    }
    std::this_thread::sleep_for(kPollInterval);
  }
}

// Waits for `stream` to drain while watching `comm` for asynchronous errors.
absl::Status WaitStream(cudaStream_t stream, ncclComm_t comm, Clock::time_point deadline,
                        const std::atomic<bool>* cancel, const char* what) {
  while (true) {
    cudaError_t raw = cudaSuccess;
    RETURN_IF_ERROR(RL_GPU_STATUS(cudaStreamQuery(stream), &raw));
    if (raw == cudaSuccess) return absl::OkStatus();
    ncclResult_t state = ncclSuccess;
    RETURN_IF_ERROR(RL_GPU_STATUS(ncclCommGetAsyncError(comm, &state)));
    if (state != ncclSuccess && state != ncclInProgress) {
      return gpu::GpuCallStatus(state, what, __FILE__, __LINE__);
    }
    if (cancel != nullptr && cancel->load()) {
      return absl::CancelledError(absl::StrCat(what, ": cancelled by Close"));
    }
    if (Clock::now() >= deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat(what, ": peer made no progress before the stall deadline"));
    }
    std::this_thread::sleep_for(kPollInterval);
  }
}

// One rank's communicator, stream and device staging buffer.
class NcclRank {
 public:
  explicit NcclRank(int device) : device_(device) {}
  ~NcclRank() { Release(); }
  NcclRank(const NcclRank&) = delete;
  NcclRank& operator=(const NcclRank&) = delete;

  // Eager communicator creation, bounded by `deadline`.
  absl::Status Init(const std::string& unique_id, int rank, int world_size,
                    Clock::time_point deadline) {
    if (unique_id.size() != sizeof(ncclUniqueId)) {
      return absl::DataLossError(absl::StrCat("nccl unique id of ", unique_id.size(),
                                              " bytes, expected ", sizeof(ncclUniqueId)));
    }
    ncclUniqueId id;
    std::memcpy(&id, unique_id.data(), sizeof(id));
    RETURN_IF_ERROR(RL_GPU_STATUS(cudaSetDevice(device_)));
    RETURN_IF_ERROR(RL_GPU_STATUS(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking)));
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    absl::Status st = RL_GPU_STATUS(ncclCommInitRankConfig(&comm_, world_size, id, rank, &config));
    if (st.ok() && comm_ != nullptr) st = WaitComm(comm_, deadline, nullptr, "ncclCommInitRank");
    if (!st.ok()) Abort();
    return st;
  }

  // Broadcasts `bytes` from rank 0's staging buffer into everyone's, bounded by `deadline`.
  // On failure the communicator is aborted.
  absl::Status Broadcast(size_t bytes, Clock::time_point deadline,
                         const std::atomic<bool>* cancel) {
    if (comm_ == nullptr) return absl::FailedPreconditionError("nccl communicator is gone");
    absl::Status st = RL_GPU_STATUS(
        ncclBroadcast(buffer_, buffer_, bytes, ncclUint8, /*root=*/0, comm_, stream_));
    if (st.ok()) st = WaitComm(comm_, deadline, cancel, "ncclBroadcast (enqueue)");
    if (st.ok()) st = WaitStream(stream_, comm_, deadline, cancel, "ncclBroadcast");
    if (!st.ok()) Abort();
    return st;
  }

  absl::Status Reserve(size_t bytes) {
    RETURN_IF_ERROR(RL_GPU_STATUS(cudaSetDevice(device_)));
    if (bytes <= capacity_) return absl::OkStatus();
    if (buffer_ != nullptr) {
      RETURN_IF_ERROR(RL_GPU_STATUS(cudaFree(buffer_)));
      buffer_ = nullptr;
      capacity_ = 0;
    }
    RETURN_IF_ERROR(RL_GPU_STATUS(cudaMalloc(&buffer_, bytes)));
    capacity_ = bytes;
    return absl::OkStatus();
  }

  void Abort() {
    if (comm_ == nullptr) return;
    LogIfError(RL_GPU_STATUS(ncclCommAbort(comm_)));
    comm_ = nullptr;
  }

  // Finalizes and destroys the communicator (aborting it if that does not finish within
  // kTeardownBudget) and frees the stream and buffer.
  void Release() {
    if (comm_ != nullptr) {
      LogIfError(RL_GPU_STATUS(cudaSetDevice(device_)));
      absl::Status st = RL_GPU_STATUS(ncclCommFinalize(comm_));
      if (st.ok()) {
        st = WaitComm(comm_, Clock::now() + kTeardownBudget, nullptr, "ncclCommFinalize");
      }
      if (st.ok()) {
        LogIfError(RL_GPU_STATUS(ncclCommDestroy(comm_)));
        comm_ = nullptr;
      } else {
        LogIfError(st);
        Abort();
      }
    }
    if (buffer_ != nullptr) LogIfError(RL_GPU_STATUS(cudaFree(buffer_)));
    buffer_ = nullptr;
    capacity_ = 0;
    if (stream_ != nullptr) LogIfError(RL_GPU_STATUS(cudaStreamDestroy(stream_)));
    stream_ = nullptr;
  }

  static void LogIfError(const absl::Status& status) {
    if (!status.ok()) spdlog::warn("weight-sync nccl teardown: {}", std::string(status.message()));
  }

  int device() const { return device_; }
  uint8_t* buffer() const { return static_cast<uint8_t*>(buffer_); }
  cudaStream_t stream() const { return stream_; }
  ncclComm_t comm() const { return comm_; }

 private:
  const int device_;
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  void* buffer_ = nullptr;
  size_t capacity_ = 0;
};

class NcclReceiver final : public ReceiverSession {
 public:
  NcclReceiver(GroupOptions options, Socket control, std::unique_ptr<NcclRank> rank)
      : ReceiverSession(std::move(options), std::move(control)), rank_(std::move(rank)) {}
  ~NcclReceiver() override { ReleaseBackend(); }

 protected:
  absl::StatusOr<absl::Span<const uint8_t>> ReceivePayload(const BucketHeader& header, bool keep,
                                                           uint32_t* crc) override {
    const size_t size = static_cast<size_t>(header.payload_bytes);
    if (rank_ == nullptr) return absl::FailedPreconditionError("group closed");
    if (size == 0) return absl::Span<const uint8_t>();
    RETURN_IF_ERROR(rank_->Reserve(size));
    const auto deadline = Clock::now() + stall();
    RETURN_IF_ERROR(rank_->Broadcast(size, deadline, closing_flag()));
    if (!keep) return absl::Span<const uint8_t>();
    if (host_capacity_ < size) {
      if (host_ != nullptr) RETURN_IF_ERROR(RL_GPU_STATUS(cudaFreeHost(host_)));
      host_ = nullptr;
      host_capacity_ = 0;
      RETURN_IF_ERROR(RL_GPU_STATUS(cudaMallocHost(&host_, size)));
      host_capacity_ = size;
    }
    RETURN_IF_ERROR(RL_GPU_STATUS(
        cudaMemcpyAsync(host_, rank_->buffer(), size, cudaMemcpyDeviceToHost, rank_->stream())));
    RETURN_IF_ERROR(WaitStream(rank_->stream(), rank_->comm(), Clock::now() + stall(),
                               closing_flag(), "device-to-host copy"));
    const auto* bytes = static_cast<const uint8_t*>(host_);
    *crc = Crc32cExtend(0, bytes, size);
    return absl::Span<const uint8_t>(bytes, size);
  }

  void ReleaseBackend() override {
    if (rank_ != nullptr) {
      rank_->Release();
      rank_.reset();
    }
    if (host_ != nullptr) NcclRank::LogIfError(RL_GPU_STATUS(cudaFreeHost(host_)));
    host_ = nullptr;
    host_capacity_ = 0;
  }

 private:
  std::unique_ptr<NcclRank> rank_;
  void* host_ = nullptr;
  size_t host_capacity_ = 0;
};

class NcclSender final : public SenderSession {
 public:
  explicit NcclSender(GroupOptions options)
      : SenderSession(options, BackendId::kNccl),
        rank_(std::make_unique<NcclRank>(options.cuda_device)) {}
  ~NcclSender() override { ReleaseBackend(); }

 protected:
  absl::StatusOr<std::string> PrepareGroup() override {
    RETURN_IF_ERROR(CheckDevice(options().cuda_device));
    RETURN_IF_ERROR(RL_GPU_STATUS(cudaSetDevice(options().cuda_device)));
    ncclUniqueId id;
    RETURN_IF_ERROR(RL_GPU_STATUS(ncclGetUniqueId(&id)));
    unique_id_.assign(reinterpret_cast<const char*>(&id), sizeof(id));
    return unique_id_;
  }

  absl::Status CompleteGroup() override {
    const auto start = Clock::now();
    absl::Status st = rank_->Init(unique_id_, 0, options().world_size, start + options().timeout);
    if (!st.ok()) {
      return absl::Status(st.code(),
                          absl::StrCat(context(), ": nccl communicator init failed after ",
                                       ElapsedMs(start), " ms: ", st.message()));
    }
    return absl::OkStatus();
  }

  std::vector<absl::Status> Transmit(const std::string& frame, uint64_t seq, int64_t payload_bytes,
                                     const std::vector<absl::Span<const uint8_t>>& data) override {
    std::vector<absl::Status> results(receivers().size());
    bool all_headers = true;
    for (size_t i = 0; i < receivers().size(); ++i) {
      results[i] = WriteMessage(receivers()[i], frame, stall(), "bucket header");
      all_headers = all_headers && results[i].ok();
    }
    absl::Status moved = all_headers ? Move(payload_bytes, data)
                                     : absl::UnavailableError(
                                           "bucket aborted: a receiver is "
                                           "unreachable, no broadcast issued");
    if (!moved.ok()) {
      for (absl::Status& r : results) {
        if (r.ok()) r = moved;
      }
      return results;
    }
    for (size_t i = 0; i < receivers().size(); ++i) results[i] = ReadAck(i, seq);
    return results;
  }

  void ReleaseBackend() override {
    if (rank_ != nullptr) {
      rank_->Release();
      rank_.reset();
    }
  }

 private:
  // Copies the tensors into the device staging buffer and broadcasts it.
  absl::Status Move(int64_t payload_bytes, const std::vector<absl::Span<const uint8_t>>& data) {
    const size_t size = static_cast<size_t>(payload_bytes);
    if (rank_ == nullptr) return absl::FailedPreconditionError("group closed");
    if (size == 0) return absl::OkStatus();
    RETURN_IF_ERROR(rank_->Reserve(size));
    size_t offset = 0;
    for (const auto& span : data) {
      if (span.empty()) continue;
      RETURN_IF_ERROR(
          RL_GPU_STATUS(cudaMemcpyAsync(rank_->buffer() + offset, span.data(), span.size(),
                                        cudaMemcpyHostToDevice, rank_->stream())));
      offset += span.size();
    }
    return rank_->Broadcast(size, Clock::now() + stall(), closing_flag());
  }

  std::unique_ptr<NcclRank> rank_;
  std::string unique_id_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<WeightReceiver>> ConnectNcclReceiver(const GroupOptions& options) {
  const auto start = Clock::now();
  const std::string context = GroupContext(options);
  if (absl::Status st = CheckDevice(options.cuda_device); !st.ok()) {
    return absl::Status(st.code(), absl::StrCat(context, ": ", st.message()));
  }
  ASSIGN_OR_RETURN(JoinedGroup joined, JoinGroup(options, BackendId::kNccl));
  auto rank = std::make_unique<NcclRank>(options.cuda_device);
  absl::Status st = rank->Init(joined.welcome.nccl_unique_id, options.rank, options.world_size,
                               start + options.timeout);
  if (!st.ok()) {
    return absl::Status(st.code(), absl::StrCat(context, ": nccl communicator init failed after ",
                                                ElapsedMs(start), " ms: ", st.message()));
  }
  return std::unique_ptr<WeightReceiver>(
      std::make_unique<NcclReceiver>(options, std::move(joined.control), std::move(rank)));
}

absl::StatusOr<std::unique_ptr<WeightSender>> CreateNcclSender(const GroupOptions& options) {
  auto sender = std::make_unique<NcclSender>(options);
  RETURN_IF_ERROR(sender->Listen());
  return std::unique_ptr<WeightSender>(std::move(sender));
}

}  // namespace rl::weight_sync
