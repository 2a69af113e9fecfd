#include "services/worker/weight_sync/weight_sync.h"

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "services/worker/weight_sync/tcp_transport.h"
#include "services/worker/weight_sync/wire.h"
#include "spdlog/spdlog.h"

#if defined(RL_WEIGHT_SYNC_CUDA)
#include "common/gpu/gpu_status.h"
#endif
#if defined(RL_WEIGHT_SYNC_NCCL)
#include "services/worker/weight_sync/nccl_transport.h"
#endif

namespace rl::weight_sync {
namespace {

absl::Status NcclNotBuilt() {
  return absl::UnimplementedError(
      "backend nccl: this build has no NCCL (configure with CUDA and the NCCL headers and "
      "library installed); use backend tcp");
}

}  // namespace

absl::Status ValidateGroupOptions(const GroupOptions& options) {
  RETURN_IF_ERROR(ParseBackend(options.backend).status());
  if (options.master_address.empty()) {
    return absl::InvalidArgumentError("master_address: must not be empty");
  }
  if (options.master_port < 0 || options.master_port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("master_port: ", options.master_port, " is outside [0, 65535]"));
  }
  if (options.world_size < 2) {
    return absl::InvalidArgumentError("world_size: must be >= 2 (the trainer and a receiver)");
  }
  if (options.rank < 0 || options.rank >= options.world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank: ", options.rank, " is outside [0, ", options.world_size, ")"));
  }
  if (options.group_name.empty()) return absl::InvalidArgumentError("group_name: must be set");
  if (options.timeout.count() <= 0) return absl::InvalidArgumentError("timeout: must be > 0");
  if (options.stall_timeout.count() < 0) {
    return absl::InvalidArgumentError("stall_timeout: must be >= 0");
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<WeightReceiver>> ConnectReceiver(const GroupOptions& options) {
  RETURN_IF_ERROR(ValidateGroupOptions(options));
  if (options.rank == 0) {
    return absl::InvalidArgumentError("rank: 0 is the sender (the trainer); receivers use >= 1");
  }
  if (options.master_port == 0) {
    return absl::InvalidArgumentError("master_port: a receiver needs the sender's port");
  }
  ASSIGN_OR_RETURN(BackendId backend, ParseBackend(options.backend));
  if (backend == BackendId::kNccl) {
#if defined(RL_WEIGHT_SYNC_NCCL)
    return ConnectNcclReceiver(options);
#else
    return NcclNotBuilt();
#endif
  }
  return ConnectTcpReceiver(options);
}

absl::StatusOr<std::unique_ptr<WeightSender>> WeightSender::Create(const GroupOptions& options) {
  RETURN_IF_ERROR(ValidateGroupOptions(options));
  if (options.rank != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank: the sender is rank 0, got ", options.rank));
  }
  ASSIGN_OR_RETURN(BackendId backend, ParseBackend(options.backend));
  if (backend == BackendId::kNccl) {
#if defined(RL_WEIGHT_SYNC_NCCL)
    return CreateNcclSender(options);
#else
    return NcclNotBuilt();
#endif
  }
  return CreateTcpSender(options);
}

bool NcclBackendBuilt() {
#if defined(RL_WEIGHT_SYNC_NCCL)
  return true;
#else
  return false;
#endif
}

int NumCudaDevices() {
#if defined(RL_WEIGHT_SYNC_CUDA)
  return gpu::NumCudaDevices();
#else
  return 0;
#endif
}

}  // namespace rl::weight_sync
