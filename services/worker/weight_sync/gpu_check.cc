#include "services/worker/weight_sync/gpu_check.h"

#include "absl/strings/str_cat.h"

namespace rl::weight_sync::internal {

absl::Status GpuCallStatus(cudaError_t result, const char* expr, const char* file, int line,
                           cudaError_t* raw) {
  if (raw != nullptr) *raw = result;
  if (result == cudaSuccess || result == cudaErrorNotReady) return absl::OkStatus();
  // Clears the error unless it is sticky, so one failed call does not poison the next.
  cudaGetLastError();
  std::string message =
      absl::StrCat("CUDA error ", cudaGetErrorName(result), " (", cudaGetErrorString(result),
                   ") in `", expr, "` at ", file, ":", line);
  switch (result) {
    case cudaErrorMemoryAllocation:
      return absl::ResourceExhaustedError(message);
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
    case cudaErrorInvalidDevice:
      return absl::FailedPreconditionError(message);
    default:
      return absl::InternalError(message);
  }
}

#if defined(RL_WEIGHT_SYNC_NCCL)
absl::Status GpuCallStatus(ncclResult_t result, const char* expr, const char* file, int line,
                           ncclResult_t* raw) {
  if (raw != nullptr) *raw = result;
  if (result == ncclSuccess || result == ncclInProgress) return absl::OkStatus();
  const char* detail = ncclGetLastError(nullptr);
  std::string message =
      absl::StrCat("NCCL error ", ncclGetErrorString(result), " in `", expr, "` at ", file, ":",
                   line, detail != nullptr && *detail != '\0' ? absl::StrCat(": ", detail) : "");
  switch (result) {
    case ncclInvalidArgument:
    case ncclInvalidUsage:
      return absl::InvalidArgumentError(message);
    case ncclSystemError:
    case ncclRemoteError:
      return absl::UnavailableError(message);
    default:
      return absl::InternalError(message);
  }
}
#endif

}  // namespace rl::weight_sync::internal
