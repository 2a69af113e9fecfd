// Device helpers shared by the CUDA kernels: weight-dtype loads widened to float32, reductions
// with a fixed order (so a row's result never depends on which block or batch it ran in), and
// the dtype dispatch macro that reports unsupported dtypes instead of guessing.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "common/model_io/dtype.h"

namespace rl::kernels::cuda {

template <typename T>
__device__ __forceinline__ float ToF32(T v);
template <>
__device__ __forceinline__ float ToF32<float>(float v) {
  return v;
}
template <>
__device__ __forceinline__ float ToF32<__nv_bfloat16>(__nv_bfloat16 v) {
  return __bfloat162float(v);
}
template <>
__device__ __forceinline__ float ToF32<__half>(__half v) {
  return __half2float(v);
}

// Sum over the warp with a fixed butterfly, then lane 0's value broadcast: every lane returns
// the same bits, and the order depends only on the lane layout.
__device__ __forceinline__ float WarpSum(float v) {
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return __shfl_sync(0xffffffffu, v, 0);
}

__device__ __forceinline__ float WarpMax(float v) {
  for (int offset = 16; offset > 0; offset >>= 1) {
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
  }
  return v;
}

// Block-wide sum with a fixed order (per-warp sums, then warp 0 sums them in warp order).
// `scratch` holds at least 33 floats of shared memory; every thread gets the result. All
// threads of the block must call it.
__device__ __forceinline__ float BlockSum(float v, float* scratch) {
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int num_warps = (blockDim.x + 31) >> 5;
  v = WarpSum(v);
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  if (warp == 0) {
    float s = lane < num_warps ? scratch[lane] : 0.0f;
    s = WarpSum(s);
    if (lane == 0) scratch[32] = s;
  }
  __syncthreads();
  const float total = scratch[32];
  __syncthreads();
  return total;
}

__device__ __forceinline__ float BlockMax(float v, float* scratch) {
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int num_warps = (blockDim.x + 31) >> 5;
  v = WarpMax(v);
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  if (warp == 0) {
    float s = lane < num_warps ? scratch[lane] : -INFINITY;
    s = WarpMax(s);
    if (lane == 0) scratch[32] = s;
  }
  __syncthreads();
  const float total = scratch[32];
  __syncthreads();
  return total;
}

inline unsigned int CeilDiv(int64_t a, int64_t b) {
  return static_cast<unsigned int>((a + b - 1) / b);
}

}  // namespace rl::kernels::cuda

// RL_DISPATCH_FLOAT_DTYPE(dtype, T, body): runs `body` with T = float, __nv_bfloat16 or __half
// for F32 / BF16 / F16; any other dtype returns cudaErrorInvalidValue from the enclosing
// launcher (which the caller reports with the op's name).
#define RL_DISPATCH_FLOAT_DTYPE(dtype, T, ...) \
  switch (dtype) {                             \
    case ::rl::model_io::DType::kF32: {        \
      using T = float;                         \
      __VA_ARGS__;                             \
      break;                                   \
    }                                          \
    case ::rl::model_io::DType::kBF16: {       \
      using T = __nv_bfloat16;                 \
      __VA_ARGS__;                             \
      break;                                   \
    }                                          \
    case ::rl::model_io::DType::kF16: {        \
      using T = __half;                        \
      __VA_ARGS__;                             \
      break;                                   \
    }                                          \
    default:                                   \
      return cudaErrorInvalidValue;            \
  }
