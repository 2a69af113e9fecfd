#include "common/gpu/gpu_status.h"

#include "absl/strings/str_cat.h"

namespace rl::gpu {

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
    case cudaErrorInvalidValue:
    case cudaErrorInvalidConfiguration:
      return absl::InvalidArgumentError(message);
    default:
      return absl::InternalError(message);
  }
}

namespace {
// cublasGetStatusName lives in libcublas; a table keeps this library free of that link.
const char* CublasStatusName(cublasStatus_t s) {
  switch (s) {
    case CUBLAS_STATUS_SUCCESS:
      return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED:
      return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED:
      return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE:
      return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH:
      return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_MAPPING_ERROR:
      return "CUBLAS_STATUS_MAPPING_ERROR";
    case CUBLAS_STATUS_EXECUTION_FAILED:
      return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR:
      return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED:
      return "CUBLAS_STATUS_NOT_SUPPORTED";
    case CUBLAS_STATUS_LICENSE_ERROR:
      return "CUBLAS_STATUS_LICENSE_ERROR";
    default:
      return "CUBLAS_STATUS_UNKNOWN";
  }
}
}  // namespace

absl::Status GpuCallStatus(cublasStatus_t result, const char* expr, const char* file, int line,
                           cublasStatus_t* raw) {
  if (raw != nullptr) *raw = result;
  if (result == CUBLAS_STATUS_SUCCESS) return absl::OkStatus();
  std::string message = absl::StrCat("cuBLAS error ", CublasStatusName(result), " in `", expr,
                                     "` at ", file, ":", line);
  switch (result) {
    case CUBLAS_STATUS_ALLOC_FAILED:
      return absl::ResourceExhaustedError(message);
    case CUBLAS_STATUS_INVALID_VALUE:
    case CUBLAS_STATUS_NOT_SUPPORTED:
      return absl::InvalidArgumentError(message);
    case CUBLAS_STATUS_NOT_INITIALIZED:
    case CUBLAS_STATUS_ARCH_MISMATCH:
      return absl::FailedPreconditionError(message);
    default:
      return absl::InternalError(message);
  }
}

#if defined(RL_HAVE_NCCL)
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

int NumCudaDevices() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return count;
}

}  // namespace rl::gpu
