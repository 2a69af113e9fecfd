// The one checking macro for every CUDA runtime, cuBLAS and NCCL call in the project (compiled
// only when CUDA is; the NCCL overload only when NCCL is found, RL_HAVE_NCCL).
//
//   RETURN_IF_ERROR(RL_GPU_STATUS(cudaMalloc(&ptr, bytes)));
//   RETURN_IF_ERROR(RL_GPU_STATUS(cublasGemmEx(...)));
//   RETURN_IF_ERROR(RL_GPU_STATUS(cudaStreamQuery(stream), &raw));
//
// RL_GPU_STATUS(expr[, &raw]) evaluates `expr` once and turns its cudaError_t / cublasStatus_t /
// ncclResult_t into an absl::Status whose message records the error name and text, the
// expression and file:line. Codes: out of memory → RESOURCE_EXHAUSTED; no device / driver →
// FAILED_PRECONDITION; invalid values / usage → INVALID_ARGUMENT (NCCL, cuBLAS); NCCL system /
// remote errors → UNAVAILABLE; else INTERNAL. Two results report pending work rather than
// failure and map to OK: cudaErrorNotReady (stream / event queries) and ncclInProgress
// (non-blocking communicators); a caller that must tell them apart passes `&raw`.
#pragma once

#include <cublas_api.h>
#include <cuda_runtime_api.h>

#include "absl/status/status.h"

#if defined(RL_HAVE_NCCL)
#include <nccl.h>
#endif

namespace rl::gpu {

absl::Status GpuCallStatus(cudaError_t result, const char* expr, const char* file, int line,
                           cudaError_t* raw = nullptr);
absl::Status GpuCallStatus(cublasStatus_t result, const char* expr, const char* file, int line,
                           cublasStatus_t* raw = nullptr);
#if defined(RL_HAVE_NCCL)
absl::Status GpuCallStatus(ncclResult_t result, const char* expr, const char* file, int line,
                           ncclResult_t* raw = nullptr);
#endif

// Number of CUDA devices this process can use; 0 when there is no device or no driver (never an
// error: a CPU-only machine simply has none).
int NumCudaDevices();

}  // namespace rl::gpu

#define RL_GPU_STATUS(expr, ...) \
  ::rl::gpu::GpuCallStatus((expr), #expr, __FILE__, __LINE__ __VA_OPT__(, ) __VA_ARGS__)
