#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/ops.h"

namespace rl::kernels::cuda {
namespace {

constexpr int kThreads = 256;

unsigned GridFor(int64_t n) {
  const unsigned blocks = CeilDiv(n, kThreads);
  return blocks < 65535u ? blocks : 65535u;
}

#define RL_GRID_STRIDE_LOOP(i, n)                                                        \
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < (n); \
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)

__global__ void AddKernel(const float* x, float* y, int64_t n) {
  RL_GRID_STRIDE_LOOP(i, n) y[i] += x[i];
}

// One block per output row (rows may repeat; out never aliases x).
__global__ void GatherRowsKernel(const float* __restrict__ x, const int32_t* __restrict__ rows,
                                 int64_t dim, float* __restrict__ out) {
  const int64_t r = blockIdx.x;
  const float* src = x + static_cast<int64_t>(rows[r]) * dim;
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) out[r * dim + i] = src[i];
}

template <typename T>
__device__ __forceinline__ T FromF32(float v);
template <>
__device__ __forceinline__ float FromF32<float>(float v) {
  return v;
}
template <>
__device__ __forceinline__ __nv_bfloat16 FromF32<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}
template <>
__device__ __forceinline__ __half FromF32<__half>(float v) {
  return __float2half_rn(v);
}

template <typename T>
__global__ void CastFromF32Kernel(const float* src, int64_t n, T* dst) {
  RL_GRID_STRIDE_LOOP(i, n) dst[i] = FromF32<T>(src[i]);
}

template <typename T>
__global__ void CastToF32Kernel(const T* src, int64_t n, float* dst) {
  RL_GRID_STRIDE_LOOP(i, n) dst[i] = ToF32(src[i]);
}

template <typename T>
__global__ void AddBiasKernel(const T* __restrict__ bias, int64_t m, int64_t n, float* y) {
  RL_GRID_STRIDE_LOOP(i, m * n) y[i] += ToF32(bias[i % n]);
}

}  // namespace

cudaError_t LaunchAddInPlace(const float* x, float* y, int64_t n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  AddKernel<<<GridFor(n), kThreads, 0, stream>>>(x, y, n);
  return cudaGetLastError();
}

cudaError_t LaunchGatherRows(const float* x, const int32_t* rows, int64_t num_rows, int64_t dim,
                             float* out, cudaStream_t stream) {
  if (num_rows == 0) return cudaSuccess;
  GatherRowsKernel<<<static_cast<unsigned>(num_rows), kThreads, 0, stream>>>(x, rows, dim, out);
  return cudaGetLastError();
}

cudaError_t LaunchCastFromF32(const float* src, int64_t n, model_io::DType dtype, void* dst,
                              cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  RL_DISPATCH_FLOAT_DTYPE(dtype, T,
                          CastFromF32Kernel<T>
                          <<<GridFor(n), kThreads, 0, stream>>>(src, n, static_cast<T*>(dst)));
  return cudaGetLastError();
}

cudaError_t LaunchCastToF32(const void* src, model_io::DType dtype, int64_t n, float* dst,
                            cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  RL_DISPATCH_FLOAT_DTYPE(
      dtype, T,
      CastToF32Kernel<T><<<GridFor(n), kThreads, 0, stream>>>(static_cast<const T*>(src), n, dst));
  return cudaGetLastError();
}

cudaError_t LaunchAddBias(const void* bias, model_io::DType dtype, int64_t m, int64_t n, float* y,
                          cudaStream_t stream) {
  if (m == 0 || n == 0) return cudaSuccess;
  RL_DISPATCH_FLOAT_DTYPE(dtype, T,
                          AddBiasKernel<T><<<GridFor(m * n), kThreads, 0, stream>>>(
                              static_cast<const T*>(bias), m, n, y));
  return cudaGetLastError();
}

}  // namespace rl::kernels::cuda
