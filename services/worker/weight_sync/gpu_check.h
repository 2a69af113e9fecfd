// The one checking macro for CUDA runtime and NCCL calls in the weight-sync library
// (compiled only when CUDA is; NCCL overloads only when NCCL is).
//
//   RETURN_IF_ERROR(RL_GPU_STATUS(cudaMalloc(&ptr, bytes)));
//   RETURN_IF_ERROR(RL_GPU_STATUS(cudaStreamQuery(stream), &raw));
//
// RL_GPU_STATUS(expr[, &raw]) evaluates `expr` once and turns its cudaError_t / ncclResult_t
// into an absl::Status whose message records the error name and text, the expression and
// file:line. Codes: out of memory → RESOURCE_EXHAUSTED; no device / driver → FAILED_PRECONDITION;
// NCCL invalid argument / usage → INVALID_ARGUMENT; NCCL system / remote errors → UNAVAILABLE;
// else INTERNAL. Two results report pending work rather than failure and map to OK:
// cudaErrorNotReady (stream / event queries) and ncclInProgress (non-blocking communicators);
// a caller that must tell them apart passes `&raw` to receive the raw result.
#pragma once

#include <cuda_runtime_api.h>

#include "absl/status/status.h"

#if defined(RL_WEIGHT_SYNC_NCCL)
#include <nccl.h>
#endif

namespace rl::weight_sync::internal {

absl::Status GpuCallStatus(cudaError_t result, const char* expr, const char* file, int line,
                           cudaError_t* raw = nullptr);
#if defined(RL_WEIGHT_SYNC_NCCL)
absl::Status GpuCallStatus(ncclResult_t result, const char* expr, const char* file, int line,
                           ncclResult_t* raw = nullptr);
#endif

}  // namespace rl::weight_sync::internal

#define RL_GPU_STATUS(expr, ...)                                      \
  ::rl::weight_sync::internal::GpuCallStatus((expr), #expr, __FILE__, \
                                             __LINE__ __VA_OPT__(, ) __VA_ARGS__)
